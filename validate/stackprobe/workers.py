"""Tasks run in a child interpreter by :func:`stackprobe.isolate.run_task` (``python -m
stackprobe.workers TASK`` with JSON arguments on stdin). Each task imports backend libraries, which may
fail, hang or print; the parent only sees the JSON result line.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import traceback
import types
from pathlib import Path

MARKER = "STACKPROBE-RESULT "


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".strip()[:800]


# --- torch ---------------------------------------------------------------------------------------
def torch_info() -> dict:
    """torch version, its CUDA version and arch list, NCCL version, symm-mem ops, GPUs and P2P."""
    out: dict = {}
    try:
        import torch
    except BaseException as e:  # noqa: BLE001 - any import failure is a finding
        return {"import_error": _err(e)}
    out["version"] = torch.__version__
    out["cuda"] = torch.version.cuda
    out["file"] = torch.__file__
    try:   # the toolkit torch's extension builder would use (toolkit coherence, case C25)
        from torch.utils import cpp_extension
        out["cuda_home"] = cpp_extension.CUDA_HOME
    except BaseException as e:  # noqa: BLE001
        out["cuda_home_error"] = _err(e)
    try:
        out["arch_list"] = list(torch.cuda.get_arch_list())
    except BaseException as e:  # noqa: BLE001
        out["arch_list_error"] = _err(e)
    try:
        v = torch.cuda.nccl.version()
        out["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except BaseException as e:  # noqa: BLE001
        out["nccl_error"] = _err(e)
    try:
        import torch.distributed as dist
        out["distributed"] = bool(dist.is_available())
        out["nccl_backend"] = bool(dist.is_available() and dist.is_nccl_available())
    except BaseException as e:  # noqa: BLE001
        out["distributed_error"] = _err(e)
    ops = {}
    for name in ("one_shot_all_reduce", "two_shot_all_reduce_", "multimem_all_reduce_"):
        try:
            ops[name] = hasattr(torch.ops.symm_mem, name)
        except BaseException as e:  # noqa: BLE001
            ops[name] = False
            out.setdefault("symm_mem_error", _err(e))
    out["symm_mem_ops"] = ops
    try:
        importlib.import_module("torch.distributed._symmetric_memory")
        out["symm_mem_module"] = True
    except BaseException as e:  # noqa: BLE001
        out["symm_mem_module"] = False
        out["symm_mem_module_error"] = _err(e)
    gpus = []
    try:
        n = torch.cuda.device_count()
        for i in range(n):
            p = torch.cuda.get_device_properties(i)
            gpus.append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                         "memory_gib": round(p.total_memory / 2**30, 1)})
        p2p = {}
        for i in range(n):
            for j in range(n):
                if i != j:
                    p2p[f"{i}-{j}"] = bool(torch.cuda.can_device_access_peer(i, j))
        out["p2p"] = p2p
    except BaseException as e:  # noqa: BLE001
        out["gpu_error"] = _err(e)
    out["gpus"] = gpus
    return out


def import_module(module: str, attrs: list | None = None) -> dict:
    """Import ``module``; report its ``__version__``, file and which of ``attrs`` it has."""
    try:
        m = importlib.import_module(module)
    except BaseException as e:  # noqa: BLE001
        return {"imported": False, "error": _err(e), "trace": traceback.format_exc()[-1500:]}
    out = {"imported": True, "version": str(getattr(m, "__version__", "")), "file": getattr(m, "__file__", "")}
    if attrs:
        found = {}
        for a in attrs:
            obj = m
            try:
                for part in a.split("."):
                    obj = getattr(obj, part)
                found[a] = True
            except AttributeError:
                found[a] = False
        out["attrs"] = found
    return out


# --- FlashInfer -----------------------------------------------------------------------------------
def _import_flashinfer(name: str):
    """Import a flashinfer submodule. First normally; when ``flashinfer/__init__.py`` fails (0.6.16
    asks device 0's properties at import on a host without a GPU), again with a bare parent package so
    that only the submodules the gate needs run. Returns (module, mode, first_error)."""
    try:
        return importlib.import_module(name), "import", ""
    except BaseException as e:  # noqa: BLE001
        first = _err(e)
    for k in [k for k in sys.modules if k == "flashinfer" or k.startswith("flashinfer.")]:
        del sys.modules[k]
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"flashinfer is not installed ({first})")
    pkg = types.ModuleType("flashinfer")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__file__ = spec.origin
    sys.modules["flashinfer"] = pkg
    return importlib.import_module(name), "submodules-only (package __init__ failed)", first


def _context_for_target(cc_mod, major: int, minor: int):
    """FlashInfer's CompilationContext() as it is built on a host whose one GPU has compute capability
    (major, minor): torch.cuda's device count and capability are answered for that GPU (there is none
    here), everything else is FlashInfer's own code, including the try/except that swallows a
    normalisation error. Returns (context, [warnings FlashInfer logged])."""
    import logging
    import torch

    class _Grab(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    grab = _Grab()
    logging.getLogger("flashinfer").addHandler(grab)
    saved = (torch.cuda.device_count, torch.cuda.get_device_capability)
    torch.cuda.device_count = lambda: 1
    torch.cuda.get_device_capability = lambda device=None: (major, minor)
    try:
        return cc_mod.CompilationContext(), grab.messages
    finally:
        torch.cuda.device_count, torch.cuda.get_device_capability = saved
        logging.getLogger("flashinfer").removeHandler(grab)


def flashinfer_gate(target: str, module_fn: str = "gen_trtllm_comm_module",
                    arch_list_env: str | None = None) -> dict:
    """Ask the installed FlashInfer what it would compile ``module_fn`` for, on a GPU of compute
    capability ``target`` ("12.0"), with this environment's nvcc.

    All with FlashInfer's own code: the CUDA version it detects (``jit.cpp_ext.get_cuda_version``), its
    normalisation of the target (``CompilationContext._normalize_cuda_arch`` where the release has it),
    the effective target list (``FLASHINFER_CUDA_ARCH_LIST`` when set, parsed by FlashInfer; otherwise
    ``CompilationContext()`` on a host reporting one GPU of the target's compute capability, where a
    normalisation error is swallowed and leaves the list empty: case C4), then ``jit.comm.<module_fn>()``
    with that context, whose ``get_nvcc_flags_list`` call is the gate.
    """
    out: dict = {"module_fn": module_fn}
    major, minor = (int(x) for x in target.split(".")[:2])
    if not arch_list_env:
        os.environ.pop("FLASHINFER_CUDA_ARCH_LIST", None)
    cc_mod, mode, first = _import_flashinfer("flashinfer.compilation_context")
    out["import_mode"], out["import_error"] = mode, first
    try:
        cpp_ext = importlib.import_module("flashinfer.jit.cpp_ext")
        out["cuda_version_seen"] = str(cpp_ext.get_cuda_version())
        try:
            out["cuda_path_seen"] = str(cpp_ext.get_cuda_path())
        except BaseException as e:  # noqa: BLE001
            out["cuda_path_error"] = _err(e)
    except BaseException as e:  # noqa: BLE001
        out["cuda_version_error"] = _err(e)
    normalise = getattr(cc_mod.CompilationContext, "_normalize_cuda_arch", None)
    if normalise is None:
        out["normalised"] = None
        out["normalise_error"] = "this release has no CompilationContext._normalize_cuda_arch (suffix rule inline in __init__)"
    else:
        try:
            m, suffix_minor = normalise(major, minor)
            out["normalised"] = f"{m}.{suffix_minor}"
        except BaseException as e:  # noqa: BLE001
            out["normalised"] = None
            out["normalise_error"] = _err(e)
    ctx = None
    try:
        if arch_list_env:
            out["arch_list_source"] = "FLASHINFER_CUDA_ARCH_LIST"
            os.environ["FLASHINFER_CUDA_ARCH_LIST"] = arch_list_env
            ctx = cc_mod.CompilationContext()
        else:
            out["arch_list_source"] = f"CompilationContext() for one detected GPU of compute capability {target}"
            ctx, logged = _context_for_target(cc_mod, major, minor)
            if logged:
                out["swallowed"] = logged
        out["effective_archs"] = sorted(f"{a}.{b}" for a, b in ctx.TARGET_CUDA_ARCHS)
    except BaseException as e:  # noqa: BLE001
        out["effective_archs"] = []
        out["context_error"] = _err(e)
    try:
        core = importlib.import_module("flashinfer.jit.core")
        comm = importlib.import_module("flashinfer.jit.comm")
        if ctx is None:
            ctx = cc_mod.CompilationContext.__new__(cc_mod.CompilationContext)
            ctx.TARGET_CUDA_ARCHS = set()
        for holder in (core, comm):
            if hasattr(holder, "current_compilation_context"):
                holder.current_compilation_context = ctx
        spec = getattr(comm, module_fn)()
        out["gate_flags"] = [f for f in (getattr(spec, "extra_cuda_cflags", None) or []) if "gencode" in f]
        out["sources"] = [str(s) for s in getattr(spec, "sources", [])]
        out["gate_passed"] = True
    except BaseException as e:  # noqa: BLE001
        out["gate_passed"] = False
        out["gate_error"] = _err(e)
    return out


def flashinfer_jit_objects(target: str, module_fn: str, arch_list: str, workspace: str,
                           timeout_s: float = 1800, build: bool = True) -> dict:
    """Compile-only JIT build: FlashInfer writes its own ninja file for ``module_fn`` (with
    ``FLASHINFER_CUDA_ARCH_LIST=arch_list``, workspace under ``workspace``), then ninja builds only
    the object files (the final link needs libcudart.so/libcuda.so that pip wheels lack). Returns the
    object paths, the ninja file's text, the nvcc command and the build log tail."""
    import subprocess
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = arch_list
    os.environ["FLASHINFER_WORKSPACE_BASE"] = workspace
    _import_flashinfer("flashinfer.compilation_context")
    comm = importlib.import_module("flashinfer.jit.comm")
    spec = getattr(comm, module_fn)()
    spec.write_ninja()
    ninja_text = open(spec.ninja_path).read()
    # the object files are the outputs of the compile rules in FlashInfer's own ninja file
    objects = []
    for line in ninja_text.splitlines():
        if line.startswith("build ") and ":" in line:
            out, rule = line[len("build "):].split(":", 1)
            rule_name = rule.split()[0] if rule.split() else ""
            if "link" not in rule_name and out.strip().endswith(".o"):
                objects.append(out.strip().replace("$ ", " "))
    if not build:
        return {"objects": objects, "ninja_text": ninja_text, "built": False,
                "sources": [str(s) for s in spec.sources], "build_dir": str(spec.build_dir)}
    import shutil
    ninja = shutil.which("ninja")
    if ninja is None:
        try:
            import ninja as ninja_pkg  # the PyPI 'ninja' package FlashInfer depends on
            ninja = os.path.join(ninja_pkg.BIN_DIR, "ninja")
        except BaseException as e:  # noqa: BLE001
            return {"objects": objects, "ninja_text": ninja_text, "built": False, "error": f"no ninja: {_err(e)}"}
    cmd = [ninja, "-C", str(spec.build_dir), "-f", str(spec.ninja_path), "-j", os.environ.get("STACKPROBE_JIT_JOBS", "1")] + objects
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        built, log = p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    except subprocess.TimeoutExpired:
        built, log = False, f"ninja timed out after {timeout_s} s"
    return {"objects": objects, "ninja_text": ninja_text, "built": built, "log": log,
            "sources": [str(s) for s in spec.sources], "build_dir": str(spec.build_dir)}


