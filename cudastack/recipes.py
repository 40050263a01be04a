"""Recipes as data: load ``recipes/*.yaml`` and validate them against the schema before anything runs.

A recipes folder holds ``toolchains.yaml`` (the CUDA toolchains, the arch table and the suffix rules)
and one file per component (``<name>.yaml``). Each component names its node ``kind`` and what it
``needs``, so the build DAG comes from the data: a test folder can describe a chain of three nodes.

Component file schema (every key not listed is an error that names the file and the key)::

    kind: base | image | wheels | runtime       # required
    node: runtime                               # optional node name (default: the file's stem)
    needs: [torch]                              # required (may be empty): the nodes this one needs;
                                                #   the first base/image node among them is the image parent
    description: "..."                          # optional
    est_disk_gib: 4                             # optional, used by the free-disk preflight
    arch_knob:                                  # how the target arch list maps onto this component's knob
      style: torch-list | numbers | suffixed | cmake-fixed
      knob: TORCH_CUDA_ARCH_LIST                # not for cmake-fixed
      separator: ";"                            # default ";" (" " for suffixed)
      scope: build | env                        # env: also set in the runtime image's environment
      ignores: [TORCH_CUDA_ARCH_LIST]           # cmake-fixed: variables the build ignores (case C10)
      covers: [{arch: "12.0a", min_cuda: "12.8"}]  # cmake-fixed: archs hard-coded in its build files
    knobs: {NAME: "value"}                      # fixed build knobs (source: recipe)
    parallelism:                                # required for `source` entries (case C8)
      memory_gib_per_job: 9                     # GiB one compile job needs at nvcc_threads threads
      nvcc_threads: 4
      jobs_knobs: [MAX_JOBS]                    # knobs that receive the job count
      threads_knobs: [NVCC_THREADS]             # knobs that receive the per-job thread count
      threads_defines: [SGL_KERNEL_COMPILE_THREADS]   # CMake cache variables that receive it (CMAKE_ARGS)
    toolchains:                                 # required: one entry per toolchain in toolchains.yaml
      "13.1":
        method: wheel | source                  # base components leave it out
        packages: ["torch==2.14.1"]             # wheel (and runtime): exact `==` pins
        index: "https://..."                    # optional index URL ("" = PyPI)
        sdist: {package: flash-attn, version: "2.8.3"}      # source: one of sdist / git / path
        git: {url: "https://...", commit: "<40 hex>", ref: "v1.2"}
        path: "../cuda_ext"                     # a local folder, relative to the recipe file
        url: {url: "https://.../x.tar.gz", sha256: "<64 hex>"}   # an upstream source tarball
        subdir: "sgl-kernel"                    # source: the folder inside the source that holds the build
        cmake_defines: {ENABLE_BELOW_SM90: "OFF"}   # source: CMake cache variables, passed as CMAKE_ARGS
        unit_cost: aten                         # source: which measured unit class of cudastack/unit_costs.yaml
                                                #   the dry run's time estimate uses (aten | cutlass)
        units_from: tree                        # source: how the dry run counts compile units: "lists" (default:
                                                #   CMakeLists targets, then setup.py names) or "tree" (every file)
        source: {url: ..., patches: ..., ...}   # wheel entries: the source build a user selects with
                                                #   `--method NAME=source` (keys: sdist, git, path, url, subdir,
                                                #   upstream, knobs, patches, build_deps, cmake_defines,
                                                #   arch_flags); with no location, `--source NAME=DIR` gives one
        patches:                                # any source: literal edits applied to the fetched tree
          - {file: setup.py, replace: "-std=c++17", with: "-std=c++20", why: "..."}   # before building;
                                                # a replace that matches nothing is a build error
        build_deps: ["scikit-build-core==0.11.6"]   # source: pinned build backend, installed first
                                                #   (builds run without isolation: BUILD_DEPS build arg)
        requires: {torch: "2.14.1"}             # pins the package's METADATA demands (checked)
        knobs: {NAME: "value"}                  # per-toolchain knobs (override the file's knobs)

Errors: :class:`cudastack.errors.RecipeError` (exit code 3), one paragraph naming file and key.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from cudastack.errors import RecipeError, UsageError
from stackprobe.archs import ArchSpecError, parse_arch, version_tuple

DEFAULT_RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"

NODE_KINDS = ("base", "image", "wheels", "runtime")
METHODS = ("wheel", "source")
ARCH_STYLES = ("torch-list", "numbers", "suffixed", "cmake-fixed")
BASE_KINDS = ("pip", "nvidia")

_COMPONENT_KEYS = {"kind", "node", "needs", "description", "est_disk_gib", "arch_knob", "knobs",
                   "parallelism", "toolchains"}
_ENTRY_KEYS = {"method", "packages", "index", "sdist", "git", "path", "url", "subdir", "requires", "knobs", "patches",
               "build_deps", "cmake_defines", "source", "unit_cost", "units_from"}
# keys of a ``source:`` alternative (a wheel entry's source build, selected with --method NAME=source)
_ALT_KEYS = {"sdist", "git", "path", "url", "subdir", "upstream", "knobs", "patches", "build_deps", "cmake_defines",
             "arch_flags", "unit_cost", "units_from"}
SOURCE_KINDS = ("sdist", "git", "path", "url")
_PATCH_KEYS = {"file", "replace", "with", "why"}
_ARCH_KNOB_KEYS = {"style", "knob", "separator", "scope", "ignores", "covers"}
_PAR_KEYS = {"memory_gib_per_job", "nvcc_threads", "jobs_knobs", "threads_knobs", "threads_defines"}
_TC_FILE_KEYS = {"archs", "suffixes", "toolchains"}
_TC_KEYS = {"cuda_version", "default_base", "bases", "torch"}
_BASE_KEYS = {"pip": {"os_image", "os_suite", "python", "pip_specs", "wheel_root", "has_nvcc"},
              "nvidia": {"image", "python", "has_nvcc"}}
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

    method: str                    # "wheel" | "source" | "" (base)
    packages: tuple[str, ...] = ()
    index: str = ""
    sdist: dict | None = None
    git: dict | None = None
    path: Path | None = None       # resolved absolute path of a local source folder
    requires: dict[str, str] = field(default_factory=dict)
    knobs: dict[str, str] = field(default_factory=dict)
    patches: tuple[dict, ...] = ()   # [{"file", "replace", "with", "why"}] applied to an unpacked sdist
    build_deps: tuple[str, ...] = ()  # pinned requirements installed before a source build
    url: dict | None = None        # {"url", "sha256"}: an upstream source tarball
    subdir: str = ""               # the folder inside the source that holds the build (e.g. sgl-kernel)
    cmake_defines: dict[str, str] = field(default_factory=dict)   # -DNAME=VALUE through CMAKE_ARGS
    arch_flags: tuple[str, ...] = ()  # gencode targets a build with hard-coded archs passes (cmake-fixed)
    upstream: str = ""             # where the source comes from when the recipe pins no location
    unit_cost: str = "aten"        # the measured unit class for the dry run's time estimate (cudastack.costs)
    units_from: str = "lists"      # how the dry run counts units: the build's source lists, or the whole tree
    alternative: "Entry | None" = None   # a wheel entry's `source:` build (--method NAME=source)
    raw: dict = field(default_factory=dict)

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
def _where(file: Path, key: str) -> str:
    return f"{file.name}: {key}" if key else file.name


def _fail(file: Path, key: str, msg: str) -> RecipeError:
    return RecipeError(f"Recipe {file} key '{key}': {msg}" if key else f"Recipe {file}: {msg}")


def _mapping(value: Any, file: Path, key: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(file, key, f"expected a mapping, got {type(value).__name__}.")
    return value


def _check_keys(d: dict, allowed: set[str], required: set[str], file: Path, key: str) -> None:
    prefix = f"{key}." if key else ""
    for k in d:
        if k not in allowed:
            raise _fail(file, f"{prefix}{k}", f"unknown key (allowed here: {', '.join(sorted(allowed))}). "
                                             "Check the spelling.")
    for k in sorted(required):
        if k not in d:
            raise _fail(file, f"{prefix}{k}", "required key is missing.")


def _str(value: Any, file: Path, key: str) -> str:
    if isinstance(value, bool):
        raise _fail(file, key, f"YAML read {value!r} as a boolean: quote the value (\"{str(value).upper()}\").")
    if isinstance(value, (int, float, str)):
        return str(value)
    raise _fail(file, key, f"expected a string, got {type(value).__name__}.")


def _str_list(value: Any, file: Path, key: str) -> list[str]:
    if not isinstance(value, list):
        raise _fail(file, key, f"expected a list, got {type(value).__name__}.")
    return [_str(v, file, f"{key}[{i}]") for i, v in enumerate(value)]


def _version(value: Any, file: Path, key: str) -> str:
    text = _str(value, file, key)
    if not re.match(r"^\d+(\.\d+)+", text):
        raise _fail(file, key, f"'{text}' is not a version number like 13.1 or 13.1.1.")
    return text


def _pinned(spec: str, file: Path, key: str) -> Requirement:
    """An exact pin ``name==1.2.3`` (extras allowed). Anything looser is an error: builds must be
    reproducible and the lockfile must record one version."""
    try:
        req = Requirement(spec)
    except InvalidRequirement as exc:
        raise _fail(file, key, f"'{spec}' is not a requirement: {exc}.") from None
    specs = list(req.specifier)
    if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
        raise _fail(file, key, f"'{spec}' is not pinned: write an exact version, e.g. {req.name}==1.2.3.")
    return req


def _knobs(value: Any, file: Path, key: str) -> dict[str, str]:
    out = {}
    for k, v in _mapping(value, file, key).items():
        if not _KNOB_NAME.match(str(k)):
            raise _fail(file, f"{key}.{k}", "a knob is an environment variable name (UPPER_CASE).")
        out[str(k)] = _str(v, file, f"{key}.{k}")
    return out


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


# -------------------------------------------------------------------------------------- toolchains
def _load_toolchains(path: Path) -> tuple[dict, dict, dict]:
    if not path.is_file():
        raise RecipeError(f"No toolchains file: {path} is missing. A recipes folder needs toolchains.yaml "
                          "(the CUDA toolchains) next to the component files.")
    data = _read_yaml(path)
    _check_keys(data, _TC_FILE_KEYS, {"archs", "toolchains"}, path, "")
    archs: dict[str, ArchInfo] = {}
    for cc, info in _mapping(data["archs"], path, "archs").items():
        key = f"archs.{cc}"
        try:
            a = parse_arch(str(cc))
        except ArchSpecError as exc:
            raise _fail(path, key, str(exc)) from None
        info = _mapping(info, path, key)
        _check_keys(info, {"min_cuda", "dropped_in"}, {"min_cuda"}, path, key)
        archs[a.cc] = ArchInfo(a.cc, _version(info["min_cuda"], path, f"{key}.min_cuda"),
                               _version(info["dropped_in"], path, f"{key}.dropped_in") if "dropped_in" in info else "")
    suffixes: dict[str, dict[str, str]] = {}
    for sfx, rule in _mapping(data.get("suffixes"), path, "suffixes").items():
        key = f"suffixes.{sfx}"
        if sfx not in ("a", "f"):
            raise _fail(path, key, "only the suffixes 'a' and 'f' exist.")
        rule = _mapping(rule, path, key)
        _check_keys(rule, {"min_cuda", "min_arch"}, {"min_cuda"}, path, key)
        suffixes[sfx] = {k: _version(v, path, f"{key}.{k}") for k, v in rule.items()}
    toolchains: dict[str, Toolchain] = {}
    for name, tc in _mapping(data["toolchains"], path, "toolchains").items():
        name = str(name)
        key = f"toolchains.{name}"
        tc = _mapping(tc, path, key)
        _check_keys(tc, _TC_KEYS, _TC_KEYS, path, key)
        cuda = _version(tc["cuda_version"], path, f"{key}.cuda_version")
        if version_tuple(cuda)[:2] != version_tuple(name)[:2]:
            raise _fail(path, f"{key}.cuda_version", f"{cuda} is not a {name} release.")
        bases: dict[str, BaseChoice] = {}
        for bk, b in _mapping(tc["bases"], path, f"{key}.bases").items():
            bkey = f"{key}.bases.{bk}"
            if bk not in BASE_KINDS:
                raise _fail(path, bkey, f"unknown base kind (known: {', '.join(BASE_KINDS)}).")
            b = _mapping(b, path, bkey)
            _check_keys(b, _BASE_KEYS[bk], _BASE_KEYS[bk], path, bkey)
            if not isinstance(b["has_nvcc"], bool):
                raise _fail(path, f"{bkey}.has_nvcc", "expected true or false.")
            if bk == "pip":
                specs = _str_list(b["pip_specs"], path, f"{bkey}.pip_specs")
                for i, s in enumerate(specs):
                    _pinned(s, path, f"{bkey}.pip_specs[{i}]")
                bases[bk] = BaseChoice("pip", _version(b["python"], path, f"{bkey}.python"), b["has_nvcc"],
                                       os_image=_str(b["os_image"], path, f"{bkey}.os_image"),
                                       os_suite=_str(b["os_suite"], path, f"{bkey}.os_suite"),
                                       pip_specs=tuple(specs),
                                       wheel_root=_str(b["wheel_root"], path, f"{bkey}.wheel_root"))
            else:
                bases[bk] = BaseChoice("nvidia", _version(b["python"], path, f"{bkey}.python"), b["has_nvcc"],
                                       image=_str(b["image"], path, f"{bkey}.image"))
        default_base = _str(tc["default_base"], path, f"{key}.default_base")
        if default_base not in bases:
            raise _fail(path, f"{key}.default_base", f"'{default_base}' is not one of this toolchain's bases "
                                                      f"({', '.join(bases)}).")
        t = _mapping(tc["torch"], path, f"{key}.torch")
        _check_keys(t, {"version", "cuda", "index"}, {"version", "cuda"}, path, f"{key}.torch")
        toolchains[name] = Toolchain(name, cuda, default_base, bases,
                                     _version(t["version"], path, f"{key}.torch.version"),
                                     _version(t["cuda"], path, f"{key}.torch.cuda"),
                                     _str(t.get("index", ""), path, f"{key}.torch.index"), tc)
    if not toolchains:
        raise _fail(path, "toolchains", "no toolchain is defined.")
    return archs, suffixes, toolchains


# -------------------------------------------------------------------------------------- components
def _load_arch_knob(value: Any, file: Path) -> ArchKnob | None:
    if value is None:
        return None
    d = _mapping(value, file, "arch_knob")
    _check_keys(d, _ARCH_KNOB_KEYS, {"style"}, file, "arch_knob")
    style = _str(d["style"], file, "arch_knob.style")
    if style not in ARCH_STYLES:
        raise _fail(file, "arch_knob.style", f"'{style}' is not a known style ({', '.join(ARCH_STYLES)}).")
    knob = _str(d.get("knob", ""), file, "arch_knob.knob")
    if style != "cmake-fixed" and not _KNOB_NAME.match(knob):
        raise _fail(file, "arch_knob.knob", f"style {style} needs the knob's name (an UPPER_CASE variable).")
    scope = _str(d.get("scope", "build"), file, "arch_knob.scope")
    if scope not in ("build", "env"):
        raise _fail(file, "arch_knob.scope", "must be 'build' or 'env'.")
    covers = []
    for i, c in enumerate(d.get("covers") or []):
        ck = f"arch_knob.covers[{i}]"
        c = _mapping(c, file, ck)
        _check_keys(c, {"arch", "min_cuda"}, {"arch", "min_cuda"}, file, ck)
        try:
            parse_arch(str(c["arch"]))
        except ArchSpecError as exc:
            raise _fail(file, f"{ck}.arch", str(exc)) from None
        covers.append((str(c["arch"]), _version(c["min_cuda"], file, f"{ck}.min_cuda")))
    if style == "cmake-fixed" and not covers:
        raise _fail(file, "arch_knob.covers", "style cmake-fixed must list the archs its build files hard-code.")
    sep_default = " " if style == "suffixed" else ";"
    return ArchKnob(style, knob, _str(d.get("separator", sep_default), file, "arch_knob.separator"), scope,
                    tuple(_str_list(d.get("ignores", []), file, "arch_knob.ignores")), tuple(covers))


def _load_parallelism(value: Any, file: Path) -> Parallelism | None:
    if value is None:
        return None
    d = _mapping(value, file, "parallelism")
    _check_keys(d, _PAR_KEYS, {"memory_gib_per_job", "jobs_knobs"}, file, "parallelism")
    mem = d["memory_gib_per_job"]
    if isinstance(mem, bool) or not isinstance(mem, (int, float)) or mem <= 0:
        raise _fail(file, "parallelism.memory_gib_per_job", "expected a positive number of GiB.")
    threads = d.get("nvcc_threads", 1)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise _fail(file, "parallelism.nvcc_threads", "expected a positive integer.")
    return Parallelism(float(mem), threads, tuple(_str_list(d["jobs_knobs"], file, "parallelism.jobs_knobs")),
                       tuple(_str_list(d.get("threads_knobs", []), file, "parallelism.threads_knobs")),
                       tuple(_str_list(d.get("threads_defines", []), file, "parallelism.threads_defines")))


def _load_location(d: dict, e: Entry, file: Path, key: str, *, need_one: bool) -> None:
    """Read the source location keys (sdist / git / path / url, subdir, patches, build_deps, cmake_defines)
    of a source entry or a ``source:`` alternative into ``e``."""
    sources = [k for k in SOURCE_KINDS if k in d]
    if len(sources) > 1 or (need_one and len(sources) != 1):
        raise _fail(file, f"{key}.{sources[1] if len(sources) > 1 else 'sdist'}",
                    "a source recipe names exactly one of: sdist, git, path, url.")
    src = sources[0] if sources else ""
    if src == "sdist":
        s = _mapping(d["sdist"], file, f"{key}.sdist")
        _check_keys(s, {"package", "version"}, {"package", "version"}, file, f"{key}.sdist")
        e.sdist = {"package": _str(s["package"], file, f"{key}.sdist.package"),
                   "version": _version(s["version"], file, f"{key}.sdist.version")}
    elif src == "git":
        g = _mapping(d["git"], file, f"{key}.git")
        _check_keys(g, {"url", "commit", "ref"}, {"url", "commit"}, file, f"{key}.git")
        commit = _str(g["commit"], file, f"{key}.git.commit")
        if not re.fullmatch(r"[0-9a-f]{40}", commit):
            raise _fail(file, f"{key}.git.commit", "pin the full 40-hex commit (a branch or tag moves).")
        e.git = {"url": _str(g["url"], file, f"{key}.git.url"), "commit": commit,
                 "ref": _str(g.get("ref", ""), file, f"{key}.git.ref")}
    elif src == "url":
        u = _mapping(d["url"], file, f"{key}.url")
        _check_keys(u, {"url", "sha256"}, {"url", "sha256"}, file, f"{key}.url")
        url = _str(u["url"], file, f"{key}.url.url")
        if not re.match(r"^(https?|file)://", url) or not re.search(r"\.(tar\.gz|tgz|tar\.xz|tar\.bz2|zip)$", url):
            raise _fail(file, f"{key}.url.url", f"'{url}' is not the http(s) URL of a source archive "
                                                 "(.tar.gz, .tgz, .tar.xz, .tar.bz2 or .zip).")
        digest = _str(u["sha256"], file, f"{key}.url.sha256").lower()
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise _fail(file, f"{key}.url.sha256", "give the archive's sha256 (64 hex digits), as its release "
                                                    "page or a checksum file publishes it.")
        e.url = {"url": url, "sha256": digest}
    elif src == "path":
        p = (file.parent / _str(d["path"], file, f"{key}.path")).resolve()
        if not p.is_dir():
            raise _fail(file, f"{key}.path", f"{p} is not a folder.")
        e.path = p
    if "subdir" in d:
        sub = _str(d["subdir"], file, f"{key}.subdir")
        if sub.startswith("/") or ".." in Path(sub).parts:
            raise _fail(file, f"{key}.subdir", "a folder inside the source, e.g. sgl-kernel.")
        e.subdir = sub
    if "patches" in d:
        if not isinstance(d["patches"], list) or not d["patches"]:
            raise _fail(file, f"{key}.patches", "expected a non-empty list of {file, replace, with}.")
        pl = []
        for i, pt in enumerate(d["patches"]):
            pk = f"{key}.patches[{i}]"
            pt = _mapping(pt, file, pk)
            _check_keys(pt, _PATCH_KEYS, {"file", "replace", "with"}, file, pk)
            rel = _str(pt["file"], file, f"{pk}.file")
            if rel.startswith("/") or ".." in Path(rel).parts:
                raise _fail(file, f"{pk}.file", "a path inside the source tree (after subdir), e.g. setup.py.")
            pl.append({"file": rel, "replace": _str(pt["replace"], file, f"{pk}.replace"),
                       "with": _str(pt["with"], file, f"{pk}.with"), "why": _str(pt.get("why", ""), file, f"{pk}.why")})
        e.patches = tuple(pl)
    if "build_deps" in d:
        deps = _str_list(d["build_deps"], file, f"{key}.build_deps")
        for i, spec in enumerate(deps):
            _pinned(spec, file, f"{key}.build_deps[{i}]")
        e.build_deps = tuple(deps)
    if "unit_cost" in d:
        from cudastack.costs import unit_costs

        e.unit_cost = _str(d["unit_cost"], file, f"{key}.unit_cost")
        if e.unit_cost not in unit_costs()["classes"]:
            raise _fail(file, f"{key}.unit_cost", f"'{e.unit_cost}' is not a measured unit class "
                                                   f"({', '.join(unit_costs()['classes'])}).")
    if "units_from" in d:
        e.units_from = _str(d["units_from"], file, f"{key}.units_from")
        if e.units_from not in ("lists", "tree"):
            raise _fail(file, f"{key}.units_from", "'lists' (the build's source lists) or 'tree' (every file).")
    if "cmake_defines" in d:
        defs = {}
        for k, v in _mapping(d["cmake_defines"], file, f"{key}.cmake_defines").items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(k)):
                raise _fail(file, f"{key}.cmake_defines.{k}", "a CMake cache variable name (letters, digits, _).")
            defs[str(k)] = _str(v, file, f"{key}.cmake_defines.{k}")
        e.cmake_defines = defs


def _load_alternative(value: Any, file: Path, key: str) -> Entry:
    """A wheel entry's ``source:`` block: the source build ``--method NAME=source`` selects."""
    d = _mapping(value, file, key)
    _check_keys(d, _ALT_KEYS, set(), file, key)
    e = Entry("source", raw={"method": "source", **d}, knobs=_knobs(d.get("knobs"), file, f"{key}.knobs"))
    _load_location(d, e, file, key, need_one=False)
    e.upstream = _str(d.get("upstream", ""), file, f"{key}.upstream")
    if not e.source_kind and not e.upstream:
        raise _fail(file, f"{key}.upstream", "a source block with no sdist, git, path or url must say where the "
                                              "source comes from (upstream: ...); the user then gives a checkout "
                                              "with --source NAME=DIR.")
    flags = _str_list(d.get("arch_flags", []), file, f"{key}.arch_flags")
    for i, f in enumerate(flags):
        if not re.fullmatch(r"sm_\d+[af]?", f):
            raise _fail(file, f"{key}.arch_flags[{i}]", f"'{f}' is not a SASS target such as sm_120a.")
    e.arch_flags = tuple(flags)
    return e


