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
from pathlib import Path

from ... import source
from ...paths import PCIE_IPC
from . import engine as se
from . import flags as sf
from . import pcie_ipc as pi
from .flags import ConfigError, parse_server_config  # noqa: F401 - public entry point
from .pyeval import UNKNOWN, Evaluator, Unbound, run_function

PS_FILE = "srt/distributed/parallel_state.py"
COMM_DIR = "srt/distributed/device_communicators"
# outplace method names -> suite backend
METHODS = {"ca": "sglang-custom-allreduce", "pcie_ipc": PCIE_IPC, "qr": "sglang-quick-allreduce",
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
            from ...runtime.workload import preset
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
    klass = next((n for n in source.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls), None)
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


def _max_numel(b: dict, tensor: DecodeTensor):
    """``self.max_numel`` for the per-call check from :func:`.pcie_ipc.row_bound`'s answer ``b``: the bound, else
    (fixed at start-up) the tensor's size when it fits and 0 when not; UNKNOWN where the bound is not assessed."""
    if b["max_numel"] is not None:
        return b["max_numel"]
    if b["admits"] is None:
        return UNKNOWN
    return tensor.rows * tensor.hidden if b["admits"] else 0


def _build_pcie_ipc(st: _State, rel: str, cls: str, check: str, none: dict) -> dict:
    """:func:`_build` for ``pcie_ipc_comm``: ``eligible_group`` run for the configuration, the world sizes, FlashInfer's
    workspace and the row bound. Raises DispatchError where deterministic mode or the world sizes are not read."""
    eng = st.engine
    dinfo = pi._deterministic(eng, st.config)
    det = dinfo["on"] if dinfo["on"] is not None else UNKNOWN
    elig = eng.function(rel, "eligible_group")
    tree = eng.tree(rel)
    groups, _ = pi._module_constant(tree, "_ELIGIBLE_GROUP_NAMES")
    sizes, sl, swhy = pi.supported_sizes(tree)
    if sizes is None:
        raise DispatchError(f"sglang {eng.version} sglang/{rel}: the PCIe IPC world sizes are not assessed: {swhy}",
                            where=f"sglang/{rel}:{sl}")
    res = {"envs.SGLANG_ENABLE_PCIE_IPC_ALLREDUCE.get()": st.env(pi.OPT_IN), "world_size": st.ws,
           "group_name": "tp", "_ELIGIBLE_GROUP_NAMES": tuple(groups or ()), "deterministic": det}
    try:
        built = run_function(elig, lambda t: res[t] if t in res else (_ for _ in ()).throw(Unbound(t))).value
    except Unbound as e:
        raise DispatchError(f"sglang {eng.version} sglang/{rel}:{elig.lineno} eligible_group reads `{e.text}`, "
                            "which this reader cannot evaluate", where=f"sglang/{rel}:{elig.lineno}") from e
    if built is UNKNOWN:
        raise DispatchError(f"sglang {eng.version} sglang/{rel}:{elig.lineno} eligible_group: whether deterministic "
                            f"collectives keep PCIe IPC off is not assessed: {dinfo.get('not_assessed', 'unknown')}",
                            where=dinfo["where"])
    if not built:
        return {**none, "why": f"not built: eligible_group (sglang/{rel}:{elig.lineno}) declines ({pi.OPT_IN}="
                f"{st.config.var(pi.OPT_IN) or 'unset'}, deterministic {_tv(det)})"}
    fi_has = _fi_has_workspace()
    disabled = st.ws not in (sizes or ()) or not fi_has
    b = pi.row_bound(eng, st.config, st.tensor)
    vals = {"self.disabled": disabled, "self._ensure_workspace(inp)": True,
            "self.max_numel": _max_numel(b, st.tensor), "self._workspace.supports(inp)": _fi_supports(st)}
    admits, why = _per_call(st, rel, cls, check, vals)
    return {"obj": _BUILT, "disabled": disabled, "check": check, "admits": admits, "bound": b,
            "why": f"built (eligible_group, sglang/{rel}:{elig.lineno}); world size {st.ws} "
                   f"{'' if st.ws in (sizes or ()) else 'not '}in _SUPPORTED_WORLD_SIZES (sglang/{rel}:{sl}); "
                   + ("" if fi_has else "flashinfer.comm has no PcieIpcAllReduceWorkspace here, so the constructor "
                      "leaves it disabled (its ImportError branch); ") + f"per call {why}; "
                   f"row bound: {b['why']}"}


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
        rule = find_pcie_world_size_rule(eng.root)
        if rule is None:
            raise se.GateNotFound(f"gate not found in sglang {eng.version} at sglang/srt/distributed: no "
                                  "`world_size > N and not full_nvlink` rule")
        disabled = st.ws > rule[0] and not st.nvlink
        vals = {"self.disabled": disabled, "self.world_size": st.ws, "self.full_nvlink": st.nvlink,
                "self.max_size": _car_max_size(eng, rel)}
        admits, why = _per_call(st, rel, cls, check, vals)
        return {"obj": _BUILT, "disabled": disabled, "check": check, "admits": admits,
                "why": f"built; {'disabled at init by ' + rule[1] if disabled else 'enabled at init'}; per call {why}"}
    if attr == "pcie_ipc_comm":
        return _build_pcie_ipc(st, rel, cls, check, none)
    if attr == "pymscclpp_comm":
        on, where = st.flag("--enable-mscclpp")
        if not on:
            return {**none, "why": f"not built: {where}"}
        pkg = mscclpp_package(eng)
        if not pkg["importable"]:
            return {"obj": _BUILT, "disabled": True, "check": check, "admits": False, "package": pkg,
                    "why": f"built ({where}) but disabled: {pkg['why']}"}
        sizes, sl, swhy = pi.supported_sizes(eng.tree(rel))
        if sizes is None:
            raise DispatchError(f"sglang {eng.version} sglang/{rel}: MSCCL++'s world sizes are not assessed: {swhy}",
                                where=f"sglang/{rel}:{sl}")
        admits, why = _per_call(st, rel, cls, check, {"self.disabled": False, "self.world_size": st.ws,
                                                      "_SUPPORTED_WORLD_SIZES": tuple(sizes or ())})
        return {"obj": _BUILT, "disabled": False, "check": check, "admits": admits, "package": pkg,
                "why": f"built ({where}; {pkg['why']}); per call {why}"}
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


def _module_findable(name: str) -> bool:
    """Whether module ``name`` (dotted) is found on the path, without importing anything: the top-level package with
    ``importlib.util.find_spec``, each submodule with ``importlib.machinery.PathFinder`` in its parent package's
    folders (``find_spec`` of a dotted name would import the parents). The mscclpp package ships ``ext`` and
    ``default_algos`` as subpackages (microsoft/mscclpp ``python/mscclpp/ext/__init__.py``,
    ``python/mscclpp/default_algos/__init__.py``), so they are files this finds."""
    import importlib.machinery
    import importlib.util

    parts = name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return False
    for i in range(1, len(parts)):
        locations = spec.submodule_search_locations if spec is not None else None
        if not locations:
            return False            # not a package: it has no submodules
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:i + 1]), list(locations))
    return spec is not None


