"""A node cache shared through a registry: a node built on one machine is pulled by every other one.

Every node's tag already names the content hash of its inputs (:mod:`cudastack.plan.hash`; a locked build's tag
also covers the locked build args and the OS image id, :func:`cudastack.lock.apply.apply_lock`), so a registry
repository holding ``<prefix>/<repository>:<hash16>`` holds exactly that node. ``invoke build --cache
REGISTRY/PREFIX`` (or ``CUDASTACK_NODE_CACHE=REGISTRY/PREFIX`` in the environment), per node in plan order:

* **cached here** (the engine has its tag; a wheels node's wheels in the wheelhouse): nothing is pulled; with a
  writable cache it is pushed when the registry lacks it;
* **in the registry cache** (the registry serves ``<prefix>/<repository>:<hash16>``, read through the engine:
  ``get_registry_data``): pulled by that digest (:func:`cudastack.registry.client.pull_by_digest`), checked to be this
  node (its ``org.cudastack.hash`` label is the node's whole hash), tagged as the node's tag; a wheels node's
  image (its ``builder`` stage) holds the wheels in ``/wheels``, which are copied out of a stopped container
  into a temporary folder beside the wheelhouse and moved in (:meth:`cudastack.build.wheelhouse.Wheelhouse.add`);
* **to build**: built as without a cache, then pushed (``--cache-read-only``: never pushed).

A pushed ``base-pip`` node takes its OS image along (:mod:`cudastack.registry.cache_parents`), so a fresh builder under
``--locked`` pulls the locked OS image instead of bootstrapping it again.

Under ``--locked`` a pulled node is checked against the lock before it is used: its image id against
``outputs.<node>.image_id`` and its wheels against ``outputs.<node>.wheels`` (where the lock recorded outputs for
this tag) and against the sha256 of every locked package file of the same name. A wheels node that was built on
another builder has no image id in the lock (this engine held only a marker of it); its manifest digest is checked
against ``outputs.<node>.cache_digest``, what that builder pushed, before anything is pulled. A difference is a LockError
(exit 7) naming the node, both values and what to do; the pulled tag is removed first, so the image is never
used.

Faults: a registry that does not answer when the build starts is a RegistryError (exit 8) before any work,
or with ``--cache-optional`` a warning and a build without the cache. A pull that fails (the registry went
away, the image is not the node's, it holds no wheels) leaves nothing in the wheelhouse and the node is built
instead, with a warning and ``cache.status = "pull failed"`` in the record. A refused or failed push leaves the
build's result as it is; it is reported (warning, ``cache.status = "push failed"``, the record's
``cache_failures``) and the exit status stays 0. Logins come from the Docker credential store, travel only
inside the engine's requests (``X-Registry-Auth``) and appear in no message: a prefix written with a login is
refused without echoing it.

Build record (:mod:`cudastack.build.executor`): a node's ``"cache"`` is ``{"status": "pulled" | "pushed" | "pull failed" |
"push failed" | "refused", "reference", "digest", "pull_s" / "push_s", "by" (the builder that pushed), "layers_downloaded",
"layers_present", "downloaded_bytes", "error"}``; the record's ``"cache"`` is ``{"prefix", "read_only"}`` and ``"cache_failures"``
``[{"node", "op" ("probe" | "pull" | "push"), "error"}]``; a node's status is "pulling" while it is pulled and
"pulled" after.

Every Docker call goes through the engine's one SDK client (:mod:`cudastack.core.docker_engine`) and the registry
functions of :mod:`cudastack.registry.client`.
"""
from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from cudastack.core.credentials import split_userinfo
from cudastack.core.errors import LockError, RegistryError, UsageError

ENV_VAR = "CUDASTACK_NODE_CACHE"
WHEELS_DIR = "/wheels"             # where images/wheels*.Dockerfile's builder stage keeps the wheels
Say = Callable[[str], None]


class CacheUnusable(RegistryError):
    """A registry cache entry that cannot stand in for the node (pull failed, not this node, no wheels): the
    node is built instead."""