def _load_entry(value: Any, file: Path, key: str, kind: str) -> Entry:
    d = _mapping(value, file, key)
    _check_keys(d, _ENTRY_KEYS, set() if kind == "base" else {"method"}, file, key)
    method = _str(d.get("method", ""), file, f"{key}.method")
    if kind == "base":
        if method:
            raise _fail(file, f"{key}.method", "a base node takes its method from toolchains.yaml and --base.")
    elif method not in METHODS:
        raise _fail(file, f"{key}.method", f"'{method}' is not a method ({', '.join(METHODS)}).")
    if kind == "runtime" and method != "wheel":
        raise _fail(file, f"{key}.method", "a runtime node installs pinned wheels: method must be 'wheel'.")
    e = Entry(method, raw=d, knobs=_knobs(d.get("knobs"), file, f"{key}.knobs"),
              index=_str(d.get("index", ""), file, f"{key}.index"))
    if "packages" in d:
        pk = _str_list(d["packages"], file, f"{key}.packages")
        for i, s in enumerate(pk):
            _pinned(s, file, f"{key}.packages[{i}]")
        e.packages = tuple(pk)
    sources = [k for k in SOURCE_KINDS if k in d]
    if method == "wheel":
        if not e.packages and kind != "runtime":
            raise _fail(file, f"{key}.packages", "a wheel recipe needs its pinned packages (name==version).")
        for k in (*sources, "patches", "build_deps", "subdir", "cmake_defines"):
            if k in d:
                raise _fail(file, f"{key}.{k}", "only source recipes name a source, its patches and build "
                                                "dependencies (a wheel entry's source build goes under `source:`).")
        if "source" in d:
            if kind not in ("image", "wheels"):
                raise _fail(file, f"{key}.source", f"a {kind} node has no source build.")
            e.alternative = _load_alternative(d["source"], file, f"{key}.source")
    if method == "source":
        if "source" in d:
            raise _fail(file, f"{key}.source", "this entry already builds from source: put its location here.")
        _load_location(d, e, file, key, need_one=True)
    req = _mapping(d.get("requires"), file, f"{key}.requires")
    e.requires = {str(k): _version(v, file, f"{key}.requires.{k}") for k, v in req.items()}
    return e


