"""FlashInfer functions shared by the fusion, PCIe IPC and all-to-all probes: the JIT modules' arch
lists read with ``ast`` from the installed ``flashinfer/jit/comm.py``, FlashInfer's own arch
normalisation (a child interpreter), and a compile-only JIT build cached by content.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from .. import source
from ..atomic import write_atomic
from ..coverage import level_for, read_elf
from ..env import dist_version, effective_nvcc
from ..isolate import run_task

DIST = "flashinfer-python"


def version() -> str | None:
    return dist_version(DIST)


def comm_source(root: Path | None = None) -> Path:
    """The installed ``flashinfer/jit/comm.py``, or the one under ``root`` (a folder holding the
    ``flashinfer`` package, e.g. an unpacked wheel). Raises source.SourceNotFound."""
    if root is not None:
        p = Path(root) / "flashinfer" / "jit" / "comm.py"
        if not p.is_file():
            raise source.SourceNotFound(f"no flashinfer/jit/comm.py under {root}")
        return p
    return source.module_file("flashinfer.jit.comm")


def module_majors(fn_name: str, root: Path | None = None) -> tuple[list | None, str]:
    """``supported_major_versions`` passed inside ``flashinfer.jit.comm.<fn_name>`` (None: the
    module passes none, i.e. every target arch) and where it was read; ``root``: see comm_source.
    Raises source.SourceNotFound."""
    path = comm_source(root)
    fns = source.functions(source.parse(path))
    if fn_name not in fns:
        raise source.SourceNotFound(f"{fn_name} is not defined in {path}")
    vals = [v for v in source.keyword_literals(fns[fn_name], "supported_major_versions") if v is not None]
    where = f"{_short(path)}:{fns[fn_name].lineno} {fn_name} (ast)"
    return (sorted(vals[0]) if vals else None), where


def all_module_majors(root: Path | None = None) -> dict:
    """Every ``gen_*`` function of flashinfer/jit/comm.py -> its supported majors (None = unrestricted)."""
    path = comm_source(root)
    out = {}
    for name, fn in source.functions(source.parse(path)).items():
        if name.startswith("gen_"):
            vals = [v for v in source.keyword_literals(fn, "supported_major_versions") if v is not None]
            out[name] = sorted(vals[0]) if vals else None
    return out


def _short(path: Path) -> str:
    parts = Path(path).parts
    return "/".join(parts[parts.index("flashinfer"):]) if "flashinfer" in parts else str(path)


def gate(ctx, module_fn: str) -> dict:
    """Run FlashInfer's own normalisation and ``module_fn`` gate for the target (workers.flashinfer_gate)."""
    o = run_task("flashinfer_gate", {"target": ctx.target.cc, "module_fn": module_fn,
                                     "arch_list_env": os.environ.get("FLASHINFER_CUDA_ARCH_LIST") or None},
                 timeout=ctx.timeout)
    if not o.ok:
        return {"worker_error": o.error, "log": o.log[-1500:]}
    return o.value


