"""The SGLang answer for one backend: its gates read from the installed source (:mod:`.sglang_engine`), then the
order of SGLang's TP allreduce dispatch (:mod:`.sglang_dispatch`). It sits above both, so that the engine reader
and the dispatch reader never import each other (each backend module's ``engine_gate`` calls :func:`answer`).
"""
from __future__ import annotations

from ...verdict import ERROR, GATE_SETTING, LIFT_SETTING, ON_AS_CONFIGURED, ON_BY_DEFAULT, PREEMPTED, Verdict
from . import dispatch as sd
from . import engine as se


def apply_preemption(v: Verdict, ctx, engine: se.Engine) -> Verdict:
    """A path that would serve (``on-as-configured``, ``on-by-default``) but that an earlier path of SGLang's TP
    allreduce dispatch claims first (:func:`stackprobe.engines.sglang.dispatch.read_dispatch`, ``Dispatch.preempted``:
    {backend: the earlier backend}) becomes ``preempted``, naming that path and where it is tried. A dispatch the
    reader cannot map is an ``error`` (never a pass). The dispatch's ``serves`` is recorded as evidence."""
    if v.status not in (ON_AS_CONFIGURED, ON_BY_DEFAULT):
        return v
    try:
        d = sd.read_dispatch(engine, ctx)
    except (se.GateNotFound, sd.DispatchError) as e:
        v.add("verdict before the dispatch order", f"{v.status}: {v.cause}", "engine gates")
        v.status, v.gate, v.cause = ERROR, "", f"the TP allreduce dispatch of sglang {engine.version} cannot be read: {e}"
        return v
    v.add("TP allreduce dispatch: the path a decode-step allreduce takes", d.serves or f"undecided ({d.undecided})",
          f"sglang/{sd.PS_FILE} GroupCoordinator.all_reduce")
    by = (d.preempted or {}).get(v.backend)
    if by:
        step = d.step(by)
        where = f" ({step.where}: `{step.condition}`)" if step is not None else ""
        v.add("verdict before the dispatch order", f"{v.status}: {v.cause}", "engine gates")
        v.status, v.gate, v.lift = PREEMPTED, GATE_SETTING, LIFT_SETTING
        v.cause = (f"SGLang {engine.version}: preempted by {by}: the TP allreduce dispatch tries {by} first{where} and "
                   f"it claims the decode-step tensor, so it never reaches {v.backend}")
        v.lift_detail = f"leave {by} off (its flag or variable unset) to let {v.backend} serve"
    return v


def answer(backend: str, ctx, decide) -> list[Verdict]:
    """The engine answer for ``backend``: ``decide(ctx, engine) -> Verdict`` over the installed SGLang;
    ``skipped (not installed: sglang)`` without one (C18) and an error naming the file when ``decide`` cannot
    find a gate (C17, :class:`~.sglang_engine.GateNotFound`): never a pass by default. A path that would serve then meets the
    dispatch order (:func:`apply_preemption`)."""
    eng = se.installed()
    if eng is None:
        return [se.not_installed(backend)]
    try:
        return [apply_preemption(decide(ctx, eng), ctx, eng)]
    except se.GateNotFound as e:
        return [se.error(backend, eng, e, ctx)]
