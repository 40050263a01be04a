"""Image references: parse ``[registry[:port]/]name[:tag][@sha256:...]`` and the enroot spelling, print both.

Our own code: no Python library parses the enroot/pyxis spelling ``registry#name`` (enroot
``doc/cmd/import.md``: ``docker://[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST]``), and the docker SDK's
``resolve_repository_name`` does not split tags and digests. Pure functions, no network.

Source of the grammar: Docker's reference grammar (distribution ``reference`` package): the first path
component is a registry host when it contains ``.`` or ``:`` or is ``localhost``; otherwise the registry is
Docker Hub (``docker.io``, API host ``registry-1.docker.io``) and single-component names get ``library/``.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Optional

from cudastack.core.errors import UsageError

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
