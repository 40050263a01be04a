"""Driver floors for every CUDA user on a path, not only torch (check 7 of :mod:`stackprobe.health`, case C56).

A path needs the driver floor of each CUDA major it loads (:data:`stackprobe.driver.MAJOR_DRIVER_FLOOR`, NVIDIA's
minor version compatibility): torch's own is applied by :func:`stackprobe.driver.driver_floor`; here

* NVIDIA's Python bindings: ``cuda-bindings`` (and the ``cuda-python`` metapackage that pulls it in) of major M
  call the driver API of CUDA M: cuda-bindings 13 needs a driver >= 580 (NVIDIA/cutlass#2866: ``cuda-bindings``
  13 on a 575 driver fails at ``cuInit``). A path needs it when a module it imports at import time (the backend's
  modules, :data:`stackprobe.probes.needs.NEEDS`, and what they import, walked statically with :mod:`ast`, no code
  run) imports ``cuda.bindings`` or ``cuda`` (FlashInfer's ``comm/mnnvl.py``: ``from cuda.bindings import driver``,
  which ``flashinfer.comm`` imports);
* extension modules of the path's distributions: the CUDA major of the libraries they link (``DT_NEEDED``);
* the libnccl that loads: the CUDA version its version string names (``2.26.2+cuda12.2``).

:func:`floors` returns {backend: [{"user", "cuda_major", "needs", "evidence"}]} and :func:`blocks` the blocks for a
driver below a floor; without a driver (static only) nothing blocks and the floors stay as evidence.
"""
from __future__ import annotations

import ast
import re
from functools import lru_cache
from importlib import util
from pathlib import Path

from .archs import version_tuple
from .driver import MAJOR_DRIVER_FLOOR
from .probes.needs import NEEDS

BINDINGS_DISTS = ("cuda-bindings", "cuda-python")
_SKIP = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


@lru_cache(maxsize=64)
def _package_root(top: str) -> str | None:
    try:
        spec = util.find_spec(top)     # a top-level name: nothing is imported
    except (ImportError, ValueError):
        return None
    locs = list(spec.submodule_search_locations or []) if spec else []
    return locs[0] if locs else (spec.origin if spec and spec.origin else None)


def module_file(name: str) -> Path | None:
    """The source file of module ``name`` found from its top-level package's folder, without importing anything."""
    root = _package_root(name.split(".")[0])
    if root is None:
        return None
    base = Path(root)
    if base.is_file():
        return base if "." not in name else None
    rest = name.split(".")[1:]
    p = base.joinpath(*rest) if rest else base
    for cand in (p / "__init__.py", p.with_suffix(".py")):
        if cand.is_file():
            return cand
    return None


def _imports(path: Path, name: str) -> list[tuple[str, int]]:
    """(absolute module name, line) of the imports ``path`` runs at import time (function bodies left out)."""
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except (SyntaxError, OSError, ValueError):
        return []
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list = []

    def walk(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _SKIP):
                continue
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = pkg.split(".")
                    base = base[:len(base) - (child.level - 1)] if child.level > 1 else base
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                out.append((mod, child.lineno))
                out.extend((f"{mod}.{a.name}", child.lineno) for a in child.names if a.name != "*")
            else:
                walk(child)

    walk(tree)
    return out


@lru_cache(maxsize=64)   # the FlashInfer paths share their modules: one walk for all of them
def bindings_import(start: tuple[str, ...], limit: int = 3000) -> dict | None:
    """Whether importing the modules ``start`` imports NVIDIA's CUDA Python bindings: the first
    {"module", "file", "line", "imports", "chain": [module, ...]} found, walking the import statements statically
    (within the packages of ``start``), else None."""
    tops = {s.split(".")[0] for s in start}
    seen: dict = {}
    start = tuple(sorted(start, key=lambda s: -s.count(".")))   # the most specific module first
    todo: list[tuple[str, str | None]] = [(s, None) for s in start]   # the path's own modules first (their parents run too: walked after)
    for s in start:
        parts = s.split(".")
        todo += [(".".join(parts[:i]), None) for i in range(1, len(parts))]
    while todo and len(seen) < limit:
        name, parent = todo.pop(0)
        if name in seen:
            continue
        seen[name] = parent
        f = module_file(name)
        if f is None:
            continue
        for mod, line in _imports(f, name):
            if mod == "cuda" or mod.startswith("cuda."):
                chain, m = [name], parent
                while m:
                    chain.append(m)
                    m = seen.get(m)
                return {"module": name, "file": str(f), "line": line, "imports": mod, "chain": chain[::-1]}
            if mod.split(".")[0] in tops and mod not in seen:
                todo.append((mod, name))
    return None


def _major(version: str | None) -> int | None:
    v = version_tuple(version or "")
    return v[0] if v else None


def floors(backends, dists: dict, shared: list, nccl: dict) -> dict:
    """{backend: [{"user", "cuda_major", "needs", "evidence"}]} (see the module docstring)."""
    bind = next(((d, dists[d].version) for d in BINDINGS_DISTS if d in dists), None)
    if bind and "cuda-bindings" in dists:
        bind = ("cuda-bindings", dists["cuda-bindings"].version)
    nccl_cuda = re.search(r"\+cuda(\d+)", (nccl or {}).get("version_string") or "")
    out: dict = {}
    for b in backends:
        need, rows = NEEDS[b], []
        if bind and _major(bind[1]) in MAJOR_DRIVER_FLOOR:
            mods = tuple(m for m, _ in need.modules if m.split(".")[0] != "torch")
            hit = bindings_import(mods) if mods else None
            major = _major(bind[1])
            if hit and major is not None:
                rows.append({"user": f"{bind[0]} {bind[1]}", "cuda_major": major, "needs": MAJOR_DRIVER_FLOOR[major],
                             "evidence": f"{' -> '.join(hit['chain'])} imports {hit['imports']} "
                                         f"({Path(hit['file']).name}:{hit['line']})",
                             "source": "NVIDIA/cutlass#2866 (cuda-bindings 13 needs a driver >= 580); CUDA minor "
                                       "version compatibility"})
        for s in shared:
            if s["dist"] in need.dists and s.get("cuda"):
                major = max(s["cuda"].values())
                if major in MAJOR_DRIVER_FLOOR:
                    rows.append({"user": f"{s['dist']} {s['version']} {s['file']}", "cuda_major": major,
                                 "needs": MAJOR_DRIVER_FLOOR[major], "evidence": f"links {', '.join(sorted(s['cuda']))}",
                                 "source": "DT_NEEDED; CUDA minor version compatibility"})
                    break
        if nccl_cuda and "torch" in need.dists and int(nccl_cuda.group(1)) in MAJOR_DRIVER_FLOOR:
            major = int(nccl_cuda.group(1))
            rows.append({"user": f"libnccl {nccl.get('version_string')}", "cuda_major": major,
                         "needs": MAJOR_DRIVER_FLOOR[major], "evidence": f"{nccl.get('library')} is built for CUDA "
                         f"{nccl_cuda.group(1)}", "source": "the library's version string"})
        if rows:
            out[b] = rows
    return out


def below(driver: dict, row: dict) -> bool:
    """Whether the host's driver (``{"version", "cuda"}``) is below ``row``'s floor (False without a driver)."""
    have = (driver or {}).get("version")
    if not have:
        return False
    if version_tuple(have) < version_tuple(row["needs"]):
        return True
    return bool(driver.get("cuda")) and version_tuple(driver["cuda"])[:1] < (row["cuda_major"],)
