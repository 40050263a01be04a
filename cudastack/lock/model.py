"""The lockfile itself: its path, schema, YAML rendering and atomic, exclusive reads and writes.

A lock is a dict (``lock_version``, ``toolchain``, ``cuda_version``, ``base_kind``, ``target_archs``, ``skipped``,
``resolver``, ``nodes``, ``outputs``, ``pushed``, ``warnings``; see :func:`check_schema`). Writes go through
:func:`write_lock` (schema check, then :func:`stackprobe.atomic.write_atomic`); read-modify-write goes through
:func:`update_lock`, under :func:`exclusive`. Errors: LockError (exit 7).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
from pathlib import Path
from typing import Callable

import yaml

from cudastack.credentials import scrub
from cudastack.errors import LockError
from stackprobe.atomic import write_atomic  # the project's one atomic writer (re-exported here)


LOCK_VERSION = 1
PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_LOCKFILES_DIR = PROJECT_ROOT / "lockfiles"
DEFAULT_INDEX = "https://pypi.org/simple"
HASH_MISMATCH_HEADER = "THESE PACKAGES DO NOT MATCH THE HASHES"

#: Installs that go to their own prefix (``pip install --target``), not into the image's Python environment:
#: the base-pip image's CUDA toolkit wheels (images/base-pip.Dockerfile installs them into /opt/cuda-wheels).
SEPARATE_PREFIX_INSTALLS = ("CUDA_PIP_SPECS",)
#: Where the base-pip image installs the CUDA toolkit wheels (``pip install --target``; images/base-pip.Dockerfile).
CUDA_WHEELS_PREFIX = "/opt/cuda-wheels"

Progress = Callable[[str], None]


def lock_path(toolchain: str, lockfiles_dir: str | Path | None = None) -> Path:
    """``<lockfiles_dir>/<toolchain>.lock.yaml`` (default folder: the project's ``lockfiles/``)."""
    return Path(lockfiles_dir or DEFAULT_LOCKFILES_DIR) / f"{toolchain}.lock.yaml"


def render_lock(lock: dict) -> str:
    """The lockfile text: a header comment, then YAML in a stable key order (block style)."""
    head = (f"# cudastack lockfile for CUDA {lock.get('toolchain')}: every input of the plan pinned, every output "
            f"recorded.\n# Generated; do not edit. Refresh with: {lock_command(lock)}\n")
    # a URL's login (a private index's user:token) is never written (credentials.scrub)
    return head + yaml.safe_dump(scrub(lock), sort_keys=False, default_flow_style=False, width=200, allow_unicode=True)


def lock_command(lock: dict) -> str:
    """The ``invoke lock`` command line that re-creates ``lock``'s plan: toolchain, base, archs, skipped
    components (``invoke lock --cuda 12.8 --base pip --skip flash-attn``)."""
    cmd = f"invoke lock --cuda {lock.get('toolchain')}"
    if lock.get("base_kind"):
        cmd += f" --base {lock['base_kind']}"
    archs = lock.get("target_archs") or []
    if archs and list(archs) != ["12.0"]:
        cmd += f" --arch {','.join(archs)}"
    return cmd + "".join(f" --skip {s}" for s in lock.get("skipped") or [])


def plan_options(cuda: str, arch, base, skip, lockfiles_dir: str | Path | None = None) -> tuple:
    """(arch, base, skip) for a command that works from the lockfile of toolchain ``cuda``: options the user
    did not give come from the lock (its base, archs and skipped components), so `invoke build --cuda 12.8
    --locked` builds the plan that `invoke lock --cuda 12.8 --base pip --skip flash-attn` locked. Without a
    lockfile, or when every option is given, they are returned unchanged."""
    path = lock_path(str(cuda), lockfiles_dir)
    if not path.is_file():
        return arch, base, skip
    try:
        lk = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return arch, base, skip
    if not isinstance(lk, dict):
        return arch, base, skip
    return (arch if arch else (",".join(lk["target_archs"]) if lk.get("target_archs") else None),
            base or lk.get("base_kind") or None,
            skip if skip else (list(lk.get("skipped") or []) or None))


@contextlib.contextmanager
def exclusive(path: str | Path):
    """Hold an exclusive ``flock`` on the lockfile's folder while reading, changing and writing the lock, so a
    push record and a re-lock running at the same time cannot lose each other's update."""
    folder = Path(path).parent
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def write_lock(path: str | Path, lock: dict) -> None:
    """Validate ``lock`` against the schema, render it and write it atomically (see :func:`write_atomic`)."""
    check_schema(lock, str(path))
    write_atomic(path, render_lock(lock))


def load_lock(path_or_toolchain: str | Path, lockfiles_dir: str | Path | None = None) -> dict:
    """Read and schema-check a lockfile. ``path_or_toolchain``: a path, or a toolchain name ("13.1") looked
    up as ``<lockfiles_dir>/<toolchain>.lock.yaml``. Raises LockError (missing, unreadable, bad schema)."""
    p = Path(path_or_toolchain)
    is_toolchain = bool(re.fullmatch(r"\d+\.\d+", str(path_or_toolchain)))
    if is_toolchain:
        p = lock_path(str(path_or_toolchain), lockfiles_dir)
    if not p.exists():
        tc = str(path_or_toolchain) if is_toolchain else (p.name[:-len(".lock.yaml")]
                                                            if p.name.endswith(".lock.yaml") else "X")
        raise LockError(f"No lockfile at {p}. Create it with `invoke lock --cuda {tc}` and commit it.")
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise LockError(f"{p} is not readable YAML ({exc}). Restore it from version control or re-create it "
                        "with `invoke lock`.") from None
    check_schema(data, str(p))
    return data


def update_lock(path: str | Path, fn: Callable[[dict], None]) -> dict:
    """Load the lock at ``path``, apply ``fn`` (mutates the dict), validate and write atomically, all under
    :func:`exclusive`."""
    with exclusive(path):
        lock = load_lock(path)
        fn(lock)
        write_lock(path, lock)
    return lock


def _refresh(lock: dict) -> str:
    return f"Refresh it with `{lock_command(lock)}` and commit the new lockfile."


_NODE_KEYS = {"kind", "method", "plan_hash", "index", "os_image", "base_image", "installs", "sdists", "git",
              "paths"}
_PKG_KEYS = {"name", "version", "filename", "url", "sha256", "requested"}


def check_schema(lock, where: str = "lock") -> None:
    """Raise LockError naming the key when ``lock`` does not follow the lockfile schema (version 1)."""
    def bad(msg):
        raise LockError(f"{where}: {msg}. Re-create the lockfile with `invoke lock --cuda X`.")

    if not isinstance(lock, dict):
        bad("the top level is not a mapping")
    if lock.get("lock_version") != LOCK_VERSION:
        bad(f"lock_version is {lock.get('lock_version')!r}, this tool reads version {LOCK_VERSION}")
    for k in ("toolchain", "cuda_version"):
        if not isinstance(lock.get(k), str):
            bad(f"'{k}' is missing or not a string")
    unknown = set(lock) - {"lock_version", "toolchain", "cuda_version", "base_kind", "target_archs", "skipped",
                           "resolver", "nodes", "outputs", "pushed", "warnings"}
    if unknown:
        bad(f"unknown top-level keys {sorted(unknown)}")
    nodes = lock.get("nodes")
    if not isinstance(nodes, dict) or not nodes:
        bad("'nodes' is missing or empty")
    for name, node in nodes.items():
        if not isinstance(node, dict):
            bad(f"nodes.{name} is not a mapping")
        extra = set(node) - _NODE_KEYS
        if extra:
            bad(f"nodes.{name} has unknown keys {sorted(extra)}")
        for arg, inst in (node.get("installs") or {}).items():
            if not isinstance(inst, dict) or not isinstance(inst.get("packages"), list):
                bad(f"nodes.{name}.installs.{arg} has no 'packages' list")
            for i, pkg in enumerate(inst["packages"]):
                if not isinstance(pkg, dict) or not {"name", "version", "sha256"} <= set(pkg) or set(pkg) - _PKG_KEYS:
                    bad(f"nodes.{name}.installs.{arg}.packages[{i}] must have name, version, sha256 "
                        f"(and optionally {sorted(_PKG_KEYS - {'name', 'version', 'sha256'})})")
                if not re.fullmatch(r"[0-9a-f]{64}", str(pkg["sha256"])):
                    bad(f"nodes.{name}.installs.{arg}.packages[{i}].sha256 is not 64 hex digits")
    for section in ("outputs", "pushed"):
        if section in lock and not isinstance(lock[section], dict):
            bad(f"'{section}' is not a mapping")
