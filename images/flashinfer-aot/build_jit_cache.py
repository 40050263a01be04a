"""Compile FlashInfer JIT modules ahead of time and package them as a ``flashinfer-jit-cache`` wheel.

Runs inside the ``flashinfer`` node's builder stage (images/wheels-aot.Dockerfile), with the pinned
flashinfer-python and its dependencies installed in the builder's Python, nvcc under ``CUDA_HOME`` and
``FLASHINFER_CUDA_ARCH_LIST`` set by the plan (``12.0f`` on CUDA 13.x, ``12.0a`` on 12.8). Standard
library only, plus the installed FlashInfer.

For each ``package.module:gen_function`` given, it calls FlashInfer's own generator (``gen_*_module()``
returns a ``JitSpec``), runs ``JitSpec.build()`` (FlashInfer writes the ninja file and runs nvcc; compile
jobs from ``MAX_JOBS``, compilers launched through ccache with ``FLASHINFER_NVCC_LAUNCHER`` /
``FLASHINFER_CXX_LAUNCHER`` when ccache exists) and copies ``<name>/<name>.so`` into the wheel.

How an installed FlashInfer finds the result (read from the flashinfer-python wheels on PyPI):

* 0.6.x (``flashinfer/jit/env.py`` ``_get_aot_dir``): when a module ``flashinfer_jit_cache`` is importable
  and its ``__version__`` starts with FlashInfer's version, ``get_jit_cache_dir()`` replaces the AOT
  directory; ``JitSpec.is_aot`` is ``<dir>/<name>/<name>.so`` existing, and ``build_and_load`` then loads
  it without building.
* 0.7.x (``flashinfer/jit/env.py`` ``_get_aot_providers`` / ``get_aot_artifacts``): the shim
  ``flashinfer_jit_cache`` must have ``__version__`` equal to FlashInfer's version or that version plus a
  local segment (``0.7.2+cu131``); ``get_jit_cache_providers()`` returns providers with ``provider_id``,
  ``distribution``, ``version`` (equal to the shim's), ``jit_cache_dir``, ``cuda_architectures``
  (``sm120f``) and ``modules``. A provider's module is used when its architectures can run on each target
  of FlashInfer's CompilationContext (``FLASHINFER_CUDA_ARCH_LIST`` in the runtime image).

This module provides both interfaces. The wheel is written here (zip + ``*.dist-info`` with METADATA,
WHEEL and RECORD as in the wheel format, PEP 427 / PEP 376), never with upstream's packaging code.

Exit codes: 0 done; 2 bad input (no arch list, a malformed module or patch, a patch that matches nothing);
3 a module failed to build or produced no library. Every error is one paragraph naming what to change.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

DIST = "flashinfer-jit-cache"
PKG = "flashinfer_jit_cache"
MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:gen_[A-Za-z0-9_]+_module$")
ARCH_RE = re.compile(r"^(\d+)\.(\d)([af]?)$")


class Refused(Exception):
    def __init__(self, code: int, msg: str):
        super().__init__(msg)
        self.code = code


def sm_names(arch_list: str) -> list[str]:
    """``"12.0f 10.0a"`` -> ``["sm100a", "sm120f"]`` (FlashInfer's provider architecture names)."""
    out = []
    for word in arch_list.split():
        m = ARCH_RE.match(word)
        if not m:
            raise Refused(2, f"FLASHINFER_CUDA_ARCH_LIST entry '{word}' is not an arch like 12.0a or 12.0f. "
                             "Set the flashinfer recipe's arch knob (the plan derives it from the target).")
        out.append(f"sm{m.group(1)}{m.group(2)}{m.group(3)}")
    return sorted(set(out))


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise Refused(2, f"Python package '{name}' is not installed in the builder; the node installs the pinned "
                         "flashinfer-python (BUILD_DEPS) before this step.")
    return Path(list(spec.submodule_search_locations)[0])


def apply_patches(root: Path, patches: list[dict]) -> list[dict]:
    """Literal edits to files of the installed FlashInfer package (paths relative to ``flashinfer/``), before
    any module is generated. A ``replace`` that matches nothing is an error (the pinned release changed)."""
    done = []
    for i, pt in enumerate(patches):
        rel = pt.get("file", "")
        if not rel or rel.startswith("/") or ".." in Path(rel).parts:
            raise Refused(2, f"patches[{i}].file '{rel}' must be a path inside the flashinfer package, "
                             "e.g. data/csrc/trtllm_allreduce_fusion.cu or jit/comm.py.")
        path = root / rel
        if not path.is_file():
            raise Refused(2, f"patches[{i}]: {rel} does not exist in the installed FlashInfer ({root}); fix the "
                             "recipe's patch list for this release.")
        text = path.read_text()
        n = text.count(pt["replace"])
        if n == 0:
            raise Refused(2, f"patches[{i}]: '{pt['replace']}' does not occur in flashinfer/{rel}; the pinned "
                             "release differs from the one the patch was written for. Update or drop the patch.")
        path.write_text(text.replace(pt["replace"], pt["with"]))
        done.append({"file": rel, "replace": pt["replace"], "with": pt["with"], "matches": n,
                     "why": pt.get("why", "")})
        print(f"cudastack-aot: patched flashinfer/{rel} ({n} match{'es' if n > 1 else ''})", flush=True)
    return done


def nvcc_version(cuda_home: str) -> str:
    nvcc = Path(cuda_home) / "bin" / "nvcc"
    if not nvcc.is_file():
        raise Refused(2, f"No nvcc at {nvcc}: an ahead-of-time FlashInfer build compiles CUDA sources. Build on "
                         "a base with nvcc (CUDA 13.x pip base, or --base nvidia).")
    out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+\.\d+), V([\d.]+)", out)
    return m.group(2) if m else out.strip().splitlines()[-1]


