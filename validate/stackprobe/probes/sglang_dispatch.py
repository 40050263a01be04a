"""SGLang's TP allreduce dispatch, read from the installed source: which path a decode-step allreduce takes.

:func:`read_dispatch` walks ``GroupCoordinator.all_reduce`` in ``srt/distributed/parallel_state.py`` statement by
statement (and, where it calls it, ``_resolve_outplace_all_reduce_method``: sglang 0.5.23; 0.5.9 has an if/elif
chain inside ``all_reduce`` itself), maps every ``if`` that hands the tensor to a path onto a suite backend name,
and evaluates its condition (:mod:`.sglang_pyeval`) for the server configuration, the target host and the decode
tensor, with each communicator's per-call check (``should_custom_ar``, ``should_pcie_ipc_ar``,
``should_mscclpp_allreduce``, ``should_torch_symm_mem_allreduce``) run from its own code. A step it cannot map
to a known path, or a condition naming something it cannot evaluate, raises :class:`DispatchError`: never a pass.
"""
from __future__ import annotations

import ast
import re
from dataclasses import asdict, dataclass, field

from .. import source
from . import sglang_engine as se
from . import sglang_flags as sf
from . import sglang_pcie_ipc as pi
from .sglang_flags import ConfigError, parse_server_config  # noqa: F401 - public entry point
from .sglang_pyeval import UNKNOWN, Evaluator, Unbound, run_function

PS_FILE = "srt/distributed/parallel_state.py"
COMM_DIR = "srt/distributed/device_communicators"
# outplace method names -> suite backend
METHODS = {"ca": "sglang-custom-allreduce", "pcie_ipc": "flashinfer-pcie-ipc-allreduce", "qr": "sglang-quick-allreduce",
           "pymscclpp": "mscclpp", "torch_symm_mem": "torch-symm-mem", "pynccl": "nccl-ring"}
# communicator attribute -> (method it serves, module under device_communicators, class, per-call check)
COMMUNICATORS = {
    "ca_comm": ("ca", "custom_all_reduce.py", "CustomAllreduce", "should_custom_ar"),
    "pcie_ipc_comm": ("pcie_ipc", "pcie_ipc_ar.py", "PcieIpcCommunicator", "should_pcie_ipc_ar"),
    "qr_comm": ("qr", "quick_all_reduce.py", "QuickAllReduce", "should_quick_allreduce"),
    "pymscclpp_comm": ("pymscclpp", "pymscclpp.py", "PyMscclppCommunicator", "should_mscclpp_allreduce"),
    "torch_symm_mem_comm": ("torch_symm_mem", "torch_symm_mem.py", "TorchSymmMemCommunicator",
                            "should_torch_symm_mem_allreduce"),
    "pynccl_comm": ("pynccl", "pynccl.py", "PyNcclCommunicator", ""),
    "hpu_communicator": ("", "hpu_communicator.py", "HpuCommunicator", ""),
    "xpu_communicator": ("", "xpu_communicator.py", "XpuCommunicator", ""),
    "npu_communicator": ("", "npu_communicator.py", "NpuCommunicator", ""),
}
_ATTR = re.compile(r"self\.(\w+_comm(?:unicator)?)\b")


class DispatchError(LookupError):
    """The dispatch cannot be read: a step maps to no known path (``unknown``: the communicator attribute), or a
    condition names something this reader cannot evaluate. The message names the release and ``file:line``."""

    def __init__(self, msg: str, unknown: str = "", where: str = ""):
        super().__init__(msg)
        self.unknown, self.where = unknown, where


@dataclass(frozen=True)
class DecodeTensor:
    """The decode-step allreduce input: bf16 ``[rows, hidden]``, rows = ``batch`` x ``tokens`` (draft tokens per
    request for EAGLE-3 verify). Built from a :class:`stackprobe.runtime.workload.Workload` (default: the seed
    preset, hidden 7168, 3 tokens, batch 1)."""

    hidden: int = 7168
    tokens: int = 3
    batch: int = 1
    dtype: str = "bfloat16"

    @property
    def rows(self) -> int:
        return self.batch * self.tokens

    @classmethod
    def from_workload(cls, workload=None, batch: int = 1) -> "DecodeTensor":
        if workload is None:
            from ..runtime.workload import preset
            workload = preset("kimi-k2")
        if isinstance(workload, cls):
            return workload
        return cls(hidden=workload.hidden, tokens=workload.tokens, batch=batch, dtype=workload.dtype)

    def to_json(self) -> dict:
        return {**asdict(self), "rows": self.rows, "shape": [self.rows, self.hidden],
                "bytes": self.rows * self.hidden * (4 if self.dtype == "float32" else 2)}


