"""Recipes as data: load ``recipes/*.yaml`` and validate them against the schema before anything runs.

A recipes folder holds ``toolchains.yaml`` (the CUDA toolchains, the arch table and the suffix rules)
and one file per component (``<name>.yaml``). Each component names its node ``kind`` and what it
``needs``, so the build DAG comes from the data: a test folder can describe a chain of three nodes.

The schema of both files is the pydantic models of :mod:`cudastack.recipes.models` (one model per section;
every key not listed is an error naming the file, the key and the allowed keys), published as JSON Schema
in ``recipes/schema/`` for editors. A component file in short::

    kind: wheels                      # base | image | wheels | runtime
    needs: [torch]                    # the first base/image node among them is the image parent
    arch_knob: {style: numbers, knob: FLASH_ATTN_CUDA_ARCHS}
    parallelism: {memory_gib_per_job: 9, nvcc_threads: 4, jobs_knobs: [MAX_JOBS]}   # source entries (C8)
    toolchains:                       # one entry per toolchain in toolchains.yaml
      "13.1": {method: source, sdist: {package: flash-attn, version: "2.8.3"}}
      # a source entry names one of sdist / git / path / url (+ subdir, patches, build_deps, cmake_defines);
      # a wheel entry may carry a `source:` block: the source build `--method NAME=source` selects

On top of the models this module checks what spans sections or files: a source entry names exactly one
of sdist / git / path / url (only source builds take subdir, cmake_defines and cost hints; patches and
build_deps also go with method aot; a local path must exist; ``unit_cost`` is a class of ``unit_costs.yaml``),
an aot entry lists modules and has a suffixed arch knob, base entries take no method, runtime entries install
wheels and only image/wheels entries carry a ``source:`` block, every toolchain has an entry, ``needs`` is a
DAG with one base, torch pins follow the toolchain's torch line, and ``requires`` agrees with the other
recipes' pins.

Errors: :class:`cudastack.core.errors.RecipeError` (exit code 3), one paragraph naming file and key.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from cudastack.core.paths import PROJECT_ROOT
from cudastack.core.errors import RecipeError, UsageError
from cudastack.recipes.graph import check_graph, check_pins
from cudastack.recipes.models import SOURCE_KINDS, ArchKnobSpec, ComponentFile, EntrySpec, SourceBlock, ToolchainsFile
from cudastack.core.schemas import explain, key_path
from stackprobe.api import parse_arch, version_tuple

DEFAULT_RECIPES_DIR = PROJECT_ROOT / "recipes"

NODE_KINDS = ("base", "image", "wheels", "runtime")
METHODS = ("wheel", "source", "aot")
UNAVAILABLE = "unavailable"   # a toolchain that cannot take the component (Entry.why says why)
COMPILING_METHODS = ("source", "aot")   # compile on the builder: memory rule, a base with nvcc, built last
ARCH_STYLES = ("torch-list", "numbers", "suffixed", "cmake-fixed")
BASE_KINDS = ("pip", "nvidia")
_KNOB_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


# --------------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class ArchInfo:
    """One compute capability: the first CUDA that compiles for it, and the first that dropped it."""

    cc: str
    min_cuda: str
    dropped_in: str = ""


@dataclass(frozen=True)
class BaseChoice:
    """How a toolchain's base image is made. ``kind`` pip: ``os_image`` + ``pip_specs`` (toolkit wheels,
    ``wheel_root`` "nvidia/cu13" or "" for CUDA 12's per-component layout); nvidia: ``image``."""

    kind: str
    python: str
    has_nvcc: bool
    image: str = ""
    os_image: str = ""
    os_suite: str = ""
    pip_specs: tuple[str, ...] = ()
    wheel_root: str = ""


@dataclass
class Toolchain:
    name: str                      # "13.1"
    cuda_version: str              # "13.1.1"
    default_base: str              # "pip" | "nvidia"
    bases: dict[str, BaseChoice]
    torch_version: str
    torch_cuda: str
    torch_index: str
    raw: dict


