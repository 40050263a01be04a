"""Expert parallelism over FlashInfer all-to-all (SGLang ``--moe-a2a-backend flashinfer``).

No topology gate exists on this path in SGLang 0.5.9 / 0.5.23 or FlashInfer 0.6.3 / 0.7.2: ``MoeAlltoAll``
allocates through ``MnnvlMemory``, which on x86_64 without an NVLink fabric exports POSIX file-descriptor
handles (0.6.3 ``flashinfer/comm/mnnvl.py:404-415``; 0.7.2 ``mnnvl.py:321-334``). Whether it then works over
PCIe (peer access, ``SYS_PTRACE`` for the fd exchange) is a runtime question.

Engine answer (read from the installed SGLang): the server argument ``--moe-a2a-backend`` (default
``none``) and the settings it requires: 0.5.9 asserts the ``flashinfer_cutlass`` MoE runner under
``if self.moe_a2a_backend == "flashinfer"`` (``srt/server_args.py:2214``); 0.5.23 asserts
``_flashinfer_a2a_topology_is_supported`` (``srt/arg_groups/moe_hook.py``: DP attention with attn_dp_size ==
tp_size), run here with its own code. Also the FlashInfer names SGLang's dispatcher imports, and the a2a JIT
modules' arch lists. Library answer: the a2a JIT modules' arch lists, then a compiler for the JIT
(``toolchain`` without nvcc or flashinfer-jit-cache), else ``needs-runtime``.
"""
from __future__ import annotations

import ast

from .. import source
from ..env import effective_nvcc
from ..verdict import (BLOCKED, GATE_NEEDS_RUNTIME, GATE_NOT_INSTALLED, GATE_PASSES, GATE_PYTHON, GATE_SETTING,
                       GATE_TOOLCHAIN, LIFT_CUDA, LIFT_NONE_NEEDED, LIFT_PACKAGE, LIFT_SETTING, LIFT_UNKNOWN,
                       SCOPE_ENGINE, SCOPE_LIBRARY, SKIPPED, Verdict)
from . import flashinfer_common as fi
from . import sglang_engine as se
from .sglang_custom_ar import short

BACKENDS = ("ep-flashinfer-a2a",)
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
    return se.answer(BACKENDS[0], ctx, _engine)


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
    arg = ans.add(se.server_argument_gate(eng, ("--moe-a2a-backend",)))
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
        dp = se.server_argument(eng, ("--enable-dp-attention",))["flag"]
        dps = se.server_argument(eng, ("--dp-size",))["flag"]
        detail = f"{arg.flag} flashinfer with DP attention: {dp} {dps} {w} (attn_dp_size == tp_size == {w})"
        setting = se.Gate("required setting: DP attention", plain, where, GATE_SETTING if dpa else GATE_PYTHON,
                          f"--moe-a2a-backend flashinfer requires DP attention with attn_dp_size == tp_size "
                          f"({PRECONDITION}(tp={w}, ep={w}) is {plain} without it, {dpa} with dp={w})",
                          LIFT_SETTING if dpa else LIFT_PACKAGE, detail if dpa else "", value=[plain, dpa])
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
        detail = f"{arg.flag} flashinfer {runner['flag']} {runners[0] if runners else '?'}"
        setting = se.Gate("required setting: MoE runner", ok, f"sglang/{rel}:{node.lineno} `assert {ast.unparse(node.test)}`",
                          GATE_SETTING, f"--moe-a2a-backend flashinfer asserts the MoE runner is one of {runners} "
                          f"(default {runner['default']!r} at {runner['default_where']})", LIFT_SETTING, detail,
                          value={"runners": runners, "default": runner["default"]})
    ans.add(setting)
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
    v.warnings.append("no topology gate in SGLang or FlashInfer on this path (MnnvlMemory falls back to POSIX "
                      "file-descriptor handles without a fabric); over PCIe it needs peer access and SYS_PTRACE "
                      "for the fd exchange: a runtime question")
    return v


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
    handles = _fd_fallback()
    v.add("MnnvlMemory handle types", handles[0], handles[1])
    jit_cache = ctx.coverage.get("flashinfer-jit-cache")
    if not effective_nvcc(ctx.env) and (jit_cache is None or jit_cache.level in ("none", "no-cuda-code")):
        v.status, v.gate, v.lift = BLOCKED, GATE_TOOLCHAIN, LIFT_CUDA
        v.cause = (f"no nvcc here and no flashinfer-jit-cache for {ctx.target.cc}: FlashInfer JIT-builds the a2a module "
                   f"({', '.join(a2a) or 'its MoE all-to-all module'}) at first use "
                   "(moe_a2a_get_workspace_size_per_rank)")
        v.lift_detail = "a CUDA toolkit with nvcc (>= 12.8 for sm_120a) or a flashinfer-jit-cache built for the target"
        return [v]
    v.status, v.gate, v.lift = SKIPPED, GATE_NEEDS_RUNTIME, LIFT_UNKNOWN
    v.cause = (f"FlashInfer's a2a modules admit {ctx.target.cc} and no topology gate exists ({handles[0]}); whether it "
               f"works over {ctx.topology} (peer access, SYS_PTRACE for the fd exchange) is for the runtime tier")
    return [v]


def _fd_fallback() -> tuple[str, str]:
    """Where the installed FlashInfer's MnnvlMemory uses POSIX fd handles (the no-fabric path)."""
    try:
        path = source.module_file("flashinfer.comm.mnnvl")
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except (source.SourceNotFound, OSError):
        return "flashinfer/comm/mnnvl.py unreadable", ""
    hits = [i for i, ln in enumerate(lines, 1) if "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR" in ln]
    if not hits:
        return "no POSIX fd fallback found: fabric only", f"{fi._short(path)}"
    return "FABRIC when a fabric exists, else POSIX file descriptors", f"{fi._short(path)}:{hits[0]}"

def probe(ctx) -> list[Verdict]:
    return library_gate(ctx) + engine_gate(ctx)
