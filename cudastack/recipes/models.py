"""The recipe files as typed models: ``toolchains.yaml`` (:class:`ToolchainsFile`) and each component file
(:class:`ComponentFile`), one model per section. Unknown keys are errors (:class:`cudastack.core.schemas.Section`).

These models check the shape of one file: keys, types, patterns, exact pins. What needs more than one
section or file (a source entry names exactly one of sdist/git/path/url, the toolchain names agree with
toolchains.yaml, ``needs`` forms a DAG, ``requires`` agrees with the pins) is checked by
:mod:`cudastack.recipes.load`, which also turns these models into the dataclasses the rest of the tool uses.
The committed JSON Schemas (``recipes/schema/*.schema.json``) are generated from here
(``python -m cudastack.core.schemas --write``).

To add a key: add a field to the section's model below (a new section is a new :class:`Section` subclass
and a field holding it), then ``python -m cudastack.core.schemas --write`` and commit the schema (a test fails
until then). The loaded :class:`cudastack.recipes.load.Entry` / ``Component`` carry their validated model as
``.spec``, so the build can read ``entry.spec.<key>`` at once; a rule that spans sections or files goes in
``cudastack.recipes.load._entry`` / ``_load_component``. A new key reaches the node's plan hash through the raw
YAML, as before (``cudastack.plan.planner`` hashes ``Component.raw`` less description, est_disk_gib and parallelism,
and ``Entry.raw``).
"""
from __future__ import annotations

from pathlib import PurePosixPath
from typing import Annotated, Any, Literal, Optional

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import AfterValidator, Field, StrictBool, model_validator

from cudastack.core.schemas import Section, checked_pattern
from stackprobe.api import parse_arch

# ----------------------------------------------------------------------------------- value types
Version = Annotated[str, checked_pattern(r"^\d+(\.\d+)+", "is not a version number like 13.1 or 13.1.1")]
KnobName = Annotated[str, checked_pattern(r"^[A-Z][A-Z0-9_]*$",
                                          "is not a knob name: a knob is an environment variable (UPPER_CASE)")]
Commit = Annotated[str, checked_pattern(r"^[0-9a-f]{40}$",
                                        "is not a commit: pin the full 40-hex commit (a branch or tag moves)")]
Knobs = Annotated[dict[KnobName, str], Field(json_schema_extra={"additionalProperties": False})]


def _pinned(spec: str) -> str:
    """An exact pin ``name==1.2.3`` (extras allowed): builds must be reproducible and the lockfile must
    record one version."""
    try:
        req = Requirement(spec)
    except InvalidRequirement as exc:
        raise ValueError(f"'{spec}' is not a requirement: {exc}") from None
    specs = list(req.specifier)
    if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
        raise ValueError(f"'{spec}' is not pinned: write an exact version, e.g. {req.name}==1.2.3")
    return spec


def _arch(spec: str) -> str:
    parse_arch(spec)   # ArchSpecError is a ValueError: its text names the accepted spellings
    return spec


def _inside(rel: str) -> str:
    if rel.startswith("/") or ".." in PurePosixPath(rel).parts:
        raise ValueError(f"'{rel}' leaves the source: write a path inside the source tree (after subdir), "
                         "e.g. setup.py (for method aot, a path inside the flashinfer package, e.g. "
                         "data/csrc/trtllm_allreduce.cu)")
    return rel


def _folder_inside(rel: str) -> str:
    if rel.startswith("/") or ".." in PurePosixPath(rel).parts:
        raise ValueError(f"'{rel}' leaves the source: write a folder inside the source, e.g. sgl-kernel")
    return rel


def _distinct(items: list) -> list:
    if len(set(items)) != len(items):
        raise ValueError("a module is listed twice")
    return items


