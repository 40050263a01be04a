"""Triton as a compiler on the engine's path (check 6 of :mod:`stackprobe.health`): whether the ptxas Triton
would call can compile for the target, decided by asking that ptxas, and which installed engine code compiles its
kernels through Triton (case C57).

Facts used:

* Which ptxas Triton calls: ``TRITON_PTXAS_PATH`` when it names a file, else the one its wheel bundles,
  ``triton/backends/nvidia/bin/ptxas`` (triton 3.2.0, ``triton/backends/nvidia/compiler.py`` ``_path_to_binary``);
  Triton compiles for ``sm_<cc>`` (``sm_90a`` for 9.0: the same file's ``make_ptx``/``make_cubin``).
* A ptxas too old for the target fails with ``ptxas fatal : Value 'sm_120' is not defined for option 'gpu-name'``
  (triton 3.2.0 bundles the CUDA 12.4 ptxas; InternLM/lmdeploy#3410, triton-lang/triton#8539). The check compiles
  an empty PTX module (``.version 7.0``, ``.target sm_80``) with ``--gpu-name sm_<cc>``: the same option parsing
  Triton's call meets, no GPU needed.
* Engine code that compiles through Triton: the engine's own ``.py`` files that define ``@triton.jit`` kernels
  (read as text; none is imported).

:func:`check` returns {} when Triton is not installed, else {"version", "ptxas", "ptxas_source", "ptxas_release",
"target", "compiles" (True | False | None: not assessed), "error", "users": [{"dist", "version", "files",
"examples"}], "not_assessed" (why, when ``compiles`` is None)}.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from importlib import util
from pathlib import Path

ENGINE_DISTS = ("sglang", "vllm", "lmdeploy")
_RELEASE = re.compile(r"release (\d+\.\d+)")
_JIT = re.compile(r"^\s*@triton\.jit", re.M)
_EMPTY_PTX = ".version 7.0\n.target sm_80\n.address_size 64\n"


def triton_root() -> Path | None:
    """The installed ``triton`` package folder, found without importing it."""
    try:
        spec = util.find_spec("triton")
    except (ImportError, ValueError):
        return None
    locs = list(spec.submodule_search_locations or []) if spec else []
    return Path(locs[0]) if locs else None


def triton_ptxas(root: Path, env=None) -> tuple[str | None, str]:
    """(path, where it came from) of the ptxas Triton calls: ``TRITON_PTXAS_PATH``, else its bundled one."""
    env = os.environ if env is None else env
    named = env.get("TRITON_PTXAS_PATH", "")
    if named and os.path.isfile(named):
        return named, "TRITON_PTXAS_PATH"
    bundled = root / "backends" / "nvidia" / "bin" / "ptxas"
    return (str(bundled), "bundled with the triton wheel") if bundled.is_file() else (None, "")


def gpu_name(target) -> str:
    """``sm_<cc>`` as Triton 3.2 passes it to ptxas (``sm_90a`` for 9.0)."""
    number = target.major * 10 + target.minor
    return "sm_90a" if number == 90 else f"sm_{number}"


def compiles(ptxas: str, name: str, timeout: float = 60) -> tuple[bool | None, str]:
    """(True | False, ptxas's message) for an empty PTX module compiled for ``name``; (None, why) when ptxas
    cannot be run here."""
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "empty.ptx"
        src.write_text(_EMPTY_PTX)
        try:
            p = subprocess.run([ptxas, "--gpu-name", name, str(src), "-o", str(Path(d) / "empty.cubin")],
                               capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"{ptxas} could not be run here ({type(e).__name__}: {e})"
    msg = (p.stderr + p.stdout).strip()
    return p.returncode == 0, msg.splitlines()[-1] if msg else ""


def ptxas_release(ptxas: str) -> str | None:
    """The CUDA release of a ptxas (``--version``: "Cuda compilation tools, release 12.4, V12.4.99")."""
    try:
        out = subprocess.run([ptxas, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = _RELEASE.search(out)
    return m.group(1) if m else None


def engine_users(dists: dict) -> list[dict]:
    """Installed engines whose own files define Triton kernels: [{"dist", "version", "files", "examples"}]."""
    out = []
    for name in ENGINE_DISTS:
        d = dists.get(name)
        if d is None:
            continue
        hits = []
        for f in d.files or []:
            if f.suffix != ".py":
                continue
            try:
                text = Path(f.locate()).read_text(errors="replace")
            except OSError:
                continue
            if _JIT.search(text):
                hits.append(str(f))
        if hits:
            out.append({"dist": name, "version": d.version, "files": len(hits), "examples": sorted(hits)[:3]})
    return out


def check(target, dists: dict, env=None) -> dict:
    """Check 6 (see the module docstring). ``target``: the :class:`stackprobe.archs.Arch` the stack is for."""
    d = dists.get("triton")
    if d is None:
        return {}
    root = triton_root()
    out: dict = {"version": d.version, "target": gpu_name(target), "ptxas": None, "ptxas_source": "",
                 "ptxas_release": None, "compiles": None, "error": "", "users": engine_users(dists)}
    ptxas, source = triton_ptxas(root, env) if root else (None, "")
    if ptxas is None:
        out["not_assessed"] = (f"triton {d.version} has no ptxas here (neither TRITON_PTXAS_PATH nor "
                               "triton/backends/nvidia/bin/ptxas)")
        return out
    out.update(ptxas=ptxas, ptxas_source=source, ptxas_release=ptxas_release(ptxas))
    ok, msg = compiles(ptxas, out["target"])
    out["compiles"], out["error"] = ok, ("" if ok else msg)
    if ok is None:
        out["not_assessed"] = msg
    return out


def finding(t: dict) -> dict | None:
    """The health finding for a ptxas that cannot compile for the target (None otherwise)."""
    if not t or t.get("compiles") is not False:
        return None
    users = "; ".join(f"{u['dist']} {u['version']} ({u['files']} files with @triton.jit kernels, e.g. {u['examples'][0]})"
                      for u in t["users"]) or "no engine installed here; the engines"
    return {"check": "triton", "level": "error", "message":
            f"Triton {t['version']} cannot compile for {t['target']}: the ptxas it calls ({t['ptxas']}, "
            f"{t['ptxas_source']}, CUDA {t['ptxas_release'] or '?'}) says \"{t['error']}\" (InternLM/lmdeploy#3410, "
            f"triton-lang/triton#8539); {users} compile their own kernels through Triton at first use, which fails "
            f"here: install a Triton whose ptxas knows {t['target']}"}