def mscclpp_package(engine: se.Engine) -> dict:
    """Whether the modules ``PyMscclppCommunicator`` imports are importable in the environment read:
    ``{"modules": [...], "importable": bool, "where": "sglang/FILE:LINES", "why": text}``. The modules are read from
    the ``importlib.import_module("...")`` calls in the ``try`` whose handler catches ImportError in its
    ``__init__`` (sglang 0.5.23 ``pymscclpp.py:1047-1056``: ``mscclpp``, ``mscclpp.ext``, ``mscclpp.default_algos``);
    each is looked up as SGLang imports it (:func:`_module_findable`; nothing is imported), so a ``mscclpp`` package
    that lacks ``ext`` or ``default_algos`` reads not importable: ``import_module("mscclpp.ext")`` raises
    ImportError there, and the same branch is taken. Without them the
    constructor returns with ``self.disabled = True`` and ``self.available = False`` (``pymscclpp.py:1029-1030``), and
    ``change_state`` keeps it disabled during graph capture (``:1270-1271``); with them, ``GroupCoordinator
    .graph_capture`` enables it (``parallel_state.py:669``). The package is not among sglang 0.5.23's Requires-Dist.
    Raises GateNotFound when the class or that ``try`` is missing."""
    rel = f"{COMM_DIR}/pymscclpp.py"
    tree = engine.tree(rel)
    klass = next((n for n in source.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "PyMscclppCommunicator"), None)
    init = next((n for n in (klass.body if klass else []) if isinstance(n, ast.FunctionDef) and n.name == "__init__"),
                None)
    for t in (x for x in source.walk(init) if isinstance(x, ast.Try)) if init else ():
        if not any("ImportError" in ast.unparse(h.type) for h in t.handlers if h.type is not None):
            continue
        mods: list[str] = [c.args[0].value for b in t.body for c in source.walk(b) if isinstance(c, ast.Call)
                           and ast.unparse(c.func).endswith("import_module") and c.args
                           and isinstance(c.args[0], ast.Constant) and isinstance(c.args[0].value, str)]
        if not mods:
            continue
        tops = list(dict.fromkeys(m.split(".")[0] for m in mods))
        missing = [m for m in tops if not _module_findable(m)]
        lacking = [m for m in mods if m.split(".")[0] not in missing and not _module_findable(m)]
        missing += list(dict.fromkeys(m.split(".")[0] for m in lacking))
        where = f"sglang/{rel}:{t.lineno}-{t.handlers[-1].end_lineno}"
        if missing:
            why = (f"the {', '.join(missing)} package is not importable here"
                   + (f" as SGLang imports it ({', '.join(lacking)} not found in it)" if lacking else "")
                   + ", so PyMscclppCommunicator's ImportError "
                   f"branch ({where}) leaves it disabled, also during graph capture (change_state keeps an unavailable "
                   "communicator disabled)")
        else:
            why = (f"the {', '.join(tops)} package is importable here ({', '.join(mods)}, {where}), so graph capture "
                   "enables it (GroupCoordinator.graph_capture: change_state(enable=True))")
        return {"modules": mods, "package": tops[0], "importable": not missing, "where": where, "why": why}
    raise se.GateNotFound(f"gate not found in sglang {engine.version} at sglang/{rel}: no try/except ImportError "
                          "around importlib.import_module(...) in PyMscclppCommunicator.__init__")


