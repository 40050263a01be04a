"""MSCCL++ as SGLang uses it (case C15).

Which MSCCL++ SGLang runs depends on the release, read from its source (:func:`flavour`): 0.5.23's
``pymscclpp.py`` imports the standalone ``mscclpp`` package inside ``try/except ImportError``; 0.5.9's calls
sgl-kernel's bundled MSCCL++ ops (``custom_all_reduce_ops.py`` imports ``sgl_kernel.allreduce`` and clears
``IS_MSCCLPP_AR_AVAILABLE`` on ImportError; ``pymscclpp.py`` returns disabled when it is False). Neither found:
an error (the suite does not guess).

Library gate: for the standalone flavour (or without SGLang), the ``mscclpp`` distribution and its import;
for the bundled flavour, sgl-kernel's ``common_ops`` (where those ops live) carrying SASS for the target (the
standalone package is then not needed). As evidence, the MSCCL++ libraries bundled in installed wheels.

Engine gate (SGLang 0.5.23, ``srt/distributed/device_communicators/pymscclpp.py``): ``--enable-mscclpp``
(default off); ``PyMscclppCommunicator.__init__`` imports ``mscclpp`` (``importlib.import_module``) and
stays disabled on ImportError, whatever sgl-kernel's binaries carry; then ``_SUPPORTED_WORLD_SIZES``.
Its single-node one-shot LL kernel writes to all peers and NVLS algorithms need multicast (FACTS).
"""
from __future__ import annotations

from .. import source
from ..coverage import SASS_LEVELS
from ..env import dist_version
from ..isolate import run_task
from ..verdict import (BLOCKED, ERROR, GATE_BINARY, GATE_NOT_INSTALLED, GATE_PASSES, GATE_PYTHON, LIFT_NONE_NEEDED,
                       LIFT_PACKAGE, LIFT_REBUILD, SCOPE_LIBRARY, SKIPPED, Verdict)
from ..engines.sglang import answer as sa
from ..engines.sglang import engine as se


BACKENDS = ("mscclpp",)
RUNTIME = {"library": (), "engine": ("sglang-mscclpp",)}
MSCCLPP_FILE = "srt/distributed/device_communicators/pymscclpp.py"


def flavour(eng) -> dict:
    """Which MSCCL++ the installed SGLang runs, read from its source: ``{"kind": "standalone" | "bundled",
    "where": "sglang/FILE:LINE ...", "node": the guarded try (standalone)}``. Standalone: a ``try`` in
    ``pymscclpp.py`` importing ``mscclpp`` with an ``except ImportError`` (0.5.23). Bundled: ``pymscclpp.py`` reads
    ``IS_MSCCLPP_AR_AVAILABLE`` and a module under ``srt/distributed/device_communicators`` imports ``sgl_kernel``
    in a ``try`` whose ImportError handler sets it False (0.5.9). Raises :class:`sglang_engine.GateNotFound`."""
    import ast

    path = eng.file(MSCCLPP_FILE)
    tree = eng.tree(MSCCLPP_FILE)
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(isinstance(h.type, ast.Name) and h.type.id == "ImportError" for h in node.handlers):
            body = ast.unparse(ast.Module(body=node.body, type_ignores=[]))
            if "'mscclpp'" in body or '"mscclpp"' in body or "import mscclpp" in body:
                return {"kind": "standalone", "node": node, "where": f"{se.short(path)}:{_import_line(node)}"}
    use = next((n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "IS_MSCCLPP_AR_AVAILABLE"), None)
    if use is not None:
        for p in sorted(path.parent.glob("*.py")):
            if "IS_MSCCLPP_AR_AVAILABLE" not in p.read_text(encoding="utf-8", errors="replace"):
                continue
            for node in ast.walk(source.parse(p)):
                if not isinstance(node, ast.Try):
                    continue
                imp = next((n for b in node.body for n in ast.walk(b)
                            if (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "sgl_kernel" for a in n.names))
                            or (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "sgl_kernel")), None)
                clear = next((h for h in node.handlers if "IS_MSCCLPP_AR_AVAILABLE = False" in ast.unparse(h)), None)
                if imp is not None and clear is not None:
                    return {"kind": "bundled", "node": None,
                            "where": f"{se.short(p)}:{imp.lineno} `{ast.unparse(imp)}` (ImportError at :{clear.lineno} "
                                     f"clears IS_MSCCLPP_AR_AVAILABLE); {se.short(path)}:{use.lineno} "
                                     f"`{ast.unparse(use)}`"}
    raise se.GateNotFound(f"gate not found in sglang {eng.version} at sglang/{MSCCLPP_FILE}: neither an import of "
                          "mscclpp guarded by `except ImportError` nor sgl-kernel's IS_MSCCLPP_AR_AVAILABLE set by a "
                          "guarded import of sgl_kernel")


