"""Registry client: push images, read their digest over the registry's HTTP API, pull them back by digest.

Sources of the external facts used here:

* Docker Registry HTTP API V2 / OCI Distribution Specification v1.1 ("Pulling manifests", "Checking if
  content exists"): ``HEAD /v2/<name>/manifests/<reference>`` answers with ``Docker-Content-Digest``, the
  sha256 of the manifest bytes the registry serves for the media types in ``Accept``; ``GET /v2/`` is the
  version check and answers 200 or 401 with a ``WWW-Authenticate`` challenge.
* Docker token authentication spec (distribution ``docs/spec/auth/token.md``): a ``Bearer realm=...,
  service=...,scope=...`` challenge is answered by a GET to the realm (basic auth with the user's
  credentials, if any) that returns ``{"token": ...}`` or ``{"access_token": ...}``.
* Docker's reference grammar (distribution ``reference`` package): the first path component is a registry
  host when it contains ``.`` or ``:`` or is ``localhost``; otherwise the registry is Docker Hub
  (``docker.io``, API host ``registry-1.docker.io``) and single-component names get ``library/``.
* Docker's registry configuration: loopback registries (127.0.0.0/8, ``localhost``) are insecure by default,
  i.e. plain HTTP is allowed; everything else is HTTPS.
* enroot/pyxis image URIs (enroot ``doc/cmd/import.md``): ``docker://[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST]``,
  i.e. a ``#`` separates the registry from the image name.

Credentials come from the Docker credential store (``~/.docker/config.json`` ``auths``, ``credsStore``,
``credHelpers``; ``DOCKER_CONFIG`` overrides the folder), read through the docker SDK's ``docker.auth``.
They are only ever placed in HTTP headers: no function here returns, logs or raises them.
"""
from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass
from typing import Callable, Optional

import requests

from cudastack.errors import EnvironmentError_, RegistryError, UsageError

#: Manifest media types we accept, most specific first (OCI image-spec v1.1 and Docker Image Manifest V2,
#: Schema 2). A registry serves the stored manifest when its type is in this list, so the digest it reports
#: equals the digest the engine computed when it pushed.
MANIFEST_MEDIA_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
)
MANIFEST_ACCEPT = ", ".join(MANIFEST_MEDIA_TYPES)

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_NAME_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_NAME_RE = re.compile(rf"^{_NAME_COMPONENT}(?:/{_NAME_COMPONENT})*$")
_TAG_RE = re.compile(r"^[\w][\w.-]{0,127}$")


# --------------------------------------------------------------------------------------------- references
@dataclass(frozen=True)
class ImageReference:
    """A parsed image reference. ``registry``: host[:port] as written ("docker.io" for Docker Hub);
    ``repository``: path inside the registry ("library/debian", "cudastack/runtime"); ``tag`` and ``digest``
    ("sha256:<64 hex>") are optional."""

    registry: str
    repository: str
    tag: Optional[str] = None
    digest: Optional[str] = None

    @property
    def api_host(self) -> str:
        """Host[:port] that serves the HTTP API (Docker Hub's API lives on registry-1.docker.io)."""
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    @property
    def name(self) -> str:
        """``registry/repository``: what the docker engine calls the repository."""
        return f"{self.registry}/{self.repository}"

    def with_digest(self, digest: str) -> "ImageReference":
        check_digest(digest)
        return ImageReference(self.registry, self.repository, None, digest)

    def pinned(self) -> str:
        """``registry/name@sha256:...`` (Kubernetes, docker). Requires a digest."""
        if not self.digest:
            raise UsageError(f"{self} has no digest; pin it first (push it or resolve it).")
        return f"{self.registry}/{self.repository}@{self.digest}"

    def enroot(self) -> str:
        """``registry#name@sha256:...``: the enroot/pyxis spelling (``srun --container-image=...``)."""
        if not self.digest:
            raise UsageError(f"{self} has no digest; pin it first (push it or resolve it).")
        return f"{self.registry}#{self.repository}@{self.digest}"

    def __str__(self) -> str:
        s = self.name
        if self.tag:
            s += f":{self.tag}"
        if self.digest:
            s += f"@{self.digest}"
        return s


def check_digest(digest: str) -> str:
    """Return ``digest`` if it is ``sha256:`` + 64 lowercase hex digits, else raise UsageError."""
    if not isinstance(digest, str) or not _DIGEST_RE.match(digest):
        raise UsageError(f"{digest!r} is not an image digest; expected 'sha256:' followed by 64 hex digits.")
    return digest