@dataclass
class Step:
    """One step of the dispatch, in order. ``backend``: suite backend name (``nccl-symm-mem``, ``mscclpp``, ...);
    ``where``: ``sglang/FILE:LINE``; ``condition``: the step's own ``if`` text; ``built``: whether that communicator
    exists and is enabled for the configuration and host (True / False / None: not a communicator step);
    ``admits``: its per-call check for the decode tensor (True / False / "unknown"); ``claims``: the whole
    condition (True / False / "unknown"); ``why``: one line on built and admits, with the check's ``file:line``."""

    backend: str
    where: str
    condition: str
    built: object = None
    admits: object = None
    claims: object = None
    why: str = ""


@dataclass
class Dispatch:
    """SGLang's dispatch of one decode-step allreduce. ``steps`` in dispatch order; ``serves``: the backend of the
    first step that claims the tensor ("" when a step before it is undecided: ``undecided`` says which);
    ``preempted``: {backend: the earlier backend that claims the tensor} for every later step whose communicator is
    built and whose per-call check admits the tensor; ``config``: ServerConfig.to_json(); ``tensor``:
    DecodeTensor.to_json(); ``notes``: what this reading assumes (decode under full CUDA graphs, no torch.compile)."""

    sglang: str
    steps: list = field(default_factory=list)
    serves: str = ""
    preempted: dict = field(default_factory=dict)
    undecided: str = ""
    config: dict = field(default_factory=dict)
    tensor: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    def step(self, backend: str) -> Step | None:
        return next((s for s in self.steps if s.backend == backend), None)

    def to_json(self) -> dict:
        return {"sglang": self.sglang, "serves": self.serves, "preempted": dict(self.preempted),
                "undecided": self.undecided, "config": self.config, "tensor": self.tensor, "notes": list(self.notes),
                "steps": [asdict(s) for s in self.steps]}


def _tv(v):
    return "unknown" if v is UNKNOWN else v


class _State:
    """Per configuration: which communicators exist, and each one's per-call answer for the tensor."""

    def __init__(self, engine: se.Engine, ctx, config, tensor: DecodeTensor):
        self.engine, self.ctx, self.config, self.tensor = engine, ctx, config, tensor
        self.ws, self.nvlink = ctx.world_size, ctx.topology == "nvlink"
        self.comms: dict[str, dict] = {}
        self.notes: list[str] = []

    def flag(self, *names):
        return sf.config_value(self.engine, self.config, *names)

    def env(self, name: str):
        v = self.config.var(name)
        if v is not None:
            return se.env_truthy(v) if v.lower() in ("0", "1", "true", "false", "yes", "no", "on", "off") else v
        default, _ = se.env_flag(self.engine, name)
        return default

    def comm(self, attr: str) -> dict:
        if attr not in self.comms:
            self.comms[attr] = _build(self, attr)
        return self.comms[attr]

    def resolve(self, text: str):
        t = self.tensor
        fixed = {"self.world_size": self.ws, "input_.is_cpu": False, "torch.compiler.is_compiling()": False,
                 "is_hip()": False, "_is_hip": False, "is_in_tc_piecewise_cuda_graph()": False,
                 "is_in_piecewise_cuda_graph()": False, "self.is_symmetric_memory_enabled()": self.flag("--enable-symm-mem")[0],
                 "self._can_use_flashinfer_allreduce(input_)": self.fi_allreduce_only()}
        if text in fixed:
            return fixed[text]
        m = re.fullmatch(r"envs\.(\w+)\.(get|is_set)\(\)", text)
        if m:
            return self.env(m.group(1)) if m.group(2) == "get" else self.config.var(m.group(1)) is not None
        m = re.fullmatch(r"self\.(\w+)(?:\.(\w+)(\(input_\))?)?", text)
        if m and m.group(1) in COMMUNICATORS:
            c = self.comm(m.group(1))
            if m.group(2) is None:
                return c["obj"]
            if m.group(2) == "disabled" and not m.group(3):
                return c["disabled"]
            if m.group(3) and m.group(2) == c.get("check"):
                return c["admits"]
        del t
        raise Unbound(text)

    def fi_allreduce_only(self) -> bool:
        # bootstrap.py: set_flashinfer_allreduce_only(flashinfer_allreduce_fusion_backend is not None and not cutedsl)
        try:
            v, _ = self.flag("--flashinfer-allreduce-fusion-backend")
        except se.GateNotFound:
            return False
        if v is None:
            return False
        self.notes.append("--flashinfer-allreduce-fusion-backend set: FlashInfer's fusion-only allreduce is tried; "
                          "its start-up behaviour on this target is the fusion verdict's")
        return UNKNOWN


