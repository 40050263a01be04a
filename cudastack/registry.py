"""Registry side: pushes and pulls through the Docker engine, manifest digests read through maintained
clients (the engine, or skopeo where there is none). Image references live in :mod:`cudastack.reference`.

What does the work (measured on dockerd 20.10.24 / API 1.41, docker SDK 7.x, skopeo 1.9.3, against Debian's
``docker-registry`` on loopback, with and without htpasswd):

* pushes and pulls: the Docker engine through the docker SDK (``client.images.push(..., stream=True,
  decode=True)``; its last ``aux`` record carries the manifest digest the engine pushed). The engine sends the
  login from the Docker credential store (the SDK reads ``config.json``/``DOCKER_CONFIG``, ``credsStore``,
  ``credHelpers`` and passes it as ``X-Registry-Auth``).
* a digest where an engine is at hand: ``client.images.get_registry_data(ref)`` (Engine API
  ``GET /distribution/{name}/json``, API >= 1.30): the engine fetches the manifest and reports
  ``Descriptor.digest``. Measured: equal to the push's ``aux`` digest, to ``RepoDigests`` and to the sha256 of
  the manifest bytes the registry serves, with and without htpasswd.
* a digest without an engine: ``skopeo inspect --raw`` (containers/image; Debian package ``skopeo``), whose
  output is the manifest exactly as served; its sha256 is the digest by definition (OCI image-spec
  "Descriptor": digests are of the content's bytes). ``--raw`` rather than ``--format {{.Digest}}``: it reads
  the top-level manifest only (for a multi-arch image, the index that ``RepoDigests`` records) and needs no
  image for this host's platform. skopeo is the containers project's own tool: it runs the basic, bearer
  and refresh-token flows (tested here), honours mirrors and TLS settings (registries.conf, certs.d) as
  podman and CRI-O do, and ships as a Debian package. Measured: the same digest as the engine, 0.02-0.06 s
  per read on loopback. The Python clients on PyPI fit less: oras 0.2.43 returns a parsed manifest (the
  digest needs our own request and hash), its default token backend fails on an htpasswd registry (it
  takes the Basic ``realm`` for a token URL), and it has no refresh-token flow; python-dxf 12.1.1's
  ``get_digest`` is the config blob's digest (the image id), not the manifest's, and it refuses a login
  over plain HTTP even on loopback.
* Loopback registries (127.0.0.0/8, localhost) are plain HTTP: the engine treats them as insecure by
  default (``docker info``: ``InsecureRegistryCIDRs: [127.0.0.0/8]``; a push to ``localhost:PORT`` works with
  no ``insecure-registries`` setting), and skopeo is given ``--tls-verify=false`` for them only.

Our own code, and why no maintained client fits:

* :func:`ping`: one ``GET /v2/`` (Distribution spec "API version check": 200, or 401 with a
  ``WWW-Authenticate`` challenge) that sends no credentials. Neither the Engine API nor skopeo has a
  credential-free "does this registry answer" call, and the challenge it returns is what
  :func:`check_login_destination` needs.
* :func:`check_login_destination`: credentials go only over https or to this machine (the rule of
  :mod:`cudastack.credentials`). A registry names the token service (``realm``) that clients send the login
  to (distribution ``docs/spec/auth/token.md``); neither the engine nor skopeo documents a refusal of a
  plain-HTTP realm on another host, so the challenge is read without credentials and checked before any
  tool is handed a login.
* image references (parse, print, the enroot spelling): :mod:`cudastack.reference`, which says why.

Credentials come from the Docker credential store only, read through the SDK's ``docker.auth``. No function
here returns, logs or raises them; tool output is scrubbed of them before it reaches a message.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Callable, Optional

import requests

from cudastack.errors import EnvironmentError_, RegistryError, UsageError
from cudastack.reference import (  # noqa: F401 - re-exported: callers import them from here
    _DIGEST_RE, DOCKER_HUB, DOCKER_HUB_API, ImageReference, check_digest, is_loopback, parse_reference,
    parse_registry_prefix)


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


# --------------------------------------------------------------------------------------------- reachability
def registry_url(registry: str) -> str:
    """Base URL of ``registry``'s HTTP API: ``http://`` for a loopback host (insecure by default for the
    engine), ``https://`` otherwise; Docker Hub's API is on ``registry-1.docker.io``."""
    host = DOCKER_HUB_API if registry == DOCKER_HUB else registry
    return f"{'http' if is_loopback(host) else 'https'}://{host}"