@dataclass(frozen=True)
class ArchKnob:
    style: str
    knob: str = ""
    separator: str = ";"
    scope: str = "build"
    ignores: tuple[str, ...] = ()
    covers: tuple[tuple[str, str], ...] = ()   # (arch spec, min cuda)


@dataclass(frozen=True)
class Parallelism:
    memory_gib_per_job: float
    nvcc_threads: int
    jobs_knobs: tuple[str, ...]
    threads_knobs: tuple[str, ...]
    threads_defines: tuple[str, ...] = ()   # CMake cache variables given the thread count (through CMAKE_ARGS)


@dataclass
class Entry:
    """A component's recipe for one toolchain."""

    method: str                    # "wheel" | "source" | "aot" | "unavailable" | "" (base)
    packages: tuple[str, ...] = ()
    index: str = ""
    sdist: dict | None = None
    git: dict | None = None
    path: Path | None = None       # resolved absolute path of a local source folder
    requires: dict[str, str] = field(default_factory=dict)
    knobs: dict[str, str] = field(default_factory=dict)
    patches: tuple[dict, ...] = ()   # [{"file", "replace", "with", "why"}] applied to the fetched source tree
    build_deps: tuple[str, ...] = ()  # pinned requirements installed before a source (or aot) build
    modules: tuple[str, ...] = ()     # aot: FlashInfer generators "package.module:gen_<name>_module"
    raw: dict = field(default_factory=dict)
    spec: EntrySpec | SourceBlock | None = None   # the validated model (a `source:` build: its SourceBlock)
    # --- source builds of any component ---
    url: dict | None = None        # {"url", "sha256"}: an upstream source tarball
    subdir: str = ""               # the folder inside the source that holds the build (e.g. sgl-kernel)
    cmake_defines: dict[str, str] = field(default_factory=dict)   # -DNAME=VALUE through CMAKE_ARGS
    arch_flags: tuple[str, ...] = ()  # gencode targets a build with hard-coded archs passes (cmake-fixed)
    upstream: str = ""             # where the source comes from when the recipe pins no location
    unit_cost: str = "aten"        # the measured unit class for the dry run's time estimate (cudastack.plan.costs)
    units_from: str = "lists"      # how the dry run counts units: the build's source lists, or the whole tree
    units_reference: dict | None = None   # {"cu", "cpp", "how"}: counted elsewhere, until the source is here
    alternative: "Entry | None" = None   # a wheel entry's `source:` build (--method NAME=source)
    why: str = ""                  # method unavailable: why this toolchain cannot take the component

    @property
    def source_kind(self) -> str:
        """"sdist" | "git" | "url" | "path" | "" (a wheel, or a source alternative with no location yet)."""
        return next((k for k in SOURCE_KINDS if getattr(self, k)), "")


@dataclass
class Component:
    name: str                      # node name
    stem: str                      # file stem (what --skip also accepts)
    file: Path
    kind: str
    needs: list[str]
    description: str
    est_disk_gib: float
    arch_knob: ArchKnob | None
    knobs: dict[str, str]
    parallelism: Parallelism | None
    toolchains: dict[str, Entry]
    raw: dict
    spec: ComponentFile | None = None  # the validated model: every key of the file, typed (new keys land here)


@dataclass
class RecipeSet:
    dir: Path
    archs: dict[str, ArchInfo]
    suffixes: dict[str, dict[str, str]]          # {"f": {"min_cuda": "12.9", "min_arch": "10.0"}}
    toolchains: dict[str, Toolchain]
    components: dict[str, Component]             # by node name, in file order

    def component(self, name: str) -> Component:
        """Look a component up by node name or file stem. Raises UsageError listing the known ones."""
        for c in self.components.values():
            if name in (c.name, c.stem):
                return c
        known = ", ".join(sorted({c.stem for c in self.components.values()} | set(self.components)))
        raise UsageError(f"Unknown component '{name}'. Known components in {self.dir}: {known}.")

    def toolchain(self, name: str) -> Toolchain:
        """Look a toolchain up by name ("13.1") or full CUDA version ("13.1.1")."""
        for tc in self.toolchains.values():
            if name in (tc.name, tc.cuda_version):
                return tc
        known = ", ".join(self.toolchains)
        raise UsageError(f"Unknown CUDA version '{name}'. Known toolchains: {known} "
                         f"(defined in {self.dir / 'toolchains.yaml'}).")


