"""Benchmark (prints figures; not a test): a fresh builder served by the registry node cache vs building cold.

On a loopback registry (Debian's ``docker-registry``, started here on a free port, removed afterwards):

1. **cold**: the plan built on an engine emptied of the plan's images (every tag and registry digest of its
   nodes removed) and a fresh state folder, with ``--cache`` writable, so each node is built and pushed. For the CI
   fixture chain (``tests/fixtures/recipes``: pip base with the CUDA 13.1 toolkit wheels -> a small CUDA extension
   compiled with nvcc for sm_120 -> runtime), its OS image is first re-labelled with a fresh nonce
   (``FROM cudastack-test/debian:bookworm`` + one ``LABEL``: a new image id), so no step of BuildKit's build cache
   matches and every RUN step executes; BuildKit's cache *mounts* (apt's and pip's download caches) stay as they
   are, so packages already downloaded on this host are not fetched again.
2. **from the cache**: the engine emptied again (the nonce OS image too), the build-cache records the cold run
   created removed (``--keep-build-cache`` keeps them; then the engine still holds the layers and a pull finds
   them "Already exists"), a fresh state folder; the same plan built with the cache: every node pulled by digest.

Printed: both times, the ratio, the push time inside the cold run, the layers each pull downloaded or found
present, and whether the runtime image id of both runs is the same.

``--stack 12.8`` adds the locked CUDA 12.8 stack (pip base, ``--skip flash-attn``, the committed lock copied to a
temporary folder so outputs are recorded there, never into ``lockfiles/``), after the fixture chain in the same
run. About 12 min of builds on a 2-core builder, so it runs only when asked.

Before each cold run every BuildKit build-cache record of the engine but the cache mounts is removed
(:func:`prune_layer_records`): an earlier build of the same steps would otherwise serve them (the nonce OS image
alone did not stop that: a re-labelled parent has the same layers), and the cold figure would be a cached one.
This empties the layer cache the test suite's builds use on this engine too; ``--keep-build-cache`` keeps it
(and then the figures say less).

Usage: ``python benchmarks/cold_builder.py [--stack 12.8] [--keep-build-cache] [--no-nonce] [--json out.json]``
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "validate"))
sys.path.insert(0, str(ROOT / "tests"))

from cudastack.build.executor import run_build  # noqa: E402
from cudastack.build.engine import Engine  # noqa: E402
from cudastack.build.node_cache import NodeCache  # noqa: E402
from cudastack.plan.planner import make_plan  # noqa: E402

FIXTURE_RECIPES = ROOT / "tests" / "fixtures" / "recipes"
FIXTURE_OS = "cudastack-test/debian:bookworm"


def say(msg: str) -> None:
    print(f"   {msg}", file=sys.stderr, flush=True)


def empty_engine(client, plan, extra: tuple[str, ...] = ()) -> int:
    """Remove every name of every node's image (and of ``extra`` images): the engine then holds none of the plan.
    Returns how many references were removed."""
    n = 0
    for tag in [node.tag for node in plan.nodes] + list(extra):
        try:
            img = client.images.get(tag)
        except Exception:  # noqa: BLE001 - not there
            continue
        for ref in list(img.tags) + list(img.attrs.get("RepoDigests") or []):
            try:
                client.images.remove(ref, force=True)
                n += 1
            except Exception:  # noqa: BLE001
                pass
    return n


def prune_build_cache_since(client, since: datetime) -> int:
    """Remove the BuildKit build-cache records created at or after ``since`` (those of this benchmark's builds on
    this engine). Returns how many were removed."""
    return prune_build_records(client, lambda r: _created(r) >= since)


def prune_layer_records(client) -> int:
    """Remove every BuildKit build-cache record of this engine except the cache *mounts* (``Type``
    ``exec.cachemount``: apt's, pip's and ccache's folders), so no RUN step of a later build is served from
    BuildKit's cache while downloaded packages stay. Returns how many were removed."""
    return prune_build_records(client, lambda r: r.get("Type") != "exec.cachemount")


def prune_build_records(client, select) -> int:
    """Remove the build-cache records ``select(record)`` is true for (``GET /system/df``'s ``BuildCache`` entries),
    one ``POST /build/prune`` with an ``id`` filter each, in passes until none is left that may go (a record a
    newer one builds on goes once that one is gone; one in use never goes). Returns how many were removed."""
    removed = 0
    for _ in range(20):
        records = client.api.df().get("BuildCache") or []
        ours = [r for r in records if select(r) and not r.get("InUse")]
        if not ours:
            break
        gone = 0
        for r in ours:
            out = client.api.prune_builds(filters={"id": [r["ID"]]}, all=True) or {}
            gone += len(out.get("CachesDeleted") or [])
        removed += gone
        if not gone:
            break
    return removed


def _created(record: dict) -> datetime:
    """A build-cache record's ``CreatedAt`` (RFC 3339 with nanoseconds) as an aware datetime."""
    import re

    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)?",
                 str(record.get("CreatedAt") or ""))
    if not m:
        return datetime.fromtimestamp(0, timezone.utc)
    zone = "+00:00" if m.group(3) in (None, "Z") else m.group(3)
    return datetime.fromisoformat(f"{m.group(1)}.{(m.group(2) or '0')[:6].ljust(6, '0')}{zone}")


