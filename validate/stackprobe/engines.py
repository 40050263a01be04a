"""The serving engine as a plug-in of the static tier: one small interface, one implementation per engine.

A :class:`ServingEngine` answers "will this engine, as installed, use backend X on the target host with the flags
asked about?" for the backends it has a path for. The interface is what the tier needs of an engine:

* ``name`` (``sglang``, ``vllm``: the ``--engine`` value and each answer's ``Verdict.engine``), ``dist`` (its
  distribution), ``title`` (how reports name it);
* :meth:`~ServingEngine.version`: the installed release (distribution metadata), None when absent;
* :meth:`~ServingEngine.parse_config`: the user's ``--server-args`` / ``--env`` checked against the installed
  engine's own flags (raises :class:`stackprobe.probes.sglang_flags.ConfigError`, one paragraph);
* :meth:`~ServingEngine.answers`: its engine-scope verdicts, one per backend, each gate with its ``FILE:LINE``
  (a gate not found is an ``error`` naming package, version and file, never a pass);
* :meth:`~ServingEngine.sections`: its dispatch of a decode-step allreduce for the report (``{}`` when none).

:data:`ENGINES` lists the implementations: SGLang (:mod:`stackprobe.probes.sglang_engine` and each backend module's
``engine_gate``) and vLLM (:mod:`stackprobe.probes.vllm_engine`). :func:`select` turns ``--engine`` into engines.
"""
from __future__ import annotations

from .env import dist_version
from .serverconfig import ServerConfig

CHOICES = ("auto", "sglang", "vllm")


class ServingEngine:
    """Base of an engine implementation (see the module docstring for each member's contract)."""

    name = ""
    dist = ""
    title = ""

    def version(self) -> str | None:
        return dist_version(self.dist)

    def parse_config(self, server_args: str, env: list[str] | tuple) -> ServerConfig:
        raise NotImplementedError

    def answers(self, ctx, module=None) -> list:
        raise NotImplementedError

    def sections(self, report, ctx) -> dict:
        return {}


class SGLang(ServingEngine):
    """SGLang: each backend module's ``engine_gate(ctx)`` (called per ``module``, in the probe loop, so every SGLang
    verdict is exactly what it was before the interface) and :func:`engine_sections`."""

    name, dist, title = "sglang", "sglang", "SGLang"

    def parse_config(self, server_args, env):
        from .probes import sglang_engine
        from .probes.sglang_flags import parse_server_config
        return parse_server_config(server_args, env, sglang_engine.installed())

    def answers(self, ctx, module=None) -> list:
        fn = getattr(module, "engine_gate", None)
        out = fn(ctx) if fn is not None else []
        for v in out:
            v.engine = self.name
        return out

    def sections(self, report, ctx) -> dict:
        engine_sections(report, ctx)
        return report.dispatch


class VLLM(ServingEngine):
    """vLLM: :func:`stackprobe.probes.vllm_engine.engine_verdicts` (its own gates and ``CudaCommunicator.all_reduce``'s
    dispatch, read from the installed vLLM); answered once for all its backends (``module`` None)."""

    name, dist, title = "vllm", "vllm", "vLLM"

    def __init__(self):
        self._dispatch: dict = {}

    def parse_config(self, server_args, env):
        from .probes import vllm_engine
        return vllm_engine.parse_config(server_args, env, vllm_engine.installed())

    def answers(self, ctx, module=None) -> list:
        from .probes import vllm_engine
        verdicts, self._dispatch = vllm_engine.engine_verdicts(ctx)
        return verdicts

    def sections(self, report, ctx) -> dict:
        return self._dispatch


ENGINES = {"sglang": SGLang, "vllm": VLLM}


class EngineChoiceError(ValueError):
    """An ``--engine`` value that is none of :data:`CHOICES`."""


def select(choice: str = "auto") -> list[ServingEngine]:
    """``--engine`` -> engines, primary first. ``auto``: every installed engine (SGLang first when both are); none
    installed: SGLang (its answers then say ``not installed: sglang``, as before the interface). Raises
    :class:`EngineChoiceError` for another value."""
    if choice not in CHOICES:
        raise EngineChoiceError(f"--engine {choice!r}: use one of {', '.join(CHOICES)} (auto: whichever serving engine "
                                "is installed, both when both are).")
    if choice != "auto":
        return [ENGINES[choice]()]
    found = [cls() for cls in ENGINES.values() if dist_version(cls.dist) is not None]
    return found or [SGLang()]


def engine_sections(report, ctx) -> None:
    """The report's ``server_config``, ``dispatch`` (SGLang's dispatch of a decode allreduce, or ``{"error": ...}``),
    ``paths`` (not-assessed paths, engine-scope verdicts as JSON) and ``launch_environment`` sections; the findings for
    an unknown communication path (C39). Nothing but ``server_config`` without SGLang."""
    from .probes import sglang_engine as se
    from .probes.sglang_dispatch import DispatchError, read_dispatch
    from .probes.sglang_paths import findings, launch_environment, paths

    report.server_config = ctx.server_config.to_json()
    eng = se.installed()
    if eng is None:
        return
    try:
        report.dispatch = read_dispatch(eng, ctx).to_json()
        from .probes.sglang_dispatch import DecodeTensor
        from .probes.sglang_pcie_ipc import pcie_ipc_admission
        report.dispatch["pcie_ipc_admission"] = [e.to_json() for e in pcie_ipc_admission(
            eng, ctx.server_config, DecodeTensor.from_workload(), ctx.world_size)]
    except (DispatchError, se.GateNotFound) as e:
        report.dispatch = {"sglang": eng.version, "error": str(e), "unknown": getattr(e, "unknown", ""),
                           "where": getattr(e, "where", "")}
        if getattr(e, "unknown", ""):
            report.environment.setdefault("findings", []).append({"case": "C39", "level": "error", "message": str(e)})
    try:
        report.paths = [v.to_json() for v in paths(eng, ctx)]
        report.environment.setdefault("findings", []).extend(findings(eng))
        report.launch_environment = launch_environment(eng, ctx.server_config)
    except se.GateNotFound as e:
        report.launch_environment = {"error": str(e)}