def ping(registry: str, *, timeout: float = 30.0) -> Optional[str]:
    """``GET /v2/`` on ``registry`` (host[:port]) with no credentials. Returns the ``WWW-Authenticate``
    challenge of a 401 (None on 200). Raises RegistryError when nothing answers, TLS fails, or the answer is
    not a V2 registry's. Our own call: see the module docstring."""
    url = f"{registry_url(registry)}/v2/"
    try:
        r = requests.get(url, timeout=timeout, allow_redirects=False)
    except requests.exceptions.SSLError as exc:
        raise RegistryError(
            f"TLS with the registry {registry} failed ({type(exc).__name__}). If it serves plain HTTP, use a "
            "loopback address or put it behind https; if it uses a private CA, set REQUESTS_CA_BUNDLE and add "
            "the CA to the engine (/etc/docker/certs.d). Nothing was sent."
        ) from None
    except requests.exceptions.RequestException as exc:
        raise RegistryError(
            f"The registry {registry} does not answer at {url} ({type(exc).__name__}). Start it or check its "
            "host and port (push: --registry; pull: the reference the lockfile recorded); nothing was pushed, "
            "pulled or recorded."
        ) from None
    if r.status_code == 200:
        return None
    if r.status_code == 401:
        return r.headers.get("WWW-Authenticate", "")
    raise RegistryError(f"{url} answered HTTP {r.status_code}; this is not a Docker Registry V2 endpoint. "
                        "Check the registry host and port.")


def _login_url_ok(url: str) -> bool:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.scheme == "https" or (parts.scheme == "http" and is_loopback(parts.hostname or ""))


def check_login_destination(registry: str, challenge: Optional[str], credentials: Optional[dict]) -> None:
    """Raise RegistryError, before any tool is handed a login, when the store holds ``credentials`` for
    ``registry`` and its Bearer ``challenge`` (from :func:`ping`) names a token service (``realm``) that is
    neither https nor loopback. (The registry itself is reached over https unless it is on loopback:
    :func:`registry_url`.) No credentials: nothing to check."""
    if not credentials:
        return
    scheme, _, rest = (challenge or "").strip().partition(" ")
    params = dict(re.findall(r'(\w+)="([^"]*)"', rest))
    realm = params.get("realm", "")
    if scheme.lower() == "bearer" and realm and not _login_url_ok(realm):
        from urllib.parse import urlsplit

        p = urlsplit(realm)
        raise RegistryError(
            f"The registry {registry} asks for the login to be sent to its token service at "
            f"{p.scheme or '?'}://{p.netloc.rsplit('@', 1)[-1]}{p.path}, which is neither https nor a loopback "
            "address; credentials are sent only over https (or to this machine). Nothing was sent. Serve the "
            "registry's token service over https, or use a registry on a loopback address."
        )


def checked_login(registry: str, *, timeout: float = 30.0) -> Optional[dict]:
    """The credential store's login for ``registry`` (or None), once :func:`ping` answered and
    :func:`check_login_destination` allows handing it to a tool. Raises RegistryError otherwise."""
    challenge = ping(registry, timeout=timeout)
    creds = registry_credentials(registry)
    check_login_destination(registry, challenge, creds)
    return creds


