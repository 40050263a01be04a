"""Plan data types: the contract between the planner (recipes -> Plan) and the executor (Plan -> images).

A :class:`Plan` is a small DAG per toolchain, in topological order::

    base  (OS + Python venv + CUDA toolkit)           kind "base-pip" | "base-nvidia"
     -> torch                                          kind "image"      (pip-installs torch into the chain)
     -> flash-attn, sgl-kernel, flashinfer             kind "wheels"     (a builder stage makes wheels,
                                                                          exported to the wheelhouse)
     -> runtime (torch image + all wheels + sglang + the stackprobe suite)   kind "runtime"

Each node's identity is ``hash``: sha256 over a canonical JSON of its inputs (recipe fields, toolchain
fields, knobs, build args, the Dockerfile's text, parents' hashes). Its image ``tag`` carries that hash,
so a node whose tag exists locally is cached and not built again.

Dockerfiles live in ``images/<kind>.Dockerfile``; every build arg a node passes is listed in
``Node.build_args`` (str -> str). Build args common to all kinds:

``PARENT_IMAGE``  tag of the (single) image parent; absent for base nodes
``PIP_INDEX_URL`` / ``PIP_EXTRA_INDEX_URL``  index for pip (omitted when PyPI default)

Per kind (the executor and the Dockerfiles must agree on these names):

* ``base-pip``:    ``OS_IMAGE`` (local tag of the bootstrapped OS), ``CUDA_PIP_SPECS`` (space separated
                   requirement strings of the toolkit wheels), ``CUDA_VERSION`` ("13.1.1"),
                   ``CUDA_WHEEL_ROOT`` ("nvidia/cu13" or "" for CUDA 12 per-component layout)
* ``base-nvidia``: ``BASE_IMAGE`` ("nvidia/cuda:13.1.1-cudnn-devel-ubuntu24.04"), ``CUDA_VERSION``
* ``image``:       ``PIP_SPECS`` (space separated pinned requirements), ``BUILD_ENV`` (space separated
                   ``K=V`` applied to the pip command)
* ``wheels``:      ``METHOD`` ("wheel": ``pip download --no-deps``; "source": ``pip wheel --no-deps
                   --no-build-isolation`` from an sdist/git ref), ``PIP_SPECS``, ``BUILD_ENV`` (the
                   component's knobs, e.g. ``MAX_JOBS=1 NVCC_THREADS=2 FLASH_ATTN_CUDA_ARCHS=120``),
                   ``SOURCE_DIR`` ("src" for a recipe whose source is a local folder, or an sdist with
                   ``patches``: the executor copies the folder, or fetches the pinned sdist (sha256 checked
                   against the index), unpacks and patches it, into the build context as ``src/`` and
                   leaves ``PIP_SPECS`` empty).
                   Stage ``builder`` holds ``/wheels``; stage ``wheels`` (FROM scratch) holds only the
                   wheels and is exported with ``--output type=local``. The executor exports first, moves
                   the wheels into the wheelhouse, then builds ``--target builder -t <tag>`` (a BuildKit
                   cache hit) so the tag marks the node done.
* ``runtime``:     ``PIP_SPECS`` (sglang and friends; may be empty), ``WHEEL_NAMES`` (the files from the
                   wheelhouse to install, filled by the executor), and one build arg per knob of
                   scope ``env`` in the plan, named as the knob (today ``TORCH_CUDA_ARCH_LIST``,
                   ``FLASHINFER_CUDA_ARCH_LIST``): the Dockerfile turns each into ``ENV`` of the image. The
                   build context holds ``wheelhouse/`` and ``stackprobe/``.

Every build also gets ``--label org.cudastack.node=<name> org.cudastack.hash=<hash>
org.cudastack.toolchain=<toolchain>`` and, when a CA bundle exists, ``--secret id=cabundle,src=<bundle>``.
The recipes' node kind ``base`` becomes ``base-pip`` or ``base-nvidia`` by ``--base``. Parallelism knobs
(MAX_JOBS, NVCC_THREADS, SGL_KERNEL_COMPILE_THREADS, CMAKE_BUILD_PARALLEL_LEVEL) travel in ``BUILD_ENV``
but are not hashed (they change how fast, not what is built).

Conventions of images/*.Dockerfile that planner and executor may rely on: ``BUILD_ENV`` is applied as
``eval "export $BUILD_ENV"`` by /bin/sh, so a value with spaces must be shell-quoted (``K='12.0a 12.1a'``);
a relative path in a ``wheels`` node's ``PIP_SPECS`` (``./src``) resolves against the build context, and
``SOURCE_DIR`` names a context folder; a ``wheels`` node may pass ``BUILD_DEPS`` (space separated
requirements installed into the builder stage before a source build, since ``--no-build-isolation`` needs the
build backend present, e.g. scikit-build-core and cmake for sgl-kernel); both bases provide ``/opt/venv`` (first on PATH), ``CUDA_HOME=
/usr/local/cuda`` (CUDA_HOME/include/cccl on CPLUS_INCLUDE_PATH), g++, git, ccache and
``/usr/local/bin/with-build-ca CMD`` (runs CMD with the ``cabundle`` secret as CA bundle for pip, git, curl
and OpenSSL when it is mounted); a base-pip image whose wheels carry no nvcc holds ``/usr/local/cuda/NO_NVCC``;
a runtime env-scope arg that is empty stays unset in the image (FlashInfer's CompilationContext splits any
value of FLASHINFER_CUDA_ARCH_LIST that is set, so an empty one would break it); a new env-scope knob needs
its own stage pair in runtime.Dockerfile. Labels set by the Dockerfiles: ``org.cudastack.kind`` and
``org.cudastack.cuda.version`` (bases). The bootstrapped OS image records its mirror and snapshot in
``org.cudastack.os.*`` labels (:func:`cudastack.osimage.bootstrap.os_image_record`).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field

KNOB_SOURCES = ("recipe", "toolchain", "cli", "memory-rule", "default", "lock")
NODE_KINDS = ("base-pip", "base-nvidia", "image", "wheels", "runtime")


@dataclass(frozen=True)
class Knob:
    """One build knob with its final value and where that value came from (one of KNOB_SOURCES).
    ``why`` explains derived values (e.g. the memory rule: "24 GiB / 9 GiB per job -> 2, capped by 2 cores")."""

    name: str
    value: str
    source: str
    why: str = ""


@dataclass
class Node:
    """One image (or wheel export) in the plan. ``name``: "base", "torch", "flash-attn", "sgl-kernel",
    "flashinfer", "runtime". ``parents``: names of nodes this one needs (image parent first)."""

    name: str
    kind: str
    dockerfile: str                     # path relative to the project root, e.g. "images/wheels.Dockerfile"
    parents: list[str]
    build_args: dict[str, str]
    knobs: list[Knob] = field(default_factory=list)
    hash: str = ""                      # sha256 hex of the canonical inputs
    tag: str = ""                       # e.g. "cudastack/cu13.1-sm120-flashinfer:<hash[:16]>"
    method: str = ""                    # "wheel" | "source" | "" (base/runtime)
    memory_gib_per_job: float = 0.0     # for source nodes: declared per-compile-job budget
    est_disk_gib: float = 0.0           # rough size estimate for the disk preflight
    inputs: dict = field(default_factory=dict)  # the canonical inputs that were hashed (for --dry-run / lock)


@dataclass
class Plan:
    """A toolchain's build plan. ``nodes`` is in topological order (parents before children)."""

    toolchain: str                      # "13.1"
    cuda_version: str                   # "13.1.1"
    target_archs: list[str]             # ["12.0"] as given (arch specs)
    base_kind: str                      # "pip" | "nvidia"
    nodes: list[Node]
    wheelhouse: str                     # "wheelhouse/cu13.1" relative to the project's state dir
    warnings: list[str] = field(default_factory=list)

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


def build_env(knobs: list[Knob]) -> str:
    """``BUILD_ENV``: space separated ``K=V``, each value shell-quoted (the Dockerfiles run
    ``eval "export $BUILD_ENV"``), so values with spaces survive."""
    return " ".join(f"{k.name}={shlex.quote(k.value)}" for k in knobs)
