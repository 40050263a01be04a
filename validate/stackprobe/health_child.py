"""The child interpreter of the health stage's import check: ``python -m stackprobe.health_child`` reads a JSON
list of module names on stdin, imports them one by one and prints one line per module,
``HEALTH-RESULT {"module", "ok", "error_class", "error", "chain", "where", "seconds"}``
(``chain``: the exceptions it was raised from, innermost last), flushed at once, so a crash or
hang in one module (the parent's timeout) still leaves the answers before it. After the imports it prints
``HEALTH-MAPS {"nccl": [{"path", "version", "version_string", "bound"}]}``: the libnccl files this process has
mapped (``/proc/self/maps``, Linux ``proc(5)``), the one the global symbol scope binds ``ncclGetVersion`` to first, each with ``ncclGetVersion`` (NCCL's ``nccl.h``: code
major*10000 + minor*100 + patch since 2.9) and the ``NCCL version ...`` string the library carries.
Standard library only, besides the modules it is asked to import.
"""
from __future__ import annotations

import importlib
import json
import mmap
import re
import sys
import time
import traceback

_VERSION_STRING = re.compile(rb"NCCL version (\d+\.\d+\.\d+(?:\+cuda[\d.]+)?)")


def _where(e: BaseException) -> str:
    frames = traceback.extract_tb(e.__traceback__)
    return " <- ".join(f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in reversed(frames[-3:]))


def import_one(name: str) -> dict:
    t0 = time.time()
    before = set(sys.modules)
    try:
        importlib.import_module(name)
        return {"module": name, "ok": True, "seconds": round(time.time() - t0, 2)}
    except BaseException as e:  # noqa: BLE001 - SystemExit and friends are findings too
        top = name.split(".")[0]
        for k in set(sys.modules) - before:   # a half-imported parent package would fail the next import oddly
            if k == top or k.startswith(top + "."):
                sys.modules.pop(k, None)
        chain, c = [], e.__cause__ or e.__context__
        while c is not None and len(chain) < 5:
            chain.append(f"{type(c).__name__}: {str(c)[:500]}")
            c = c.__cause__ or c.__context__
        return {"module": name, "ok": False, "error_class": type(e).__name__, "error": str(e)[:2000],
                "chain": chain, "where": _where(e), "seconds": round(time.time() - t0, 2)}


def mapped(pattern: str = "libnccl") -> list[str]:
    """Paths of the files this process maps whose name contains ``pattern``, in the order first mapped."""
    out = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and pattern in parts[5].rsplit("/", 1)[-1] and parts[5].strip() not in out:
                    out.append(parts[5].strip())
    except OSError:
        pass
    return out


def nccl_version(path: str) -> dict:
    """``ncclGetVersion`` of the library at ``path`` (already mapped: ctypes returns the same handle) and the
    version string found in its file."""
    import ctypes

    out: dict = {"path": path, "version": None, "version_string": None}
    try:
        code = ctypes.c_int()
        if ctypes.CDLL(path).ncclGetVersion(ctypes.byref(code)) == 0:
            c = code.value
            out["version"] = (f"{c // 10000}.{c % 10000 // 100}.{c % 100}" if c >= 20900
                              else f"{c // 1000}.{c % 1000 // 100}.{c % 100}")
    except (OSError, AttributeError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            i = m.find(b"NCCL version ")
            while i >= 0 and out["version_string"] is None:
                hit = _VERSION_STRING.match(m[i:i + 80])
                out["version_string"] = hit.group(1).decode() if hit else None
                i = m.find(b"NCCL version ", i + 1)
    except (OSError, ValueError):
        pass
    return out


class _DlInfo(__import__("ctypes").Structure):
    _fields_ = [("dli_fname", __import__("ctypes").c_char_p), ("dli_fbase", __import__("ctypes").c_void_p),
                ("dli_sname", __import__("ctypes").c_char_p), ("dli_saddr", __import__("ctypes").c_void_p)]


def bound_library(symbol: str = "ncclGetVersion") -> str | None:
    """The file whose ``symbol`` the process's global scope resolves to (``dlsym(RTLD_DEFAULT)`` then ``dladdr``,
    dlsym(3)/dladdr(3)): with two libnccl mapped (an ``LD_PRELOAD`` one and torch's own), the one calls bind to."""
    import ctypes
    import os

    try:
        fn = getattr(ctypes.CDLL(None), symbol)
        info = _DlInfo()
        if ctypes.CDLL(None).dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info)) and info.dli_fname:
            return os.path.realpath(info.dli_fname.decode())
    except (OSError, AttributeError):
        pass
    return None


def main() -> int:
    modules = json.loads(sys.stdin.read() or "[]")
    for name in modules:
        print("HEALTH-BEGIN " + name, flush=True)
        print("HEALTH-RESULT " + json.dumps(import_one(name)), flush=True)
    libs = mapped("libnccl")
    bound = bound_library()
    import os
    libs.sort(key=lambda p: os.path.realpath(p) != bound)   # the one symbol lookups bind to first
    print("HEALTH-MAPS " + json.dumps({"nccl": [dict(nccl_version(p), bound=os.path.realpath(p) == bound)
                                                for p in libs]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