# --------------------------------------------------------------------------------------------- digests
_LOGIN_WORDS = ("unauthorized", "authentication required", "denied", "no basic auth credentials", "401", "403")
_GONE_WORDS = ("connection refused", "connection reset", "broken pipe", "eof", "no such host", "i/o timeout",
               "server closed", "connection closed", "dial tcp", "use of closed network connection")


def _says(low: str, words) -> bool:
    """Whether the lowercased message ``low`` holds one of ``words`` as a whole word (so a digest's hex, as
    in ``sha256:..404..``, is no HTTP status)."""
    return any(re.search(rf"(?<![0-9a-z]){re.escape(w)}(?![0-9a-z])", low) for w in words)


def _hide(text: str, creds: Optional[dict]) -> str:
    """``text`` without any secret of ``creds`` (tools quote what they were given in some errors)."""
    for key in ("Password", "IdentityToken"):
        if creds and creds.get(key):
            text = text.replace(creds[key], "***")
    return text


def _read_failure(ref: ImageReference, reference: str, error: str, creds: Optional[dict], via: str) -> RegistryError:
    """One paragraph for a failed manifest read: unknown manifest, login missing or refused, registry gone,
    or the tool's own words."""
    low = error.lower()
    what = f"{ref.name}{'@' if reference.startswith('sha256:') else ':'}{reference}"
    if _says(low, ("manifest unknown", "not found", "404")):
        return RegistryError(f"The registry {ref.registry} has no manifest {what} (HTTP 404, manifest unknown). "
                             "Check the tag or digest (for a pull: the lockfile's reference; push it again if the "
                             "registry lost it).")
    if _says(low, _LOGIN_WORDS):
        if not creds:
            return RegistryError(f"The registry {ref.registry} asks for a login to read {what} and the Docker "
                                 f"credential store has none for it. Run `docker login {ref.registry}` (the "
                                 "credentials stay in the credential store).")
        return RegistryError(f"The registry {ref.registry} refused the credentials from the Docker credential "
                             f"store for {what} ({via}: {_hide(error, creds)}). Run `docker login {ref.registry}` "
                             "with an account that may read this repository.")
    if _says(low, _GONE_WORDS):
        return RegistryError(f"The registry {ref.registry} does not answer ({via}: {error}). Start it or check "
                             "its host and port; nothing was recorded.")
    return RegistryError(f"Reading the digest of {what} from {ref.registry} failed ({via}): {_hide(error, creds)}.")


def _checked(ref: ImageReference, reference: str, digest: str, via: str) -> str:
    if not isinstance(digest, str) or not _DIGEST_RE.match(digest):
        raise RegistryError(f"{via} reported a digest {digest!r} for {ref.name} that is not sha256.")
    if reference.startswith("sha256:") and digest != reference:
        raise RegistryError(f"The registry {ref.registry} serves {ref.name}@{reference} under another digest "
                            f"{digest}; the registry or a proxy rewrote the manifest.")
    return digest


def engine_digest(ref: ImageReference, client, *, creds: Optional[dict] = None) -> str:
    """The manifest digest of ``ref`` (tag or digest) as the Docker engine reads it from the registry
    (``get_registry_data``, with the credential store's login). Pass ``creds`` from :func:`checked_login`.
    Raises RegistryError (unknown manifest, login missing or refused, registry gone)."""
    import docker.errors

    reference = ref.digest or ref.tag or "latest"
    name = f"{ref.name}@{reference}" if reference.startswith("sha256:") else f"{ref.name}:{reference}"
    try:
        data = client.images.get_registry_data(name)
    except docker.errors.APIError as exc:
        raise _read_failure(ref, reference, str(exc.explanation or exc), creds, "the Docker engine") from None
    return _checked(ref, reference, data.id, "The Docker engine")