def build_modules(entries: list[str], stage: Path) -> list[dict]:
    """Generate and build each module with FlashInfer's own JitSpec; copy ``<name>.so`` under ``stage``."""
    built = []
    for entry in entries:
        if not MODULE_RE.match(entry):
            raise Refused(2, f"Module '{entry}' is not 'package.module:gen_<name>_module' "
                             "(e.g. flashinfer.jit.comm:gen_trtllm_comm_module).")
        mod_name, fn_name = entry.split(":")
        try:
            fn = getattr(importlib.import_module(mod_name), fn_name)
        except (ImportError, AttributeError) as exc:
            raise Refused(2, f"Module generator {entry} is not in this FlashInfer release ({exc}); pick one that "
                             f"{mod_name} defines.") from None
        try:
            spec = fn()
        except Exception as exc:   # FlashInfer's own gate (e.g. supported_major_versions) refuses the targets
            raise Refused(3, f"{entry}() refused FLASHINFER_CUDA_ARCH_LIST="
                             f"'{os.environ.get('FLASHINFER_CUDA_ARCH_LIST')}': {type(exc).__name__}: {exc}. "
                             "The module's own arch list does not admit the target: a FlashInfer release whose "
                             "module admits it, or a patch of that list and of the kernels it guards.") from None
        t0 = time.time()
        print(f"cudastack-aot: building {spec.name} ({entry}) with MAX_JOBS={os.environ.get('MAX_JOBS', '')}",
              flush=True)
        try:
            spec.build(verbose=True)
        except Exception as exc:
            raise Refused(3, f"Building {spec.name} ({entry}) failed: {type(exc).__name__}: {exc}") from None
        so = Path(spec.jit_library_path)
        if not so.is_file():
            raise Refused(3, f"Building {spec.name} produced no {so}.")
        dest = stage / PKG / "jit_cache" / spec.name / f"{spec.name}.so"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(so, dest)
        secs = round(time.time() - t0, 1)
        print(f"cudastack-aot: {spec.name}: {dest.stat().st_size} bytes in {secs} s", flush=True)
        built.append({"name": spec.name, "generator": entry, "file": f"jit_cache/{spec.name}/{spec.name}.so",
                      "bytes": dest.stat().st_size, "seconds": secs})
    return built


