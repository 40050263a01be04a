"""Costs before building: for each source node of a plan, the arch flags that reach the compiler, the compile
units it will run (counted from the source), the memory rule's jobs and an estimate of the time on this builder.

**Arch flags** (:func:`arch_flags`): from the node's arch knob as the component's build turns it into
``-gencode`` targets: torch's ``TORCH_CUDA_ARCH_LIST`` ("12.0" -> sm_120, "+PTX" adds compute_120:
torch.utils.cpp_extension / cmake/Modules_CUDA_fix select_compute_arch), flash-attn style numbers ("120" ->
sm_120), FlashInfer style suffixed ("12.0f" -> sm_120f); for a build that hard-codes its archs (sgl-kernel,
case C10) the source block's ``arch_flags`` (what its CMakeLists passes for this toolchain with the recipe's
``cmake_defines``), else the recipe's ``covers``.

**Compile units** (:func:`count_units`), from the source as this builder has it:

* a local folder (``path``, ``--source``) with a ``CMakeLists.txt`` that lists its sources
  (``set(NAME "a.cu" ...)``, ``list(APPEND NAME ...)``): each target (``add_library``,
  ``Python_add_library``, ``add_executable``, ``cuda_add_library``) counts the .cu / .cc / .cpp / .c files
  it names directly or through such a list; a file under a ``${...}`` folder that is not in the tree (a
  FetchContent dependency) still counts, since the list names it; a ``file(GLOB ...)`` is resolved against
  the tree when it can be and otherwise reported as unresolved;
* any other local folder, or a source archive already downloaded into the state folder: every .cu / .cc /
  .cpp / .c file, leaving out tests, benchmarks, docs and examples (an upper bound: a build may skip some,
  e.g. other backends' files in torch's tree);
* a URL, git or sdist source not fetched yet: "unknown until fetched" (never a guess).

Each .cu unit compiles once per arch flag (nvcc runs cicc and ptxas per target), so ``cu x archs`` is the
device work; C++ units compile once.

**Time**: ``(cu x (front end + archs x seconds per arch) + cpp x seconds per C++ unit) / jobs``, from the
per-unit costs measured on a builder and stored in ``unit_costs.yaml`` next to this module (with the date,
host cores and toolchain), scaled by the memory rule's jobs (capped by the cores). It is an estimate: a
unit's cost varies several-fold with its templates; the figure for each component's class says which unit
was measured.
"""
from __future__ import annotations

import fnmatch
import re
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path


from cudastack.recipes.unit_costs import unit_costs

CU = (".cu",)
CPP = (".cc", ".cpp", ".cxx", ".c")
_SKIP_DIRS = {"test", "tests", "benchmarks", "benchmark", "docs", "doc", "examples", "example", ".git", "build",
              "dist", "__pycache__"}
_TARGET = re.compile(r"\b(?:Python_add_library|add_library|add_executable|cuda_add_library)\s*\(([^)]*)\)",
                     re.IGNORECASE)
_LIST = re.compile(r"\b(set|list)\s*\(([^)]*)\)", re.IGNORECASE)
_GLOB = re.compile(r"\bfile\s*\(\s*GLOB(?:_RECURSE)?\s+(\S+)([^)]*)\)", re.IGNORECASE)


@dataclass
class UnitCount:
    """Compile units of one source: ``cu`` and ``cpp`` counts, how they were counted (``how``) and what
    could not be resolved (``unresolved``: e.g. globs over FetchContent folders). ``known`` False: the
    source is not on this builder yet (``how`` says why)."""

    cu: int = 0
    cpp: int = 0
    how: str = ""
    known: bool = True
    unresolved: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------- arch flags
def _sm(spec: str) -> list[str]:
    spec = spec.strip()
    ptx = spec.upper().endswith("+PTX")
    spec = spec[:-4] if ptx else spec
    m = re.fullmatch(r"(?:sm_|compute_)?(\d+)(?:\.(\d))?([af]?)", spec)
    if not m:
        return []
    num = f"{m.group(1)}{m.group(2) or ''}" if m.group(2) is not None else m.group(1)
    out = [f"sm_{num}{m.group(3)}"]
    if ptx:
        out.append(f"compute_{num}{m.group(3)}")
    return out