def _load_component(path: Path, toolchains: dict[str, Toolchain]) -> Component:
    d = _read_yaml(path)
    _check_keys(d, _COMPONENT_KEYS, {"kind", "needs", "toolchains"}, path, "")
    kind = _str(d["kind"], path, "kind")
    if kind not in NODE_KINDS:
        raise _fail(path, "kind", f"'{kind}' is not a node kind ({', '.join(NODE_KINDS)}).")
    needs = _str_list(d["needs"] if d["needs"] is not None else [], path, "needs")
    est = d.get("est_disk_gib", 1)
    if isinstance(est, bool) or not isinstance(est, (int, float)) or est < 0:
        raise _fail(path, "est_disk_gib", "expected a number of GiB.")
    tcs = _mapping(d["toolchains"], path, "toolchains")
    entries = {}
    for name in tcs:
        if str(name) not in toolchains:
            raise _fail(path, f"toolchains.{name}", f"unknown toolchain (toolchains.yaml defines "
                                                     f"{', '.join(toolchains)}).")
        entries[str(name)] = _load_entry(tcs[name], path, f"toolchains.{name}", kind)
    for name in toolchains:
        if name not in entries:
            raise _fail(path, f"toolchains.{name}", "missing: every component says how it is obtained for "
                                                     "every toolchain in toolchains.yaml.")
    par = _load_parallelism(d.get("parallelism"), path)
    for name, e in entries.items():
        if e.method == "source" and par is None:
            raise _fail(path, "parallelism", f"toolchains.{name} builds from source, so the recipe must declare "
                                             "parallelism.memory_gib_per_job (the memory one compile job needs).")
    return Component(
        name=_str(d.get("node", path.stem), path, "node"), stem=path.stem, file=path, kind=kind, needs=needs,
        description=_str(d.get("description", ""), path, "description"), est_disk_gib=float(est),
        arch_knob=_load_arch_knob(d.get("arch_knob"), path), knobs=_knobs(d.get("knobs"), path, "knobs"),
        parallelism=par, toolchains=entries, raw=d)