def cache_prefix(value: Optional[str], environ=None) -> str:
    """The cache prefix: ``value`` (``--cache``), else ``$CUDASTACK_NODE_CACHE``, else "" (no cache). Raises
    UsageError, without quoting the login, for a prefix written with one (``user:pw@host/x``) or with a scheme."""
    env = os.environ if environ is None else environ
    raw = (value if value else env.get(ENV_VAR, "")) or ""
    raw = raw.strip()
    if not raw:
        return ""
    where = "--cache" if value else ENV_VAR
    shown, had_login = split_userinfo(raw if "://" in raw else f"x://{raw}")
    if had_login or "@" in raw:
        host = shown.split("://", 1)[-1]
        raise UsageError(f"{where}: write REGISTRY[:PORT]/PREFIX without a login (here: {host}); the login comes "
                         f"from the Docker credential store (`docker login {host.split('/', 1)[0]}`).")
    from cudastack.registry.reference import parse_registry_prefix

    try:
        parse_registry_prefix(raw)
    except UsageError as exc:
        raise UsageError(str(exc).replace("--registry", where, 1)) from None
    return raw.rstrip("/")


@dataclass
class NodeCache:
    """A registry node cache at ``prefix`` (``HOST[:PORT][/NAMESPACE]``) used through ``client`` (the engine's
    docker SDK client). ``read_only``: never push. ``lock``: the lock a ``--locked`` build was prepared from
    (pulled nodes are checked against it). Make one with :meth:`open`."""

    prefix: str
    client: Any                    # a docker.DockerClient (cudastack.core.docker_engine.docker_client)
    read_only: bool = False
    lock: Optional[dict] = None
    failures: list = field(default_factory=list)

    # --- opening ---------------------------------------------------------------------------------
    @classmethod
    def open(cls, prefix: str, client, *, read_only: bool = False, optional: bool = False,
             lock: Optional[dict] = None, say: Optional[Say] = None) -> Optional["NodeCache"]:
        """Check that the registry of ``prefix`` answers (``GET /v2/``, and the login the credential store
        holds may be sent there: :func:`cudastack.registry.client.checked_login`) and return the cache. Raises
        RegistryError (exit 8) in one paragraph when it does not; with ``optional``, says a warning and
        returns None instead (the build runs without a cache)."""
        from cudastack.registry.client import checked_login, parse_registry_prefix

        host, _ = parse_registry_prefix(prefix)
        try:
            checked_login(host, timeout=15)
        except RegistryError as exc:
            if optional:
                if say:
                    say(f"warning: the node cache {prefix} cannot be used ({exc}) Building without it "
                        "(--cache-optional).")
                return None
            raise RegistryError(
                f"The node cache {prefix} (--cache or {ENV_VAR}) cannot be used: {exc} Start the registry or fix "
                f"the prefix; or add --cache-optional to build without the cache when it is away, or unset "
                f"{ENV_VAR} / leave out --cache. Nothing was built or pulled.") from None
        return cls(prefix, client, read_only=read_only, lock=lock)

    # --- names -------------------------------------------------------------------------------------
    def target(self, node) -> str:
        """``HOST/NAMESPACE/<repository>:<hash16>`` of ``node`` (the node's own tag under the prefix)."""
        from cudastack.registry.client import push_target

        return push_target(node.tag, self.prefix)

    def pinned(self, node, digest: str) -> str:
        """``HOST/NAMESPACE/<repository>@<digest>``: ``node``'s cache entry by the manifest digest it serves."""
        from cudastack.registry.client import parse_reference

        return parse_reference(self.target(node)).with_digest(digest).pinned()

    def probe(self, node, target: Optional[str] = None) -> Optional[str]:
        """The manifest digest the registry serves for ``node``'s cache tag (or for ``target``, another
        ``HOST/PREFIX/<repo>:<tag>`` of this cache), or None when it has none. Raises RegistryError when the
        registry cannot be read (gone, login refused)."""
        from cudastack.registry.client import parse_reference
        from cudastack.registry.digest import engine_digest_or_none
        from cudastack.registry.login import registry_credentials

        ref = parse_reference(target or self.target(node))
        return engine_digest_or_none(ref, self.client, creds=registry_credentials(ref.registry))

    def probe_plan(self, plan, cached: dict[str, bool], say: Say, *, for_push: bool = True) -> dict[str, Optional[str]]:
        """{node name: digest or None} for every node not cached here, and, with a writable cache and
        ``for_push``, for the cached ones too (a node the registry lacks is pushed). A registry that cannot be read
        for a node is said, recorded in :attr:`failures` (with ``for_push``) and counted as a miss."""
        out: dict[str, Optional[str]] = {}
        for node in plan.nodes:
            if cached.get(node.name) and (self.read_only or not for_push):
                continue
            try:
                out[node.name] = self.probe(node)
            except RegistryError as exc:
                say(f"warning: node cache: reading {self.target(node)} failed ({exc}); counted as not cached")
                if for_push:
                    self.failures.append({"node": node.name, "op": "probe", "error": str(exc)})
                out[node.name] = None
        return out

    # --- pull ----------------------------------------------------------------------------------------
    def restore(self, node, digest: str, wheelhouse, *, say: Say) -> dict:
        """Pull ``node`` from the cache by ``digest``, check it (label, lock) and tag it as ``node.tag``; for a
        wheels node, move its wheels into ``wheelhouse``. Returns ``{"image_id", "size_bytes", "wheels",
        "reference", "digest", "pull_s", "layers_downloaded", "layers_present", "downloaded_bytes"}`` (layers the
        engine fetched, and found already on it; the compressed bytes of the fetched ones, as the engine's progress
        reports their sizes: the dry run's pull rate, :mod:`cudastack.plan.cache_estimates`). Raises CacheUnusable (the caller builds the node instead; nothing
        was added to the wheelhouse and the node's tag is not set) or LockError (the pulled content differs
        from the lock: refused, the tag removed)."""
        import docker.errors
        import requests

        from cudastack.registry.client import pull_by_digest

        pinned = self.pinned(node, digest)
        want_digest = self._locked_outputs(node).get("cache_digest")
        if want_digest and want_digest != digest:
            raise self._refuse(node, pinned, f"the cache serves {digest}, the lock's outputs.{node.name}.cache_digest "
                                             f"is {want_digest} (what builder "
                                             f"{self._locked_outputs(node).get('built_on', '?')} pushed)")
        t0 = time.monotonic()
        seen: dict[str, int] = {}       # layer id -> compressed bytes the engine said it downloads
        present: set[str] = set()

        def on_chunk(chunk: dict) -> None:
            if chunk.get("status") == "Already exists":
                present.add(str(chunk.get("id")))
            if chunk.get("status") == "Downloading" and chunk.get("id") not in seen:
                total = int((chunk.get("progressDetail") or {}).get("total") or 0)
                seen[str(chunk.get("id"))] = total
                say(f"  cache: downloading layer {chunk.get('id')}" + (f" ({total / 2**20:.0f} MiB)" if total else ""))

        try:
            image = pull_by_digest(pinned, client=self.client, on_chunk=on_chunk)
        except RegistryError as exc:
            raise CacheUnusable(f"pulling {pinned} failed: {exc}") from None
        except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
            raise CacheUnusable(f"pulling {pinned} failed: {type(exc).__name__}: {exc}") from None
        labels = (image.attrs.get("Config") or {}).get("Labels") or {}
        if labels.get("org.cudastack.hash") != node.hash:
            self._drop(pinned)
            raise CacheUnusable(f"{pinned} is not node {node.name} at hash {node.hash[:16]}... (its "
                                f"org.cudastack.hash label is {labels.get('org.cudastack.hash') or 'missing'}); "
                                "not used")
        self._check_image_id(node, image.id, pinned)
        wheels: dict[str, str] = {}
        if node.kind == "wheels":
            wheels = self._export_wheels(node, image, wheelhouse, pinned)
        repo, _, tag = node.tag.rpartition(":")
        image.tag(repo, tag)
        return {"image_id": image.id, "size_bytes": int(image.attrs.get("Size", 0)), "wheels": wheels,
                "reference": pinned, "digest": digest, "pull_s": round(time.monotonic() - t0, 1),
                "layers_downloaded": len(seen), "layers_present": len(present),
                "downloaded_bytes": sum(seen.values())}

    def _drop(self, name: str) -> None:
        """Remove the reference ``name`` from the engine (the image goes with it when nothing else names it)."""
        try:
            self.client.images.remove(name)
        except Exception:  # noqa: BLE001 - already gone, or in use: nothing of ours to clean
            pass

    def _locked_outputs(self, node) -> dict:
        if not self.lock:
            return {}
        out = (self.lock.get("outputs") or {}).get(node.name) or {}
        return out if out.get("tag") in (None, node.tag) else {}

    def _refuse(self, node, pinned: str, what: str) -> LockError:
        self._drop(pinned)
        return LockError(
            f"The node cache's {node.name} ({pinned}) differs from the lock: {what}. It was not used (its tag was "
            f"removed from this engine). Someone pushed another build under this node's tag, or the lock's outputs "
            "come from another build: rebuild the node without the cache (leave out --cache) and compare, then push "
            "the build that matches the lock (`invoke build --locked --cache ...` after removing the registry's "
            "tag), or record the cache's build in the lock if it is the one to keep. Nothing was built from it.")

    def _check_image_id(self, node, image_id: str, pinned: str) -> None:
        want = self._locked_outputs(node).get("image_id")
        if want and want != image_id:
            raise self._refuse(node, pinned, f"its image id is {image_id}, the lock's outputs.{node.name}.image_id "
                                             f"is {want}")

    def _locked_wheel_hashes(self, node) -> dict[str, str]:
        """{file name: sha256} the lock pins for ``node``'s wheels: its recorded outputs and every locked
        package file of its installs."""
        if not self.lock:
            return {}
        want: dict[str, str] = {}
        entry = (self.lock.get("nodes") or {}).get(node.name) or {}
        for inst in (entry.get("installs") or {}).values():
            for p in inst.get("packages") or []:
                if p.get("filename") and p.get("sha256"):
                    want[p["filename"]] = p["sha256"]
        for w in self._locked_outputs(node).get("wheels") or []:
            want[w["filename"]] = w["sha256"]
        return want

    def _export_wheels(self, node, image, wheelhouse, pinned: str) -> dict[str, str]:
        """Copy ``/wheels/*.whl`` out of ``image`` (a stopped container's archive) into a temporary folder
        beside the wheelhouse, check them against the lock, then move them in. Returns {file: sha256}."""
        import docker.errors
        import requests

        from cudastack.build.wheelhouse import sha256_file

        wheelhouse.path.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".export-{node.name}-p{os.getpid()}-", dir=wheelhouse.path.parent))
        container = None
        try:
            try:
                container = self.client.containers.create(image.id, command=["true"], entrypoint=[])
                stream, _ = container.get_archive(WHEELS_DIR)
                buf = io.BytesIO(b"".join(stream))
            except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
                buf = None
                why = f"{type(exc).__name__}: {exc}"
            finally:
                if container is not None:       # gone before any refusal, so the pulled image can be removed
                    try:
                        container.remove(force=True)
                    except Exception:  # noqa: BLE001
                        pass
            if buf is None:
                self._drop(pinned)
                raise CacheUnusable(f"{pinned} holds no {WHEELS_DIR} to export ({why}); not used")
            with tarfile.open(fileobj=buf) as tar:
                for member in tar.getmembers():
                    name = Path(member.name).name
                    if member.isfile() and name.endswith(".whl"):
                        src = tar.extractfile(member)
                        assert src is not None
                        with open(tmp / name, "wb") as out:
                            shutil.copyfileobj(src, out)
            got = {p.name: sha256_file(p) for p in sorted(tmp.glob("*.whl"))}
            if not got:
                self._drop(pinned)
                raise CacheUnusable(f"{pinned} holds no wheel in {WHEELS_DIR}; not used")
            want = self._locked_wheel_hashes(node)
            recorded = {w["filename"] for w in self._locked_outputs(node).get("wheels") or []}
            bad = [f"{f}: sha256 {d[:16]}... in the cache, {want[f][:16]}... in the lock"
                   for f, d in got.items() if f in want and want[f] != d]
            if recorded and recorded != set(got):
                bad.append(f"wheels {', '.join(sorted(got))} in the cache, {', '.join(sorted(recorded))} in the "
                           f"lock's outputs.{node.name}.wheels")
            if bad:
                raise self._refuse(node, pinned, "; ".join(bad))
            return wheelhouse.add(node, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    # --- push ----------------------------------------------------------------------------------------
    def store(self, node, *, say: Say, local: Optional[str] = None, target: Optional[str] = None) -> dict:
        """Push ``node``'s image (its tag; or the image ``local`` to ``target``) to its cache tag through the
        engine, verified by digest (:func:`cudastack.registry.client.push_image`); the extra local name the push needs is
        removed afterwards. Returns ``{"reference", "digest", "push_s"}``. Raises RegistryError or UsageError (the
        caller reports it; the build's result stands)."""
        from cudastack.registry.client import push_image

        local, target = local or node.tag, target or self.target(node)
        t0 = time.monotonic()
        try:
            pushed = push_image(local, target, client=self.client, progress=lambda s: say(f"  cache: {s}"))
        finally:
            if target != local:
                self._drop(target)
        return {"reference": pushed.reference, "digest": pushed.digest, "push_s": round(time.monotonic() - t0, 1)}


# --- the run loop's two steps (cudastack.build.executor.run_build) -------------------------------------------------
def serve_node(cache: NodeCache, node, digest: str, entry: dict, wheelhouse, say: Say, label: str) -> bool:
    """Pull ``node`` (its cache tag serves ``digest``) into the engine and ``wheelhouse`` for the build record
    ``entry`` (status "pulled", image id, size, wheels, ``cache``). Returns True when pulled, False when the node
    must be built instead (the failure is said, recorded in ``entry["cache"]`` and the cache's failures). Raises
    LockError, with ``entry`` marked failed, when the pulled content differs from the lock."""
    from cudastack.build.progress import _fmt_s

    label = f"{label} {node.name}"
    say(f"{label}: in the node cache ({cache.target(node)}, {digest}): pulling")
    t0 = time.monotonic()
    try:
        got = cache.restore(node, digest, wheelhouse, say=say)
    except LockError as exc:
        entry.update(status="failed", duration_s=round(time.monotonic() - t0, 1),
                     cache={"status": "refused", "error": str(exc)})
        raise
    except RegistryError as exc:
        entry["cache"] = {"status": "pull failed", "error": str(exc)}
        cache.failures.append({"node": node.name, "op": "pull", "error": str(exc)})
        say(f"warning: {label}: the node cache could not serve it ({exc}); building it instead")
        return False
    entry.update(status="pulled", image_id=got["image_id"], size_bytes=got["size_bytes"],
                 duration_s=round(time.monotonic() - t0, 1),
                 cache={"status": "pulled", **{k: got[k] for k in ("reference", "digest", "pull_s", "layers_downloaded",
                                                                  "layers_present", "downloaded_bytes")}})
    if node.kind == "wheels":
        entry["wheels"] = got["wheels"]
    say(f"{label}: pulled in {_fmt_s(entry['duration_s'])}"
        + (f", wheels: {', '.join(got['wheels'])}" if got["wheels"] else ""))
    return True


def push_node(cache: NodeCache, node, entry: dict, say: Say, label: str) -> None:
    """Push ``node`` to the node cache for the build record ``entry``; a failure is reported (warning,
    ``entry["cache"]``, the cache's failures) and never changes the node's own result."""
    from cudastack.build.progress import _fmt_s
    from cudastack.core.errors import StackError

    try:
        pushed = cache.store(node, say=say)
    except StackError as exc:
        entry["cache"] = {"status": "push failed", "error": str(exc)}
        cache.failures.append({"node": node.name, "op": "push", "error": str(exc)})
        say(f"warning: {label}: pushing it to the node cache failed; the build's result stands: {exc}")
        return
    entry["cache"] = {"status": "pushed", **{k: pushed[k] for k in ("reference", "digest", "push_s")}}
    say(f"{label}: pushed to the node cache as {pushed['reference']} ({_fmt_s(pushed['push_s'])})")
    if node.kind == "base-pip" and node.build_args.get("OS_IMAGE"):    # a fresh locked builder pulls it too
        from cudastack.registry.cache_parents import push_os_image

        try:
            entry["cache"]["os_image"] = push_os_image(cache, node.build_args["OS_IMAGE"], say)
        except StackError as exc:
            entry["cache"]["os_image"] = {"status": "push failed", "error": str(exc)}
            cache.failures.append({"node": f"{node.name} (OS image)", "op": "push", "error": str(exc)})
            say(f"warning: {label}: pushing its OS image to the node cache failed; the build's result stands: {exc}")
            return
        say(f"{label}: its OS image pushed to the node cache as {entry['cache']['os_image']['reference']}")