def arch_flags(style: str, value: str, separator: str, fixed: tuple[str, ...] = ()) -> list[str]:
    """The SASS/PTX targets a build passes to nvcc for one arch knob value (see module doc). ``fixed``: the
    targets a cmake-fixed build hard-codes."""
    if style == "cmake-fixed":
        return list(fixed)
    parts = [p for p in re.split(r"[\s;,]+" if separator.strip() == "" else re.escape(separator), value) if p.strip()]
    out: list[str] = []
    for p in parts:
        for s in _sm(p):
            if s not in out:
                out.append(s)
    return out


# ------------------------------------------------------------------------------------------ counting
def _kind(name: str) -> str:
    n = name.lower()
    return "cu" if n.endswith(CU) else "cpp" if n.endswith(CPP) else ""


def _skip(rel_parts: tuple[str, ...]) -> bool:
    return any(p in _SKIP_DIRS for p in rel_parts[:-1])


def count_tree(names: list[str]) -> tuple[int, int]:
    """(cu, cpp) over relative file names, leaving out tests, benchmarks, docs, examples and build outputs."""
    cu = cpp = 0
    for n in names:
        parts = tuple(Path(n).parts)
        if not parts or _skip(parts):
            continue
        k = _kind(parts[-1])
        cu += k == "cu"
        cpp += k == "cpp"
    return cu, cpp


def _words(text: str) -> list[str]:
    text = re.sub(r"#[^\n]*", "", text)
    return [w.strip('"') for w in re.findall(r'"[^"]*"|\S+', text)]


class Tree:
    """A source tree to count in: a folder or an archive (its top folder and ``subdir`` taken off);
    ``names``: relative file names; :meth:`read`: a file's text ("" when absent)."""

    def __init__(self, names: list[str], reader, label: str):
        self.names, self._reader, self.label = names, reader, label

    @classmethod
    def folder(cls, root: Path) -> "Tree":
        names = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]
        return cls(names, lambda n: (root / n).read_text(errors="replace") if (root / n).is_file() else "", root.name + "/")

    @classmethod
    def archive(cls, archive: Path, subdir: str = "") -> "Tree":
        names = _archive_names(archive)
        top = names[0].split("/", 1)[0] + "/" if names and "/" in names[0] else ""
        prefix = top + (subdir.strip("/") + "/" if subdir else "")
        rel = [n[len(prefix):] for n in names if n.startswith(prefix)]

        def read(n: str) -> str:
            if archive.name.endswith(".zip"):
                with zipfile.ZipFile(archive) as z:
                    try:
                        return z.read(prefix + n).decode(errors="replace")
                    except KeyError:
                        return ""
            with tarfile.open(archive) as t:
                try:
                    f = t.extractfile(prefix + n)
                except KeyError:
                    return ""
                return f.read().decode(errors="replace") if f else ""

        return cls(rel, read, archive.name)

    def read(self, name: str) -> str:
        return self._reader(name)


def count_in(tree: Tree, units_from: str = "lists") -> UnitCount:
    """The build's source lists when it has them (CMakeLists.txt targets, then setup.py's literal source
    names), else, or with ``units_from`` "tree" (a build whose lists live in many CMake files, torch), every
    .cu/.cc/.cpp/.c file of the tree."""
    for counter in ((count_cmake, count_setup_py) if units_from == "lists" else ()):
        c = counter(tree)
        if c is not None:
            return c
    cu, cpp = count_tree(tree.names)
    return UnitCount(cu, cpp, f"every .cu/.cc/.cpp/.c file in {tree.label} (tests, docs, examples left out; an "
                              "upper bound: the build may skip some)")


