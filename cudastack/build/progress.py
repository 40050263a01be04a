"""Build progress for the terminal: BuildKit's plain progress parsed (:class:`_Progress`: steps, CACHED
count, a ninja/CMake ``[n/N]`` counter, the failing step's last lines) and shown (:class:`BuildDisplay`: one
status line per step with the elapsed time, a heartbeat while a long step runs; on a terminal, one line
redrawn in place). Build control (the docker CLI, its process, errors) is :mod:`cudastack.build.engine`.
"""
from __future__ import annotations

import re
import sys
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable

_STEP = re.compile(r"^#(\d+) (\[[^\]]+\] .*|\S.*)$")
_COUNTER = re.compile(r"^\d+\.\d+\s+\[(\d+)/(\d+)\] ")   # ninja / CMake progress inside a RUN step
#: A line that reports an error inside a RUN step (BuildKit's "12.3 " time prefix removed): a compiler's
#: ``file:line: error:`` (gcc, clang) or ``file(line): error:`` (nvcc), ninja's ``FAILED:``, pip's ``ERROR:``,
#: a Python traceback, ``fatal error``, CMake's ``CMake Error``. Warnings that quote the word are not errors.
_ERROR_LINE = re.compile(r"(\berror\b\s*:|\bfatal error\b|\bfatal\s+:|^FAILED:|^ERROR:|^Traceback \(most recent call last\)"
                         r"|\bCMake Error\b|\berror: subprocess-exited-with-error)")
_WARNING_LINE = re.compile(r"\bwarning\b\s*[:#]|-W[a-z-]*error", re.IGNORECASE)
Say = Callable[[str], None]


def _fmt_s(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


@dataclass
class _Progress:
    """Parses BuildKit plain progress: current step title, per-step line buffers, CACHED count."""

    steps: "OrderedDict[str, str]" = field(default_factory=OrderedDict)
    tails: dict = field(default_factory=dict)
    cached: set = field(default_factory=set)
    errors: list = field(default_factory=list)
    current: str = ""
    last_line: str = ""
    counter: str = ""               # "12/73": the last ninja-style progress counter seen
    final: deque = field(default_factory=lambda: deque(maxlen=40))
    first_error: dict = field(default_factory=dict)   # step id -> the first error line, 3 lines before, 6 after
    _after: dict = field(default_factory=dict)        # step id -> lines still to add after its first error

    def feed(self, line: str) -> bool:
        """Returns True when a new step started."""
        self.final.append(line)
        m = _STEP.match(line)
        if not m:
            return False
        sid, rest = m.group(1), m.group(2)
        tail = self.tails.setdefault(sid, deque(maxlen=60))
        body = re.sub(r"^\d+\.\d+ ", "", rest)
        if self._after.get(sid):
            self.first_error[sid].append(rest)
            self._after[sid] -= 1
        elif (sid not in self.first_error and sid in self.steps and body != rest     # a RUN step's own output
              and _ERROR_LINE.search(body) and not _WARNING_LINE.search(body)):
            self.first_error[sid] = list(tail)[-3:] + [rest]
            self._after[sid] = 6
        tail.append(rest)
        if rest.startswith("ERROR") or " ERROR:" in rest[:12]:
            self.errors.append(sid)
        if rest == "CACHED":
            self.cached.add(sid)
        new = False
        if sid not in self.steps and rest.startswith("["):
            self.steps[sid] = rest
            self.current = sid
            new = True
        elif sid in self.steps:
            self.current = sid
            if not re.match(r"^(DONE|CACHED|extracting|sha256|transferring|writing|naming|exporting)", rest):
                self.last_line = re.sub(r"^\d+\.\d+ ", "", rest)
                c = _COUNTER.match(rest)
                if c:
                    self.counter = f"{c.group(1)}/{c.group(2)}"
        return new

    def first_error_line(self) -> str:
        """The failing step's first error line (time prefix removed), or "" when none was recognised."""
        sid = self.errors[-1] if self.errors else self.current
        first = self.first_error.get(sid) or []
        line = next((ln for ln in first if _ERROR_LINE.search(re.sub(r"^\d+\.\d+ ", "", ln))), "")
        return re.sub(r"^\d+\.\d+ ", "", line)

    def failure_excerpt(self, n: int = 25) -> str:
        """The failing step's title, its first error with the lines around it (the cause: a compiler's later
        lines are often warnings and follow-on errors), then the step's last lines and BuildKit's summary."""
        sid = self.errors[-1] if self.errors else self.current
        title = _clip(self.steps.get(sid, f"#{sid}"), 160)
        first = self.first_error.get(sid, [])
        lines = list(self.tails.get(sid, []))[-(n if not first else 10):]
        summary = [ln for ln in self.final if ln.startswith(("error:", "ERROR:", "failed to solve"))]
        body = "\n".join(f"    {_clip(ln, 240)}" for ln in lines)
        tail = "\n".join(f"    {_clip(ln, 240)}" for ln in summary[-2:])
        head = ""
        if first:
            head = "first error:\n" + "\n".join(f"    {_clip(ln, 240)}" for ln in first) + "\nlast lines:\n"
        return f"failing step: {title}\n{head}{body}" + (f"\n{tail}" if tail else "")



class BuildDisplay:
    """The terminal side of one build named ``name``: a status line per step (``say``; on a terminal, one line
    redrawn in place) and a heartbeat while a step runs (every second on a terminal, every 60 s in a log).
    ``prog``: the build's :class:`_Progress`; ``t0``: its start (``time.monotonic()``); ``tty``: default
    whether stderr is a terminal. Use :meth:`start`, :meth:`line` per output line, :meth:`stop` (always)."""

    def __init__(self, name: str, prog: _Progress, say: Say, t0: float, *, tty: bool | None = None):
        self.name = name
        self.prog = prog
        self.say = say
        self.t0 = t0
        self.tty = sys.stderr.isatty() if tty is None else tty
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def status(self) -> str:
        prog = self.prog
        step = prog.steps.get(prog.current, "starting")
        last = f" | {prog.last_line[:70]}" if prog.last_line else ""
        count = f" (compiled {prog.counter})" if prog.counter else ""
        return f"  [{self.name}] {_fmt_s(time.monotonic() - self.t0)}{count} {step[:80]}{last}"

    def _heartbeat(self) -> None:
        interval = 1.0 if self.tty else 60.0
        while not self._stop.wait(interval):
            if self.tty:
                sys.stderr.write("\r\033[K" + self.status()[:200])
                sys.stderr.flush()
            else:
                self.say(self.status())

    def start(self) -> None:
        self._thread = threading.Thread(target=self._heartbeat, daemon=True)
        self._thread.start()

    def line(self, line: str) -> None:
        """Feed one line of BuildKit's plain progress (without its newline); a new step gets a status line
        (not on a terminal, where the heartbeat redraws it; not for BuildKit's ``[internal]`` steps)."""
        prog = self.prog
        if prog.feed(line) and not self.tty and not prog.steps[prog.current].startswith("[internal]"):
            self.say(self.status())

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