_BUILT = object()


def _tensor_resolver(st: _State, self_vals: dict):
    t = st.tensor
    dtype = f"torch.{t.dtype}"
    base = {"inp.numel()": t.rows * t.hidden, "inp.element_size()": 2 if t.dtype != "float32" else 4,
            "inp.dtype": dtype, "torch.bfloat16": "torch.bfloat16", "torch.float16": "torch.float16",
            "torch.float32": "torch.float32", "inp.is_contiguous()": True, "is_weak_contiguous(inp)": True,
            "self._is_weak_contiguous(inp)": True, "inp.dim()": 2, "inp.device": "cuda", "self.device": "cuda",
            "op": "ReduceOp.SUM", "ReduceOp.SUM": "ReduceOp.SUM", "_is_hip": False,
            "is_in_tc_piecewise_cuda_graph()": False, "is_in_torch_compile_warmup()": False,
            "get_pcg_capture_stream()": None, **self_vals}

    def resolve(text: str):
        if text in base:
            return base[text]
        raise Unbound(text)
    return resolve


def _per_call(st: _State, rel: str, cls: str, check: str, self_vals: dict) -> tuple[object, str]:
    """Run ``cls.check`` from ``rel`` for the tensor: (True / False / UNKNOWN, "sglang/FILE:LINE deciding")."""
    tree = st.engine.tree(rel)
    klass = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls), None)
    fn = next((n for n in (klass.body if klass else []) if isinstance(n, ast.FunctionDef) and n.name == check), None)
    if fn is None:
        raise se.GateNotFound(f"gate not found in sglang {st.engine.version} at sglang/{rel}: no {cls}.{check}")
    try:
        out = run_function(fn, _tensor_resolver(st, self_vals))
    except Unbound as e:
        return UNKNOWN, f"sglang/{rel}:{e.line or fn.lineno} {check}: `{e.text}` is decided at run time"
    last = out.trace[-1] if out.trace else None
    why = f"sglang/{rel}:{out.line} {check}" + (f" (after `{last[1]}` -> {_tv(last[2])})" if last else "")
    return out.value if out.value is UNKNOWN else bool(out.value), why