def _other_backend(path: str) -> bool:
    """Whether a source path belongs to a ROCm build (a path part ending in ``_ck``, Composable Kernel, or named
    rocm/hip), which a CUDA build never compiles: flash-attn 2.8.3.post2's setup.py names
    ``csrc/flash_attn_ck/*.cpp`` (7 files) in its ROCm branch beside the CUDA branch's 72 .cu and flash_api.cpp,
    and ninja's counter in the CUDA build reads /73."""
    parts = [q.lower() for q in Path(path).parts[:-1]]
    return any(q.endswith("_ck") or q in ("rocm", "hip") for q in parts)


def count_setup_py(tree: Tree) -> UnitCount | None:
    """Units named as string literals in ``setup.py`` ("csrc/x.cu", "src/host.cpp"), each checked against the
    tree; a literal with a wildcard is matched against the tree; a ROCm build's sources are left out
    (:func:`_other_backend`). None when it names none. The count is the build's own step count (ninja's
    ``[n/N]``, which the build's progress shows), so the dry run and the build count the same units."""
    text = tree.read("setup.py")
    if not text:
        return None
    lits = re.findall(r"""["']([^"'\s]+\.(?:cu|cc|cpp|cxx|c))["']""", text)
    if not lits:
        return None
    names = set(tree.names)
    files: set[str] = set()
    lits = [lit for lit in lits if not _other_backend(lit)]
    for lit in lits:
        if any(ch in lit for ch in "*?["):
            files.update(n for n in names if fnmatch.fnmatch(n, lit))
        elif lit in names:
            files.add(lit)
    if not files:
        return None
    cu = sum(_kind(f) == "cu" for f in files)
    return UnitCount(cu, len(files) - cu, f"the source files setup.py names ({len(files)} found in {tree.label})")


def count_cmake(tree: Tree) -> UnitCount | None:
    """Units of the targets in the tree's top ``CMakeLists.txt`` (see module doc), or None when it lists no
    source files."""
    text = tree.read("CMakeLists.txt")
    if not text:
        return None
    text = re.sub(r"#[^\n]*", "", text)
    all_names = tree.names
    lists: dict[str, list[str]] = {}
    unresolved: list[str] = []
    for m in _GLOB.finditer(text):
        var, rest = m.group(1), _words(m.group(2))
        files: list[str] = []
        for pat in rest:
            if "${" in pat and not pat.startswith("${CMAKE_CURRENT_SOURCE_DIR}") and not pat.startswith("${PROJECT_SOURCE_DIR}"):
                unresolved.append(pat)
                continue
            rel = re.sub(r"^\$\{(CMAKE_CURRENT_SOURCE_DIR|PROJECT_SOURCE_DIR)\}/", "", pat)
            files += [n for n in all_names if fnmatch.fnmatch(n, rel)]
        lists.setdefault(var, []).extend(files)
    for m in _LIST.finditer(text):
        cmd, words = m.group(1).lower(), _words(m.group(2))
        if cmd == "set" and words:
            name, vals = words[0], words[1:]
            lists[name] = _expand(vals, lists)
        elif cmd == "list" and len(words) >= 2 and words[0].upper() == "APPEND":
            lists.setdefault(words[1], []).extend(_expand(words[2:], lists))
    cu = cpp = 0
    targets = 0
    for m in _TARGET.finditer(text):
        words = _words(m.group(1))[1:]
        files = [f for f in _expand(words, lists) if _kind(f)]
        if not files:
            continue
        targets += 1
        cu += sum(_kind(f) == "cu" for f in files)
        cpp += sum(_kind(f) == "cpp" for f in files)
    if not targets:
        return None
    how = (f"the source lists of {targets} CMake targets in CMakeLists.txt (a file in two targets counts twice"
           + ("; unresolved globs: " + ", ".join(unresolved) if unresolved else "") + ")")
    return UnitCount(cu, cpp, how, True, unresolved)


def _expand(words: list[str], lists: dict[str, list[str]]) -> list[str]:
    out: list[str] = []
    for w in words:
        m = re.fullmatch(r"\$\{(\w+)\}", w)
        if m and m.group(1) in lists:
            out += lists[m.group(1)]
        else:
            out.append(w)
    return out


