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
* :meth:`~ServingEngine.sections`: its sections of the report's ``engines`` entry (report schema 4): ``dispatch`` (its
  dispatch of a decode-step allreduce), and where it has them ``paths`` (not-assessed paths, Verdict JSON) and
  ``launch_environment``; ``{}`` when none.

* :meth:`~ServingEngine.not_assessed`: the paths and settings it ships that no verdict judges (Verdict JSON);
* :meth:`~ServingEngine.p2p_check`: does it check P2P itself before its custom allreduce, or trust the driver (its
  reader named by ``p2p_check_ref``, e.g. :func:`stackprobe.probes.engine_p2p.sglang_p2p_check`), for the host
  stage's verdicts (:func:`p2p_check` by engine name, passed to :func:`stackprobe.host.apply`);
* :attr:`~ServingEngine.runtime`: its record for the runtime tier's dispatch probe
  (:class:`stackprobe.runtime.dispatch.RuntimeEngine`, resolved on first use so that this module stays stdlib-only),
  None for an engine without one.

One registry holds the implementations: :func:`register` (one call, for a new engine or a test's), :func:`unregister`,
:func:`registered`, :func:`choices` (``auto`` and every registered name: the ``--engine`` values of both tiers).
SGLang (:mod:`stackprobe.probes.sglang_engine` and each backend module's ``engine_gate``) and vLLM
(:mod:`stackprobe.probes.vllm_engine`) are registered here. :func:`select` turns ``--engine`` into engines.
"""
from __future__ import annotations

import importlib

from .env import dist_version
from .serverconfig import ServerConfig

#: the engine of reports made before the engine list (their engine answers carry no ``engine``), and the one
#: :func:`select` answers for when no registered engine is installed (its answers then say "not installed")
DEFAULT = "sglang"


class ServingEngine:
    """Base of an engine implementation (see the module docstring for each member's contract)."""

    name = ""
    dist = ""
    title = ""
    #: True: :meth:`answers` is called once per probe module (``answers(ctx, module)``, in the static tier's probe
    #: loop, beside the module's library gate); False: once for all backends (``module`` None)
    per_module = False
    #: ``module:attr`` of its :class:`stackprobe.runtime.dispatch.RuntimeEngine`; "" when it has none
    runtime_ref = ""
    #: ``module:function`` of the reader of its own P2P check (no arguments; returns the dict :meth:`p2p_check`
    #: describes, raises LookupError on a release it does not know); "" when it has none
    p2p_check_ref = ""

    def version(self) -> str | None:
        return dist_version(self.dist)

    def not_assessed(self, ctx) -> list:
        """The settings and modules the installed engine ships that no verdict judges, as Verdict JSON dicts
        (appended to the report's ``paths``); [] by default."""
        return []

    @property
    def runtime(self):
        """Its :class:`stackprobe.runtime.dispatch.RuntimeEngine` (imported on first use), or None."""
        if not self.runtime_ref:
            return None
        mod, _, attr = self.runtime_ref.partition(":")
        return getattr(importlib.import_module(mod), attr)

    def p2p_check(self) -> dict:
        """Does the installed engine check P2P before its custom allreduce, or trust the driver? ``{"checks": bool,
        "how": one sentence, "where": [file:line], "turn_on": what makes it check}`` from the reader
        ``p2p_check_ref`` names, or ``{"error": why}`` (no reader; a release the reader does not know)."""
        if not self.p2p_check_ref:
            return {"error": f"not assessed: no reader of {self.title or self.name}'s own P2P check"}
        mod, _, attr = self.p2p_check_ref.partition(":")
        try:
            return getattr(importlib.import_module(mod), attr)()
        except LookupError as exc:
            return {"error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - a crashing reader is a not-assessed answer, never a crashed run
            return {"error": f"not assessed: the P2P-check reader {self.p2p_check_ref} crashed "
                             f"({type(exc).__name__}: {exc})"}

    def parse_config(self, server_args: str, env: list[str] | tuple) -> ServerConfig:
        raise NotImplementedError

    def answers(self, ctx, module=None) -> list:
        raise NotImplementedError

    def sections(self, report, ctx) -> dict:
        """Its sections of the report's ``engines`` entry: ``{"dispatch": dict, "paths": [Verdict JSON],
        "launch_environment": dict}``, each key optional; findings it makes go to ``report.environment``."""
        return {}


class SGLang(ServingEngine):
    """SGLang: each backend module's ``engine_gate(ctx)`` (called per ``module``, in the probe loop, so every SGLang
    verdict is exactly what it was before the interface) and :func:`engine_sections`."""

    name, dist, title = "sglang", "sglang", "SGLang"
    per_module = True
    runtime_ref = f"{__package__}.runtime.dispatch:SGLANG"
    p2p_check_ref = f"{__package__}.probes.engine_p2p:sglang_p2p_check"

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
        return engine_sections(report, ctx)


class VLLM(ServingEngine):
    """vLLM: :func:`stackprobe.probes.vllm_engine.engine_verdicts` (its own gates and ``CudaCommunicator.all_reduce``'s
    dispatch, read from the installed vLLM); answered once for all its backends (``module`` None)."""

    name, dist, title = "vllm", "vllm", "vLLM"
    runtime_ref = f"{__package__}.runtime.dispatch:VLLM"
    p2p_check_ref = f"{__package__}.probes.engine_p2p:vllm_p2p_check"

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
        return {"dispatch": self._dispatch}

    def not_assessed(self, ctx) -> list:
        """:func:`stackprobe.probes.vllm_paths.report_paths` (issue 39 point 6)."""
        from .probes.vllm_paths import report_paths
        return report_paths(ctx)


_REGISTRY: dict[str, type[ServingEngine]] = {}


def register(engine: type[ServingEngine] | ServingEngine) -> type[ServingEngine]:
    """Register an engine implementation (a :class:`ServingEngine` subclass, or an instance: its class is kept;
    :func:`select` makes a fresh instance per run). From then on it is an ``--engine`` choice, ``auto`` picks it
    where its distribution is installed, and both tiers ask it. Raises ``ValueError`` for a class that is no
    ServingEngine, has no ``name`` / ``dist`` / ``title``, is named ``auto``, or whose name another class holds.
    Returns the class."""
    cls = engine if isinstance(engine, type) else type(engine)
    if not issubclass(cls, ServingEngine):
        raise ValueError(f"{cls.__name__} is not a stackprobe.engines.ServingEngine subclass: derive from it and "
                         "set name, dist and title")
    if not (cls.name and cls.dist and cls.title) or cls.name == "auto":
        raise ValueError(f"{cls.__name__}: set name (the --engine value, not 'auto'), dist (its distribution) and title "
                         f"(how reports name it); got name={cls.name!r}, dist={cls.dist!r}, title={cls.title!r}")
    held = _REGISTRY.get(cls.name)
    if held is not None and held is not cls:
        raise ValueError(f"engine name {cls.name!r} is already registered by {held.__module__}.{held.__qualname__}; "
                         f"unregister({cls.name!r}) first or pick another name")
    _REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Take engine ``name`` out of the registry (tests); nothing when it is not there."""
    _REGISTRY.pop(name, None)


def registered() -> dict[str, type[ServingEngine]]:
    """Name -> implementation class, in registration order (SGLang, vLLM, then any registered later)."""
    return dict(_REGISTRY)


def choices() -> tuple[str, ...]:
    """The ``--engine`` values: ``auto`` and every registered name."""
    return ("auto", *_REGISTRY)


def title_of(name: str) -> str:
    """How reports name engine ``name`` (its registered ``title``; the name itself for an engine not registered)."""
    cls = _REGISTRY.get(name)
    return cls.title if cls is not None else name


def __getattr__(attr: str):
    # CHOICES and ENGINES, read at use: what the registry holds then
    if attr == "CHOICES":
        return choices()
    if attr == "ENGINES":
        return registered()
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def p2p_check(name: str) -> dict:
    """:meth:`ServingEngine.p2p_check` of the registered engine ``name``; ``{"error": ...}`` for a name no engine
    registered (what :func:`stackprobe.host.apply` is given as ``p2p_check``)."""
    cls = _REGISTRY.get(name)
    if cls is None:
        return {"error": f"not assessed: no registered engine {name!r} (registered: {', '.join(_REGISTRY) or 'none'})"}
    return cls().p2p_check()


class EngineChoiceError(ValueError):
    """An ``--engine`` value that is none of :func:`choices`."""


def select(choice: str = "auto") -> list[ServingEngine]:
    """``--engine`` -> engines, primary first. ``auto``: every registered engine whose distribution is installed, in
    registration order (SGLang first when both it and vLLM are); none installed: :data:`DEFAULT` (its answers then
    say ``not installed: sglang``, as before the interface). Raises :class:`EngineChoiceError` for another value."""
    if choice not in _REGISTRY and choice != "auto":
        raise EngineChoiceError(f"--engine {choice!r}: use one of {', '.join(choices())} (auto: whichever serving "
                                "engine is installed, every one that is).")
    if choice != "auto":
        return [_REGISTRY[choice]()]
    found = [cls() for cls in _REGISTRY.values() if dist_version(cls.dist) is not None]
    return found or [_REGISTRY[DEFAULT]()]


register(SGLang)
register(VLLM)


def engine_sections(report, ctx) -> dict:
    """SGLang's sections of its ``engines`` entry: ``dispatch`` (its dispatch of a decode allreduce, or
    ``{"error": ...}``), ``paths`` (not-assessed paths, engine-scope verdicts as JSON) and ``launch_environment``; the
    findings for an unknown communication path (C39) go to ``report.environment``. ``{}`` without SGLang."""
    from .probes import sglang_engine as se
    from .probes.sglang_dispatch import DispatchError, read_dispatch
    from .probes.sglang_paths import findings, launch_environment, paths

    eng = se.installed()
    if eng is None:
        return {}
    out: dict = {}
    try:
        out["dispatch"] = read_dispatch(eng, ctx).to_json()
        from .probes.sglang_dispatch import DecodeTensor
        from .probes.sglang_pcie_ipc import pcie_ipc_admission
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