def nonce_os_image(engine: Engine, base: str, tmp: Path) -> str:
    """``base`` with one more LABEL (a fresh nonce), so its image id is new and BuildKit's cache matches no step
    built on it. Returns its tag."""
    import os

    nonce = os.urandom(6).hex()
    tag = f"cudastack-test/debian:bench-{nonce}"
    ctx = tmp / "nonce"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM {base}\nLABEL org.cudastack.bench-nonce={nonce}\n")
    engine.build(name="nonce OS image", log_path=tmp / "nonce.log", say=lambda s: None, context=str(ctx),
                 dockerfile=str(ctx / "Dockerfile"), tag=tag)
    return tag


def fixture_recipes(tmp: Path, os_image: str) -> Path:
    """A copy of the fixture recipes whose pip base uses ``os_image`` (and the extension's folder by its
    absolute path)."""
    rdir = tmp / "recipes"
    shutil.copytree(FIXTURE_RECIPES, rdir)
    tc = yaml.safe_load((rdir / "toolchains.yaml").read_text())
    tc["toolchains"]["13.1"]["bases"]["pip"]["os_image"] = os_image
    (rdir / "toolchains.yaml").write_text(yaml.safe_dump(tc, sort_keys=False))
    ext = yaml.safe_load((rdir / "cuda-ext.yaml").read_text())
    ext["toolchains"]["13.1"]["path"] = str((FIXTURE_RECIPES.parent / "cuda_ext").resolve())
    (rdir / "cuda-ext.yaml").write_text(yaml.safe_dump(ext, sort_keys=False))
    return rdir


def _ensure_fixture_os(engine: Engine) -> None:
    if engine.exists(FIXTURE_OS):
        return
    from cudastack.osimage.bootstrap import bootstrap_os_image

    say(f"{FIXTURE_OS} is missing: bootstrapping it (mmdebstrap), not timed")
    bootstrap_os_image("bookworm", tag=FIXTURE_OS, progress=say, docker_cli=engine.buildkit.docker)