def count_units(fetch: dict, context: dict, state_dir: str | Path = ".stack", sdist: dict | None = None,
                units_from: str = "lists") -> UnitCount:
    """Count a source node's compile units (module doc). ``fetch``/``context``/``sdist``: the PlannedNode's
    fields (a patched sdist is counted from the state folder's sdist cache when it is there)."""
    spec = dict(fetch or {})
    if sdist:
        found = sorted((Path(state_dir) / "sdists").glob(
            f"{re.sub(r'[-_.]+', '[-_.]', sdist['package'])}-{sdist['version']}.*"))
        found = [f for f in found if f.name.endswith((".tar.gz", ".zip"))]
        if not found:
            return UnitCount(how="the sdist is not in the state folder yet", known=False)
        return count_in(Tree.archive(found[0]), units_from)
    path = spec.get("path") or (context or {}).get("src") or ""
    if path:
        root = Path(path) / spec.get("subdir", "")
        if not root.is_dir():
            return UnitCount(how=f"{root} is not a folder", known=False)
        count = count_in(Tree.folder(root), units_from)
        if count.cu + count.cpp == 0:     # a wrong folder, not a build with nothing to compile
            return UnitCount(how=f"no compile unit found in {root}: is it the build's folder (e.g. the "
                                 "checkout's sgl-kernel folder)?", known=False)
        return count
    if spec.get("kind") == "url":
        from cudastack.plan.sources import archive_name

        archive = Path(state_dir) / "sources" / archive_name(spec["url"])
        if archive.is_file():
            return count_in(Tree.archive(archive, spec.get("subdir", "")), units_from)
        return UnitCount(how="the archive is not in the state folder yet", known=False)
    if spec.get("kind") == "git":
        clone = Path(state_dir) / "sources" / f"git-{spec['commit']}"
        if clone.is_dir():
            return count_units({"kind": "path", "path": str(clone), "subdir": spec.get("subdir", "")}, {}, state_dir,
                               units_from=units_from)
        return UnitCount(how="not cloned into the state folder yet", known=False)
    return UnitCount(how="no local source", known=False)


def _archive_names(archive: Path) -> list[str]:
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            return [n for n in z.namelist() if not n.endswith("/")]
    with tarfile.open(archive) as t:
        return [m.name for m in t.getmembers() if m.isfile()]


# ------------------------------------------------------------------------------------------ estimate
def estimate_seconds(count: UnitCount, n_archs: int, jobs: int, cores: int, unit_class: str) -> float | None:
    """Seconds for ``count`` at ``n_archs`` targets per .cu unit with ``jobs`` compile jobs (capped by
    ``cores``), from the measured class ``unit_class`` of unit_costs.yaml. None when the count is unknown."""
    if not count.known:
        return None
    cls = unit_costs()["classes"][unit_class]
    per_cu = cls["cu_front_seconds"] + max(1, n_archs) * cls["cu_seconds_per_arch"]
    serial = count.cu * per_cu + count.cpp * cls["cpp_seconds"]
    return serial / max(1, min(jobs, cores))


def _fmt(seconds: float) -> str:
    h, rem = divmod(int(seconds), 3600)
    return f"{h} h {rem // 60:02d} min" if h else f"{rem // 60} min {rem % 60:02d} s"


