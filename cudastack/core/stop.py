"""Stop requests from outside the process: Ctrl-C (SIGINT) and SIGTERM (a stopped session, CI job or service).

:func:`install` makes both signals raise :class:`KeyboardInterrupt` in the main thread and remembers which one
came (:func:`requested`). The remembered signal lets a build tell "the docker CLI exited non-zero because it
was stopped with us" from "the build failed": a terminal's Ctrl-C reaches the whole foreground process group,
and a child that dies of it first would otherwise read as a failed build with the compiler's last lines.

An explicit handler is installed even where the signal was ignored at start (a job started in the background
by a non-interactive shell inherits SIGINT ignored: POSIX ``sh`` "Asynchronous lists"), so ``kill -INT`` stops
a build the same way wherever it was started.
"""
from __future__ import annotations

import signal

#: The exit status of a run stopped from outside: 128 + SIGINT, the shell's convention for a command ended by
#: Ctrl-C (bash(1), "EXIT STATUS"). Documented in the README's exit-code table.
EXIT_INTERRUPTED = 128 + int(signal.SIGINT)

_received: list[int] = []


def _handler(signum, frame) -> None:
    _received.append(signum)
    raise KeyboardInterrupt


def install() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt from now on (main thread only; elsewhere a no-op)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _handler)


def requested() -> str | None:
    """The name of the first stop signal received since :func:`install` (``"SIGINT"``, ``"SIGTERM"``), or None."""
    return signal.Signals(_received[0]).name if _received else None


def note(signum: int = signal.SIGINT) -> None:
    """Remember a stop that arrived as a plain KeyboardInterrupt (Python's own SIGINT handler)."""
    if not _received:
        _received.append(int(signum))
