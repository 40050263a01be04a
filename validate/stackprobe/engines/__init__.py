"""The serving engine as a plug-in of the static tier: one small interface, one implementation per engine.

A :class:`ServingEngine` answers "will this engine, as installed, use backend X on the target host with the flags
asked about?" for the backends it has a path for. The interface is what the tier needs of an engine:

* ``name`` (``sglang``, ``vllm``: the ``--engine`` value and each answer's ``Verdict.engine``), ``dist`` (its
  distribution), ``title`` (how reports name it);
* :meth:`~ServingEngine.version`: the installed release (distribution metadata), None when absent;
* :meth:`~ServingEngine.parse_config`: the user's ``--server-args`` / ``--env`` checked against the installed
  engine's own flags (raises :class:`stackprobe.engines.sglang.flags.ConfigError`, one paragraph);
* :meth:`~ServingEngine.answers`: its engine-scope verdicts, one per backend, each gate with its ``FILE:LINE``
  (a gate not found is an ``error`` naming package, version and file, never a pass);
* :meth:`~ServingEngine.sections`: its sections of the report's ``engines`` entry (report schema 4): ``dispatch`` (its
  dispatch of a decode-step allreduce), and where it has them ``paths`` (not-assessed paths, Verdict JSON) and
  ``launch_environment``; ``{}`` when none.

* :meth:`~ServingEngine.not_assessed`: the paths and settings it ships that no verdict judges (Verdict JSON);
* :meth:`~ServingEngine.p2p_check`: does it check P2P itself before its custom allreduce, or trust the driver (its
  reader named by ``p2p_check_ref``, e.g. :func:`stackprobe.engines.sglang.p2p_check.sglang_p2p_check`), for the host
  stage's verdicts (:func:`p2p_check` by engine name, passed to :func:`stackprobe.host.apply`);
* :attr:`~ServingEngine.runtime`: its record for the runtime tier's dispatch probe
  (:class:`stackprobe.runtime.dispatch.RuntimeEngine`, resolved on first use so that this module stays stdlib-only),
  None for an engine without one.

One registry holds the implementations: :func:`register` (one call, for a new engine or a test's), :func:`unregister`,
:func:`registered`, :func:`choices` (``auto`` and every registered name: the ``--engine`` values of both tiers).
SGLang (:mod:`stackprobe.engines.sglang.engine` and each backend module's ``engine_gate``) and vLLM
(:mod:`stackprobe.engines.vllm.engine`) are registered here. :func:`select` turns ``--engine`` into engines.
"""
from __future__ import annotations

from ..env import dist_version
from .base import ServingEngine
from .sglang import SGLang
from .vllm import VLLM

__all__ = ["DEFAULT", "ServingEngine", "SGLang", "VLLM", "register", "unregister", "registered", "choices",
           "title_of", "p2p_check", "select", "EngineChoiceError"]

#: the engine of reports made before the engine list (their engine answers carry no ``engine``), and the one
#: :func:`select` answers for when no registered engine is installed (its answers then say "not installed")
DEFAULT = "sglang"


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