def jit_compile(ctx, module_fn: str, arch_list: str) -> dict:
    """Compile-only JIT build of ``module_fn`` for ``arch_list`` with this environment's nvcc, cached
    under ``ctx.cache_dir/flashinfer-jit/<key>`` where key = sha256(module sources, ninja file, nvcc
    version, flashinfer version). Returns {"ran" (compiled now), "cached", "built", "objects": [{path,
    sass, level}], "seconds", "key", "log"}."""
    nvcc = effective_nvcc(ctx.env) or {}
    root = Path(ctx.cache_dir) / "flashinfer-jit"
    root.mkdir(parents=True, exist_ok=True)
    ws = root / "workspace"
    # first pass: FlashInfer writes its ninja file (cheap) so the key covers the real flags
    probe_args = {"target": ctx.target.cc, "module_fn": module_fn, "arch_list": arch_list, "workspace": str(ws)}
    t0 = time.time()
    key_src = hashlib.sha256()
    o = run_task("flashinfer_jit_objects", dict(probe_args, build=False), timeout=ctx.timeout,
                 env={"STACKPROBE_JIT_JOBS": "1"})
    if not o.ok:
        return {"ran": False, "cached": False, "built": False, "error": o.error, "log": o.log[-1500:]}
    info = o.value
    for s in info.get("sources", []):
        try:
            key_src.update(Path(s).read_bytes())
        except OSError:
            pass
    key_src.update(info.get("ninja_text", "").encode())
    key_src.update(json.dumps([nvcc.get("version"), nvcc.get("realpath"), version()]).encode())
    key = key_src.hexdigest()[:24]
    record = root / f"{key}.json"
    if record.is_file():
        res = json.loads(record.read_text())
        res.update(cached=True, ran=False)
        return res
    jobs = os.environ.get("STACKPROBE_JIT_JOBS", "1")
    o = run_task("flashinfer_jit_objects", dict(probe_args, timeout_s=3600), timeout=3700,
                 env={"STACKPROBE_JIT_JOBS": jobs})
    if not o.ok:
        return {"ran": True, "cached": False, "built": False, "error": o.error, "log": o.log[-1500:], "key": key}
    info = o.value
    objects = []
    for p in info.get("objects", []):
        if os.path.isfile(p):
            ims = read_elf(p)
            objects.append({"path": os.path.basename(p), "sass": sorted({i.name for i in ims if i.kind == "sass"}),
                            "level": level_for(ims, ctx.target)})
        else:
            objects.append({"path": os.path.basename(p), "sass": [], "level": "missing"})
    res = {"ran": True, "cached": False, "built": bool(info.get("built")) and all(x["level"] != "missing" for x in objects),
           "objects": objects, "seconds": round(time.time() - t0, 1), "key": key, "nvcc": nvcc.get("version"),
           "arch_list": arch_list, "log": info.get("log", "")[-1500:]}
    if res["built"]:
        write_atomic(record, json.dumps(res))
    return res


# ------------------------------------------------------------------------ modules compiled ahead of time
JIT_CACHE_DIST = "flashinfer-jit-cache"


def module_name(fn_name: str, root: Path | None = None) -> tuple[str | None, str]:
    """The JIT module name ``flashinfer.jit.comm.<fn_name>`` builds: the first positional string literal of
    the ``gen_jit_spec(...)`` call inside it (``"trtllm_comm"``), read with ``ast`` from the installed
    package, and where it was read. (None, where) when the function passes no literal name.
    Raises source.SourceNotFound."""
    import ast

    path = comm_source(root)
    fns = source.functions(source.parse(path))
    if fn_name not in fns:
        raise source.SourceNotFound(f"{fn_name} is not defined in {path}")
    for n in ast.walk(fns[fn_name]):
        if isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", "")) == "gen_jit_spec" \
                and n.args and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str):
            return n.args[0].value, f"{_short(path)}:{n.lineno} {fn_name} (ast)"
    return None, f"{_short(path)}:{fns[fn_name].lineno} {fn_name} (ast)"


def jit_cache_version_accepted(cache_version: str, fi_version: str) -> bool:
    """Whether FlashInfer loads a flashinfer-jit-cache of ``cache_version`` (flashinfer 0.7.x ``jit/env.py``
    ``_check_jit_cache_version``: equal, or equal plus a local segment ``+cu131``; 0.6.x only asks that it
    starts with FlashInfer's version, which both forms satisfy). Without it FlashInfer ignores the package
    (0.7.x, a warning) or refuses to import (0.6.x) unless FLASHINFER_DISABLE_VERSION_CHECK is set."""
    return cache_version == fi_version or cache_version.startswith(fi_version + "+")


_AOT_SEEN: dict = {}