def _bundled_library(ctx, v: Verdict, eng, fl: dict) -> Verdict:
    """The library answer when SGLang runs sgl-kernel's bundled MSCCL++ ops: their binary, common_ops."""
    from .sglang_custom_ar import kernel_coverage

    v.add("MSCCL++ SGLang runs", f"sgl-kernel's bundled ops (sglang {eng.version})", fl["where"])
    dist, _, ops = kernel_coverage(ctx)
    if not ops:
        v.status, v.gate, v.lift = SKIPPED, GATE_NOT_INSTALLED, LIFT_PACKAGE
        v.cause = (f"not installed: sgl-kernel (SGLang {eng.version} runs MSCCL++ through sgl-kernel's bundled ops, "
                   f"{fl['where']})")
        v.lift_detail = "pip install the sgl-kernel release SGLang pins"
        return v
    if not any(f.level in SASS_LEVELS for f in ops):
        v.status, v.gate, v.lift = BLOCKED, GATE_BINARY, LIFT_REBUILD
        v.cause = (f"SGLang {eng.version} runs MSCCL++ through {dist}'s bundled ops ({fl['where']}); its common_ops "
                   f"carries no SASS for {ctx.target.cc}: {[(f.path, f.level) for f in ops]}")
        v.lift_detail = f"{dist} built with sm_{ctx.target.number} (its arch list)"
        return v
    v.cause = (f"SGLang {eng.version} runs MSCCL++ through {dist}'s bundled ops ({fl['where']}), not the standalone "
               f"mscclpp package; {dist}'s common_ops carries SASS for {ctx.target.cc} "
               f"({', '.join(sorted({f.level for f in ops if f.level in SASS_LEVELS}))})")
    return v


def _library(ctx) -> Verdict:
    from .sglang_custom_ar import kernel_coverage

    v = Verdict("mscclpp", GATE_PASSES, lift=LIFT_NONE_NEEDED, scope=SCOPE_LIBRARY)
    eng = se.installed()
    fl = None
    if eng is not None and eng.references("mscclpp"):
        try:
            fl = flavour(eng)
        except se.GateNotFound as e:
            v.status, v.cause = ERROR, str(e)
            v.lift_detail = "teach this suite where the gate lives in this sglang release (it refuses to guess)"
            return v
    dv = dist_version("mscclpp")
    bundled = [f for c in ctx.coverage.values() for f in c.files if "mscclpp" in f.path]
    if bundled:
        v.add("MSCCL++ libraries bundled in installed wheels", [(f.path, f.level) for f in bundled], "static coverage (fatbin)")
        weak = [f.path for f in bundled if f.level in ("ptx-only", "none")]
        if weak:
            v.warnings.append(f"bundled MSCCL++ libraries without SASS for {ctx.target.cc} (PTX JIT at load or no "
                              f"kernel image): {weak}; a note about these files only: an SGLang whose communicator "
                              "calls sgl-kernel's common_ops MSCCL++ ops (0.5.9) does not load them, and the engine "
                              "answer judges common_ops")
    dist, _, ops = kernel_coverage(ctx)
    if ops:
        v.add(f"{dist} common_ops coverage", [(f.path, f.level) for f in ops], "static coverage (fatbin)")
    if fl is not None and fl["kind"] == "bundled":
        return _bundled_library(ctx, v, eng, fl)
    if fl is not None:
        v.add("MSCCL++ SGLang runs", f"the standalone mscclpp package (sglang {eng.version})", fl["where"])
    if dv is None and source.package_dir("mscclpp") is None:
        v.status, v.gate, v.lift = SKIPPED, GATE_NOT_INSTALLED, LIFT_PACKAGE
        v.cause = "not installed: mscclpp (the standalone package SGLang's communicator imports)"
        v.lift_detail = "the mscclpp Python package (built from microsoft/mscclpp for the target)"
        return v
    v.add("mscclpp version", dv, "distribution metadata")
    o = run_task("import_module", {"module": "mscclpp"}, timeout=ctx.timeout)
    res = o.value if o.ok else {"imported": False, "error": o.error}
    v.add("import mscclpp", "ok" if res.get("imported") else res.get("error"), "child interpreter")
    if not res.get("imported"):
        v.status, v.cause, v.lift = ERROR, f"import mscclpp failed: {res.get('error')}", LIFT_PACKAGE
        return v
    v.cause = "mscclpp imports; whether its kernels work on the target over PCIe is for the runtime tier"
    return v


