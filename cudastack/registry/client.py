"""Registry side: pushes and pulls through the Docker engine, manifest digests read through maintained
clients (the engine, or skopeo where there is none). Image references live in :mod:`cudastack.registry.reference`.

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
  :mod:`cudastack.core.credentials`). A registry names the token service (``realm``) that clients send the login
  to (distribution ``docs/spec/auth/token.md``); neither the engine nor skopeo documents a refusal of a
  plain-HTTP realm on another host, so the challenge is read without credentials and checked before any
  tool is handed a login.
* image references (parse, print, the enroot spelling): :mod:`cudastack.registry.reference`, which says why.

Credentials come from the Docker credential store only, read through the SDK's ``docker.auth``. No function
here returns, logs or raises them; tool output is scrubbed of them before it reaches a message.

Where the parts live: credentials, :func:`ping` and the login checks in :mod:`cudastack.registry.login`;
digest reads (engine, skopeo) in :mod:`cudastack.registry.digest`; pushes and pulls here. Every name is
importable from this module.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import requests

from cudastack.core.errors import RegistryError, UsageError
from cudastack.registry.reference import (
    DOCKER_HUB, ImageReference, parse_reference,
    parse_registry_prefix)
from cudastack.registry.digest import (
    _GONE_WORDS, _LOGIN_WORDS, _hide, _says, engine_digest)
from cudastack.core.docker_engine import docker_client
from cudastack.registry.login import (
    checked_login, ping, registry_url)


# --------------------------------------------------------------------------------------------- push and pull
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


def _stream_errors(stream, on_chunk: Optional[Callable[[dict], None]] = None) -> tuple[list[str], Optional[str]]:
    """Collect error messages and the ``aux`` digest from a decoded docker push/pull JSON stream; ``on_chunk``
    sees every decoded record (``{"status", "id", "progressDetail": {"current", "total"}}``) as it arrives."""
    errors, digest = [], None
    for chunk in stream:
        if not isinstance(chunk, dict):
            continue
        if on_chunk is not None:
            on_chunk(chunk)
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
                   progress: Callable[[str], None] = lambda s: None,
                   on_chunk: Optional[Callable[[dict], None]] = None):
    """Pull ``registry/name@sha256:...`` (or the enroot spelling) through the Docker engine and verify it: the
    registry still serves that digest, the pulled image lists it in ``RepoDigests``, and (when given) its
    image id equals ``expected_image_id``. ``on_chunk`` sees each record of the engine's pull stream (layer
    status: "Downloading", "Already exists", "Pull complete"). Returns the docker SDK Image. Raises UsageError
    (no digest), RegistryError (registry down or gone mid-pull, unknown digest, login refused, another image)."""
    import docker.errors

    ref = parse_reference(reference)
    if not ref.digest:
        raise UsageError(f"{reference!r} has no digest; pull by digest needs NAME@sha256:... (see the lockfile).")
    client = client or docker_client()
    creds = checked_login(ref.registry)
    engine_digest(ref, client, creds=creds)          # raises if the registry lost it or serves another digest
    progress(f"pulling {ref.pinned()}")
    try:
        errors, _ = _stream_errors(client.api.pull(ref.name, tag=ref.digest, stream=True, decode=True), on_chunk)
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