# ---------------------------------------------------------------------------------------- helpers
_fail = RecipeError.at


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RecipeError(f"Recipe {path} is not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise _fail(path, "", "the top level must be a mapping.")
    return data


def _parse(model: type[BaseModel], data: dict, path: Path):
    """``model`` validated from ``data``; a RecipeError naming ``path`` and the first bad key otherwise."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(f"Recipe {path} {explain(exc, model)}") from None


# -------------------------------------------------------------------------------------- toolchains
def _load_toolchains(path: Path) -> tuple[dict, dict, dict]:
    if not path.is_file():
        raise RecipeError(f"No toolchains file: {path} is missing. A recipes folder needs toolchains.yaml "
                          "(the CUDA toolchains) next to the component files.")
    data = _read_yaml(path)
    f: ToolchainsFile = _parse(ToolchainsFile, data, path)
    archs = {}
    for spec, row in f.archs.items():
        cc = parse_arch(spec).cc
        archs[cc] = ArchInfo(cc, row.min_cuda, row.dropped_in)
    suffixes = {sfx: rule.model_dump(include=rule.model_fields_set) for sfx, rule in f.suffixes.items()}
    raw = {str(k): v for k, v in (data["toolchains"] or {}).items()}
    toolchains: dict[str, Toolchain] = {}
    for name, tc in f.toolchains.items():
        key = key_path(("toolchains", name))
        if version_tuple(tc.cuda_version)[:2] != version_tuple(name)[:2]:
            raise _fail(path, f"{key}.cuda_version", f"{tc.cuda_version} is not a {name} release.")
        bases = {kind: BaseChoice(kind, **dict(b.model_dump(), pip_specs=tuple(getattr(b, "pip_specs", ()))))
                 for kind in raw[name]["bases"] or () if (b := getattr(tc.bases, kind)) is not None}  # file order
        if tc.default_base not in bases:
            raise _fail(path, f"{key}.default_base", f"'{tc.default_base}' is not one of this toolchain's bases "
                                                      f"({', '.join(bases)}).")
        toolchains[name] = Toolchain(name, tc.cuda_version, tc.default_base, bases, tc.torch.version,
                                     tc.torch.cuda, tc.torch.index, raw[name])
    if not toolchains:
        raise _fail(path, "toolchains", "no toolchain is defined.")
    return archs, suffixes, toolchains


# -------------------------------------------------------------------------------------- components
def _arch_knob(s: ArchKnobSpec | None, file: Path) -> ArchKnob | None:
    if s is None:
        return None
    if s.style != "cmake-fixed" and not _KNOB_NAME.match(s.knob):
        raise _fail(file, "arch_knob.knob", f"style {s.style} needs the knob's name (an UPPER_CASE variable).")
    if s.style == "cmake-fixed" and not s.covers:
        raise _fail(file, "arch_knob.covers", "style cmake-fixed must list the archs its build files hard-code.")
    sep = s.separator if s.separator is not None else (" " if s.style == "suffixed" else ";")
    return ArchKnob(s.style, s.knob, sep, s.scope, tuple(s.ignores), tuple((c.arch, c.min_cuda) for c in s.covers))


_SOURCE_ONLY = (*SOURCE_KINDS, "patches", "build_deps", "subdir", "cmake_defines", "unit_cost", "units_from",
                "units_reference")


def _location(s: EntrySpec | SourceBlock, e: Entry, file: Path, key: str, *, need_one: bool) -> None:
    """Copy the source keys of a source entry or a ``source:`` block (the models checked their shapes) into
    ``e``: the location (sdist / git / path / url), subdir, patches, build_deps, CMake defines, cost hints."""
    sources = [k for k in SOURCE_KINDS if getattr(s, k) is not None]
    if len(sources) > 1 or (need_one and len(sources) != 1):
        raise _fail(file, f"{key}.{sources[1] if len(sources) > 1 else 'sdist'}",
                    f"a source recipe names exactly one of: {', '.join(SOURCE_KINDS)}.")
    e.sdist = s.sdist.model_dump() if s.sdist else None
    e.git = s.git.model_dump() if s.git else None
    e.url = s.url.model_dump() if s.url else None
    if s.path is not None:
        e.path = (file.parent / s.path).resolve()
        if not e.path.is_dir():
            raise _fail(file, f"{key}.path", f"{e.path} is not a folder.")
    e.subdir = s.subdir or ""
    e.patches = tuple(p.model_dump(by_alias=True) for p in s.patches or ())
    e.build_deps, e.cmake_defines = tuple(s.build_deps), dict(s.cmake_defines)
    e.units_from = s.units_from or "lists"
    e.units_reference = s.units_reference.model_dump() if s.units_reference else None
    if s.unit_cost is not None:
        from cudastack.recipes.unit_costs import unit_costs

        if s.unit_cost not in unit_costs()["classes"]:
            raise _fail(file, f"{key}.unit_cost", f"'{s.unit_cost}' is not a measured unit class "
                                                   f"({', '.join(unit_costs()['classes'])}).")
        e.unit_cost = s.unit_cost


def _entry(s: EntrySpec, raw: dict, file: Path, key: str, kind: str) -> Entry:  # noqa: C901, PLR0912 - reason: one raise per rule of a recipe entry, each naming its key
    method = s.method or ""
    if kind == "base" and method:
        raise _fail(file, f"{key}.method", "a base node takes its method from toolchains.yaml and --base.")
    if kind != "base" and not method:
        raise _fail(file, f"{key}.method", f"required key is missing ({' or '.join(METHODS)}).")
    if method == UNAVAILABLE:
        if not s.why.strip():
            raise _fail(file, f"{key}.why", "method unavailable needs a one-line why (the pin or rule that keeps this "
                                             "toolchain from taking the component), which the plan prints.")
        extra = sorted(k for k in s.model_fields_set if k not in ("method", "why"))
        if extra:
            raise _fail(file, f"{key}.{extra[0]}", "an unavailable entry takes only `why`: nothing is built for this "
                                                   "toolchain.")
        return Entry(method, raw=raw, spec=s, why=s.why.strip())
    if s.why:
        raise _fail(file, f"{key}.why", "only method unavailable takes a why.")
    if kind == "runtime" and method != "wheel":
        raise _fail(file, f"{key}.method", "a runtime node installs pinned wheels: method must be 'wheel'.")
    e = Entry(method, packages=tuple(s.packages), index=s.index, requires=dict(s.requires), knobs=dict(s.knobs),
              raw=raw, spec=s)
    if method in ("wheel", "aot") and not e.packages and kind != "runtime":
        raise _fail(file, f"{key}.packages", "a wheel recipe needs its pinned packages (name==version).")
    if method != "aot" and s.modules is not None:
        raise _fail(file, f"{key}.modules", "only an aot recipe compiles modules (method: aot).")
    also = ("patches", "build_deps", "units_reference") if method == "aot" else ()   # aot: the installed package
    if method != "source":
        for k in _SOURCE_ONLY:
            if k in s.model_fields_set and k not in also:
                raise _fail(file, f"{key}.{k}", "only source recipes name a source, its patches and build "
                                                "dependencies (a wheel entry's source build goes under `source:`).")
    if method == "aot":
        if kind != "wheels":
            raise _fail(file, f"{key}.method", "method aot makes a wheel of modules: the kind must be 'wheels'.")
        if s.modules is None:
            raise _fail(file, f"{key}.modules", "an aot recipe lists the FlashInfer JIT modules to compile, e.g. "
                                                "[flashinfer.jit.comm:gen_trtllm_comm_module].")
        e.modules, e.build_deps = tuple(s.modules), tuple(s.build_deps)
        e.patches = tuple(p.model_dump(by_alias=True) for p in s.patches or ())
        e.units_reference = s.units_reference.model_dump() if s.units_reference else None
    if s.source is not None:
        if method != "wheel" or kind not in ("image", "wheels"):
            raise _fail(file, f"{key}.source", "only a wheel entry of an image or wheels node carries a source "
                                               "build (a source entry puts its location in the entry itself).")
        a = s.source
        e.alternative = Entry("source", raw={"method": "source", **raw["source"]}, knobs=dict(a.knobs), spec=a,
                              upstream=a.upstream, arch_flags=tuple(a.arch_flags))
        _location(a, e.alternative, file, f"{key}.source", need_one=False)
    if method == "source":
        _location(s, e, file, key, need_one=True)
    return e


def _load_component(path: Path, toolchains: dict[str, Toolchain]) -> Component:
    d = _read_yaml(path)
    f: ComponentFile = _parse(ComponentFile, d, path)
    raw = {str(k): v or {} for k, v in (d.get("toolchains") or {}).items()}
    entries = {}
    for name, spec in f.toolchains.items():
        key = key_path(("toolchains", name))
        if name not in toolchains:
            raise _fail(path, key, f"unknown toolchain (toolchains.yaml defines {', '.join(toolchains)}).")
        entries[name] = _entry(spec, raw[name], path, key, f.kind)
    for name in toolchains:
        if name not in entries:
            raise _fail(path, key_path(("toolchains", name)), "missing: every component says how it is obtained "
                                                               "for every toolchain in toolchains.yaml.")
    p = f.parallelism
    par = p and Parallelism(float(p.memory_gib_per_job), p.nvcc_threads, tuple(p.jobs_knobs), tuple(p.threads_knobs),
                            tuple(p.threads_defines))
    arch_knob = _arch_knob(f.arch_knob, path)
    for name, e in entries.items():
        if e.method in COMPILING_METHODS and par is None:
            raise _fail(path, "parallelism", f"{key_path(('toolchains', name))} builds from source, so the recipe "
                                             "must declare parallelism.memory_gib_per_job (the memory one compile "
                                             "job needs).")
        if e.method == "aot" and getattr(arch_knob, "style", "") != "suffixed":
            raise _fail(path, "arch_knob", f"{key_path(('toolchains', name))} compiles FlashInfer modules ahead of time: "
                        "that needs arch_knob {style: suffixed, knob: FLASHINFER_CUDA_ARCH_LIST} (case C4).")
    return Component(
        name=f.node if f.node is not None else path.stem, stem=path.stem, file=path, kind=f.kind,
        needs=list(f.needs), description=f.description, est_disk_gib=float(f.est_disk_gib),
        arch_knob=arch_knob, knobs=dict(f.knobs), parallelism=par, toolchains=entries, raw=d,
        spec=f)


# ------------------------------------------------------------------------------------- cross-file
def load_recipes(recipes_dir: str | Path | None = None) -> RecipeSet:
    """Load and validate a recipes folder (``toolchains.yaml`` + one ``<component>.yaml`` each).

    Returns a :class:`RecipeSet` whose components are in file-name order. Raises :class:`RecipeError`
    (file and key named) for any unknown key, missing pin, bad type, dangling ``needs`` or cycle, and
    for a version set that contradicts itself (``requires`` / torch line).
    """
    d = Path(recipes_dir) if recipes_dir else DEFAULT_RECIPES_DIR
    if not d.is_dir():
        raise UsageError(f"Recipes folder {d} does not exist: pass --recipes DIR with toolchains.yaml in it.")
    archs, suffixes, toolchains = _load_toolchains(d / "toolchains.yaml")
    components: dict[str, Component] = {}
    for path in sorted(d.glob("*.yaml")):
        if path.name == "toolchains.yaml":
            continue
        c = _load_component(path, toolchains)
        if c.name in components:
            raise _fail(path, "node", f"node name '{c.name}' is also used by {components[c.name].file.name}.")
        components[c.name] = c
    if not components:
        raise RecipeError(f"Recipes folder {d} has no component files next to toolchains.yaml.")
    check_graph(components)
    check_pins(components, toolchains)
    return RecipeSet(d, archs, suffixes, toolchains, components)