# ------------------------------------------------------------------------------------- cross-file
def _check_graph(components: dict[str, Component]) -> None:
    bases = [c for c in components.values() if c.kind == "base"]
    if len(bases) != 1:
        names = ", ".join(c.file.name for c in bases) or "none"
        raise RecipeError(f"A recipes folder needs exactly one component of kind 'base' (found: {names}).")
    for c in components.values():
        for i, n in enumerate(c.needs):
            if n not in components:
                raise _fail(c.file, f"needs[{i}]", f"'{n}' is not a component here "
                                                   f"(known: {', '.join(components)}).")
        if c.kind != "base":
            if not c.needs:
                raise _fail(c.file, "needs", f"a {c.kind} node needs at least its image parent.")
            if not any(components[n].kind in ("base", "image") for n in c.needs):
                raise _fail(c.file, "needs", "none of these is a base or image node to build FROM.")
        elif c.needs:
            raise _fail(c.file, "needs", "the base node needs nothing.")
        if c.kind in ("base", "image", "wheels"):
            for n in c.needs:
                if components[n].kind in ("wheels", "runtime") and c.kind != "runtime":
                    raise _fail(c.file, "needs", f"'{n}' is a {components[n].kind} node; only a runtime node "
                                                 "installs other nodes' wheels.")
    # cycles
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            raise _fail(components[name].file, "needs", f"cycle: {' -> '.join(trail + [name])}.")
        state[name] = 1
        for n in components[name].needs:
            visit(n, trail + [name])
        state[name] = 2

    for name in components:
        visit(name, [])