Pin = Annotated[str, AfterValidator(_pinned), Field(description="an exact pin: name==1.2.3 (extras allowed)")]
ArchSpec = Annotated[str, AfterValidator(_arch), Field(description="a compute capability: 12.0, 12.0a, sm_120")]
AotModule = Annotated[str, checked_pattern(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:gen_[A-Za-z0-9_]+_module$",
                                           "is not 'package.module:gen_<name>_module' "
                                           "(e.g. flashinfer.jit.comm:gen_pcie_ipc_comm_module)")]


# ------------------------------------------------------------------------------- toolchains.yaml
class ArchRow(Section):
    """``archs."12.0"``: the first CUDA release that compiles for this compute capability, and the first
    that no longer does (absent: still supported)."""

    min_cuda: Version
    dropped_in: Version = ""


class SuffixRule(Section):
    """``suffixes.a`` / ``suffixes.f``: the first CUDA release that accepts the suffix, the first arch with it."""

    min_cuda: Version
    min_arch: Version = ""


class PipBase(Section):
    """``bases.pip``: an OS image plus PyPI's CUDA toolkit wheels (``wheel_root`` "nvidia/cu13", or "" for
    CUDA 12's per-component layout)."""

    os_image: str
    os_suite: str
    python: Version
    pip_specs: list[Pin]
    wheel_root: str
    has_nvcc: StrictBool


class NvidiaBase(Section):
    """``bases.nvidia``: NVIDIA's devel image."""

    image: str
    python: Version
    has_nvcc: StrictBool


class Bases(Section):
    """``toolchains."13.1".bases``: the ways this toolchain's base image can be made."""

    pip: Optional[PipBase] = None
    nvidia: Optional[NvidiaBase] = None


class TorchLine(Section):
    """``toolchains."13.1".torch``: the torch line of this toolchain and the CUDA it was built with."""

    version: Version
    cuda: Version
    index: str = ""


class ToolchainSpec(Section):
    """``toolchains."13.1"``: one CUDA toolchain."""

    cuda_version: Version
    default_base: str = Field(description="one of the keys of bases")
    bases: Bases
    torch: TorchLine


class ToolchainsFile(Section):
    """``toolchains.yaml``: the arch table, the suffix rules and the CUDA toolchains."""

    archs: dict[ArchSpec, ArchRow]
    suffixes: dict[Literal["a", "f"], SuffixRule] = {}
    toolchains: dict[str, ToolchainSpec]


# ------------------------------------------------------------------------------ component files
class Cover(Section):
    """``arch_knob.covers[i]``: an arch a cmake-fixed build hard-codes, from this CUDA release on."""

    arch: ArchSpec
    min_cuda: Version


class ArchKnobSpec(Section):
    """``arch_knob``: how the target arch list maps onto this component's knob."""

    style: Literal["torch-list", "numbers", "suffixed", "cmake-fixed"]
    knob: str = Field("", description="the knob's name (UPPER_CASE); not for cmake-fixed")
    separator: Optional[str] = Field(None, description='default ";" (" " for suffixed)')
    scope: Literal["build", "env"] = "build"
    ignores: list[str] = Field([], description="cmake-fixed: variables the build ignores")
    covers: list[Cover] = Field([], description="cmake-fixed: archs hard-coded in its build files")


class ParallelismSpec(Section):
    """``parallelism``: the memory one compile job needs and the knobs that receive the counts (case C8)."""

    memory_gib_per_job: Annotated[float, Field(strict=True, gt=0)]
    nvcc_threads: Annotated[int, Field(strict=True, ge=1)] = 1
    jobs_knobs: list[str]
    threads_knobs: list[str] = []
    # source builds: CMake cache variables that receive the thread count (through CMAKE_ARGS)
    threads_defines: list[str] = []


class Sdist(Section):
    package: str
    version: Version


class GitSource(Section):
    url: str
    commit: Commit
    ref: str = ""