def skopeo_digest(ref: ImageReference, *, creds: Optional[dict] = None, timeout: float = 120.0) -> str:
    """The manifest digest of ``ref`` read without a Docker engine: sha256 of ``skopeo inspect --raw``'s
    output (the manifest bytes as served). ``creds`` (from the credential store) reach skopeo through a
    private ``--authfile`` (containers-auth.json(5) format, mode 0600, deleted afterwards), never the command
    line. Pass ``creds`` from :func:`checked_login`. Raises EnvironmentError_ (no skopeo), RegistryError."""
    exe = shutil.which("skopeo")
    if not exe:
        raise EnvironmentError_("Reading a digest without a Docker engine needs skopeo (Debian/Ubuntu: "
                                "`apt-get install skopeo`); or start the Docker engine.")
    reference = ref.digest or ref.tag or "latest"
    sep = "@" if reference.startswith("sha256:") else ":"
    entry = {}
    if creds and creds.get("IdentityToken"):
        entry = {"identitytoken": creds["IdentityToken"]}
    elif creds and creds.get("Username"):
        import base64
        entry = {"auth": base64.b64encode(f"{creds['Username']}:{creds.get('Password', '')}".encode()).decode()}
    with tempfile.TemporaryDirectory(prefix="cudastack-auth-") as tmp:
        authfile = os.path.join(tmp, "auth.json")
        fd = os.open(authfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"auths": {ref.registry: entry} if entry else {}}, f)
        cmd = [exe, "inspect", "--raw", "--authfile", authfile]
        if is_loopback(ref.registry):
            cmd.append("--tls-verify=false")        # loopback registries are plain HTTP (module docstring)
        cmd.append(f"docker://{ref.name}{sep}{reference}")
        try:
            p = subprocess.run(cmd, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RegistryError(f"skopeo did not read {ref.name}{sep}{reference} within {timeout:.0f} s; the "
                                f"registry {ref.registry} hangs. Check it and try again.") from None
    if p.returncode != 0:
        err = p.stderr.decode(errors="replace").strip()
        m = re.search(r'msg="((?:[^"\\]|\\.)*)"', err)
        raise _read_failure(ref, reference, (m.group(1).replace('\\"', '"') if m else err[-500:]), creds, "skopeo")
    return _checked(ref, reference, "sha256:" + hashlib.sha256(p.stdout).hexdigest(), "skopeo")


def resolve_digest(ref: str, *, client=None, timeout: float = 120.0) -> str:
    """Digest of ``ref`` (e.g. "nvidia/cuda:13.1.1-cudnn-devel-ubuntu24.04", or NAME@sha256:... to check it
    is still served) as its registry reports it: through the Docker engine ``client`` when one is given,
    else through skopeo when installed, else through the local engine. The login, if the credential store
    holds one, is checked by :func:`check_login_destination` first. Raises UsageError (bad reference),
    EnvironmentError_ (neither skopeo nor an engine), RegistryError (unreachable, unknown, refused)."""
    r = parse_reference(ref)
    creds = checked_login(r.registry, timeout=min(timeout, 30.0))
    if client is None and shutil.which("skopeo"):
        return skopeo_digest(r, creds=creds, timeout=timeout)
    if client is None:
        try:
            client = docker_client()
        except EnvironmentError_ as exc:
            raise EnvironmentError_(f"{exc} Or install skopeo (`apt-get install skopeo`), which reads a digest "
                                    "without an engine.") from None
    return engine_digest(r, client, creds=creds)


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
    """Collect error messages and the ``aux`` digest from a decoded docker push/pull JSON stream."""
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


def push_failure(ref: ImageReference, error: str, creds: Optional[dict] = None) -> RegistryError:
    """The RegistryError for a push the engine reported as failed with ``error``. A registry that stopped
    answering during the push (the engine saw the connection drop, or :func:`ping` now fails) is said to have
    gone away; a refused login suggests ``docker login``; anything else quotes the registry's reason."""
    low = error.lower()
    error = _hide(error, creds)
    gone = _says(low, _GONE_WORDS)
    try:
        ping(ref.registry, timeout=10)
        answers = True
    except RegistryError:
        answers = False
    if not answers or (gone and not _says(low, _LOGIN_WORDS)):
        return RegistryError(
            f"The registry {ref.registry} went away during the push of {ref.name}:{ref.tag}: the engine reported "
            f"'{error}'" + ("" if answers else f", and {registry_url(ref.registry)}/v2/ no longer answers")
            + ". Start it again (or check the network to it) and push again; the layers already uploaded are "
            "reused. Nothing was recorded.")
    if _says(low, _LOGIN_WORDS):
        why = ("the Docker credential store has no login for it" if not creds
               else "it refused the login from the Docker credential store")
        return RegistryError(
            f"The registry {ref.registry} refused the push of {ref.name}:{ref.tag}: {why} ({error}). "
            f"Run `docker login {ref.registry}` with an account that may push there; nothing was recorded.")
    return RegistryError(f"The registry {ref.registry} refused the push of {ref.name}:{ref.tag}: {error}. "
                         "Nothing was recorded.")


def push_image(local_image: str, target: str, *, client=None,
               progress: Callable[[str], None] = lambda s: None) -> PushedImage:
    """Tag ``local_image`` (tag or id) as ``target`` (``registry/name:tag``), push it through the Docker
    engine, read the digest back through the engine (``get_registry_data``) and check it against the digest
    the push reported and the local image's ``RepoDigests``. Raises UsageError (bad reference, no such local
    image), RegistryError (registry down or gone mid-push, push refused, login sent nowhere safe, digests
    disagree)."""
    import docker.errors

    ref = parse_reference(target)
    if ref.digest or not ref.tag:
        raise UsageError(f"push target {target!r} must be REGISTRY/NAME:TAG (a tag, no digest).")
    if ref.registry == DOCKER_HUB and not target.startswith(("docker.io/", "index.docker.io/")):
        raise UsageError(f"push target {target!r} has no registry host; write e.g. 127.0.0.1:5000/{target}.")
    client = client or docker_client()
    creds = checked_login(ref.registry)          # fail fast when the registry is down, before any tagging
    try:
        image = client.images.get(local_image)
    except docker.errors.ImageNotFound:
        raise UsageError(f"No local image {local_image!r}; build it first (invoke build --cuda X).") from None
    image.tag(ref.name, ref.tag)
    progress(f"pushing {ref.name}:{ref.tag} ({image.id[:19]})")
    try:
        errors, pushed_digest = _stream_errors(client.images.push(ref.name, tag=ref.tag, stream=True, decode=True))
    except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
        errors, pushed_digest = [str(getattr(exc, "explanation", None) or exc)], None
    if errors:
        raise push_failure(ref, errors[-1], creds)
    digest = engine_digest(ref, client, creds=creds)
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
                   progress: Callable[[str], None] = lambda s: None):
    """Pull ``registry/name@sha256:...`` (or the enroot spelling) through the Docker engine and verify it: the
    registry still serves that digest, the pulled image lists it in ``RepoDigests``, and (when given) its
    image id equals ``expected_image_id``. Returns the docker SDK Image. Raises UsageError (no digest),
    RegistryError (registry down, unknown digest, login refused, another image)."""
    import docker.errors

    ref = parse_reference(reference)
    if not ref.digest:
        raise UsageError(f"{reference!r} has no digest; pull by digest needs NAME@sha256:... (see the lockfile).")
    client = client or docker_client()
    creds = checked_login(ref.registry)
    engine_digest(ref, client, creds=creds)          # raises if the registry lost it or serves another digest
    progress(f"pulling {ref.pinned()}")
    try:
        errors, _ = _stream_errors(client.api.pull(ref.name, tag=ref.digest, stream=True, decode=True))
    except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
        errors = [str(getattr(exc, "explanation", None) or exc)]
    if errors:
        raise RegistryError(f"Pulling {ref.pinned()} failed: {_hide(errors[-1], creds)}.")
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