def find_pcie_world_size_rule(root: Path) -> tuple[int, str] | None:
    """(N, "file:line `test`") of the first ``world_size > N and not <...nvlink...>`` test under
    ``root/srt/distributed``, or None."""
    base = root / "srt" / "distributed"
    for p in source.find_files_containing(base if base.is_dir() else root, "nvlink"):
        try:
            tree = source.parse(p)
        except SyntaxError:
            continue
        for node in source.walk(tree):
            if not (isinstance(node, ast.If) and isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And)):
                continue
            limit, nvl = None, False
            for val in node.test.values:
                if (isinstance(val, ast.Compare) and isinstance(val.left, ast.Name) and val.left.id == "world_size"
                        and isinstance(val.ops[0], ast.Gt) and isinstance(val.comparators[0], ast.Constant)):
                    limit = val.comparators[0].value
                if isinstance(val, ast.UnaryOp) and isinstance(val.op, ast.Not) and "nvlink" in ast.unparse(val.operand).lower():
                    nvl = True
            if limit is not None and nvl:
                return int(limit), f"{se.short(p)}:{node.lineno} `{ast.unparse(node.test)}`"
    return None


def _car_max_size(engine: se.Engine, rel: str):
    """CustomAllreduce's default ``max_size``: the first ``_MAX_CAR_SIZE = ...`` in ``rel`` (the CUDA one; the
    later ones are ROCm's), evaluated; UNKNOWN when absent."""
    node = next((n for n in source.walk(engine.tree(rel)) if isinstance(n, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "_MAX_CAR_SIZE" for t in n.targets)), None)
    if node is None:
        return UNKNOWN
    try:
        return Evaluator(lambda t: (_ for _ in ()).throw(Unbound(t))).value(node.value)
    except Unbound:
        return UNKNOWN


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


# The walk over ``GroupCoordinator.all_reduce``: steps in order, then the served path and the preempted ones.

# steps that hand the tensor to something other than a communicator's outplace method: (needle in the test, backend)
_DIRECT = (("use_deterministic_ar", "rocm-deterministic-allreduce"), ("input_.is_cpu", "cpu-allreduce"),
           ("hpu_communicator", "hpu-communicator"), ("xpu_communicator", "xpu-communicator"),
           ("npu_communicator", "npu-communicator"), ("torch.compiler.is_compiling()", "torch-compile-dispatch"),
           ("is_symmetric_memory_enabled", "nccl-symm-mem"), ("_can_use_flashinfer_allreduce", "flashinfer-allreduce-only"))
_NOT_ON_CUDA = {"rocm-deterministic-allreduce", "cpu-allreduce", "hpu-communicator", "xpu-communicator",
                "npu-communicator"}


def _chain(node: ast.If):
    """(test, body, if-node) of an if / elif chain; the final else as (None, body, node)."""
    while True:
        yield node.test, node.body, node
        if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
            node = node.orelse[0]
            continue
        if node.orelse:
            yield None, node.orelse, node
        return