def library_gate(ctx) -> list[Verdict]:
    return [_library(ctx)]


def engine_gate(ctx) -> list[Verdict]:
    return sa.answer(BACKENDS[0], ctx, _engine)


def _engine(ctx, eng) -> Verdict:
    import ast
    import importlib.util

    if not eng.references("mscclpp"):
        return se.not_integrated(BACKENDS[0], eng, ("mscclpp",), ctx)
    path = eng.file(MSCCLPP_FILE)
    fl = flavour(eng)
    imp = fl["node"]
    ans = se.EngineAnswer(BACKENDS[0], eng, ctx)
    ans.add(se.server_argument_gate(eng, ("--enable-mscclpp",), ctx=ctx))
    if imp is not None:          # 0.5.23: the standalone package
        try:
            found = importlib.util.find_spec("mscclpp") is not None
        except (ImportError, ValueError):
            found = False
        line = _import_line(imp)
        handler = next(h.lineno for h in imp.handlers if isinstance(h.type, ast.Name) and h.type.id == "ImportError")
        ans.add(se.Gate("import mscclpp", found, f"{se.short(path)}:{line} (ImportError caught at :{handler}: disabled)",
                        GATE_NOT_INSTALLED, "its communicator imports the standalone mscclpp package and disables itself "
                        "on ImportError: not installed: mscclpp (sgl-kernel's bundled MSCCL++ binaries do not count)",
                        LIFT_PACKAGE, "install the mscclpp Python package (microsoft/mscclpp) built for the target",
                        value="importable" if found else "not importable", on_fail="decline",
                        falls_to=se.NCCL_FALLBACK))
    else:                        # 0.5.9: sgl-kernel's bundled MSCCL++ ops
        from .sglang_custom_ar import kernel_coverage
        dist, _, ops = kernel_coverage(ctx)
        ok = bool(ops) and any(f.level in SASS_LEVELS for f in ops)
        ans.add(se.Gate("sgl-kernel's MSCCL++ ops (IS_MSCCLPP_AR_AVAILABLE)", ok, fl["where"],
                        GATE_NOT_INSTALLED if not ops else GATE_BINARY,
                        "its communicator runs sgl-kernel's bundled MSCCL++ ops: "
                        + ("not installed: sgl-kernel" if not ops else f"{dist}'s common_ops has no SASS for {ctx.target.cc}"),
                        LIFT_PACKAGE, "sgl-kernel built for the target", value=[(f.path, f.level) for f in ops]))
    try:
        try:
            sizes, line = source.module_assignment(path, "_SUPPORTED_WORLD_SIZES")
        except source.SourceNotFound:
            sizes, line = source.class_attribute(path, "PyMscclppCommunicator", "_SUPPORTED_WORLD_SIZES")
    except (source.SourceNotFound, ValueError) as e:
        raise se.GateNotFound(f"gate not found in sglang {eng.version} at sglang/{MSCCLPP_FILE}: "
                              f"_SUPPORTED_WORLD_SIZES ({e})") from e
    ans.add(se.Gate("PyMscclppCommunicator supported world sizes", ctx.world_size in sizes,
                    f"{se.short(path)}:{line} (ast)", GATE_PYTHON,
                    f"PyMscclppCommunicator supports world sizes {sorted(sizes)}, not {ctx.world_size}", LIFT_PACKAGE,
                    value=sorted(sizes)))
    how = "mscclpp imports" if imp is not None else "sgl-kernel's bundled MSCCL++ ops carry the target"
    notes = _scope_notes(eng, path)
    v = ans.verdict(f"{how} and SGLang {eng.version} admits world size {ctx.world_size}; enable it with "
                       "--enable-mscclpp; its one-shot LL kernel writes to all peers and NVLS needs multicast: "
                       "the runtime tier decides")
    for what, value, where in notes:
        v.add(what, value, where)
        v.warnings.append(f"{what}: {value} ({where})")
    shot = _one_shot_at(eng, path, ctx.world_size)
    if shot is not None and ctx.topology == "pcie":
        v.add("caveat: ", f"at world size {ctx.world_size} it selects {shot[0]}, a one-shot kernel: each rank writes "
              f"to all {ctx.world_size - 1} peers at once over PCIe, the pattern SGLang's own custom allreduce "
              "refuses beyond 2 GPUs without NVLink", shot[1])
    return v


