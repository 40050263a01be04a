"""Run one probe step in a child interpreter, so that a backend library that crashes, hangs or
poisons the process at import time becomes a result instead of the end of the suite.

The child is ``sys.executable -m stackprobe.workers TASK`` with the arguments as JSON on stdin; it
prints one line ``STACKPROBE-RESULT <json>`` on stdout. Everything else it prints (library warnings,
compiler output) is kept as ``log`` for the evidence.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MARKER = "STACKPROBE-RESULT "
_SUITE_ROOT = str(Path(__file__).resolve().parent.parent)  # the folder holding the stackprobe package


@dataclass
class Outcome:
    """What a child run gave back. ``ok``: the task returned; ``value``: its JSON result;
    ``error``: one line (exception type and message, "timed out after N s", "exit code -11")."""

    ok: bool
    value: Any = None
    error: str = ""
    log: str = ""
    extra: dict = field(default_factory=dict)


def run_task(task: str, args: dict | None = None, *, timeout: float = 120.0,
             env: dict | None = None, python: str | None = None) -> Outcome:
    """Run ``stackprobe.workers.<task>(**args)`` in a child of ``python`` (default: this interpreter).

    ``env`` entries are added to (a value of ``None`` removes them from) the current environment.
    ``timeout`` in seconds. Never raises for a failing task: the failure is in the Outcome.
    """
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = os.pathsep.join([_SUITE_ROOT] + [p for p in child_env.get("PYTHONPATH", "").split(os.pathsep) if p])
    child_env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    for k, v in (env or {}).items():
        if v is None:
            child_env.pop(k, None)
        else:
            child_env[k] = str(v)
    cmd = [python or sys.executable, "-m", "stackprobe.workers", task]
    # a new session, group-killed at the end or on timeout, and a guard if this process dies first: a JIT
    # compiler (ninja, nvcc) the task starts never outlives it (stackprobe.runtime.orchestrate.run_in_session)
    from .runtime.orchestrate import run_in_session
    proc = run_in_session(cmd, input=json.dumps(args or {}), timeout=timeout, env=child_env)
    if proc.timed_out:
        return Outcome(False, error=f"timed out after {timeout:.0f} s", log=proc.stdout[-4000:])
    log_lines, value, found = [], None, False
    for line in proc.stdout.splitlines():
        if line.startswith(MARKER):
            value, found = json.loads(line[len(MARKER):]), True
        else:
            log_lines.append(line)
    log = ("\n".join(log_lines) + "\n" + proc.stderr).strip()
    if not found:
        tail = log.strip().splitlines()[-1] if log.strip() else ""
        return Outcome(False, error=f"child exited with code {proc.returncode} before answering: {tail}"[:600],
                       log=log[-4000:])
    if isinstance(value, dict) and value.get("__error__"):
        return Outcome(False, error=value["__error__"], log=log[-4000:], extra=value)
    return Outcome(True, value=value, log=log[-4000:])