def _check_pins(components: dict[str, Component], toolchains: dict[str, Toolchain]) -> None:
    for tc in toolchains:
        pinned: dict[str, tuple[str, Component]] = {}
        for c in components.values():
            for spec in c.toolchains[tc].packages:
                r = Requirement(spec)
                pinned[canonicalize_name(r.name)] = (next(iter(r.specifier)).version, c)
            if c.toolchains[tc].sdist:
                s = c.toolchains[tc].sdist
                pinned[canonicalize_name(s["package"])] = (s["version"], c)
        torch = pinned.get("torch")
        if torch and torch[0] != toolchains[tc].torch_version:
            raise _fail(torch[1].file, f"toolchains.{tc}.packages",
                        f"torch=={torch[0]} but toolchains.yaml says toolchain {tc} uses the torch "
                        f"{toolchains[tc].torch_version} line; make them agree.")
        for c in components.values():
            for pkg, ver in c.toolchains[tc].requires.items():
                key = f"toolchains.{tc}.requires.{pkg}"
                have = pinned.get(canonicalize_name(pkg))
                if have is None:
                    raise _fail(c.file, key, f"no recipe pins {pkg} for toolchain {tc}.")
                if have[0] != ver:
                    raise _fail(c.file, key, f"{pkg}=={ver} is required but {have[1].file.name} pins "
                                             f"{pkg}=={have[0]}: the set is inconsistent.")


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
    _check_graph(components)
    _check_pins(components, toolchains)
    return RecipeSet(d, archs, suffixes, toolchains, components)