def _method_of(body: list) -> str | None:
    """The outplace method a branch picks: ``return "ca"`` or ``outplace_all_reduce_method = "ca"``."""
    for st in body:
        if isinstance(st, ast.Return) and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str):
            return st.value.value
        if (isinstance(st, ast.Assign) and ast.unparse(st.targets[0]) == "outplace_all_reduce_method"
                and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str)):
            return st.value.value
    return None


def _hands_off(body: list) -> bool:
    return any(isinstance(n, ast.Return) for st in body for n in source.walk(st))


def read_dispatch(engine: se.Engine, ctx, workload=None, config=None) -> Dispatch:
    """SGLang's dispatch of a decode-step allreduce for ``ctx.server_config`` (or ``config``) on the target host
    (``ctx.world_size``, ``ctx.topology``), for ``workload`` (a Workload or :class:`DecodeTensor`; default the
    seed: bf16 [3, 7168], batch 1 x 3 EAGLE-3 tokens), decode under full CUDA graphs. Raises
    :class:`DispatchError` for a step it cannot map or evaluate, GateNotFound for a file or function that moved."""
    config = config if config is not None else ctx.server_config
    tensor = DecodeTensor.from_workload(workload)
    st = _State(engine, ctx, config, tensor)
    tree = engine.tree(PS_FILE)
    gc = next((n for n in source.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "GroupCoordinator"), None)
    fns = {n.name: n for n in (gc.body if gc else []) if isinstance(n, ast.FunctionDef)}
    if "all_reduce" not in fns:
        raise se.GateNotFound(f"gate not found in sglang {engine.version} at sglang/{PS_FILE}: no "
                              "GroupCoordinator.all_reduce")
    d = Dispatch(sglang=engine.version, config=config.to_json(), tensor=tensor.to_json(),
                 notes=["decode step under full CUDA graph replay (not piecewise, not torch.compile): "
                        "is_in_tc_piecewise_cuda_graph() and torch.compiler.is_compiling() read False"])
    ev = Evaluator(st.resolve)
    walk(fns["all_reduce"].body, ev, st, d, fns, "all_reduce")
    _decide(d)
    d.notes += st.notes
    return d


def _check_attrs(text: str, where: str, engine) -> None:
    for attr in _ATTR.findall(text):
        if attr not in COMMUNICATORS:
            raise DispatchError(f"sglang {engine.version} {where}: the TP allreduce dispatch tries self.{attr}, a "
                                f"communication path this suite does not know (`{text}`): unknown communication "
                                "path, not assessed", unknown=attr, where=where)


def _eval(ev: Evaluator, node, where: str, engine):
    try:
        return ev.value(node)
    except Unbound as e:
        raise DispatchError(f"sglang {engine.version} {where}: the dispatch condition `{ast.unparse(node)}` reads "
                            f"`{e.text}`, which this reader cannot evaluate: teach the suite this step (it refuses "
                            "to guess)", where=where) from e


def walk(body: list, ev: Evaluator, st: _State, d: Dispatch, fns: dict, fn_name: str) -> None:
    eng = st.engine
    for stmt in body:
        where = f"sglang/{PS_FILE}:{stmt.lineno}"
        if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
            call = stmt.value
            if isinstance(call, ast.Call) and ast.unparse(call.func) == "self._resolve_outplace_all_reduce_method":
                inner = fns.get("_resolve_outplace_all_reduce_method")
                if inner is None:
                    raise se.GateNotFound(f"gate not found in sglang {eng.version} at sglang/{PS_FILE}: "
                                          "no _resolve_outplace_all_reduce_method")
                n_before = len(d.steps)
                walk(inner.body, ev, st, d, fns, inner.name)
                picked = next((s for s in d.steps[n_before:] if s.claims is True), None)
                ev.locals[name] = _method_name(picked) if picked else None
                continue
            _check_attrs(ast.unparse(call), where, eng)
            try:
                ev.locals[name] = ev.value(call)
            except Unbound:
                ev.locals[name] = UNKNOWN
            continue
        if not isinstance(stmt, ast.If):
            continue
        for test, branch, node in _chain(stmt):
            where = f"sglang/{PS_FILE}:{(test or node).lineno}"
            text = ast.unparse(test) if test is not None else "else"
            _check_attrs(text, where, eng)
            if text == "self.world_size == 1":
                continue
            if text == "outplace_all_reduce_method is not None":
                if ev.locals.get("outplace_all_reduce_method") is None:
                    fb = node.orelse[0] if node.orelse else node
                    d.steps.append(Step("nccl-ring", f"sglang/{PS_FILE}:{fb.lineno}", "in-place fallback: "
                                        "inplace_all_reduce -> _all_reduce_in_place (pynccl, else torch.distributed)",
                                        True, True, True, "NCCL as configured (its own algorithm choice)"))
                break
            method = _method_of(branch)
            direct = next((b for needle, b in _DIRECT if needle in text), None)
            if method is None and direct is None:
                if _hands_off(branch) and test is not None:
                    raise DispatchError(f"sglang {eng.version} {where}: a dispatch step `{text}` hands the tensor to "
                                        "a path this reader cannot map: not assessed, never a pass", where=where)
                if test is None or _eval(ev, test, where, eng) is True:   # plain code: run it for its assignments
                    ev.run(branch)
                    break
                continue
            claims = _eval(ev, test, where, eng) if test is not None else True
            d.steps.append(_step(st, method, direct, text, where, claims, eng))
            if fn_name == "all_reduce" and method is not None and claims is True:
                ev.locals["outplace_all_reduce_method"] = method