def aot_load_order(root: Path | None = None) -> tuple[str, str]:
    """How the installed FlashInfer prefers an ahead-of-time module over a JIT build, read with ``ast`` from
    ``flashinfer/jit/core.py`` (under ``root`` when given): ``JitSpec.build_and_load`` calls ``self.try_load()``
    (0.7.x: ``build_and_load`` at :337-346 and ``try_load`` at :535-568 in 0.7.2) or tests ``self.is_aot`` and
    returns ``self.load(self.aot_path)`` (0.6.x) before any build, so an AOT module is used whatever nvcc is in reach.
    Returns (text, "flashinfer/jit/core.py:L1-L2 ..."); ("", "") when neither form is found (then no claim is made)."""
    import ast

    try:
        path = (Path(root) / "flashinfer" / "jit" / "core.py") if root is not None else source.module_file("flashinfer.jit.core")
        fns = source.functions(source.parse(path))
    except (source.SourceNotFound, SyntaxError, OSError):
        return "", ""
    bal = fns.get("build_and_load")
    if bal is None or not bal.body:
        return "", ""
    body = [st for st in bal.body if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))]
    first = body[0] if body else None
    text = ast.unparse(first) if first is not None else ""
    if "self.try_load()" in text:
        last = bal.lineno
        for node in ast.walk(bal):     # each `x = self.try_load()` and the `if` right after it that returns x
            for field in ("body", "orelse", "finalbody"):
                stmts = getattr(node, field, None) or []
                for i, st in enumerate(stmts):
                    if isinstance(st, ast.stmt) and "self.try_load()" in ast.unparse(st) and not isinstance(st, (ast.With, ast.If, ast.Try)):
                        nxt = stmts[i + 1] if i + 1 < len(stmts) and isinstance(stmts[i + 1], ast.If) else st
                        last = max(last, nxt.end_lineno)
        # the concrete try_load: the longest definition (a base class may declare an abstract one)
        tls = [n for n in ast.walk(source.parse(path)) if isinstance(n, ast.FunctionDef) and n.name == "try_load"]
        tl = max(tls, key=lambda n: n.end_lineno - n.lineno) if tls else None
        where = f"{_short(path)}:{bal.lineno}-{last} build_and_load" + (f", :{tl.lineno}-{tl.end_lineno} try_load" if tl else "")
        return "FlashInfer's build_and_load calls try_load, which loads the AOT module, before any build", where
    if isinstance(first, ast.If) and "aot" in ast.unparse(first.test) and any(isinstance(b, ast.Return) for b in first.body):
        return ("FlashInfer's build_and_load returns the AOT module (`" + ast.unparse(first.test) + "`) before any build",
                f"{_short(path)}:{first.lineno}-{first.end_lineno} build_and_load")
    return "", ""


def aot_module(fn_name: str, target, root: Path | None = None, *, resolve: bool = True) -> dict:
    """Is the module of ``flashinfer.jit.comm.<fn_name>`` available compiled ahead of time for ``target``
    (an :class:`stackprobe.archs.Arch`), so the installed FlashInfer loads it without a JIT build?

    Looks in the installed ``flashinfer-jit-cache`` distribution for ``<name>/<name>.so`` (the layout both
    FlashInfer 0.6.x ``JitSpec.aot_path`` and 0.7.x ``get_aot_artifacts`` read), reads its fatbins
    (:func:`stackprobe.coverage.read_elf`: SASS with its ``a``/``f`` suffix) and applies the loader's
    version rule (:func:`jit_cache_version_accepted`). Returns {"module", "where", "dist_version",
    "version_ok", "file", "sass", "ptx", "level", "covers", "cause"}; ``covers`` is True only when the file
    exists, the version is accepted, its level for ``target`` is a SASS level (no JIT, no PTX JIT) and, with
    ``resolve``, the installed FlashInfer's own loader resolves that file (``workers.flashinfer_aot_resolve``, a
    child interpreter; it also tries to load it, which needs the driver's libcuda.so.1: a failed load is
    reported in the cause, not a refusal, since a GPU host has the driver)."""
    from ..coverage import SASS_LEVELS, dist_files

    key = (fn_name, target.cc, str(root), resolve)
    if key not in _AOT_SEEN:
        _AOT_SEEN[key] = _aot_module(fn_name, target, root, resolve, SASS_LEVELS, dist_files)
    return dict(_AOT_SEEN[key])