def _one_shot_at(eng, path, world_size: int) -> tuple[str, str] | None:
    """``(context name, "sglang/FILE:LINE")`` when the communicator picks a one-shot context at ``world_size``: sglang
    0.5.9 ``pymscclpp.py:186-187`` ``if world_size == 8: self.context_selection =
    MscclContextSelection.MSCCL1SHOT1NODELL``; None when no such branch is read (nothing claimed)."""
    import ast

    tree = source.parse(path)
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and ast.unparse(n.test) in (f"world_size == {world_size}",
                                                              f"self.world_size == {world_size}"):
            for a in n.body:
                if (isinstance(a, ast.Assign) and any(ast.unparse(t) == "self.context_selection" for t in a.targets)
                        and "1SHOT" in ast.unparse(a.value)):
                    return ast.unparse(a.value).rsplit(".", 1)[-1], f"{se.short(path)}:{a.lineno}"
    return None


def _scope_notes(eng, path) -> list[tuple[str, str, str]]:
    """Where SGLang uses its MSCCL++ communicator, read from source: enabled only inside CUDA-graph capture
    (``__init__`` ends ``self.disabled = True``; ``GroupCoordinator.graph_capture`` calls
    ``pymscclpp_comm.change_state(enable=True)``) and the message-size cap (``_MAX_BYTES`` from
    ``os.getenv(NAME, DEFAULT)``). Each is returned only when found (0.5.9 has both)."""
    import ast

    out = []
    tree = eng.tree(MSCCLPP_FILE)
    cls = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "PyMscclppCommunicator"), None)
    init = next((n for n in (cls.body if cls else []) if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    last = init.body[-1] if init is not None and init.body else None
    disabled = (isinstance(last, ast.Assign) and ast.unparse(last).replace(" ", "") == "self.disabled=True")
    ps_rel = "srt/distributed/parallel_state.py"
    enable = None
    if disabled and (eng.root / ps_rel).is_file():
        for fn in ast.walk(eng.tree(ps_rel)):
            if isinstance(fn, ast.FunctionDef) and fn.name == "graph_capture":
                enable = next((n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                               and n.func.attr == "change_state" and "pymscclpp" in ast.unparse(n.func.value)), None)
                if enable is not None:
                    break
    if disabled and enable is not None:
        out.append(("runs only inside CUDA-graph capture", "PyMscclppCommunicator starts disabled and graph_capture "
                    "enables it", f"{se.short(path)}:{last.lineno} `self.disabled = True`; sglang/{ps_rel}:{enable.lineno} "
                    f"`{ast.unparse(enable)}`"))
    for node in (cls.body if cls else []):
        if isinstance(node, ast.Assign) and any(isinstance(tg, ast.Name) and tg.id == "_MAX_BYTES" for tg in node.targets):
            env = next((c for c in ast.walk(node.value) if isinstance(c, ast.Call) and ast.unparse(c.func) in
                        ("os.getenv", "os.environ.get") and len(c.args) == 2
                        and all(isinstance(a, ast.Constant) for a in c.args)), None)
            if env is not None:
                out.append(("message-size cap", f"allreduce messages up to {env.args[1].value} only (larger ones go "
                            f"to NCCL; {env.args[0].value} overrides)", f"{se.short(path)}:{node.lineno} _MAX_BYTES"))
    return out


def _import_line(node) -> int:
    """The line of the ``import mscclpp`` (an Import / ImportFrom node, or ``import_module("mscclpp")``) in a try body."""
    import ast

    for n in ast.walk(ast.Module(body=node.body, type_ignores=[])):
        if isinstance(n, ast.Import) and any(a.name.split(".")[0] == "mscclpp" for a in n.names):
            return n.lineno
        if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "mscclpp":
            return n.lineno
        if isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Constant) and n.args[0].value == "mscclpp":
            return n.lineno
    return node.lineno


def probe(ctx) -> list[Verdict]:
    return library_gate(ctx) + engine_gate(ctx)
