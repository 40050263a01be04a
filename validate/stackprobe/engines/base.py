"""The contract of a serving engine for both tiers (:class:`ServingEngine`); the registry and the members'
descriptions are in :mod:`stackprobe.engines`."""
from __future__ import annotations

import importlib

from ..env import dist_version
from ..serverconfig import ServerConfig

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
