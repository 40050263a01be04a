"""Expert parallelism over FlashInfer all-to-all (SGLang ``--moe-a2a-backend flashinfer``).

No topology gate exists on this path in SGLang 0.5.9 / 0.5.23 or FlashInfer 0.6.3 / 0.7.2: ``MoeAlltoAll``
allocates through ``MnnvlMemory``, whose handle type is read from the installed source (:func:`_fd_fallback`):
0.6.3 picks FABRIC on aarch64 and POSIX file descriptors otherwise, by CPU type (``flashinfer/comm/mnnvl.py:404-414``);
0.7.2 probes fabric support (``mnnvl.py:327-334``). The POSIX fds travel by ``pidfd_getfd`` in 0.6.3 (ptrace access
to the peer: ``CAP_SYS_PTRACE`` in a container) and over ``SCM_RIGHTS`` in 0.7.2 (no ``CAP_SYS_PTRACE``), read by
:func:`_fd_exchange`. Whether POSIX handles then work over PCIe (peer access) is a runtime question.

The path is an MoE all-to-all, not a decode allreduce (:data:`COLLECTIVE`): the headline gives it its own part, and
its engine answer there is combined with the library answer (a blocked library: not worth measuring).

Engine answer (read from the installed SGLang): the server argument ``--moe-a2a-backend`` (default
``none``) and the settings it requires: 0.5.9 asserts the ``flashinfer_cutlass`` MoE runner under
``if self.moe_a2a_backend == "flashinfer"`` (``srt/server_args.py:2214``); 0.5.23 asserts
``_flashinfer_a2a_topology_is_supported`` (``srt/arg_groups/moe_hook.py``: DP attention with attn_dp_size ==
tp_size), run here with its own code, and asserts the MoE runner is one of its FlashInfer / DeepGEMM runners
(``moe_hook.py``; the default ``auto`` resolves to ``flashinfer_cutlass`` on SM120 only for ``modelopt_fp4``,
``overrides.py``). Also the FlashInfer names SGLang's dispatcher imports; a blocked engine answer's lift also
names the library blocker (no nvcc and no flashinfer-jit-cache: the a2a module cannot build). Library answer:
the a2a JIT modules' arch lists, then a compiler for the JIT (``toolchain``, lift ``package-upgrade``: nvcc or a
flashinfer-jit-cache, see :func:`compiler_blocker`), else ``needs-runtime``.
"""
from __future__ import annotations

import ast
import re

from .. import source
from ..serverconfig import NO_FLAGS
from ..env import all_nvccs, effective_nvcc
from ..verdict import (FALLS_BACK, OPT_IN, STARTUP_FAILURE, BLOCKED, GATE_NEEDS_RUNTIME, GATE_NOT_INSTALLED, GATE_PASSES, GATE_PYTHON, GATE_SETTING,
                       GATE_TOOLCHAIN, LIFT_NONE_NEEDED, LIFT_PACKAGE, LIFT_SETTING, LIFT_UNKNOWN,
                       SCOPE_ENGINE, SCOPE_LIBRARY, SKIPPED, Verdict)
from . import flashinfer_common as fi
from ..engines.sglang import answer as sa
from ..engines.sglang import engine as se
from .sglang_custom_ar import short

BACKENDS = ("ep-flashinfer-a2a",)
#: the collective of each backend that is not a decode-step allreduce (:func:`stackprobe.userwords.collective`)
COLLECTIVE = {"ep-flashinfer-a2a": "MoE all-to-all for expert parallelism"}
RUNTIME = {"library": (), "engine": ()}
PRECONDITION = "_flashinfer_a2a_topology_is_supported"


def _flashinfer_has(module: str, name: str) -> bool | None:
    try:
        path = source.module_file(module)
    except source.SourceNotFound:
        return None
    return name in source.defined_names(path)


def engine_gate(ctx) -> list[Verdict]:
    """SGLang's server argument and the settings it requires, the FlashInfer names it imports, the JIT arch lists."""
    if fi.version() is None and se.installed() is not None:
        return [Verdict(BACKENDS[0], SKIPPED, scope=SCOPE_ENGINE, gate=GATE_NOT_INSTALLED, lift=LIFT_PACKAGE,
                        cause="not installed: flashinfer-python")]
    return sa.answer(BACKENDS[0], ctx, _engine)