class Patch(Section):
    """A literal edit applied to the unpacked sdist before building; one that matches nothing is a build
    error."""

    file: Annotated[str, AfterValidator(_inside)]
    replace: str
    with_: str = Field(alias="with")
    why: str = ""


# ---------------------------------------------------------------- source builds (url, subdir, source:)
#: the keys that say where a source build's tree comes from; a source entry names exactly one
SOURCE_KINDS = ("sdist", "git", "path", "url")
_UNIT_COST = "the measured unit class of cudastack/unit_costs.yaml the dry run's time estimate uses (default aten)"
_UNITS_FROM = "how the dry run counts compile units: lists (CMake targets, then setup.py) or tree (every file)"
Subdir = Annotated[str, AfterValidator(_folder_inside),
                   Field(description="the folder inside the source that holds the build")]
CMakeName = Annotated[str, checked_pattern(r"^[A-Za-z_][A-Za-z0-9_]*$",
                                           "is not a CMake cache variable name (letters, digits, _)")]
CMakeDefines = Annotated[dict[CMakeName, str], Field(description="CMake cache variables, passed as CMAKE_ARGS",
                                                     json_schema_extra={"additionalProperties": False})]
UnitsFrom = Literal["lists", "tree"]
ArchFlag = Annotated[str, checked_pattern(r"^sm_\d+[af]?$", "is not a SASS target such as sm_120a")]


class UnitsReference(Section):
    """``units_reference``: the build's compile units counted somewhere other than its source tree (e.g. the
    fatbin containers of the official binary, one per CUDA unit), so the dry run can estimate before the source
    is on the builder. A count from the source, once there, replaces it."""

    cu: Annotated[int, Field(strict=True, ge=0)]
    cpp: Annotated[int, Field(strict=True, ge=0)] = 0
    how: Annotated[str, Field(min_length=1, description="where the count comes from, checkable by a reader")]


class UrlSource(Section):
    """``url``: an upstream source archive and its published sha256 (checked after the download)."""

    url: Annotated[str, checked_pattern(r"^(https?|file)://.*\.(tar\.gz|tgz|tar\.xz|tar\.bz2|zip)$",
                                        "is not the http(s) URL of a source archive (.tar.gz, .tgz, .tar.xz, "
                                        ".tar.bz2 or .zip)")]
    sha256: Annotated[str, checked_pattern(r"^[0-9a-fA-F]{64}$",
                                           "is not a sha256: give the archive's sha256 (64 hex digits), as its "
                                           "release page or a checksum file publishes it"),
                      AfterValidator(str.lower)]


class SourceBlock(Section):
    """``source:`` of a wheel entry: the source build a user selects with ``--method NAME=source``. With no
    location (sdist, git, path, url) it says where the source comes from (``upstream``) and the user gives a
    checkout with ``--source NAME=DIR``."""

    sdist: Optional[Sdist] = None
    git: Optional[GitSource] = None
    path: Optional[str] = Field(None, description="a local folder, relative to the recipe file")
    url: Optional[UrlSource] = None
    subdir: Optional[Subdir] = None
    upstream: str = Field("", description="where the source comes from when no location is pinned")
    knobs: Knobs = {}
    patches: Optional[Annotated[list[Patch], Field(min_length=1)]] = None
    build_deps: list[Pin] = []
    cmake_defines: CMakeDefines = {}
    arch_flags: list[ArchFlag] = Field([], description="SASS targets its build files hard-code (cmake-fixed)")
    unit_cost: Optional[str] = Field(None, description=_UNIT_COST)
    units_from: Optional[UnitsFrom] = Field(None, description=_UNITS_FROM)
    units_reference: Optional[UnitsReference] = None

    @model_validator(mode="before")
    @classmethod
    def _one_location(cls, data: Any) -> Any:
        found = [k for k in SOURCE_KINDS if isinstance(data, dict) and data.get(k) is not None]
        if len(found) > 1:
            raise ValueError(f"names {' and '.join(found)}: a source recipe names exactly one of: "
                             f"{', '.join(SOURCE_KINDS)}")
        return data

    @model_validator(mode="after")
    def _says_where(self) -> "SourceBlock":
        if not any(getattr(self, k) is not None for k in SOURCE_KINDS) and not self.upstream:
            raise ValueError("a source block with no sdist, git, path or url must say where the source comes from "
                             "(upstream: ...); the user then gives a checkout with --source NAME=DIR")
        return self


