"""SGLang as a serving engine of both tiers: its :class:`SGLang` record and the readers of its installed source
(this package: ``engine`` finds the installed release and reads gates, ``flags`` its server arguments, ``pcie_ipc``,
``dispatch`` the walk over ``GroupCoordinator.all_reduce``, ``answer`` a backend's gates then the dispatch order,
``paths`` the settings no verdict judges and the launch environment, ``raises``, ``pyeval``, ``startup`` (the variables it writes from a flag on every launch),
``p2p_check`` its own P2P check before custom allreduce). Its backend answers are each backend module's
``engine_gate`` (:mod:`stackprobe.probes`), which call ``answer``."""
from __future__ import annotations

from ..base import ServingEngine

class SGLang(ServingEngine):
    """SGLang: each backend module's ``engine_gate(ctx)`` (called per ``module``, in the probe loop, so every SGLang
    verdict is exactly what it was before the interface) and :func:`engine_sections`."""

    name, dist, title = "sglang", "sglang", "SGLang"
    per_module = True
    runtime_ref = "stackprobe.runtime.dispatch:SGLANG"
    p2p_check_ref = f"{__package__}.p2p_check:sglang_p2p_check"

    def parse_config(self, server_args, env):
        from . import engine as sglang_engine
        from .flags import parse_server_config
        return parse_server_config(server_args, env, sglang_engine.installed())

    def answers(self, ctx, module=None) -> list:
        fn = getattr(module, "engine_gate", None)
        out = fn(ctx) if fn is not None else []
        for v in out:
            v.engine = self.name
        return out

    def sections(self, report, ctx) -> dict:
        return engine_sections(report, ctx)


def engine_sections(report, ctx) -> dict:
    """SGLang's sections of its ``engines`` entry: ``dispatch`` (its dispatch of a decode allreduce, or
    ``{"error": ...}``), ``paths`` (not-assessed paths, engine-scope verdicts as JSON) and ``launch_environment``; the
    findings for an unknown communication path (C39) go to ``report.environment``. ``{}`` without SGLang."""
    from . import engine as se
    from .dispatch import DispatchError, read_dispatch
    from .paths import findings, launch_environment, paths

    eng = se.installed()
    if eng is None:
        return {}
    out: dict = {}
    try:
        out["dispatch"] = read_dispatch(eng, ctx).to_json()
        from .dispatch import DecodeTensor
        from .pcie_ipc import pcie_ipc_admission
        out["dispatch"]["pcie_ipc_admission"] = [e.to_json() for e in pcie_ipc_admission(
            eng, ctx.server_config, DecodeTensor.from_workload(), ctx.world_size)]
    except (DispatchError, se.GateNotFound) as e:
        out["dispatch"] = {"sglang": eng.version, "error": str(e), "unknown": getattr(e, "unknown", ""),
                           "where": getattr(e, "where", "")}
        if getattr(e, "unknown", ""):
            report.environment.setdefault("findings", []).append({"case": "C39", "level": "error", "message": str(e)})
    try:
        out["paths"] = [v.to_json() for v in paths(eng, ctx)]
        report.environment.setdefault("findings", []).extend(findings(eng))
        out["launch_environment"] = launch_environment(eng, ctx.server_config)
    except se.GateNotFound as e:
        out["launch_environment"] = {"error": str(e)}
    return out
