"""Parents from the registry node cache (:mod:`cudastack.build.node_cache`): the pip base's OS image, so a fresh builder
under ``--locked`` pulls it instead of running mmdebstrap again, and the parent of a node sent to a builder
(:func:`cache_reference`: the builder pulls it by digest itself).

A locked build checks the OS image's id on this engine against ``nodes.<base>.os_image.image_id`` of the lock
(:func:`cudastack.lock.apply.verify_plan_against_lock`); a fresh builder lacks it, and before this module made it
again from the locked Debian Release (:func:`cudastack.lock.apply.ensure_locked_os_image`: mmdebstrap, reproducible,
about 20 s, a Debian mirror that still serves that Release and the mmdebstrap program needed). With a node cache:

* **push**: whenever the base node is pushed to the cache (:func:`cudastack.build.node_cache.push_node`), its OS image
  is pushed too, under ``<prefix>/<repository>:<tag>-<id16>`` (the local tag with the first 16 hex digits of
  its image id appended: the name says which content it holds, so another Release never lands on the same tag);
* **pull**: where the lock's OS image is not on this engine, ``<prefix>/<repository>:<tag>-<locked id16>`` is
  pulled by the digest the registry serves for it, its image id compared with the lock's whole id (a difference
  is refused: the pulled name removed, the image not tagged), and tagged as the plan's OS image tag.

Anything short of a pulled image with the locked id (no such tag, a registry that does not answer, another id)
is said, and the caller falls back to mmdebstrap, whose result the lock check verifies as before.
"""
from __future__ import annotations

from typing import Callable, Optional

from cudastack.core.errors import RegistryError, UsageError

Say = Callable[[str], None]


def _split(tag: str) -> tuple[str, str]:
    """``repo:name`` -> ``(repo, name)``; a tag without a name is ``latest`` (a registry port is not a name)."""
    repo, _, name = tag.rpartition(":") if ":" in tag.rsplit("/", 1)[-1] else (tag, "", "latest")
    return repo, name


def os_image_target(cache, tag: str, image_id: str) -> str:
    """``HOST/NAMESPACE/<repository>:<tag>-<id16>`` for the OS image ``tag`` (``cudastack/debian:bookworm``)
    whose id is ``image_id`` (``sha256:<64 hex>``), under the cache's prefix."""
    from cudastack.registry.client import push_target

    repo, name = _split(tag)
    return push_target(f"{repo}:{name}-{image_id.split(':', 1)[-1][:16]}", cache.prefix)


def push_os_image(cache, tag: str, say: Say) -> dict:
    """Push the OS image ``tag`` of this engine to :func:`os_image_target` through the cache's own push
    (:meth:`cudastack.build.node_cache.NodeCache.store`: verified by digest, the extra local name removed). Returns
    ``{"target" (the tag pushed), "reference" (by digest), "digest", "image_id", "push_s"}``. Raises RegistryError
    or UsageError (the caller reports it; the build's result stands)."""
    try:
        image_id = cache.client.images.get(tag).id
    except Exception as exc:  # noqa: BLE001 - docker.errors.ImageNotFound and friends
        raise UsageError(f"the OS image {tag} is not on this engine ({type(exc).__name__}); nothing to push") from None
    target = os_image_target(cache, tag, image_id)
    return {"target": target, "image_id": image_id, **cache.store(None, say=say, local=tag, target=target)}


def pull_os_image(cache, tag: str, image_id: str, say: Say) -> bool:
    """Pull the OS image whose id the lock pins (``image_id``) from the cache and tag it ``tag``. Returns True
    when this engine now has ``tag`` with exactly ``image_id``; False (said why: not in the cache, the registry
    failed, another id) when it does not, with no name of the pulled image left behind."""
    import docker.errors
    import requests

    from cudastack.registry.client import parse_reference, pull_by_digest

    target = os_image_target(cache, tag, image_id)
    ref = parse_reference(target)
    try:
        digest = cache.probe(None, target)
    except RegistryError as exc:
        say(f"the node cache could not be read for the OS image ({target}: {exc})")
        return False
    if digest is None:
        say(f"the node cache has no OS image {target}")
        return False
    pinned = ref.with_digest(digest).pinned()
    try:
        image = pull_by_digest(pinned, client=cache.client)
    except (RegistryError, docker.errors.APIError, requests.exceptions.RequestException) as exc:
        say(f"pulling the OS image {pinned} failed ({exc})")
        return False
    if image.id != image_id:
        cache._drop(pinned)
        say(f"refused the node cache's OS image {pinned}: its image id is {image.id}, the lock pins {image_id}")
        return False
    image.tag(*_split(tag))
    cache._drop(pinned)     # the image stays under the plan's tag
    say(f"OS image {tag} pulled from the node cache ({pinned}), id {image_id[:19]} as locked")
    return True


def cache_reference(cache, node, entry: dict, digest: Optional[str]) -> Optional[str]:
    """``HOST/PREFIX/<repo>@sha256:...`` of the very image this engine has for ``node`` (its build record
    ``entry``; ``digest``: what the cache serves for it, or None), or None: a node pulled or pushed in this run, or
    one cached here whose ``RepoDigests`` list the cache's entry (another build under the same tag is not it)."""
    got = entry.get("cache") or {}
    if got.get("status") in ("pulled", "pushed") and "@sha256:" in str(got.get("reference")):
        return got["reference"]
    if cache is None or not digest:
        return None
    try:
        held = cache.client.images.get(node.tag).attrs.get("RepoDigests") or []
    except Exception:  # noqa: BLE001 - not here, or unreadable
        return None
    return cache.pinned(node, digest) if cache.pinned(node, digest) in held else None