def _build(st: _State, attr: str) -> dict:
    """{"obj": _BUILT or None, "disabled": bool, "check": name, "admits": value, "why": text} for one communicator."""
    method, mod, cls, check = COMMUNICATORS[attr]
    eng, rel = st.engine, f"{COMM_DIR}/{mod}"
    none = {"obj": None, "disabled": True, "check": check, "admits": False}
    if attr in ("hpu_communicator", "xpu_communicator", "npu_communicator", "qr_comm"):
        return {**none, "why": f"not built on NVIDIA GPUs ({cls} is for another platform or ROCm)"}
    if attr == "pynccl_comm":
        return {"obj": _BUILT, "disabled": False, "check": "", "admits": True,
                "why": "built for the tp group on CUDA (use_pynccl); NCCL's own algorithm choice applies"}
    if attr == "ca_comm":
        off, where = st.flag("--disable-custom-all-reduce")
        if off or st.ws < 2:
            return {**none, "why": f"not built: {where}"}
        from .sglang_custom_ar import find_pcie_world_size_rule
        rule = find_pcie_world_size_rule(eng.root)
        if rule is None:
            raise se.GateNotFound(f"gate not found in sglang {eng.version} at sglang/srt/distributed: no "
                                  "`world_size > N and not full_nvlink` rule")
        disabled = st.ws > rule[0] and not st.nvlink
        vals = {"self.disabled": disabled, "self.world_size": st.ws, "self.full_nvlink": st.nvlink,
                "self.max_size": 8 * 1024 * 1024}
        admits, why = _per_call(st, rel, cls, check, vals)
        return {"obj": _BUILT, "disabled": disabled, "check": check, "admits": admits,
                "why": f"built; {'disabled at init by ' + rule[1] if disabled else 'enabled at init'}; per call {why}"}
    if attr == "pcie_ipc_comm":
        det = pi._deterministic(eng, st.config)["on"]
        elig = eng.function(rel, "eligible_group")
        tree = eng.tree(rel)
        groups, _ = pi._module_constant(tree, "_ELIGIBLE_GROUP_NAMES")
        sizes, sl = pi._module_constant(tree, "_SUPPORTED_WORLD_SIZES")
        res = {"envs.SGLANG_ENABLE_PCIE_IPC_ALLREDUCE.get()": st.env(pi.OPT_IN), "world_size": st.ws,
               "group_name": "tp", "_ELIGIBLE_GROUP_NAMES": tuple(groups or ()), "deterministic": det}
        try:
            built = run_function(elig, lambda t: res[t] if t in res else (_ for _ in ()).throw(Unbound(t))).value
        except Unbound as e:
            raise DispatchError(f"sglang {eng.version} sglang/{rel}:{elig.lineno} eligible_group reads `{e.text}`, "
                                "which this reader cannot evaluate", where=f"sglang/{rel}:{elig.lineno}") from e
        if not built:
            return {**none, "why": f"not built: eligible_group (sglang/{rel}:{elig.lineno}) declines ({pi.OPT_IN}="
                    f"{st.config.var(pi.OPT_IN) or 'unset'}, deterministic {det})"}
        fi_has = _fi_has_workspace()
        disabled = st.ws not in (sizes or ()) or not fi_has
        b = pi.row_bound(eng, st.config, st.tensor)
        vals = {"self.disabled": disabled, "self._ensure_workspace(inp)": True,
                "self.max_numel": b["max_numel"] if b["max_numel"] is not None else
                (st.tensor.rows * st.tensor.hidden if b["admits"] else 0), "self._workspace.supports(inp)":
                _fi_supports(st)}
        admits, why = _per_call(st, rel, cls, check, vals)
        return {"obj": _BUILT, "disabled": disabled, "check": check, "admits": admits, "bound": b,
                "why": f"built (eligible_group, sglang/{rel}:{elig.lineno}); world size {st.ws} "
                       f"{'' if st.ws in (sizes or ()) else 'not '}in _SUPPORTED_WORLD_SIZES (sglang/{rel}:{sl}); "
                       + ("" if fi_has else "flashinfer.comm has no PcieIpcAllReduceWorkspace here, so the constructor "
                          "leaves it disabled (its ImportError branch); ") + f"per call {why}; "
                       f"row bound: {b['why']}"}
    if attr == "pymscclpp_comm":
        on, where = st.flag("--enable-mscclpp")
        if not on:
            return {**none, "why": f"not built: {where}"}
        sizes, _ = pi._module_constant(eng.tree(rel), "_SUPPORTED_WORLD_SIZES")
        admits, why = _per_call(st, rel, cls, check, {"self.disabled": False, "self.world_size": st.ws,
                                                      "_SUPPORTED_WORLD_SIZES": tuple(sizes or ())})
        return {"obj": _BUILT, "disabled": False, "check": check, "admits": admits,
                "why": f"built ({where}; needs the mscclpp package); per call {why}"}
    if attr == "torch_symm_mem_comm":
        on, where = st.flag("--enable-torch-symm-mem")
        if not on:
            return {**none, "why": f"not built: {where}"}
        disabled = not st.nvlink
        admits, why = _per_call(st, rel, cls, check, {"self.disabled": disabled, "self.dtype": "torch.bfloat16"})
        return {"obj": _BUILT, "disabled": disabled, "check": check, "admits": admits,
                "why": f"built ({where}); " + ("disabled at init without multicast (the torch-symm-mem verdict)"
                                               if disabled else "enabled") + f"; per call {why}"}
    raise DispatchError(f"no rule for communicator {attr}")


def _fi_has_workspace() -> bool:
    """Whether the installed FlashInfer exports ``PcieIpcAllReduceWorkspace`` (the communicator imports it)."""
    try:
        return "PcieIpcAllReduceWorkspace" in source.defined_names(source.module_file("flashinfer.comm"))
    except (source.SourceNotFound, SyntaxError, OSError):
        return False


def _fi_supports(st: _State):
    """FlashInfer's ``PcieIpcAllReduceWorkspace.supports`` for the tensor: numel a multiple of one 16-byte pack and
    at least one pack per rank (flashinfer/comm/pcie_ipc_policy.py ``_admits``), when FlashInfer is installed."""
    p = source.package_dir("flashinfer")
    f = p / "comm" / "pcie_ipc_policy.py" if p else None
    if f is None or not f.is_file():
        return UNKNOWN
    fn = source.functions(source.parse(f)).get("_admits")
    consts = f.parent / "pcie_ipc_collectives" / "_constants.py"
    pack, _ = pi._module_constant(source.parse(consts), "PACK_BYTES") if consts.is_file() else (None, 0)
    if fn is None or not isinstance(pack, int):
        return UNKNOWN
    vals = {"world_size": st.ws, "numel": st.tensor.rows * st.tensor.hidden, "elem_size": 2, "PACK_BYTES": pack}
    try:
        return bool(run_function(fn, lambda t: vals[t] if t in vals else (_ for _ in ()).throw(Unbound(t))).value)
    except Unbound:
        return UNKNOWN


from .sglang_dispatch_walk import read_dispatch, walk  # noqa: E402,F401 - the walk lives beside the state