def _is_registry_host(component: str) -> bool:
    return "." in component or ":" in component or component == "localhost"


def parse_reference(ref: str) -> ImageReference:
    """Parse ``[registry[:port]/]name[:tag][@sha256:...]`` (also the enroot spelling ``registry#name...``)
    following Docker's reference grammar. Raises UsageError on anything else."""
    original = ref
    if not ref or any(c.isspace() for c in ref):
        raise UsageError(f"{original!r} is not an image reference; expected [REGISTRY[:PORT]/]NAME[:TAG][@DIGEST].")
    digest = None
    if "@" in ref:
        ref, digest = ref.split("@", 1)
        check_digest(digest)
    if "#" in ref:                       # enroot: registry#name
        registry, rest = ref.split("#", 1)
    else:
        first, sep, rest = ref.partition("/")
        if sep and _is_registry_host(first):
            registry = first
        else:
            registry, rest = DOCKER_HUB, ref
    tag = None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        rest, tag = rest.rsplit(":", 1)
        if not _TAG_RE.match(tag):
            raise UsageError(f"{original!r}: tag {tag!r} is not a valid tag (letters, digits, '_', '.', '-').")
    if registry in ("index.docker.io", "registry-1.docker.io"):
        registry = DOCKER_HUB
    if registry == DOCKER_HUB and "/" not in rest:
        rest = f"library/{rest}"
    if not _NAME_RE.match(rest):
        raise UsageError(
            f"{original!r}: repository {rest!r} is not a valid name (lowercase letters, digits, separators "
            "'.', '_', '__', '-', components joined by '/')."
        )
    return ImageReference(registry, rest, tag, digest)


def parse_registry_prefix(value: str) -> tuple[str, str]:
    """Split ``HOST[:PORT][/NAMESPACE]`` (the ``--registry`` flag) into (host, namespace). The host must look
    like a registry host (contain '.' or ':' or be 'localhost'), so a bare name is not mistaken for Docker Hub."""
    value = value.strip().rstrip("/")
    if "://" in value:
        raise UsageError(f"--registry {value!r}: give HOST[:PORT]/NAMESPACE without a scheme (no http://).")
    host, _, namespace = value.partition("/")
    if not host or not _is_registry_host(host):
        raise UsageError(
            f"--registry {value!r}: the first part must be a registry host such as 'registry.example.com', "
            "'127.0.0.1:5000' or 'localhost:5000', optionally followed by /NAMESPACE."
        )
    if namespace and not _NAME_RE.match(namespace):
        raise UsageError(f"--registry {value!r}: namespace {namespace!r} is not a valid repository path.")
    return host, namespace


def is_loopback(host: str) -> bool:
    """True for localhost and 127.0.0.0/8 / ::1 hosts (with or without port)."""
    h = host
    if h.startswith("["):
        h = h[1:].split("]", 1)[0]
    elif h.count(":") == 1:
        h = h.split(":", 1)[0]
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


# --------------------------------------------------------------------------------------------- credentials
def registry_credentials(registry: str, config_path: Optional[str] = None) -> Optional[dict]:
    """The credentials the Docker credential store holds for ``registry`` (host[:port]), as the docker SDK
    resolves them: ``{"Username": ..., "Password": ...}`` or ``{"IdentityToken": ...}``, or None.
    Raises EnvironmentError_ when a configured credential helper fails (the helper's name, never a secret)."""
    import docker.auth
    import docker.errors

    try:
        cfg = docker.auth.load_config(config_path=config_path)
        auth = cfg.resolve_authconfig(registry if registry != DOCKER_HUB else None)
    except docker.errors.DockerException as exc:
        raise EnvironmentError_(
            f"The Docker credential store could not be read for {registry} ({type(exc).__name__}). Check the "
            "credsStore/credHelpers entries in your Docker config.json (DOCKER_CONFIG) and that the helper runs."
        ) from None
    if not auth:
        return None
    out = {k: auth[k] for k in ("Username", "Password", "IdentityToken") if auth.get(k)}
    # legacy "auth": base64(user:pass) entries are decoded by load_config into username/password
    if not out and auth.get("username"):
        out = {"Username": auth["username"], "Password": auth.get("password", "")}
    return out or None


