"""The walk over ``GroupCoordinator.all_reduce`` (see :mod:`.sglang_dispatch`): steps in order, then the served
path and the preempted ones."""
from __future__ import annotations

import ast

from . import sglang_engine as se
from .sglang_dispatch import (_ATTR, _BUILT, COMMUNICATORS, METHODS, PS_FILE, DecodeTensor, Dispatch, DispatchError,
                              Step, _State, _tv)
from .sglang_pyeval import UNKNOWN, Evaluator, Unbound

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
    return any(isinstance(n, ast.Return) for st in body for n in ast.walk(st))


def read_dispatch(engine: se.Engine, ctx, workload=None, config=None) -> Dispatch:
    """SGLang's dispatch of a decode-step allreduce for ``ctx.server_config`` (or ``config``) on the target host
    (``ctx.world_size``, ``ctx.topology``), for ``workload`` (a Workload or :class:`DecodeTensor`; default the
    seed: bf16 [3, 7168], batch 1 x 3 EAGLE-3 tokens), decode under full CUDA graphs. Raises
    :class:`DispatchError` for a step it cannot map or evaluate, GateNotFound for a file or function that moved."""
    config = config if config is not None else ctx.server_config
    tensor = DecodeTensor.from_workload(workload)
    st = _State(engine, ctx, config, tensor)
    tree = engine.tree(PS_FILE)
    gc = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "GroupCoordinator"), None)
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
