"""Manifest digests read through maintained clients: the Docker engine (``get_registry_data``) where one is
at hand, else ``skopeo inspect --raw`` (sha256 of the manifest bytes as served), with the login checked by
:func:`cudastack.registry.login.checked_login` first; and the one-paragraph errors for a failed read (unknown
manifest, login missing or refused, registry gone), which :mod:`cudastack.registry.client`'s push reuses. The
measurements behind the choice of clients are in :mod:`cudastack.registry.client`'s docstring; callers import
these names from there.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from typing import Optional

from cudastack.core.errors import EnvironmentError_, RegistryError
from cudastack.registry.reference import _DIGEST_RE, ImageReference, is_loopback, parse_reference
from cudastack.core.docker_engine import docker_client
from cudastack.registry.login import checked_login


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


def engine_digest_or_none(ref: ImageReference, client, *, creds: Optional[dict] = None) -> Optional[str]:
    """As :func:`engine_digest`, but None when the registry answers that it has no such manifest or repository
    (HTTP 404: "manifest unknown", "name unknown"; Distribution spec, "Pulling manifests"): a cache miss, not a
    fault. Raises RegistryError for everything else (login missing or refused, registry gone)."""
    import docker.errors

    reference = ref.digest or ref.tag or "latest"
    name = f"{ref.name}@{reference}" if reference.startswith("sha256:") else f"{ref.name}:{reference}"
    try:
        data = client.images.get_registry_data(name)
    except docker.errors.APIError as exc:
        text = str(exc.explanation or exc)
        if exc.status_code == 404 or _says(text.lower(), ("manifest unknown", "name unknown")):
            return None
        raise _read_failure(ref, reference, text, creds, "the Docker engine") from None
    return _checked(ref, reference, data.id, "The Docker engine")


def skopeo_digest(ref: ImageReference, *, creds: Optional[dict] = None, timeout: float = 120.0) -> str:
    """The manifest digest of ``ref`` read without a Docker engine: sha256 of ``skopeo inspect --raw``'s
    output (the manifest bytes as served, :func:`skopeo_manifest`). Raises EnvironmentError_ (no skopeo),
    RegistryError."""
    reference = ref.digest or ref.tag or "latest"
    raw = skopeo_manifest(ref, creds=creds, timeout=timeout, why="Reading a digest without a Docker engine")
    return _checked(ref, reference, "sha256:" + hashlib.sha256(raw).hexdigest(), "skopeo")


def skopeo_manifest(ref: ImageReference, *, creds: Optional[dict] = None, timeout: float = 120.0,
                    why: str = "Reading a manifest") -> bytes:
    """The manifest of ``ref`` (tag or digest) exactly as the registry serves it: ``skopeo inspect --raw``.
    ``creds`` (from the credential store) reach skopeo through a private ``--authfile`` (containers-auth.json(5)
    format, mode 0600, deleted afterwards), never the command line. Pass ``creds`` from :func:`checked_login`.
    Raises EnvironmentError_ (no skopeo; ``why`` says what needed it), RegistryError (one paragraph)."""
    exe = shutil.which("skopeo")
    if not exe:
        raise EnvironmentError_(f"{why} needs skopeo (Debian/Ubuntu: `apt-get install skopeo`); or start the "
                                "Docker engine.")
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
    return p.stdout


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