# --------------------------------------------------------------------------------------------- HTTP client
def _check_credential_url(url: str, registry: str, what: str) -> None:
    """Credentials go only over https, or to a loopback host (this machine). A registry names the token service
    (``realm``) its clients send their login to (distribution token auth spec), so a registry, or anyone who
    can change its answer, could otherwise collect the login over plain HTTP or on another host. Raises
    RegistryError before anything is sent."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme == "https" or (parts.scheme == "http" and is_loopback(host)):
        return
    raise RegistryError(
        f"The registry {registry} asks for the login to be sent to its {what} at "
        f"{parts.scheme or '?'}://{parts.netloc.rsplit('@', 1)[-1]}{parts.path}, which is neither https nor a "
        "loopback address; credentials are sent only over https (or to this machine). Nothing was sent. Serve the "
        "registry's token service over https, or use a registry on a loopback address."
    )


def _parse_challenge(header: str) -> tuple[str, dict]:
    scheme, _, rest = header.strip().partition(" ")
    params = dict(re.findall(r'(\w+)="([^"]*)"', rest))
    return scheme.lower(), params


class RegistryClient:
    """Minimal Registry HTTP API V2 client (manifest digests only) with basic and bearer-token auth.

    ``registry``: host[:port] ("docker.io" maps to its API host). ``scheme``: "https"/"http"; None picks http
    for loopback hosts and https otherwise (Docker's default for insecure loopback registries).
    ``credentials``: a dict as returned by :func:`registry_credentials`; None reads the credential store.
    ``timeout``: seconds per HTTP request. Every network failure becomes a RegistryError naming the URL."""

    def __init__(self, registry: str, *, scheme: Optional[str] = None, credentials: Optional[dict] = None,
                 timeout: float = 30.0, session: Optional[requests.Session] = None,
                 credential_loader: Callable[[str], Optional[dict]] = registry_credentials):
        self.registry = registry
        self.host = DOCKER_HUB_API if registry == DOCKER_HUB else registry
        self.scheme = scheme or ("http" if is_loopback(self.host) else "https")
        self._credentials = credentials
        self._credential_loader = credential_loader
        self._loaded = credentials is not None
        self.timeout = timeout
        self.session = session or requests.Session()
        self._auth_header: Optional[str] = None

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}"

    def _creds(self) -> Optional[dict]:
        if not self._loaded:
            self._credentials = self._credential_loader(self.registry)
            self._loaded = True
        return self._credentials

    def _request(self, method: str, url: str, headers: dict) -> requests.Response:
        try:
            return self.session.request(method, url, headers=headers, timeout=self.timeout, allow_redirects=True)
        except requests.exceptions.SSLError as exc:
            raise RegistryError(
                f"TLS with the registry {self.registry} failed ({type(exc).__name__}). If it serves plain HTTP, "
                "use a loopback address or configure it as insecure; if it uses a private CA, set REQUESTS_CA_BUNDLE."
            ) from None
        except requests.exceptions.RequestException as exc:
            raise RegistryError(
                f"The registry {self.registry} does not answer at {self.base_url} ({type(exc).__name__}). "
                "Start it or check its host and port (push: --registry; pull: the reference the lockfile "
                "recorded); nothing was pushed, pulled or recorded."
            ) from None

    def _authorize(self, challenge: str, scope_hint: str) -> None:
        scheme, params = _parse_challenge(challenge)
        creds = self._creds() or {}
        if scheme == "basic":
            if creds.get("Username"):
                _check_credential_url(self.base_url, self.registry, "registry")
            if not creds.get("Username"):
                raise RegistryError(
                    f"The registry {self.registry} asks for a login and the Docker credential store has none for "
                    f"it. Run `docker login {self.registry}` (the credentials stay in the credential store)."
                )
            import base64
            token = base64.b64encode(f"{creds['Username']}:{creds.get('Password', '')}".encode()).decode()
            self._auth_header = f"Basic {token}"
            return
        if scheme == "bearer" and params.get("realm"):
            if creds.get("IdentityToken") or creds.get("Username"):
                _check_credential_url(params["realm"], self.registry, "token service")
            query = {"service": params.get("service", "")}
            query["scope"] = params.get("scope") or scope_hint
            auth = None
            if creds.get("IdentityToken"):
                # OAuth2 refresh-token flow of the token spec (docker's "identitytoken").
                try:
                    r = self.session.post(params["realm"], timeout=self.timeout, data={
                        "grant_type": "refresh_token", "refresh_token": creds["IdentityToken"],
                        "service": query["service"], "scope": query["scope"], "client_id": "cudastack"})
                except requests.exceptions.RequestException as exc:
                    raise RegistryError(f"The token service of {self.registry} does not answer "
                                        f"({type(exc).__name__}).") from None
            else:
                if creds.get("Username"):
                    auth = (creds["Username"], creds.get("Password", ""))
                try:
                    r = self.session.get(params["realm"], params=query, auth=auth, timeout=self.timeout)
                except requests.exceptions.RequestException as exc:
                    raise RegistryError(f"The token service of {self.registry} does not answer "
                                        f"({type(exc).__name__}).") from None
            if r.status_code != 200:
                raise RegistryError(
                    f"The token service of {self.registry} refused the credentials (HTTP {r.status_code}). "
                    f"Run `docker login {self.registry}` with an account that may read this repository."
                )
            body = r.json()
            token = body.get("token") or body.get("access_token")
            if not token:
                raise RegistryError(f"The token service of {self.registry} returned no token.")
            self._auth_header = f"Bearer {token}"
            return
        raise RegistryError(f"The registry {self.registry} asks for an unsupported authentication scheme {scheme!r}.")

    def _get_with_auth(self, method: str, path: str, accept: str, scope: str) -> requests.Response:
        url = f"{self.base_url}{path}"
        headers = {"Accept": accept}
        if self._auth_header:
            headers["Authorization"] = self._auth_header
        r = self._request(method, url, headers)
        if r.status_code == 401 and "WWW-Authenticate" in r.headers:
            self._authorize(r.headers["WWW-Authenticate"], scope)
            headers["Authorization"] = self._auth_header
            r = self._request(method, url, headers)
            if r.status_code == 401:
                raise RegistryError(
                    f"The registry {self.registry} refused the credentials from the Docker credential store "
                    f"(HTTP 401 on {path}). Run `docker login {self.registry}` with the right account."
                )
        return r

    def ping(self) -> None:
        """``GET /v2/``: raise RegistryError unless the registry answers as a V2 registry (200 or 401)."""
        r = self._request("GET", f"{self.base_url}/v2/", {})
        if r.status_code not in (200, 401):
            raise RegistryError(
                f"{self.base_url}/v2/ answered HTTP {r.status_code}; this is not a Docker Registry V2 endpoint. "
                "Check the --registry host and port."
            )

    def manifest_digest(self, repository: str, reference: str) -> str:
        """The digest the registry reports for ``repository`` at ``reference`` (a tag or a digest):
        ``Docker-Content-Digest`` of a manifest HEAD with :data:`MANIFEST_ACCEPT`; when a registry omits that
        header, the sha256 of the manifest bytes from a GET. Raises RegistryError when the manifest is
        unknown (404), access is refused, or the registry is down."""
        path = f"/v2/{repository}/manifests/{reference}"
        scope = f"repository:{repository}:pull"
        r = self._get_with_auth("HEAD", path, MANIFEST_ACCEPT, scope)
        if r.status_code == 404:
            raise RegistryError(f"The registry {self.registry} has no manifest {repository}:{reference} (HTTP 404).")
        if r.status_code == 403:
            raise RegistryError(f"The registry {self.registry} denies access to {repository} (HTTP 403).")
        if r.status_code != 200:
            raise RegistryError(f"Manifest HEAD {path} on {self.registry} answered HTTP {r.status_code}.")
        digest = r.headers.get("Docker-Content-Digest")
        if not digest:
            g = self._get_with_auth("GET", path, MANIFEST_ACCEPT, scope)
            if g.status_code != 200:
                raise RegistryError(f"Manifest GET {path} on {self.registry} answered HTTP {g.status_code}.")
            digest = "sha256:" + hashlib.sha256(g.content).hexdigest()
        if not _DIGEST_RE.match(digest):
            raise RegistryError(f"The registry {self.registry} reported a digest {digest!r} that is not sha256.")
        if reference.startswith("sha256:") and digest != reference:
            raise RegistryError(
                f"The registry {self.registry} serves {repository}@{reference} under another digest {digest}; "
                "the registry or a proxy rewrote the manifest."
            )
        return digest


def resolve_digest(ref: str, **client_kw) -> str:
    """Digest of ``ref`` (e.g. "nvidia/cuda:13.1.1-cudnn-devel-ubuntu24.04") as its registry reports it.
    Raises RegistryError (unreachable, unknown, refused)."""
    r = parse_reference(ref)
    client = RegistryClient(r.registry, **client_kw)
    return client.manifest_digest(r.repository, r.digest or r.tag or "latest")


# --------------------------------------------------------------------------------------------- engine side
def docker_client():
    """A docker SDK client from the environment (DOCKER_HOST, DOCKER_CONFIG); EnvironmentError_ if no engine."""
    import docker
    import docker.errors

    try:
        client = docker.from_env()
        client.ping()
        return client
    except docker.errors.DockerException as exc:
        raise EnvironmentError_(
            f"No Docker engine answers ({type(exc).__name__}). Start the daemon (e.g. `sudo dockerd &`) or set "
            "DOCKER_HOST."
        ) from None


@dataclass(frozen=True)
class PushedImage:
    """What a push produced. ``digest``: manifest digest the registry reports; ``reference``:
    ``registry/name@sha256:...``; ``enroot``: ``registry#name@sha256:...``; ``image_id``: local image id
    (the config digest, equal on every engine that pulls the reference); ``tag``: what was pushed."""

    digest: str
    reference: str
    enroot: str
    image_id: str
    tag: str

    def as_dict(self) -> dict:
        return {"digest": self.digest, "reference": self.reference, "enroot": self.enroot,
                "image_id": self.image_id, "tag": self.tag}


def _stream_errors(stream) -> tuple[list[str], Optional[str]]:
    """Collect error messages and the aux digest from a decoded docker push/pull JSON stream."""
    errors, digest = [], None
    for chunk in stream:
        if not isinstance(chunk, dict):
            continue
        if chunk.get("error") or chunk.get("errorDetail"):
            errors.append(str(chunk.get("error") or chunk["errorDetail"].get("message", "")))
        aux = chunk.get("aux") or {}
        if isinstance(aux, dict) and aux.get("Digest"):
            digest = aux["Digest"]
    return errors, digest


_LOGIN_WORDS = ("unauthorized", "authentication required", "denied", "no basic auth credentials", "401", "403")
_GONE_WORDS = ("connection refused", "connection reset", "broken pipe", "eof", "no such host", "i/o timeout",
               "server closed", "connection closed", "dial tcp", "use of closed network connection")


def push_failure(ref: "ImageReference", error: str, rc: "RegistryClient") -> RegistryError:
    """The RegistryError for a push the engine reported as failed with ``error``. A registry that stopped
    answering during the push (the engine saw the connection drop, and a ping now fails) is said to have gone
    away; a refused login suggests ``docker login``; anything else quotes the registry's reason."""
    low = error.lower()
    gone = any(w in low for w in _GONE_WORDS)
    try:
        rc.ping()
        answers = True
    except RegistryError:
        answers = False
    if not answers or (gone and not any(w in low for w in _LOGIN_WORDS)):
        return RegistryError(
            f"The registry {ref.registry} went away during the push of {ref.name}:{ref.tag}: the engine reported "
            f"'{error}'" + ("" if answers else f", and {rc.base_url}/v2/ no longer answers")
            + ". Start it again (or check the network to it) and push again; the layers already uploaded are "
            "reused. Nothing was recorded.")
    if any(w in low for w in _LOGIN_WORDS):
        return RegistryError(
            f"The registry {ref.registry} refused the push of {ref.name}:{ref.tag} for want of a login: {error}. "
            f"Run `docker login {ref.registry}` with an account that may push there; nothing was recorded.")
    return RegistryError(f"The registry {ref.registry} refused the push of {ref.name}:{ref.tag}: {error}. "
                         "Nothing was recorded.")


def push_image(local_image: str, target: str, *, client=None, registry_client: Optional[RegistryClient] = None,
               progress: Callable[[str], None] = lambda s: None) -> PushedImage:
    """Tag ``local_image`` (tag or id) as ``target`` (``registry/name:tag``), push it through the docker
    engine, read the digest over the registry HTTP API and check it against the digest the engine printed
    and the local image's ``RepoDigests``. Raises UsageError (bad reference, no such local image),
    RegistryError (registry down, push refused, digests disagree)."""
    import docker.errors

    ref = parse_reference(target)
    if ref.digest or not ref.tag:
        raise UsageError(f"push target {target!r} must be REGISTRY/NAME:TAG (a tag, no digest).")
    if ref.registry == DOCKER_HUB and not target.startswith(("docker.io/", "index.docker.io/")):
        raise UsageError(f"push target {target!r} has no registry host; write e.g. 127.0.0.1:5000/{target}.")
    client = client or docker_client()
    rc = registry_client or RegistryClient(ref.registry)
    rc.ping()                                   # fail fast when the registry is down, before any tagging
    try:
        image = client.images.get(local_image)
    except docker.errors.ImageNotFound:
        raise UsageError(f"No local image {local_image!r}; build it first (invoke build --cuda X).") from None
    image.tag(ref.name, ref.tag)
    progress(f"pushing {ref.name}:{ref.tag} ({image.id[:19]})")
    try:
        stream = client.api.push(ref.name, tag=ref.tag, stream=True, decode=True)
        errors, pushed_digest = _stream_errors(stream)
    except docker.errors.APIError as exc:
        errors, pushed_digest = [str(exc.explanation or exc)], None
    if errors:
        raise push_failure(ref, errors[-1], rc)
    digest = rc.manifest_digest(ref.repository, ref.tag)
    if pushed_digest and pushed_digest != digest:
        raise RegistryError(
            f"The engine pushed {ref.name}:{ref.tag} as {pushed_digest} but the registry reports {digest}; "
            "another push raced this one or a proxy rewrote the manifest. Push again."
        )
    image.reload()
    pinned = ref.with_digest(digest)
    repo_digests = image.attrs.get("RepoDigests") or []
    if pinned.pinned() not in repo_digests:
        raise RegistryError(
            f"The local image {image.id[:19]} does not list {pinned.pinned()} in its RepoDigests "
            f"({', '.join(repo_digests) or 'none'}): the registry holds another image under {ref.tag}."
        )
    progress(f"pushed {pinned.pinned()}")
    return PushedImage(digest, pinned.pinned(), pinned.enroot(), image.id, f"{ref.name}:{ref.tag}")


def pull_by_digest(reference: str, *, expected_image_id: Optional[str] = None, client=None,
                   registry_client: Optional[RegistryClient] = None,
                   progress: Callable[[str], None] = lambda s: None):
    """Pull ``registry/name@sha256:...`` (or the enroot spelling) and verify it: the registry still serves
    that digest, the pulled image lists it in ``RepoDigests``, and (when given) its image id equals
    ``expected_image_id``. Returns the docker SDK Image. Raises UsageError (no digest), RegistryError."""
    import docker.errors

    ref = parse_reference(reference)
    if not ref.digest:
        raise UsageError(f"{reference!r} has no digest; pull by digest needs NAME@sha256:... (see the lockfile).")
    client = client or docker_client()
    rc = registry_client or RegistryClient(ref.registry)
    rc.manifest_digest(ref.repository, ref.digest)   # raises if the registry lost it or serves another digest
    progress(f"pulling {ref.pinned()}")
    try:
        errors, _ = _stream_errors(client.api.pull(ref.name, tag=ref.digest, stream=True, decode=True))
    except docker.errors.APIError as exc:
        errors = [str(exc.explanation or exc)]
    if errors:
        raise RegistryError(f"Pulling {ref.pinned()} failed: {errors[-1]}.")
    image = client.images.get(ref.pinned())
    if ref.pinned() not in (image.attrs.get("RepoDigests") or []):
        raise RegistryError(f"The pulled image {image.id[:19]} does not carry {ref.pinned()} in its RepoDigests.")
    if expected_image_id and image.id != expected_image_id:
        raise RegistryError(
            f"{ref.pinned()} pulled as image {image.id} but the lock records {expected_image_id}: the registry "
            "content differs from what was built. Rebuild and push again."
        )
    progress(f"verified {ref.pinned()} -> {image.id[:19]}")
    return image


# --------------------------------------------------------------------------------------------- from the lock
def push_target(local_tag: str, registry_prefix: str) -> str:
    """Where ``local_tag`` (``cudastack/cu13.1-pip-sm120-runtime:<hash16>``) goes under ``registry_prefix``
    (``HOST[:PORT][/NAMESPACE]``): ``HOST/NAMESPACE/cu13.1-pip-sm120-runtime:<hash16>``."""
    host, namespace = parse_registry_prefix(registry_prefix)
    local = parse_reference(local_tag)
    repo = local.repository.rsplit("/", 1)[-1]
    return f"{host}/{namespace + '/' if namespace else ''}{repo}:{local.tag or 'latest'}"
