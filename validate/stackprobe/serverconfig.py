"""The serving configuration a verdict is judged for (stdlib only).

A user asks "with the flags I would run, what does the engine do on this box?". :class:`ServerConfig` holds
those flags as given: the engine's own server arguments (``--enable-symm-mem``, ``--tp-size 8``) and the
environment variables set for the server (``SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1``). The default, :data:`NO_FLAGS`,
is "change nothing": every verdict then says what the engine does as shipped.

Parsing a command line into a ServerConfig and checking each flag against the installed engine's own
argument definitions belongs to the engine reader (:mod:`stackprobe.engines.sglang.dispatch`); this module only
fixes the data shape that every probe reads from ``Context.server_config``.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ServerConfig:
    """``args``: server flag (spelled with its leading ``--`` and dashes, as the engine's parser defines it) ->
    value (``True`` for a bare switch, else the string given). ``env``: variable name -> value as given.
    ``source``: how the user gave them (for the report), e.g. ``--server-args "--enable-symm-mem"``."""

    args: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    source: str = ""

    def flag(self, name: str, default=None):
        """The value given for server flag ``name`` (``--enable-symm-mem`` or ``enable_symm_mem``), else ``default``."""
        key = name if name.startswith("--") else "--" + name.replace("_", "-")
        return self.args.get(key, default)

    def var(self, name: str, default: str | None = None) -> str | None:
        """The value given for environment variable ``name``, else ``default``."""
        return self.env.get(name, default)

    @property
    def empty(self) -> bool:
        return not self.args and not self.env

    def describe(self) -> str:
        """One line for reports: ``no flags`` or the flags and variables given, in order."""
        if self.empty:
            return "no flags"
        parts = [k if v is True else f"{k} {v}" for k, v in self.args.items()]
        parts += [f"{k}={v}" for k, v in self.env.items()]
        return " ".join(parts)

    def to_json(self) -> dict:
        return {"args": dict(self.args), "env": dict(self.env), "source": self.source, "describe": self.describe()}


NO_FLAGS = ServerConfig()