class EntrySpec(Section):
    """``toolchains."13.1"`` of a component file: how the component is obtained for that toolchain.

    Method ``aot`` (FlashInfer ahead of time, images/wheels-aot.Dockerfile): ``packages`` pins the
    flashinfer-python wheel (and optionally flashinfer-cubin), exported as they are; the builder installs
    ``build_deps`` (default: ``packages``), calls each generator in ``modules`` and builds its JitSpec with nvcc
    for the component's suffixed arch knob (12.0f on CUDA 13.x, 12.0a on 12.8) under the memory rule, then packs
    the modules into a ``flashinfer-jit-cache`` wheel of the same version, which the installed FlashInfer loads
    instead of JIT-compiling. Its ``patches`` edit files of the installed ``flashinfer`` package before the
    modules are generated: they change the compiled modules only.

    Method ``unavailable`` (with ``why``): this toolchain cannot take the component, e.g. vLLM 0.33.0 pins a
    CUDA 13.0 torch, which no CUDA 12 toolchain holds. The plan leaves the node (and every node that needs it)
    out and prints ``why``; nothing else may be set."""

    method: Optional[Literal["wheel", "source", "aot", "unavailable"]] = Field(
        None, description="base components leave it out; unavailable: this toolchain cannot take the component "
                          "(say why; the plan leaves the node out and prints the reason)")
    why: str = Field("", description="method unavailable: why this toolchain cannot take the component (one line "
                                     "naming the pin that stops it)")
    packages: list[Pin] = []
    index: str = Field("", description='index URL ("" = PyPI)')
    sdist: Optional[Sdist] = None
    git: Optional[GitSource] = None
    path: Optional[str] = Field(None, description="a local folder, relative to the recipe file")
    patches: Optional[Annotated[list[Patch], Field(min_length=1)]] = None
    build_deps: list[Pin] = Field([], description="source: pinned build backend, installed first")
    modules: Optional[Annotated[list[AotModule], Field(min_length=1), AfterValidator(_distinct)]] = Field(
        None, description="aot only: FlashInfer JIT module generators, package.module:gen_<name>_module")
    requires: dict[str, Version] = Field({}, description="the package's METADATA pins (checked)")
    knobs: Knobs = Field({}, description="per-toolchain knobs (override the file's knobs)")
    # --- source builds of any component (see the "source builds" section below) ---
    url: Optional[UrlSource] = None
    subdir: Optional[Subdir] = None
    cmake_defines: CMakeDefines = {}
    unit_cost: Optional[str] = Field(None, description=_UNIT_COST)
    units_from: Optional[UnitsFrom] = Field(None, description=_UNITS_FROM)
    units_reference: Optional[UnitsReference] = None
    source: Optional[SourceBlock] = Field(None, description="wheel entries: the source build that "
                                                            "--method NAME=source selects")


class ComponentFile(Section):
    """``<component>.yaml``: one node of the build graph."""

    kind: Literal["base", "image", "wheels", "runtime"]
    node: Optional[str] = Field(None, description="node name (default: the file's stem)")
    needs: list[str] = Field(description="the nodes this one needs; the first base/image one is the parent")
    description: str = ""
    est_disk_gib: Annotated[float, Field(strict=True, ge=0)] = 1
    arch_knob: Optional[ArchKnobSpec] = None
    knobs: Knobs = {}
    parallelism: Optional[ParallelismSpec] = None
    toolchains: dict[str, EntrySpec]