def _method_name(step: Step) -> str | None:
    return next((m for m, b in METHODS.items() if b == step.backend), None)


def _step(st: _State, method, direct, text, where, claims, eng) -> Step:
    if direct is not None:
        if direct in _NOT_ON_CUDA:
            return Step(direct, where, text, False, False, _tv(claims), "not on an NVIDIA GPU decode tensor")
        if direct == "nccl-symm-mem":
            on, fw = st.flag("--enable-symm-mem")
            return Step(direct, where, text, bool(on), True, _tv(claims),
                        f"pynccl with NCCL symmetric memory: {fw}; no per-call check of its own (claims the tensor "
                        "unless MSCCL++ or custom allreduce does)")
        if direct == "flashinfer-allreduce-only":
            v = st.fi_allreduce_only()
            return Step(direct, where, text, _tv(v), _tv(v), _tv(claims),
                        "FlashInfer's fusion-only allreduce: built when --flashinfer-allreduce-fusion-backend is set")
        return Step(direct, where, text, False, False, _tv(claims), "torch.compile traces only (not a decode replay)")
    if method not in METHODS:
        raise DispatchError(f"sglang {eng.version} {where}: the dispatch picks outplace method {method!r}, which maps to "
                            "no path this suite knows: unknown communication path, not assessed", unknown=method,
                            where=where)
    attrs = [a for a in _ATTR.findall(text) if COMMUNICATORS.get(a, ("",))[0] == method]
    if method == "pynccl":
        return Step(METHODS[method], where, text, True, False, _tv(claims),
                    "pynccl out-of-place under a piecewise CUDA graph (prefill), not a decode replay")
    if not attrs:
        raise DispatchError(f"sglang {eng.version} {where}: step {method!r} (`{text}`) names no communicator this "
                            "reader maps to it", unknown=method, where=where)
    c = st.comm(attrs[0])
    built = c["obj"] is _BUILT and not c["disabled"]
    return Step(METHODS[method], where, text, built, _tv(c["admits"]) if built else False, _tv(claims), c["why"])


def _decide(d: Dispatch) -> None:
    idx = None
    for i, s in enumerate(d.steps):
        if s.claims == "unknown":
            d.undecided = f"{s.backend} at {s.where}: `{s.condition}` is decided at run time"
            break
        if s.claims is True:
            idx = i
            d.serves = s.backend
            break
    if idx is None:
        return
    for s in d.steps[idx + 1:]:
        if s.backend != d.serves and s.backend != "nccl-ring" and s.built is True and s.admits is True:
            d.preempted.setdefault(s.backend, d.serves)


def custom_ar_per_call(engine: se.Engine, ctx, workload=None) -> tuple[object, str]:
    """Case C48: ``CustomAllreduce.should_custom_ar`` run from its own code for the decode tensor on the target host
    (world size, full NVLink or not), as if the init rule had admitted the group (``self.disabled`` False), so the
    answer never borrows the init rule's. Returns (True / False / UNKNOWN, "sglang/FILE:LINE should_custom_ar
    (after `deciding test` -> value)")."""
    st = _State(engine, ctx, ctx.server_config, DecodeTensor.from_workload(workload))
    mod, cls, check = COMMUNICATORS["ca_comm"][1:]
    return _per_call(st, f"{COMM_DIR}/{mod}", cls, check, {"self.disabled": False, "self.world_size": st.ws,
                                                            "self.full_nvlink": st.nvlink,
                                                            "self.max_size": _car_max_size(engine, f"{COMM_DIR}/{mod}")})