def cost_input(component, entry, knobs, toolchain) -> dict:
    """What :func:`cost_lines` needs of a source node, taken at planning time: the arch knob's style, value
    and separator, the fixed targets of a cmake-fixed build, the jobs knobs and the unit class."""
    from stackprobe.api import version_tuple

    ak = component.arch_knob
    info = {"style": ak.style if ak else "", "separator": ak.separator if ak else ";",
            "jobs_knobs": list(component.parallelism.jobs_knobs) if component.parallelism else [],
            "unit_class": "flashinfer-jit" if entry.method == "aot" else entry.unit_cost,
            "units_from": entry.units_from, "sdist": dict(entry.sdist) if entry.sdist else {},
            "reference": dict(entry.units_reference or {})}
    if entry.method == "aot":
        info["aot"] = {"packages": list(entry.packages), "modules": list(entry.modules)}
    if ak and ak.style == "cmake-fixed":
        if entry.arch_flags:
            info["fixed"] = list(entry.arch_flags)
            info["arch_from"] = f"hard-coded in its build files: the recipe's source.arch_flags for {toolchain.name}"
        else:
            cuda = version_tuple(toolchain.cuda_version)
            info["fixed"] = [f"sm_{a.replace('.', '')}" for a, mc in ak.covers if version_tuple(mc) <= cuda]
            info["arch_from"] = "hard-coded in its build files: the recipe's covers"
    elif ak:
        k = next((k for k in knobs if k.name == ak.knob), None)
        info["value"] = k.value if k else ""
        info["arch_from"] = f"{ak.knob}={info['value']}"
    else:
        info["arch_from"] = "no arch knob in the recipe"
    return info


def cost_lines(node, resources, state_dir: str | Path = ".stack") -> list[str]:
    """The dry run's cost lines for one source or aot node (empty for other nodes): :func:`cost_estimate`'s."""
    return cost_estimate(node, resources, state_dir)[0]


def cost_estimate(node, resources, state_dir: str | Path = ".stack") -> tuple[list[str], float | None]:
    """(cost lines, estimated seconds or None) for one source or aot node (([], None) for other nodes). The units
    are counted from the source on this builder (an aot node: its generators' sources in the pinned FlashInfer
    wheel, :mod:`cudastack.plan.costs_aot`); until it is here, from the recipe's ``units_reference`` when it has one."""
    info = getattr(node, "cost", None) or {}
    if getattr(node, "method", "") not in ("source", "aot") or not info:   # recipes.COMPILING_METHODS (it imports us)
        return [], None
    flags = arch_flags(info["style"], info.get("value", ""), info.get("separator", ";"), tuple(info.get("fixed", ())))
    jobs = next((int(k.value) for k in node.knobs if k.name in info.get("jobs_knobs", ())), 1)
    cores = resources.cores if resources else 1
    if info.get("aot"):
        from cudastack.plan.costs_aot import count_aot_units

        count = UnitCount(**count_aot_units(info["aot"]["packages"], info["aot"]["modules"], state_dir))
    else:
        count = count_units(getattr(node, "fetch", {}), getattr(node, "context", {}), state_dir,
                            getattr(node, "sdist", None) or info.get("sdist") or None, info.get("units_from", "lists"))
    ref = info.get("reference") or {}
    if not count.known and ref:
        count = UnitCount(ref["cu"], ref.get("cpp", 0), f"the recipe's units_reference ({ref['how']}); "
                                                         f"counted from the source once it is here: {count.how}")
    out = [f"    archs   {' '.join(flags) or '(none found)'}  ({info.get('arch_from', '')})"]
    if count.known:
        out.append(f"    units   {count.cu} .cu x {len(flags)} archs + {count.cpp} C/C++  -- {count.how}")
    else:
        out.append(f"    units   unknown until fetched  -- {count.how}")
    cls = info.get("unit_class", "aten")
    data = unit_costs()
    c = data["classes"][cls]
    est = estimate_seconds(count, len(flags), jobs, cores, cls)
    basis = (f"{cls} units: {c['cu_front_seconds']:g} s + {c['cu_seconds_per_arch']:g} s per arch per .cu, "
             f"{c['cpp_seconds']:g} s per C++ (cudastack/unit_costs.yaml, measured {c.get('measured', data['measured'])})")
    jobs_note = f"{jobs} jobs (memory rule) on {cores} cores"
    if est is None:
        out.append(f"    time    unknown until the source is fetched; {jobs_note}; basis {basis}")
    else:
        out.append(f"    time    about {_fmt(est)} with {jobs_note}; basis {basis}")
    return out, est