def select_methods(recipes: RecipeSet, toolchain: str, methods: dict[str, str] | None = None,
                   sources: dict[str, str] | None = None) -> RecipeSet:
    """The recipes with the methods a user chose for one toolchain (``--method NAME=wheel|source``) and local
    source folders (``--source NAME=DIR``: a checkout that replaces the source block's location; its patches
    still apply). Returns a new RecipeSet (the input is not changed).

    Raises UsageError (one paragraph, before anything is built) for an unknown component or method, a
    component without a ``source:`` block, a folder that does not exist, or a selected source build that
    has no location and no ``--source``.
    """
    import copy

    methods, sources = dict(methods or {}), dict(sources or {})
    if not methods and not sources:
        return recipes
    tc = recipes.toolchain(toolchain).name
    out = copy.copy(recipes)
    out.components = dict(recipes.components)
    for name, method in methods.items():
        c = recipes.component(name)
        if method not in METHODS:
            raise UsageError(f"--method {name}={method}: the method is 'wheel' or 'source'.")
        e = c.toolchains[tc]
        if method == e.method:
            continue
        if method == "wheel":
            raise UsageError(f"--method {name}=wheel: {c.file.name} builds {c.name} from source for CUDA {tc} and "
                             "names no wheel to use instead; edit the recipe to change that.")
        if e.alternative is None:
            raise UsageError(f"--method {name}=source: {c.file.name} has no source build for CUDA {tc} (no "
                             f"`source:` block under toolchains.{tc}). Add one (url + sha256, git + commit, or "
                             "path, with its knobs and patches), or leave the component on its wheel.")
        if c.kind == "image" and c.parallelism is None:
            raise UsageError(f"--method {name}=source: {c.file.name} declares no parallelism (memory per compile "
                             "job), which a source build needs.")
        alt = copy.copy(e.alternative)
        alt.index, alt.requires = e.index, dict(e.requires)
        c2 = copy.copy(c)
        c2.toolchains = dict(c.toolchains)
        c2.toolchains[tc] = alt
        out.components[c.name] = c2
    for name, folder in sources.items():
        c = out.component(name)
        e = c.toolchains[tc]
        if e.method != "source":
            raise UsageError(f"--source {name}={folder}: {c.name} is not built from source for CUDA {tc}; add "
                             f"--method {c.stem}=source.")
        p = Path(folder).expanduser().resolve()
        if not p.is_dir():
            raise UsageError(f"--source {name}={folder}: {p} is not a folder. Give the checkout (or unpacked "
                             "release) of the component's source.")
        e = copy.copy(e)
        e.sdist = e.git = e.url = None
        e.path = p
        e.raw = {**{k: v for k, v in e.raw.items() if k not in SOURCE_KINDS}, "path": str(p)}
        c2 = copy.copy(c)
        c2.toolchains = dict(c.toolchains)
        c2.toolchains[tc] = e
        out.components[c.name] = c2
    for c in out.components.values():
        e = c.toolchains[tc]
        if e.method == "source" and not e.source_kind:
            raise UsageError(f"{c.name}: its source build for CUDA {tc} pins no location ({e.upstream}). Give a "
                             f"checkout with --source {c.stem}=DIR.")
        if e.method == "source" and c.parallelism is None:
            raise UsageError(f"{c.name}: a source build needs the recipe's parallelism block ({c.file.name}).")
    return out