def _aot_module(fn_name, target, root, resolve, SASS_LEVELS, dist_files) -> dict:
    out: dict = {"module": None, "where": "", "dist_version": None, "version_ok": False, "file": None,
                 "sass": [], "ptx": [], "level": None, "covers": False, "cause": ""}
    try:
        out["module"], out["where"] = module_name(fn_name, root)
    except (source.SourceNotFound, SyntaxError) as e:
        out["cause"] = f"cannot read {fn_name}'s module name: {e}"
        return out
    if not out["module"]:
        out["cause"] = f"{fn_name} builds a module whose name is not a literal ({out['where']})"
        return out
    found = dist_files(JIT_CACHE_DIST)
    if found is None:
        out["cause"] = f"{JIT_CACHE_DIST} is not installed"
        return out
    out["dist_version"], files = found
    fi_ver = version() or ""
    out["version_ok"] = jit_cache_version_accepted(out["dist_version"], fi_ver)
    name = out["module"]
    hit = next(((rel, path) for rel, path in files if rel.endswith(f"/{name}/{name}.so")), None)
    if hit is None:
        mods = sorted({Path(rel).parent.name for rel, _ in files if rel.endswith(".so")})
        out["cause"] = f"{JIT_CACHE_DIST} {out['dist_version']} has no {name}/{name}.so (it holds: {', '.join(mods) or 'none'})"
        return out
    out["file"] = hit[0]
    try:
        ims = read_elf(hit[1])
    except Exception as e:   # unreadable file: a wrong answer must not pass
        out["cause"] = f"cannot read {hit[0]}: {e}"
        return out
    out["sass"] = sorted({i.name for i in ims if i.kind == "sass"})
    out["ptx"] = sorted({i.name for i in ims if i.kind == "ptx"})
    out["level"] = level_for(ims, target) if ims else "none"
    out["cuda_mismatch"] = _cuda_mismatch(hit[1])
    if not out["version_ok"]:
        out["cause"] = (f"{JIT_CACHE_DIST} {out['dist_version']} does not match flashinfer-python {fi_ver}: FlashInfer "
                        "ignores it and JIT-compiles")
    elif out["cuda_mismatch"]:   # case C42: a module built for another CUDA major cannot load on this stack
        mm = out["cuda_mismatch"]
        out["cause"] = (f"{hit[0]} needs {', '.join(mm['needs'])}, another CUDA major than the stack's (torch: CUDA "
                        f"{mm['stack']}): the module cannot load here, so FlashInfer JIT-compiles it (with no nvcc the "
                        "path is unavailable)")
    elif out["level"] not in SASS_LEVELS:
        out["cause"] = (f"{hit[0]} carries SASS {', '.join(out['sass']) or 'none'} (level {out['level']} for "
                        f"{target.cc}): no kernel image that runs on the target")
    else:
        out["covers"] = True
        out["cause"] = f"{hit[0]} carries {', '.join(out['sass'])} ({out['level']} for {target.cc})"
    if resolve and out["covers"]:
        # FlashInfer's own loader: does the installed release resolve this very file (and can it load it)?
        o = run_task("flashinfer_aot_resolve", {"target": target.cc, "module_fn": fn_name, "load": True}, timeout=300)
        if not o.ok:
            out["resolved_by_flashinfer"] = {"error": o.error}
        else:
            r = o.value
            out["resolved_by_flashinfer"] = {k: r.get(k) for k in ("aot_paths", "loaded", "load_error", "import_mode")}
            if not any(os.path.realpath(p) == os.path.realpath(hit[1]) for p in r.get("aot_paths") or []):
                out["covers"] = False
                out["cause"] = (f"{hit[0]} has SASS for {target.cc}, but the installed FlashInfer does not resolve it as "
                                f"an AOT module (it resolves: {r.get('aot_paths') or 'nothing'}), so it would JIT-compile")
            elif r.get("loaded") is False:
                out["cause"] += (f"; FlashInfer resolves it, and loading it here failed: {r.get('load_error')} "
                                 "(the module links libcuda.so.1, which a GPU host's driver provides)")
            else:
                out["cause"] += "; FlashInfer resolves and loads it"
    return out


def _cuda_mismatch(path: str) -> dict | None:
    from ..health import artifact_mismatch
    return artifact_mismatch(path)


def add_aot_evidence(v, module_fn: str, target) -> tuple[dict, str, str]:
    """Add to verdict ``v`` the evidence of the ahead-of-time module of generator ``module_fn`` for ``target``
    (:func:`aot_module`: file, SASS, whether FlashInfer's loader resolves it) and whether a JIT build is needed
    (:func:`aot_load_order`: FlashInfer loads an AOT module before it would build one). Returns the
    :func:`aot_module` dict and the load order's text and source."""
    aot = aot_module(module_fn, target)
    v.add("AOT module", {k: aot.get(k) for k in ("module", "file", "dist_version", "version_ok", "sass", "level", "covers",
                                                 "resolved_by_flashinfer", "cuda_mismatch")},
          f"flashinfer-jit-cache; module name from {aot['where'] or module_fn}")
    order, order_where = aot_load_order()
    layout = "flashinfer-jit-cache layout <name>/<name>.so + version rule"
    v.add("JIT needed", f"no: {order or 'FlashInfer loads the AOT module'}" if aot["covers"] else f"yes: {aot['cause']}",
          f"{layout}; {order_where}" if order_where else layout)
    return aot, order, order_where
