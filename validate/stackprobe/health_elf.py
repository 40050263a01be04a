"""Shared-object facts for the environment health stage (:mod:`stackprobe.health`), read with the suite's own
ELF reader (:mod:`stackprobe.elfread`, standard library only: the check runs in any target environment; it
used pyelftools before, which no engine stack installs, and was silently off without it, case C60):

* :func:`needed`: an extension's ``DT_NEEDED`` entries (the libraries the dynamic loader must find);
* :func:`cuda_majors`: the CUDA major each needed CUDA library names in its soname (``libcudart.so.12`` ->
  12; cuBLAS, cuBLASLt, NVRTC, nvJitLink and CUPTI the same way);
* :func:`undefined_symbols` / :func:`missing_symbols`: the global undefined dynamic symbols of an extension
  that none of the libraries it names (resolved in the folders given, e.g. torch's ``lib/``) exports: what
  ``dlopen`` would report as ``undefined symbol`` once every library is found, decided without loading
  (a CPU-only host cannot load an extension that also needs the driver's ``libcuda.so.1``);
* :func:`demangle`: ``c++filt`` from binutils when present, else the mangled name is kept and said so.

Sonames and their majors: NVIDIA ships each CUDA library with the toolkit major in its soname (CUDA Toolkit
release notes, "CUDA Toolkit Major Component Versions"); ``libcuda.so.1`` is the driver's and carries none.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

from .elfread import ELF, STB_GLOBAL

#: CUDA libraries whose soname carries the toolkit major (``libcudart.so.13``)
#: (cuFFT, cuRAND, cuSPARSE and cuSOLVER are versioned on their own: CUDA 13.0 ships libcufft.so.12, so they
#: say nothing about the toolkit major and are left out)
CUDA_SONAMES = ("libcudart", "libcublas", "libcublasLt", "libnvrtc", "libnvJitLink", "libcupti")
_SONAME = re.compile(r"^(lib[\w+-]+?)\.so\.(\d+)")
#: mangled-name prefixes of the namespaces torch's libraries export (c10::, at::, torch::, caffe2::)
TORCH_PREFIXES = ("_ZN3c10", "_ZNK3c10", "_ZN2at", "_ZNK2at", "_ZN5torch", "_ZNK5torch", "_ZN6caffe2", "_ZNK6caffe2")
#: the torch library that defines each namespace (torch's own CMake targets: c10 -> libc10.so, ...)
NAMESPACE_LIBRARY = (("c10::cuda::", "libc10_cuda.so"), ("c10::", "libc10.so"), ("at::cuda::", "libtorch_cuda.so"),
                     ("at::", "libtorch_cpu.so"), ("torch::", "libtorch_cpu.so"), ("caffe2::", "libtorch_cpu.so"))


def _elf(path: str) -> ELF:
    return ELF(path)


def is_elf(path: str | Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


@lru_cache(maxsize=4096)
def needed(path: str) -> tuple[str, ...]:
    """The ``DT_NEEDED`` sonames of the shared object at ``path`` (() when it has no dynamic section).
    Raises OSError / :class:`stackprobe.elfread.ELFReadError` for an unreadable file."""
    with _elf(path) as elf:
        return elf.needed()


def cuda_majors(sonames) -> dict[str, int]:
    """{soname: CUDA major} for the CUDA libraries among ``sonames`` (:data:`CUDA_SONAMES`)."""
    out = {}
    for s in sonames:
        m = _SONAME.match(s)
        if m and m.group(1) in CUDA_SONAMES:
            out[s] = int(m.group(2))
    return out


def undefined_symbols(path: str, prefixes: tuple = TORCH_PREFIXES) -> list[str]:
    """Global (not weak) undefined dynamic symbols of ``path`` whose mangled name starts with one of ``prefixes``."""
    with _elf(path) as elf:
        return [s.name for s in elf.dynamic_symbols()
                if not s.defined and s.bind == STB_GLOBAL and s.name.startswith(prefixes)]


class _Exports:
    """Defined dynamic symbols of one library (one read of its ``.dynsym``; libtorch_cpu.so's few hundred
    thousand names take well under a second)."""

    def __init__(self, path: str):
        self.path = path
        with _elf(path) as elf:
            self.names = {s.name for s in elf.dynamic_symbols() if s.defined}

    def defines(self, name: str) -> bool:
        return name in self.names

    def close(self):
        self.names = set()


def missing_symbols(path: str, search: list[str | Path], prefixes: tuple = TORCH_PREFIXES) -> dict:
    """Which of ``path``'s undefined symbols (:func:`undefined_symbols`) none of its needed libraries found in the
    ``search`` folders (and, one level down, the libraries those need from the same folders) defines.

    Returns {"checked": n symbols, "libraries": [resolved library paths], "unresolved_libraries": [sonames of
    ``path``'s needed libraries matching torch's names (libc10*, libtorch*) not found in ``search``: then nothing
    is judged and "undecided" says why],
    "missing": [{"symbol", "demangled", "expected_in"}]}. Raises OSError / ELFReadError for an unreadable file."""
    folders = [Path(p) for p in search if p and Path(p).is_dir()]
    libs, unresolved, seen = [], [], set()

    def resolve(soname):
        for d in folders:
            if (d / soname).is_file():
                return str(d / soname)
        return None

    for soname in needed(path):
        p = resolve(soname)
        if p is None:
            if soname.startswith(("libc10", "libtorch")):
                unresolved.append(soname)
            continue
        for lib in (p,) + tuple(q for q in (resolve(s) for s in needed(p)) if q):
            if lib not in seen:
                seen.add(lib)
                libs.append(lib)
    wanted = undefined_symbols(path, prefixes)
    if unresolved:   # a CPU build of torch lacks libc10_cuda.so / libtorch_cuda.so: its exports cannot answer
        return {"checked": 0, "libraries": libs, "unresolved_libraries": unresolved, "missing": [],
                "undecided": f"torch here has no {', '.join(unresolved)} (a CPU build?): symbols not judged"}
    exports = [_Exports(lib) for lib in libs]
    try:
        miss = [s for s in wanted if not any(e.defines(s) for e in exports)]
    finally:
        for e in exports:
            e.close()
    names = demangle(miss)
    return {"checked": len(wanted), "libraries": libs, "unresolved_libraries": unresolved,
            "missing": [{"symbol": s, "demangled": names.get(s, s), "expected_in": expected_library(names.get(s, s))}
                        for s in miss]}


#: C symbols by prefix -> the library that defines them (NCCL's API is ``nccl*``, its profiling twins ``pnccl*``:
#: nccl.h; cuBLAS ``cublas*``/``cublasLt*``: cublas_api.h / cublasLt.h)
C_PREFIX_LIBRARY = (("pnccl", "libnccl.so.2"), ("nccl", "libnccl.so.2"), ("cublasLt", "libcublasLt.so"),
                    ("cublas", "libcublas.so"))


def expected_library(demangled: str) -> str:
    """The library that should define a demangled name: torch's by its namespace (:data:`NAMESPACE_LIBRARY`), a C
    API's by its prefix (:data:`C_PREFIX_LIBRARY`: ``ncclCommResume`` -> libnccl.so.2); ""."""
    head = demangled.split("(")[0]
    for ns, lib in NAMESPACE_LIBRARY:
        if head.startswith(ns) or f" {ns}" in head:
            return lib
    if "::" not in head:
        for prefix, lib in C_PREFIX_LIBRARY:
            if head.startswith(prefix):
                return lib
    return ""


def demangle(symbols) -> dict[str, str]:
    """{mangled: demangled} through ``c++filt`` (binutils); with no c++filt every name maps to itself plus the
    note ``(mangled: c++filt not found)``."""
    symbols = [s for s in symbols if s]
    if not symbols:
        return {}
    exe = shutil.which("c++filt")
    if exe:
        try:
            p = subprocess.run([exe], input="\n".join(symbols) + "\n", capture_output=True, text=True, timeout=30)
            lines = p.stdout.splitlines()
            if p.returncode == 0 and len(lines) == len(symbols):
                return dict(zip(symbols, lines))
        except (OSError, subprocess.TimeoutExpired):
            pass
    return {s: f"{s} (mangled: c++filt not found)" for s in symbols}