def measure(name: str, engine: Engine, make, cache_prefix: str, tmp: Path, *, keep_build_cache: bool,
            extra_images: tuple[str, ...] = (), lock_for=None, after_cold=None, cold_layers: bool = False) -> dict:
    """Cold build (+ push) then the cache build of the plan ``make()`` returns, on emptied engines
    (``cold_layers``: BuildKit's layer records removed first, :func:`prune_layer_records`). ``lock_for``:
    the lock a locked plan was prepared from (the cache checks pulls against it); ``after_cold(record)``: run
    between the two (a locked build records its outputs into the lock)."""
    client = engine.client
    plan = make()
    empty_engine(client, plan)
    if cold_layers:
        say(f"before the cold run: {prune_layer_records(client)} BuildKit build-cache records removed (cache "
            "mounts kept), so no step is served from an earlier build")
    t_start = datetime.now(timezone.utc)
    cache = NodeCache.open(cache_prefix, client, lock=lock_for(plan) if lock_for else None)
    t0 = time.monotonic()
    cold = run_build(plan, state_dir=tmp / f"{name}-cold", engine=engine, cache=cache, say=say)
    cold_s = time.monotonic() - t0
    if cache.failures:
        raise SystemExit(f"{name}: the cold run's cache failed: {cache.failures}")
    push_s = sum((n.get("cache") or {}).get("push_s", 0) for n in cold["nodes"])
    built = [n["name"] for n in cold["nodes"] if n["status"] == "built"]
    if after_cold is not None:
        after_cold(cold)

    removed = empty_engine(client, plan, extra_images)
    pruned = 0 if keep_build_cache else prune_build_cache_since(client, t_start)
    say(f"emptied the engine: {removed} image references removed, {pruned} build-cache records removed")
    plan2 = make()
    cache2 = NodeCache.open(cache_prefix, client, read_only=True, lock=lock_for(plan2) if lock_for else None)
    t0 = time.monotonic()
    warm = run_build(plan2, state_dir=tmp / f"{name}-cache", engine=engine, cache=cache2, say=say)
    warm_s = time.monotonic() - t0
    runtime = [n for n in warm["nodes"] if n["kind"] == "runtime"]
    same = bool(runtime) and runtime[0]["image_id"] == [n for n in cold["nodes"] if n["kind"] == "runtime"][0]["image_id"]
    row = {"plan": name, "nodes": len(plan.nodes), "built_cold": built, "cold_s": round(cold_s, 1),
           "cold_push_s": round(push_s, 1), "cache_s": round(warm_s, 1),
           "ratio": round(cold_s / max(warm_s, 1e-6), 1),
           "pulled": [n["name"] for n in warm["nodes"] if n["status"] == "pulled"],
           "docker_builds_from_cache": warm["docker_builds"],
           "layers_downloaded": sum((n.get("cache") or {}).get("layers_downloaded", 0) for n in warm["nodes"]),
           "layers_present": sum((n.get("cache") or {}).get("layers_present", 0) for n in warm["nodes"]),
           "build_cache_records_pruned": pruned, "same_runtime_image": same,
           "runtime_image": runtime[0]["image_id"] if runtime else None}
    print(f"== {name}: {len(plan.nodes)} nodes")
    print(f"   cold (built {', '.join(built)}; pushes included: {push_s:.1f} s): {cold_s:.1f} s")
    print(f"   from the cache on an emptied engine ({len(row['pulled'])} pulled, {warm['docker_builds']} docker "
          f"builds; {row['layers_downloaded']} layers downloaded, {row['layers_present']} already present): "
          f"{warm_s:.1f} s")
    print(f"   ratio cold / cache: {row['ratio']}x; same runtime image id: {same}")
    empty_engine(client, plan2, extra_images)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stack", action="append", default=[], choices=["12.8"],
                    help="also the locked stack of this toolchain (12.8: pip base, no flash-attn; ~12 min of builds)")
    ap.add_argument("--keep-build-cache", action="store_true",
                    help="do not remove the build-cache records the cold run made (pulls then find the layers)")
    ap.add_argument("--no-nonce", action="store_true",
                    help="build the fixture chain on its own OS image (BuildKit's cache may then serve steps)")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    a = ap.parse_args(argv)
    from registry_server import start_registry

    engine = Engine.connect()
    tmp = Path(tempfile.mkdtemp(prefix="cold-builder-"))
    registry = start_registry(tmp / "registry", auth=False)
    rows = []
    try:
        prefix = f"{registry.host}/bench"
        _ensure_fixture_os(engine)
        os_image = FIXTURE_OS if a.no_nonce else nonce_os_image(engine, FIXTURE_OS, tmp)
        extra = () if a.no_nonce else (os_image,)
        rdir = fixture_recipes(tmp, os_image)
        rows.append(measure("CI fixture chain", engine,
                            lambda: make_plan(rdir, "13.1", resources=engine.resources(), prefix="cudastack-test"),
                            prefix, tmp, keep_build_cache=a.keep_build_cache, extra_images=extra,
                            cold_layers=not a.keep_build_cache))
        for cuda in a.stack:
            rows.append(_stack(cuda, engine, prefix, tmp, a.keep_build_cache))
    finally:
        registry.stop()
        for image in [] if a.no_nonce else [os_image]:
            try:
                engine.client.images.remove(image, force=True)
            except Exception:  # noqa: BLE001
                pass
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


def _stack(cuda: str, engine: Engine, prefix: str, tmp: Path, keep_build_cache: bool) -> dict:
    """The locked ``cuda`` stack (12.8: pip base, flash-attn skipped), cold then from the cache, with the
    committed lock copied to a temporary lockfiles folder (outputs recorded there)."""
    from cudastack import lock as L
    from cudastack.recipes.load import DEFAULT_RECIPES_DIR

    lockdir = tmp / f"lockfiles-{cuda}"
    lockdir.mkdir()
    shutil.copy2(L.lock_path(cuda), lockdir / f"{cuda}.lock.yaml")
    arch, base, skip = L.plan_options(cuda, None, "pip", ["flash-attn"], str(lockdir))
    path = L.lock_path(cuda, str(lockdir))
    locks: dict = {}

    def make():
        plan = make_plan(DEFAULT_RECIPES_DIR, cuda, archs=arch, base=base, skip=skip or (),
                         resources=engine.resources())
        locks[id(plan)] = L.prepare_locked_build(plan, path, client=engine.client, say=say)
        return plan

    return measure(f"locked CUDA {cuda} stack (pip base, no flash-attn)", engine, make, prefix, tmp,
                   keep_build_cache=keep_build_cache, lock_for=lambda plan: locks[id(plan)],
                   cold_layers=not keep_build_cache,
                   after_cold=lambda record: L.record_build_outputs(path, record))


if __name__ == "__main__":
    sys.exit(main())