def _assert_under(tree: ast.AST, attr: str, value: str, needle: str) -> ast.Assert | None:
    """The ``assert`` mentioning ``needle`` inside ``if self.<attr> == "<value>":``."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and isinstance(node.test.left, ast.Attribute) and node.test.left.attr == attr
                and any(isinstance(c, ast.Constant) and c.value == value for c in node.test.comparators)):
            for n in ast.walk(node):
                if isinstance(n, ast.Assert) and needle in ast.unparse(n.test):
                    return n
    return None


def _engine(ctx, eng) -> Verdict:
    if not eng.references("MoeAlltoAll", "moe_a2a_backend"):
        return se.not_integrated(BACKENDS[0], eng, ("MoeAlltoAll", "moe_a2a_backend"), ctx)
    root, fv, w = eng.root, fi.version(), ctx.world_size
    ans = se.EngineAnswer(BACKENDS[0], eng, ctx)
    arg = ans.add(se.server_argument_gate(eng, ("--moe-a2a-backend",), ctx=ctx, set_to="flashinfer", equals="flashinfer"))
    # the settings --moe-a2a-backend flashinfer requires
    setting = None
    found = source.find_files_containing(root, f"def {PRECONDITION}")
    if found:                                   # 0.5.23: DP attention with attn_dp_size == tp_size
        fn, line = source.load_function(found[0], PRECONDITION)
        try:
            plain = fn(architecture=None, tp_size=w, ep_size=w, attn_dp_size=1, attn_dp_enabled=False,
                       enable_layernorm_sp=False)
            dpa = fn(architecture=None, tp_size=w, ep_size=w, attn_dp_size=w, attn_dp_enabled=True,
                     enable_layernorm_sp=False)
        except TypeError as e:
            raise se.GateNotFound(f"gate not readable in sglang {eng.version} at {short(found[0])}:{line}: "
                                  f"{PRECONDITION} has another signature ({e})") from e
        tree = source.parse(found[0])
        asserted = next((n.lineno for n in ast.walk(tree) if isinstance(n, ast.Assert)
                         and PRECONDITION in ast.unparse(n.test)), None)
        where = f"{short(found[0])}:{line} {PRECONDITION}" + (f", asserted at :{asserted}" if asserted else "")
        detail, spelled = _dp_attention_flags(eng, w)
        setting = se.Gate("required setting: DP attention", plain, where, GATE_SETTING if dpa else GATE_PYTHON,
                          f"--moe-a2a-backend flashinfer requires DP attention with attn_dp_size == tp_size "
                          f"({PRECONDITION}(tp={w}, ep={w}) is {plain} without it, {dpa} with dp={w})"
                          + (f"; {spelled['note']}" if spelled.get("note") else ""),
                          LIFT_SETTING if dpa else LIFT_PACKAGE, detail if dpa else "",
                          value={"admits": [plain, dpa], "spelling": spelled})
        runner_gate = _runner_gate_0523(eng, found[0], tree, ctx)
    else:                                       # 0.5.9: the flashinfer_cutlass MoE runner
        rel = "srt/server_args.py"
        node = _assert_under(eng.tree(rel), "moe_a2a_backend", "flashinfer", "moe_runner_backend")
        if node is None:
            raise se.GateNotFound(f"gate not found in sglang {eng.version}: neither {PRECONDITION} under sglang/srt nor "
                                  f"an assert on moe_runner_backend under `if self.moe_a2a_backend == \"flashinfer\"` in "
                                  f"sglang/{rel}")
        runners = [c.value for c in ast.walk(node.test) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                   and c.value != "flashinfer"]
        runner = se.server_argument(eng, ("--moe-runner-backend",))
        ok = runner["default"] in runners
        detail = f"{runner['flag']} {runners[0] if runners else '?'}"
        runner_gate = None
        setting = se.Gate("required setting: MoE runner", ok, f"sglang/{rel}:{node.lineno} `assert {ast.unparse(node.test)}`",
                          GATE_SETTING, f"--moe-a2a-backend flashinfer asserts the MoE runner is one of {runners} "
                          f"(default {runner['default']!r} at {runner['default_where']})", LIFT_SETTING, detail,
                          value={"runners": runners, "default": runner["default"]})
    for g in (setting, runner_gate):
        if g is not None:
            ans.add(_required(ctx, arg, g))
    qg = _quantization_gate(eng, _runner(runner_gate or setting), ctx, arg)
    if qg is not None:
        ans.add(qg)
    # the names SGLang's dispatcher imports from flashinfer
    moe = root / "srt" / "layers" / "moe"
    needed = []
    for p in source.find_files_containing(moe if moe.is_dir() else root, "MoeAlltoAll"):
        needed += [(m, n, f"{short(p)}:{ln}") for m, n, ln in source.imports_from(p, "flashinfer")]
    missing = [(m, n, wh) for m, n, wh in needed if _flashinfer_has(m, n) is False]
    names = sorted({f"{m}.{n}" for m, n, _ in (missing or needed)})
    ans.add(se.Gate("FlashInfer names the a2a dispatcher imports", not missing,
                    "; ".join(sorted({wh for *_, wh in (missing or needed)})) or "sglang/srt/layers/moe (ast)",
                    GATE_PYTHON, f"it imports {names}, which FlashInfer {fv} does not export: its dispatcher raises "
                    "'Flashinfer is not installed or does not support A2A'", LIFT_PACKAGE,
                    "an sglang / flashinfer-python pair whose APIs match", value=names))
    # the workspace size, where the release reads it from the environment (0.5.9)
    for p in source.find_files_containing(moe if moe.is_dir() else root, "FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK"):
        for n in ast.walk(source.parse(p)):
            if (isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Constant)
                    and str(n.args[0].value).endswith("FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK")):
                dflt = ast.literal_eval(n.args[1]) if len(n.args) > 1 and isinstance(n.args[1], ast.Constant) else None
                ans.add(se.Gate("dispatch tokens per rank (workspace)", True, f"{short(p)}:{n.lineno}",
                                value=f"{n.args[0].value} (default {dflt}) x ep_size tokens"))
                break
    v = ans.verdict(f"SGLang {eng.version} builds the FlashInfer a2a dispatcher with these settings; no topology gate "
                    "on this path: PCIe viability is for the runtime tier")
    handles, exch = _fd_fallback(), _fd_exchange()
    v.add("MnnvlMemory POSIX fd exchange", exch[0], exch[1])
    v.warnings.append(f"no topology gate in SGLang or FlashInfer on this path (MnnvlMemory handle type: {handles[0]}, "
                      f"{handles[1]}); over PCIe it needs peer access, and the fd exchange is {exch[0]} ({exch[1]}): "
                      "a runtime question")
    if v.status in (BLOCKED, OPT_IN, FALLS_BACK, STARTUP_FAILURE):
        # the library side too: without nvcc or a flashinfer-jit-cache the a2a module cannot build (library answer)
        blocker = compiler_blocker(ctx, _a2a_modules(ctx))
        if blocker is not None:
            v.add("library blocker: a2a module build", blocker[0], "library answer (ep-flashinfer-a2a)")
            v.lift_detail = "; ".join(x for x in (v.lift_detail, "and " + blocker[1]) if x)
    return v


def _dp_attention_flags(eng, w: int) -> tuple[str, dict]:
    """How a user asks the installed SGLang for DP attention over ``w`` ranks: ``("DP attention: --attn-dp-size 8
    (attn_dp_size == tp_size == 8)", {"flags", "deprecated", "note"})``. Where the release registers
    ``--enable-dp-attention`` as deprecated (:func:`.sglang_engine.deprecated_flag`; sglang 0.5.23
    ``srt/server_args.py:416-424``: ``new_flag="--attn-dp-size <dp-size>"``) the new spelling is advised and the old
    pair is still accepted as given; otherwise ``--enable-dp-attention --dp-size w`` (sglang 0.5.9)."""
    dep = se.deprecated_flag(eng, "--enable-dp-attention")
    if dep is not None and dep["new_flag"]:
        new = re.sub(r"<[^>]*>", str(w), dep["new_flag"])
        se.server_argument(eng, (new.split()[0],))   # the new flag must exist (GateNotFound otherwise)
        dps = se.server_argument(eng, ("--dp-size",))["flag"]
        return (f"DP attention: {new} (attn_dp_size == tp_size == {w})",
                {"flags": new.split(), "deprecated": ["--enable-dp-attention", dps],
                 "note": f"--enable-dp-attention is deprecated in sglang {eng.version} for {dep['new_flag']} "
                         f"({dep['where']})"})
    dp = se.server_argument(eng, ("--enable-dp-attention",))["flag"]
    dps = se.server_argument(eng, ("--dp-size",))["flag"]
    return f"DP attention: {dp} {dps} {w} (attn_dp_size == tp_size == {w})", {"flags": [dp, dps, str(w)]}


def _runner(g: se.Gate | None) -> str:
    """The MoE runner a user is told to set with the a2a backend (flashinfer_cutlass where admitted), from the MoE
    runner gate's value (``{"runners": [...]}``, or ``{"required": {...}}`` once configured); "" when unknown."""
    value = g.value if g is not None else None
    if isinstance(value, dict) and "required" in value:
        value = value["required"]
    runners = value.get("runners") if isinstance(value, dict) else None
    if not runners:
        return ""
    return "flashinfer_cutlass" if "flashinfer_cutlass" in runners else runners[0]


def _quantization_gate(eng, runner: str, ctx, arg) -> se.Gate | None:
    """The quantizations SGLang admits with MoE runner ``runner`` (the one the a2a backend requires): the ``assert
    <...>.quantization in [...]`` under ``if <...>.moe_runner_backend == "<runner>":`` in its argument files (sglang
    0.5.23 ``srt/arg_groups/moe_hook.py:80-88``; 0.5.9 ``srt/server_args.py:2136-2141``), against the
    ``--quantization`` the configuration gives (default ``None``: bf16). A quantization outside the list is an
    ``AssertionError`` while SGLang resolves its arguments (a start-up failure). None when the release has no such
    assert (nothing to read) or ``runner`` is empty."""
    if not runner:
        return None
    for path, n in se.arg_ifs(eng):
        t = ast.unparse(n.test)
        if not (isinstance(n.test, ast.Compare) and "moe_runner_backend" in ast.unparse(n.test.left)
                and any(isinstance(c, ast.Constant) and c.value == runner for c in n.test.comparators)):
            continue
        node = next((a for a in n.body if isinstance(a, ast.Assert) and isinstance(a.test, ast.Compare)
                     and "quantization" in ast.unparse(a.test.left) and isinstance(a.test.ops[0], ast.In)
                     and isinstance(a.test.comparators[0], (ast.List, ast.Tuple, ast.Set))), None)
        if node is None:
            continue
        elts = getattr(getattr(node.test, "comparators", [None])[0], "elts", [])
        allowed = [c.value for c in elts if isinstance(c, ast.Constant)]
        given = (getattr(ctx, "server_config", None) or NO_FLAGS).flag("--quantization")
        q = None if given in (None, True) else str(given)
        g = se.Gate(f"required setting: quantization with --moe-runner-backend {runner}", q in allowed,
                    f"{se.short(path)}:{node.lineno}-{node.end_lineno} `assert {ast.unparse(node.test)}` (under `{t}`)",
                    GATE_SETTING, f"with --moe-runner-backend {runner} SGLang asserts the quantization is one of "
                    f"{allowed} (None: bf16); the configuration gives {q!r}", LIFT_SETTING,
                    f"a model whose --quantization is one of {allowed} (None: bf16)",
                    value={"allowed": allowed, "configured": q})
        if not g.admits:
            g.on_fail = "raise"
            g.raises = f"AssertionError while SGLang resolves its arguments: {g.cause}"
        return g
    return None


def _a2a_modules(ctx) -> list[str]:
    """The ``gen_*`` a2a module functions of the installed flashinfer/jit/comm.py that admit the target."""
    try:
        table = fi.all_module_majors()
    except (source.SourceNotFound, SyntaxError):
        return []
    return [k for k, val in table.items() if "alltoall" in k and ("moe" in k or "nvlink" in k)
            and (val is None or ctx.target.major in val)]


def _required(ctx, arg: se.Gate, g: se.Gate) -> se.Gate:
    """A setting ``--moe-a2a-backend flashinfer`` requires (DP attention, the MoE runner), asserted by SGLang while
    it resolves its arguments. Closed with the a2a backend configured: an ``AssertionError`` at start-up
    (``on_fail="raise"``). Closed without it: one more opt-in to set beside the flag (the flags its lift names,
    admitted when the configuration gives them)."""
    if g.admits or g.kind != GATE_SETTING:
        return g
    flags = [w for w in g.lift_detail.replace(":", " ").split() if w.startswith("--")]
    old = (g.value or {}).get("spelling", {}).get("deprecated") if isinstance(g.value, dict) else None
    given = (bool(flags) and all(se.configured(ctx, f) for f in flags)
             or bool(old) and all(se.configured(ctx, f) for f in (old or [])))
    if given:
        g.admits = True
        g.value = {"required": g.value, "configured": flags}
        return g
    if arg.configured:
        g.on_fail = "raise"
        g.raises = f"AssertionError while SGLang resolves its arguments: {g.cause}"
        return g
    typed = re.search(r"--[^()]*", g.lift_detail)
    g.opt_in, g.flag = True, typed.group(0).strip() if typed else g.lift_detail
    return g


def _runner_gate_0523(eng, hook, tree, ctx) -> se.Gate:
    """SGLang 0.5.23's second condition on ``--moe-a2a-backend flashinfer`` (``srt/arg_groups/moe_hook.py``): under
    ``if a2a_now == "flashinfer":`` it asserts ``resolved_view(server_args).moe_runner_backend in [...]`` (the
    flashinfer_cutlass / cutedsl / trtllm(_routed) / deep_gemm runners). The default ``auto`` resolves to
    ``flashinfer_cutlass`` on SM120 only for ``--quantization modelopt_fp4`` (``srt/arg_groups/overrides.py``, read
    when found), so other models need ``--moe-runner-backend flashinfer_cutlass``. Raises GateNotFound when the
    assert is not found (fails closed)."""
    node = None
    for n in ast.walk(tree):
        if (isinstance(n, ast.If) and isinstance(n.test, ast.Compare) and "a2a" in ast.unparse(n.test.left)
                and any(isinstance(c, ast.Constant) and c.value == "flashinfer" for c in n.test.comparators)):
            node = next((a for a in ast.walk(n) if isinstance(a, ast.Assert) and isinstance(a.test, ast.Compare)
                         and "moe_runner_backend" in ast.unparse(a.test.left) and isinstance(a.test.ops[0], ast.In)
                         and isinstance(a.test.comparators[0], (ast.List, ast.Tuple, ast.Set))), None)
            if node is not None:
                break
    if node is None:
        raise se.GateNotFound(f"gate not found in sglang {eng.version} at {short(hook)}: no `assert ...moe_runner_backend "
                              "in [...]` under `if <a2a backend> == \"flashinfer\"`")
    runners = [c.value for c in node.test.comparators[0].elts if isinstance(c, ast.Constant)]
    runner = se.server_argument(eng, ("--moe-runner-backend",))
    want = "flashinfer_cutlass" if "flashinfer_cutlass" in runners else runners[0]
    auto = _auto_runner(eng, runner["default"], runners, ctx.target.major)
    note = (f"; default {runner['default']!r} becomes {auto['to']!r} only for --quantization {auto['quantization']} "
            f"on {' / '.join(auto['predicates'])} ({auto['where']})") if auto else ""
    where = f"{short(hook)}:{node.lineno}-{node.end_lineno} `assert {ast.unparse(node.test)}`"
    return se.Gate("required setting: MoE runner", runner["default"] in runners, where, GATE_SETTING,
                   f"--moe-a2a-backend flashinfer asserts the MoE runner is one of {runners} (default "
                   f"{runner['default']!r} at {runner['default_where']}){note}", LIFT_SETTING,
                   f"{runner['flag']} {want}" + (f" (for models other than {auto['quantization']}; SGLang picks it "
                                                  f"itself for {auto['quantization']} on this GPU)" if auto else ""),
                   value={"runners": runners, "default": runner["default"], "auto": auto})


def _auto_runner(eng, default, runners, major: int) -> dict | None:
    """Where SGLang resolves the default MoE runner to one of ``runners`` by quantization and platform on the target
    (compute-capability ``major``): the first ``if moe_runner_backend == <default> and ....quantization == Q and
    (<platform predicates admitting major>)`` under srt/arg_groups whose body assigns a runner of ``runners``.
    Returns {"to", "quantization", "predicates", "majors", "where"} or None."""
    table = se.platform_majors(eng)
    for path, n in se.arg_ifs(eng):
        if not isinstance(n.test, ast.BoolOp):
            continue
        t = ast.unparse(n.test)
        if f"moe_runner_backend == {default!r}" not in t or "quantization ==" not in t:
            continue
        to = next((a.value.value for a in n.body if isinstance(a, ast.Assign) and isinstance(a.value, ast.Constant)
                   and "moe_runner_backend" in ast.unparse(a.targets[0]) and a.value.value in runners), None)
        quant = next((c.comparators[0].value for c in ast.walk(n.test) if isinstance(c, ast.Compare)
                      and "quantization" in ast.unparse(c.left) and isinstance(c.comparators[0], ast.Constant)), None)
        names, majors = se.predicate_majors(n.test, table)
        if to and quant and names and major in majors:
            return {"to": to, "quantization": quant, "predicates": names, "majors": majors,
                    "where": f"{se.short(path)}:{n.lineno}-{n.body[0].end_lineno}"}
    return None


def library_gate(ctx) -> list[Verdict]:
    """FlashInfer's side: its all-to-all JIT modules' arch lists and the MNNVL (NVLink fabric) design."""
    v = Verdict("ep-flashinfer-a2a", GATE_PASSES, lift=LIFT_NONE_NEEDED, scope=SCOPE_LIBRARY)
    fv = fi.version()
    if fv is None:
        v.status, v.gate, v.cause, v.lift = SKIPPED, GATE_NOT_INSTALLED, "not installed: flashinfer-python", LIFT_PACKAGE
        return [v]
    v.add("flashinfer-python version", fv, "distribution metadata")
    try:
        table = fi.all_module_majors()
    except (source.SourceNotFound, SyntaxError) as e:
        v.status, v.cause = "error", f"cannot read flashinfer/jit/comm.py of flashinfer-python {fv}: {e}"
        return [v]
    a2a = {k: val for k, val in table.items() if "alltoall" in k and ("moe" in k or "nvlink" in k)}
    v.add("a2a JIT modules' supported majors (None = unrestricted)", a2a, "flashinfer/jit/comm.py (ast)")
    refused = [k for k, val in a2a.items() if val is not None and ctx.target.major not in val]
    if a2a and len(refused) == len(a2a):
        v.status, v.gate, v.lift = BLOCKED, GATE_PYTHON, LIFT_PACKAGE
        v.cause = f"every a2a JIT module's arch list excludes major {ctx.target.major}: {refused}"
        return [v]
    handles, exch = _fd_fallback(), _fd_exchange()
    v.add("MnnvlMemory handle types", handles[0], handles[1])
    v.add("MnnvlMemory POSIX fd exchange", exch[0], exch[1])
    v.add("every nvcc in reach", all_nvccs(ctx.env) or "none (PATH, CUDA_HOME, /usr/local/cuda, PyPI toolkit folders)",
          "environment")
    blocker = compiler_blocker(ctx, [k for k in a2a if k not in refused])
    if blocker is not None:
        v.status, v.gate, v.lift = BLOCKED, GATE_TOOLCHAIN, LIFT_PACKAGE
        v.cause, v.lift_detail = blocker
        return [v]
    blocker = arch_list_blocker(ctx, v, [k for k in a2a if k not in refused])
    if blocker is not None:
        v.status, v.gate, v.lift = BLOCKED, GATE_TOOLCHAIN, LIFT_SETTING
        v.cause, v.lift_detail = blocker
        return [v]
    v.status, v.gate, v.lift = SKIPPED, GATE_NEEDS_RUNTIME, LIFT_UNKNOWN
    v.cause = (f"FlashInfer's a2a modules admit {ctx.target.cc} and no topology gate exists (handle type: {handles[0]}, "
               f"{handles[1]}); whether it "
               f"works over {ctx.topology} (peer access; fd exchange: {_exchange_words(exch[0])}) is for the runtime "
               "tier")
    return [v]


def compiler_blocker(ctx, modules: list[str]) -> tuple[str, str] | None:
    """(cause, lift_detail) when FlashInfer cannot get the a2a module here: no nvcc in reach
    (:func:`stackprobe.env.effective_nvcc`: CUDA_HOME, PATH, the PyPI toolkit folders) for its JIT build and no
    flashinfer-jit-cache holding one of ``modules`` (``gen_*`` names of flashinfer/jit/comm.py) with SASS for the
    target (:func:`flashinfer_common.aot_module`); None when either is present.

    The lift is ``package-upgrade``, not ``cuda-upgrade``: the installed CUDA release is not the problem (12.8
    already compiles sm_120a); what is missing is a package in the image: nvcc (a CUDA *devel* base image; CUDA 12
    PyPI wheels carry no nvcc, CUDA 13's nvidia-cuda-nvcc does) or a flashinfer-jit-cache built with the module."""
    if effective_nvcc(ctx.env):
        return None
    aots = {m: fi.aot_module(m, ctx.target) for m in modules}
    if any(a["covers"] for a in aots.values()):
        return None
    names = ", ".join(a["module"] or m for m, a in aots.items()) or "its MoE all-to-all module"
    why = "; ".join(dict.fromkeys(a["cause"] for a in aots.values() if a["cause"])) or "no flashinfer-jit-cache"
    cause = (f"no nvcc in reach for FlashInfer's JIT (PATH, CUDA_HOME, the PyPI toolkit folders) and no ahead-of-time "
             f"build of the a2a module for {ctx.target.cc} ({why}): FlashInfer JIT-builds {names} at first use "
             "(moe_a2a_get_workspace_size_per_rank), so the MoE all-to-all cannot build here")
    lift = (f"install nvcc (a CUDA devel base image; CUDA >= 12.8 compiles sm_{ctx.target.number}a, so the installed "
            f"CUDA release suffices) or a flashinfer-jit-cache holding {names} with SASS for {ctx.target.cc}")
    return cause, lift


def arch_list_blocker(ctx, v, modules: list[str]) -> tuple[str, str] | None:
    """(cause, lift_detail) when FlashInfer's own arch normalisation leaves the a2a module generator no target for
    ``ctx.target`` (case C45: FlashInfer 0.6.7-0.6.18 refuse SM 12.x on nvcc < 12.9 unless FLASHINFER_CUDA_ARCH_LIST is
    set, the same check that blocks fusion, C4); the gate is FlashInfer's code run in a child
    (:func:`flashinfer_common.gate`), its answer added to ``v``. None when the list has the target's major."""
    if not modules or not effective_nvcc(ctx.env):
        return None
    g = fi.gate(ctx, modules[0])
    if "worker_error" in g:
        v.add("FlashInfer gate call", g["worker_error"], "child interpreter")
        return None
    v.add(f"effective target arch list ({modules[0]})", g.get("effective_archs"), g.get("arch_list_source", ""))
    if any(int(a.split(".")[0]) == ctx.target.major for a in g.get("effective_archs") or []):
        return None
    why = ((g.get("swallowed") or [None])[0] or g.get("context_error") or g.get("normalise_error")
           or "FlashInfer kept no entry for the target")
    return (f"FlashInfer's effective target list for {ctx.target.cc} is empty, so {modules[0]} builds no code for it: "
            f"{why} (the check that blocks allreduce fusion, case C4)",
            f"FLASHINFER_CUDA_ARCH_LIST={ctx.target.cc}a (a suffixed entry is used verbatim), or a CUDA >= 12.9 nvcc")


def _fd_fallback() -> tuple[str, str]:
    """How the installed FlashInfer's ``MnnvlMemory`` picks its memory handle type, read from
    ``flashinfer/comm/mnnvl.py`` (``ast``): 0.6.3 picks FABRIC on aarch64 CPUs and POSIX file descriptors
    otherwise, by ``platform.machine()`` (``mnnvl.py:404-414``); 0.7.2 probes whether the GPU supports fabric
    handles (``_probe_fabric_supported``, ``mnnvl.py:321-334``). Returns (text, "flashinfer/comm/mnnvl.py:L1-L2")."""
    import ast

    try:
        path = source.module_file("flashinfer.comm.mnnvl")
        tree = source.parse(path)
    except (source.SourceNotFound, OSError, SyntaxError):
        return "flashinfer/comm/mnnvl.py unreadable", ""
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        choice = next((n for n in ast.walk(fn) if isinstance(n, ast.If)
                       and "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR" in ast.unparse(n)
                       and "CU_MEM_HANDLE_TYPE_FABRIC" in ast.unparse(n) and "requestedHandleTypes" in ast.unparse(n)), None)
        if choice is None:
            continue
        text = ast.unparse(fn)
        where = f"{fi._short(path)}:{choice.lineno}-{choice.end_lineno} {fn.name}"
        if "platform.machine" in text or "aarch64" in text:
            return ("FABRIC on aarch64 CPUs, POSIX file descriptors otherwise: chosen by CPU type "
                    "(platform.machine()), not by whether a fabric exists"), where
        if "fabric_supported" in text.lower():
            return "FABRIC when the GPU supports fabric handles (probed), else POSIX file descriptors", where
        return f"FABRIC or POSIX file descriptors, chosen by `{ast.unparse(choice.test)}`", where
    if "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR" not in path.read_text(encoding="utf-8", errors="replace"):
        return "no POSIX fd fallback found: fabric only", f"{fi._short(path)}"
    return "POSIX file descriptors (no FABRIC/POSIX choice found)", f"{fi._short(path)}"

def _exchange_words(text: str) -> str:
    """A short phrase for :func:`_fd_exchange`'s answer: ``pidfd_getfd, which needs SYS_PTRACE (CAP_SYS_PTRACE in a
    container)`` or ``SCM_RIGHTS, no CAP_SYS_PTRACE needed``."""
    head = text.split(":")[0]
    if head == "pidfd_getfd":
        return "pidfd_getfd, which needs SYS_PTRACE (CAP_SYS_PTRACE in a container)"
    if head == "SCM_RIGHTS":
        return "SCM_RIGHTS, no CAP_SYS_PTRACE needed"
    return text


def _fd_exchange() -> tuple[str, str]:
    """How the installed FlashInfer's ``MnnvlMemory`` hands each rank its peers' POSIX file descriptors (the handle
    type it uses over PCIe, :func:`_fd_fallback`), read from the function that exports the allocation
    (``cuMemExportToShareableHandle``) in ``flashinfer/comm/mnnvl.py`` (``ast``):

    * ``pidfd_getfd``: each rank takes the peer's fd out of the peer process (flashinfer-python 0.6.3,
      ``mnnvl.py:497-530``): that needs ptrace access to the peer, ``CAP_SYS_PTRACE`` in a container (FlashInfer's
      own error text says ``--cap-add=SYS_PTRACE``);
    * ``SCM_RIGHTS``: descriptors passed over an AF_UNIX socket (flashinfer-python 0.7.2, ``mnnvl.py:386-397`` ->
      ``flashinfer/comm/fd_exchange.py``, whose docstring at ``:15-19`` says no ``CAP_SYS_PTRACE`` is needed), all
      ranks on one host.

    Returns ``(text, "flashinfer/comm/FILE:LINE")``; the text says "not read" when neither is found."""
    try:
        path = source.module_file("flashinfer.comm.mnnvl")
        tree = source.parse(path)
    except (source.SourceNotFound, OSError, SyntaxError):
        return "not read: flashinfer/comm/mnnvl.py unreadable", ""
    imported = {a.asname or a.name: ("flashinfer.comm." * bool(n.level)) + n.module for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.module for a in n.names}
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MnnvlMemory"), tree)
    for fn in ast.walk(cls):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or "cuMemExportToShareableHandle" not in \
                ast.unparse(fn):
            continue
        pid = next((n for n in ast.walk(fn) if isinstance(n, ast.Name) and "pidfd_getfd" in n.id), None)
        if pid is not None:
            return ("pidfd_getfd: each rank takes its peers' fds out of their processes, which needs ptrace access "
                    "to them (CAP_SYS_PTRACE in a container: docker run --cap-add=SYS_PTRACE, as FlashInfer's own "
                    "error says)"), f"{fi._short(path)}:{pid.lineno} {fn.name}"
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)):
            callee = getattr(call.func, "id", "")
            mod = imported.get(callee)
            if not mod:
                continue
            try:
                other = source.module_file(mod)
            except source.SourceNotFound:
                continue
            if "SCM_RIGHTS" in other.read_text(encoding="utf-8", errors="replace"):
                return ("SCM_RIGHTS: descriptors are passed over an AF_UNIX socket, so no CAP_SYS_PTRACE is needed "
                        "(all ranks on one host)"), \
                    f"{fi._short(path)}:{call.lineno} {fn.name} -> {fi._short(other)} {callee}"
        if "SCM_RIGHTS" in ast.unparse(fn):
            return "SCM_RIGHTS: descriptors passed over an AF_UNIX socket (no CAP_SYS_PTRACE needed)", \
                f"{fi._short(path)}:{fn.lineno} {fn.name}"
    return "not read: no fd exchange found beside cuMemExportToShareableHandle", fi._short(path)


def probe(ctx) -> list[Verdict]:
    return library_gate(ctx) + engine_gate(ctx)
