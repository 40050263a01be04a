#!/usr/bin/env python3
"""The test suite's disk footprint: checked before a run, explained after one, freed on request (stdlib only:
it runs before the project's virtual environment exists).

    python3 scripts/test_footprint.py preflight [--fast]   # exit 5 naming the place, its free GiB and the need
    python3 scripts/test_footprint.py after                # after pytest: says so when a place is (nearly) full
    python3 scripts/test_footprint.py clean                # frees the caches and the tests' own images

Where the suite writes (one place for the caches, ``$CUDASTACK_TEST_CACHE``, default ``~/.cache/cudastack-tests``;
``scripts/dev.sh test`` points pip, uv, the package index cache and stackprobe's compile cache there), the Docker
engine's data root (the tests' images, tagged ``cudastack-test/...``, and BuildKit's cache) and the temporary
folder (``$TMPDIR``, default /tmp: pytest's tmp_path, unpacked wheels).

The figures: a full run kept about 19 GB of caches and 17 test images of about 0.9 GB each (35 minutes, measured
when issue 40 was filed), so the preflight asks for :data:`FULL_GIB` free where the caches and the images go
(one filesystem on most machines) and :data:`TMP_GIB` in the temporary folder; the fast lane (no Docker, registry
or network) writes no images and downloads nothing: :data:`FAST_GIB`. ``CUDASTACK_TEST_DISK_GIB`` overrides the
need. The caches a previous run left (up to :data:`CACHE_GIB`) are taken off the need: a warm run reuses them. A
place whose filesystem is nearly full after a run is reported as full: a full
disk (less than :data:`FULL_AFTER_MIB` or 5 % of a smaller filesystem) shows up in the tests as other errors (pip's "Connection interrupted ... network connectivity" for a
download that could not be written).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

CACHE_GIB = 19.0         # what a full run keeps in the test caches (pip, uv, index, wheels unpacked)
FULL_GIB = 40.0          # caches (about 19 GB) + test images (17 x 0.9 GB) + headroom
TMP_GIB = 5.0            # pytest's tmp_path: wheels unpacked, OS image tarballs
FAST_GIB = 2.0           # the fast lane: pytest's tmp_path only
FULL_AFTER_MIB = 512     # below this, a place counts as full after a run
TEST_IMAGE_PREFIX = os.environ.get("CUDASTACK_TEST_IMAGE_PREFIX", "cudastack-test")
EXIT_NO_DISK = 5         # the project's exit code for "the host cannot do the work"


def cache_dir() -> Path:
    return Path(os.environ.get("CUDASTACK_TEST_CACHE") or Path.home() / ".cache" / "cudastack-tests")


def docker_root() -> Path | None:
    """The Docker engine's data root, from ``docker info`` (None where no engine answers)."""
    try:
        r = subprocess.run(["docker", "info", "--format", "{{.DockerRootDir}}"], capture_output=True, text=True,
                           timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    root = r.stdout.strip()
    return Path(root) if r.returncode == 0 and root else None


def _existing(p: Path) -> Path:
    p = p.resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def places(fast: bool) -> list[tuple[str, Path, float]]:
    """``(what, path, GiB needed)`` per place the run writes; places on one filesystem are merged (their needs
    added) under the first one's name."""
    tmp = Path(os.environ.get("TMPDIR") or "/tmp")
    need = os.environ.get("CUDASTACK_TEST_DISK_GIB")
    wanted: list[tuple[str, Path, float]] = []
    if fast:
        wanted.append(("temporary folder", tmp, float(need) if need else FAST_GIB))
    else:
        root = docker_root()
        # caches a previous run left are reused, not written again: a warm cache needs only the rest
        full = float(need) if need else FULL_GIB - min(CACHE_GIB, _du_gib(cache_dir()) if cache_dir().is_dir() else 0.0)
        wanted.append(("test caches ($CUDASTACK_TEST_CACHE)", cache_dir(), full))
        if root is not None:
            wanted.append(("Docker data root (test images, BuildKit cache)", root, 0.0))
        wanted.append(("temporary folder", tmp, TMP_GIB))
    merged: dict[int, tuple[str, Path, float]] = {}
    for what, path, gib in wanted:
        dev = os.stat(_existing(path)).st_dev
        if dev in merged:
            w, p, g = merged[dev]
            merged[dev] = (f"{w} + {what} ({path})", p, g + gib)
        else:
            merged[dev] = (what, path, gib)
    return list(merged.values())


def free_gib(path: Path) -> float:
    return shutil.disk_usage(_existing(path)).free / 2**30


def preflight(fast: bool) -> int:
    """Exit 0 when every place has its need free, else 5 with one paragraph per short place."""
    short = []
    for what, path, need in places(fast):
        free = free_gib(path)
        line = f"{what} at {path}: {free:.1f} GiB free, the {'fast lane' if fast else 'test suite'} needs about {need:g} GiB"
        print(f"[footprint] {line}", file=sys.stderr)
        if free < need:
            short.append(line)
    if short:
        print("Too little free disk for the tests: " + "; ".join(short) + ". A run on a disk that fills fails in "
              "ways that hide the cause (downloads report 'Connection interrupted'). Free space with "
              "`bash scripts/dev.sh clean-tests` (the test caches and the cudastack-test/ images), point "
              "CUDASTACK_TEST_CACHE or TMPDIR at a larger disk, or run the fast lane: `bash scripts/dev.sh test "
              "--fast`. CUDASTACK_TEST_DISK_GIB overrides the figure.", file=sys.stderr)
        return EXIT_NO_DISK
    return 0


def after(fast: bool) -> int:
    """Print a paragraph for each place that is (nearly) full after the run; exit 1 when one is, else 0."""
    full = []
    for what, path, _ in places(fast):
        usage = shutil.disk_usage(_existing(path))
        free_mib = usage.free / 2**20
        if free_mib < min(FULL_AFTER_MIB, 0.05 * usage.total / 2**20):    # a small filesystem: 5 % of it
            full.append(f"{what} at {path} has {free_mib:.0f} MiB free")
    if full:
        print("[footprint] THE DISK FILLED during the tests: " + "; ".join(full) + ". Failures above that read as "
              "network or connection errors (pip: 'Connection interrupted ... network connectivity') or cut-off "
              "logs are most likely this full disk. Free space (`bash scripts/dev.sh clean-tests`) and run again.",
              file=sys.stderr)
        return 1
    print(f"[footprint] after the run: {', '.join(f'{w}: {free_gib(p):.1f} GiB free' for w, p, _ in places(fast))}",
          file=sys.stderr)
    return 0


def _du_gib(path: Path) -> float:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total / 2**30


def clean() -> int:
    """Remove the test cache folder and the images whose repository starts with ``cudastack-test/`` (the tests'
    own prefix; no other image is touched). Prints what it freed."""
    cache = cache_dir()
    if cache.exists():
        gib = _du_gib(cache)
        shutil.rmtree(cache, ignore_errors=True)
        print(f"removed the test caches {cache} ({gib:.1f} GiB)")
    else:
        print(f"no test caches at {cache}")
    try:
        r = subprocess.run(["docker", "images", "--format", "{{json .}}", "--filter",
                            f"reference={TEST_IMAGE_PREFIX}/*"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"test images not removed: no docker client answers ({exc})")
        return 0
    if r.returncode != 0:
        print(f"test images not removed: {r.stderr.strip()}")
        return 0
    rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.strip()]
    refs = [f"{d['Repository']}:{d['Tag']}" for d in rows if d.get("Tag") != "<none>"]
    refs = [ref for ref in refs if ref.startswith(f"{TEST_IMAGE_PREFIX}/")]
    if refs:
        subprocess.run(["docker", "rmi", *refs], capture_output=True, text=True, timeout=600)
    print(f"removed {len(refs)} test image tag(s) ({TEST_IMAGE_PREFIX}/...); BuildKit's cache of their builds stays "
          "(shared with other builds on this engine: `docker builder prune` frees it)")
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("preflight", "after", "clean"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    fast = "--fast" in argv[1:]
    return {"preflight": preflight, "after": after}.get(argv[0], lambda fast: clean())(fast)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
