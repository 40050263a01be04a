"""The lockfile itself: its path, schema, YAML rendering and atomic, exclusive reads and writes.

A lock is a dict (``lock_version``, ``toolchain``, ``cuda_version``, ``base_kind``, ``target_archs``, ``skipped``,
``resolver``, ``nodes``, ``outputs``, ``pushed``, ``warnings``; the models :class:`LockFile` and its sections,
checked by :func:`check_schema` and published as ``lockfiles/schema/lock.schema.json``). Writes go through
:func:`write_lock` (schema check, then :func:`stackprobe.atomic.write_atomic`); read-modify-write goes through
:func:`update_lock`, under :func:`exclusive`. Errors: LockError (exit 7).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
from pathlib import Path
from typing import Annotated, Callable, Literal, Optional

import yaml
from pydantic import Field, StrictBool, ValidationError

from cudastack.core.paths import PROJECT_ROOT
from cudastack.core.credentials import scrub
from cudastack.core.errors import LockError
from cudastack.core.schemas import Section, checked_pattern, explain
from stackprobe.api import write_atomic  # the project's one atomic writer (re-exported here)


LOCK_VERSION = 1
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


# ------------------------------------------------------------------------------------------ schema
# The lockfile schema (version 1), one model per section; unknown keys are errors. The lock itself stays a
# dict (what the rest of the package reads and writes); check_schema validates it against LockFile. The
# JSON Schema lockfiles/schema/lock.schema.json is generated from these models (python -m cudastack.core.schemas).
Sha256 = Annotated[str, checked_pattern(r"^[0-9a-f]{64}$", "is not a sha256 digest (64 hex digits, lower case)")]
Text = Annotated[str, Field(strict=True)]


class LockedPackage(Section):
    """One file of a pip closure, as pip's installation report names it."""

    name: str
    version: str
    sha256: Sha256
    filename: str = ""
    url: str = ""
    requested: StrictBool = Field(False, description="named in the requested specs (not only a dependency)")


class LockedInstall(Section):
    """``nodes.<node>.installs.<BUILD_ARG>``: one pip install of the node and its whole closure."""

    requested: list[str] = []
    no_deps: StrictBool = False
    packages: list[LockedPackage]


class OsImage(Section):
    """``nodes.<base>.os_image``: the bootstrapped OS image (cudastack.osimage.bootstrap.os_image_record)."""

    tag: str
    image_id: str
    mirror: str = ""
    suite: str = ""
    codename: str = ""
    variant: str = ""
    release_date: str = Field("", alias="release-date")
    release_sha256: str = Field("", alias="release-sha256")
    tool: str = ""          # the bootstrap program's version (mmdebstrap: reproducible; cudastack.osimage.bootstrap)
    debootstrap: str = ""   # locks written before mmdebstrap: the same, under its old name


class BaseImage(Section):
    """``nodes.<base>.base_image``: a registry base image pinned by digest."""

    ref: str
    digest: str
    reference: str = Field(description="ref@digest")


class SdistPin(Section):
    name: str
    version: str
    filename: str
    sha256: Sha256
    url: str = ""


class GitPin(Section):
    url: str
    ref: str = ""
    commit: Annotated[str, checked_pattern(r"^[0-9a-f]{40}$", "is not a 40-hex commit")]


class PathPin(Section):
    path: str
    sha256: Sha256


class LockedNode(Section):
    """``nodes.<node>``: every input of one plan node, pinned."""

    kind: Literal["base-pip", "base-nvidia", "image", "wheels", "runtime"]
    method: str = ""
    plan_hash: Sha256
    index: str = ""
    os_image: Optional[OsImage] = None
    base_image: Optional[BaseImage] = None
    installs: dict[str, LockedInstall] = {}
    sdists: list[SdistPin] = []
    git: list[GitPin] = []
    paths: list[PathPin] = []


class Resolver(Section):
    """``resolver``: the tool and the target platform the closures were resolved for."""

    tool: str
    python_version: str
    glibc: str
    machine: str
    implementation: str
    resolved_at: str = ""


class WheelRecord(Section):
    filename: str
    sha256: Sha256


class Output(Section):
    """``outputs.<node>``: what a locked build of the node produced."""

    image_id: str = ""
    tag: str = ""
    wheels: list[WheelRecord] = []


class Pushed(Section):
    """``pushed.<node>``: a push of the node's image (cudastack.registry.client.PushedImage)."""

    digest: str
    reference: str
    enroot: str
    image_id: str
    tag: str


class LockFile(Section):
    """A lockfile (``lockfiles/<toolchain>.lock.yaml``): every input of a toolchain's plan pinned."""

    lock_version: Literal[1]
    toolchain: Text
    cuda_version: Text
    base_kind: str = ""
    target_archs: list[str] = []
    skipped: list[str] = []
    resolver: Optional[Resolver] = None
    nodes: Annotated[dict[str, LockedNode], Field(min_length=1)]
    outputs: dict[str, Output] = {}
    pushed: dict[str, Pushed] = {}
    warnings: list[str] = []


def check_schema(lock, where: str = "lock") -> None:
    """Raise LockError naming the key when ``lock`` does not follow the lockfile schema (:class:`LockFile`,
    version :data:`LOCK_VERSION`): one paragraph with the file, the key path and what is wrong."""
    toolchain = lock.get("toolchain") if isinstance(lock, dict) else None
    redo = f"Re-create the lockfile with `invoke lock --cuda {toolchain if isinstance(toolchain, str) else 'X'}`."
    if not isinstance(lock, dict):
        raise LockError(f"{where}: the top level is not a mapping. {redo}")
    if lock.get("lock_version") != LOCK_VERSION:     # first: another version has other keys
        raise LockError(f"{where}: lock_version is {lock.get('lock_version')!r}, this tool reads version "
                        f"{LOCK_VERSION}. {redo}")
    try:
        LockFile.model_validate(lock)
    except ValidationError as exc:
        raise LockError(f"{where}: {explain(exc, LockFile)} {redo}") from None
