"""Compile units of a FlashInfer ahead-of-time node (recipe ``method: aot``), for the dry run's cost lines.

Each module generator (``flashinfer.jit.comm:gen_trtllm_comm_module``) returns a JitSpec whose sources it
names as literals in its body (FlashInfer 0.7.2 ``flashinfer/jit/comm.py``:
``jit_env.FLASHINFER_CSRC_DIR / "trtllm_allreduce.cu"``, three such files for ``gen_trtllm_comm_module``, one
for ``gen_pcie_ipc_comm_module``). They are read from the pinned flashinfer-python wheel when this builder has
it (a wheelhouse of the state folder: after the node's first build, or any build that exported it), with
Python's ``ast``: nothing is imported or run. A generator that builds its list at run time (a loop over
variants) names no literal and is reported as unresolved rather than counted as zero.
"""
from __future__ import annotations

import ast
import zipfile
from typing import Any
from pathlib import Path

_WHEEL_PACKAGE = "flashinfer_python"
CU, CPP = (".cu",), (".cc", ".cpp", ".cxx", ".c")     # as cudastack.plan.costs counts them (no import: it imports us)


def _find_wheel(packages: list[str], state_dir: str | Path) -> Path | None:
    """The flashinfer-python wheel pinned in ``packages`` ("flashinfer-python==0.7.2") in any wheelhouse of
    ``state_dir``; None when none is there."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    version = next((s.version for r in map(Requirement, packages)
                    if canonicalize_name(r.name) == canonicalize_name(_WHEEL_PACKAGE)
                    for s in r.specifier if s.operator == "=="), "")
    if not version:
        return None
    found = sorted(Path(state_dir).glob(f"wheelhouse/*/{_WHEEL_PACKAGE}-{version}-*.whl"))
    return found[0] if found else None


def generator_sources(source: str, function: str) -> list[str] | None:
    """The file names (``*.cu``, ``*.cpp``, ...) written as string literals in the body of ``function`` in
    the Python ``source``; None when the function is not defined there."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return [c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                    and c.value.endswith(CU + CPP)]
    return None


def _unknown(how: str) -> dict:
    return {"cu": 0, "cpp": 0, "how": how, "known": False, "unresolved": []}


def count_aot_units(packages: list[str], modules: list[str], state_dir: str | Path = ".stack") -> dict:
    """Count the compile units of ``modules`` ("package.module:gen_<name>_module") from the flashinfer-python
    wheel pinned in ``packages``: the fields of :class:`cudastack.plan.costs.UnitCount` as a dict (``cu``, ``cpp``,
    ``how``, ``known``, ``unresolved``). ``known`` False when the wheel is not on this builder or a generator is
    not found in it; ``unresolved`` names a generator whose body lists no file."""
    wheel = _find_wheel(packages, state_dir)
    if wheel is None:
        return _unknown("the flashinfer-python wheel is not in a wheelhouse of the state folder yet")
    count: dict[str, Any] = {"cu": 0, "cpp": 0, "how": "", "known": True, "unresolved": []}
    parts = []
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for spec in modules:
            module, _, function = spec.partition(":")
            member = module.replace(".", "/") + ".py"
            if member not in names:
                return _unknown(f"{member} is not in {wheel.name}")
            files = generator_sources(z.read(member).decode("utf-8", "replace"), function)
            if files is None:
                return _unknown(f"{function} is not defined in {member} of {wheel.name}")
            if not files:
                count["unresolved"].append(spec)
            cu = sum(f.endswith(CU) for f in files)
            count["cu"] += cu
            count["cpp"] += len(files) - cu
            parts.append(f"{function} {cu} .cu" + (f" + {len(files) - cu} C++" if len(files) > cu else ""))
    count["how"] = f"the sources each generator names in {wheel.name}: {', '.join(parts)}"
    return count