def flashinfer_aot_resolve(target: str, module_fn: str, load: bool = True) -> dict:
    """Ask the installed FlashInfer where it would load ``flashinfer.jit.comm.<module_fn>``'s module from
    without building it: the JitSpec's ``aot_artifacts`` (0.7.x: the flashinfer-jit-cache providers whose
    architectures run on each target) or ``is_aot``/``aot_path`` (0.6.x). With no FLASHINFER_CUDA_ARCH_LIST
    the targets come from a host reporting one GPU of compute capability ``target`` (as in
    :func:`flashinfer_gate`). With ``load``, the first artifact is loaded with FlashInfer's own
    ``JitSpec.load`` (tvm-ffi dlopen: no GPU needed, but the module links libcuda.so.1, so a host without
    the driver reports that error). Nothing is compiled: FLASHINFER_DISABLE_JIT is set."""
    os.environ["FLASHINFER_DISABLE_JIT"] = "1"
    major, minor = (int(x) for x in target.split(".")[:2])
    out: dict = {"module_fn": module_fn}
    comm, mode, first = _import_flashinfer("flashinfer.jit.comm")
    out["import_mode"], out["import_error"] = mode, first
    import torch

    saved = (torch.cuda.device_count, torch.cuda.get_device_capability)
    if not os.environ.get("FLASHINFER_CUDA_ARCH_LIST"):
        torch.cuda.device_count = lambda: 1
        torch.cuda.get_device_capability = lambda device=None: (major, minor)
    try:
        spec = getattr(comm, module_fn)()
        out["name"] = spec.name
        if hasattr(spec, "aot_artifacts"):
            paths = [str(a.path) for a in spec.aot_artifacts]
        else:
            paths = [str(spec.aot_path)] if spec.is_aot else []
    finally:
        torch.cuda.device_count, torch.cuda.get_device_capability = saved
    out["aot_paths"] = paths
    out["is_aot"] = bool(paths)
    if load and paths:
        try:
            spec.load(Path(paths[0]))
            out["loaded"] = True
        except BaseException as e:  # noqa: BLE001
            out["loaded"] = False
            out["load_error"] = _err(e)
    return out


def main() -> None:
    task = sys.argv[1]
    args = json.loads(sys.stdin.read() or "{}")
    try:
        result = globals()[task](**args)
    except BaseException as e:  # noqa: BLE001
        result = {"__error__": _err(e), "trace": traceback.format_exc()[-2000:]}
    sys.stdout.flush()
    print(MARKER + json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main()