INIT_TEMPLATE = '''"""FlashInfer JIT modules compiled ahead of time by cudastack (generated; see build.json)."""
import os as _os
from collections import namedtuple as _namedtuple

__version__ = {version!r}
CUDA_ARCHITECTURES = {archs!r}
MODULES = {modules!r}

_Provider = _namedtuple("_Provider", "provider_id distribution version jit_cache_dir cuda_architectures modules")


def get_jit_cache_dir():
    """Folder holding <module>/<module>.so (the interface FlashInfer 0.6.x reads)."""
    return _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "jit_cache")


def get_jit_cache_providers():
    """One provider: this package (the interface FlashInfer 0.7.x reads)."""
    return (_Provider({dist!r}, {dist!r}, __version__, get_jit_cache_dir(), CUDA_ARCHITECTURES, MODULES),)
'''


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(stage: Path, out_dir: Path, version: str, requires: str) -> Path:
    """Zip ``stage/flashinfer_jit_cache`` into ``flashinfer_jit_cache-<version>-py3-none-<platform>.whl`` with
    its dist-info (Metadata-Version 2.1, Root-Is-Purelib false: it holds shared objects)."""
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    tag = f"py3-none-{plat}"
    info = f"{PKG}-{version}.dist-info"
    files: dict[str, bytes] = {}
    for p in sorted((stage / PKG).rglob("*")):
        if p.is_file():
            files[p.relative_to(stage).as_posix()] = p.read_bytes()
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {version}\n"
        "Summary: FlashInfer JIT modules compiled ahead of time (cudastack flashinfer node)\n"
        f"Requires-Dist: {requires}\n").encode()
    files[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: cudastack-aot\nRoot-Is-Purelib: false\n"
                              f"Tag: {tag}\n").encode()
    record = [f"{name},{_record_hash(data)},{len(data)}" for name, data in files.items()]
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    whl = out_dir / f"{PKG}-{version}-{tag}.whl"
    tmp = whl.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            zi = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = (0o755 if name.endswith(".so") else 0o644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    os.replace(tmp, whl)
    return whl


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modules", required=True, help="space separated package.module:gen_<name>_module")
    ap.add_argument("--patches", default="[]", help="JSON list of {file, replace, with, why}")
    ap.add_argument("--local-version", default="", help="local version segment, e.g. cu131")
    ap.add_argument("--out", required=True, help="folder for the wheel (the node's /wheels)")
    ap.add_argument("--stage", default="/tmp/flashinfer-aot-stage")
    a = ap.parse_args(argv)
    try:
        arch_list = os.environ.get("FLASHINFER_CUDA_ARCH_LIST", "").strip()
        if not arch_list:
            raise Refused(2, "FLASHINFER_CUDA_ARCH_LIST is unset: an ahead-of-time build needs the target list "
                             "(the plan sets 12.0f on CUDA 13.x, 12.0a on 12.8 from the recipe's arch knob).")
        archs = sm_names(arch_list)
        cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        nvcc = nvcc_version(cuda_home)
        try:
            patches = json.loads(a.patches or "[]")
        except json.JSONDecodeError as exc:
            raise Refused(2, f"--patches is not JSON: {exc}") from None
        fi_version = importlib.metadata.version("flashinfer-python")
        applied = apply_patches(package_dir("flashinfer"), patches)
        if shutil.which("ccache"):
            os.environ.setdefault("FLASHINFER_NVCC_LAUNCHER", "ccache")
            os.environ.setdefault("FLASHINFER_CXX_LAUNCHER", "ccache")
        stage = Path(a.stage)
        shutil.rmtree(stage, ignore_errors=True)
        (stage / PKG).mkdir(parents=True)
        print(f"cudastack-aot: flashinfer-python {fi_version}, nvcc {nvcc}, FLASHINFER_CUDA_ARCH_LIST='{arch_list}'"
              f" -> {', '.join(archs)}", flush=True)
        built = build_modules(a.modules.split(), stage)
        version = fi_version + (f"+{a.local_version}" if a.local_version else "")
        (stage / PKG / "__init__.py").write_text(INIT_TEMPLATE.format(
            version=version, archs=tuple(archs), modules=tuple(m["name"] for m in built), dist=DIST))
        (stage / PKG / "build.json").write_text(json.dumps({
            "flashinfer_version": fi_version, "version": version, "arch_list": arch_list,
            "cuda_architectures": archs, "nvcc": nvcc, "modules": built, "patches": applied}, indent=1) + "\n")
        whl = write_wheel(stage, Path(a.out), version, f"flashinfer-python=={fi_version}")
        print(f"cudastack-aot: wrote {whl.name}", flush=True)
        return 0
    except Refused as exc:
        print(f"cudastack-aot: error: {exc}", file=sys.stderr, flush=True)
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
