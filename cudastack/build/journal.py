"""The run journal's recovery side: a build record left "running" by a process that is gone (SIGKILL, the OOM
killer, a lost machine) is rewritten as "interrupted", and the ``.export-<node>-p<pid>-*`` and
``.secrets-p<pid>-*`` folders such runs leave are removed unless their run is alive. The journal itself is
written by :func:`cudastack.build.executor.run_build`; the record's format is in :mod:`cudastack.build.executor`'s docstring, and
callers may import these names from there.

How "alive" is told: each run holds an exclusive ``flock`` on ``<state>/locks/run-p<pid>.lock`` for its whole
life (:class:`RunLock`; the record names it in ``"lock"``). The kernel drops the lock when its holder dies,
SIGKILL included (flock(2)), so a lock file no process holds is a dead run, and a recycled pid cannot pass for
it. Where the kernel does not offer flock on the state folder (some network filesystems), and for records
written before the lock existed, the check falls back to pid plus start time from /proc/<pid>/stat (proc(5)).
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

from stackprobe.api import write_atomic

Say = Callable[[str], None]


def _proc_start(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot, field 22 of /proc/<pid>/stat: proc(5)), or
    None when no such process exists. With the pid it tells a live process from a recycled pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


LOCKS = "locks"


def lock_name(pid: int) -> str:
    """The run lock of process ``pid``, relative to the state folder (``locks/run-p<pid>.lock``)."""
    return f"{LOCKS}/run-p{pid}.lock"


class RunLock:
    """An exclusive flock(2) on ``<state>/locks/run-p<pid>.lock``, held from ``__enter__`` to ``__exit__`` (the
    whole build run); ``__exit__`` removes the file while still holding it. ``name`` is the path relative to
    ``state`` when the lock is held, None where the kernel refused flock there (then the pid + start time check
    stands in). The file's inode is checked after locking, so a stale lock removed by another run's cleanup at
    the same moment (:func:`remove_stale_locks`) is never held by mistake."""

    def __init__(self, state: Path) -> None:
        self.state = Path(state)
        self.path = self.state / lock_name(os.getpid())
        self.fd: int | None = None

    @property
    def name(self) -> str | None:
        return lock_name(os.getpid()) if self.fd is not None else None

    def __enter__(self) -> "RunLock":
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            return self
        for _ in range(50):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError:
                return self
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:          # a checker's brief shared lock, or a same-pid run of another host
                os.close(fd)
                time.sleep(0.02)
                continue
            except OSError:                  # no flock on this filesystem: pid + start time stand in
                os.close(fd)
                return self
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except OSError:
                same = False
            if same:
                self.fd = fd
                return self
            os.close(fd)                     # removed as stale between our open and flock: take the new file
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            try:
                self.path.unlink()
            except OSError:
                pass
            os.close(self.fd)
            self.fd = None


def lock_held(path: Path) -> bool | None:
    """Whether a process holds the flock on ``path``: True (held), False (the file exists and no process holds
    it: its run is dead), None (no such file, or flock not offered there)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)                         # closing drops the shared lock, if taken
    return False


def _process_alive(pid, start, host, lock: str | None = None, state: Path | None = None) -> bool:
    """Whether the run that wrote a journal (``pid``, ``start``, ``host``, ``lock`` relative to ``state``) still
    runs. A journal from another host counts as alive (it cannot be checked from here). With a lock: held means
    alive, not held or gone (a run removes its lock as it ends) means dead; without one, pid + start time."""
    import socket

    if host and host != socket.gethostname():
        return True
    if lock and state is not None:
        held = lock_held(Path(state) / lock)
        return bool(held)
    if not isinstance(pid, int) or pid <= 0:
        return False
    now = _proc_start(pid)
    if now is None:
        if Path("/proc/self/stat").exists():
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return start is None or now == start


def _pid_alive(pid: int, locks: Path | None) -> bool:
    """Whether the run of ``pid`` that named a folder lives: its lock file under ``locks`` decides where one
    exists; else (a run from before the lock, or no flock here) whether the pid exists."""
    held = lock_held(locks / f"run-p{pid}.lock") if locks is not None else None
    return held if held is not None else _proc_start(pid) is not None


def remove_stale_locks(state: Path) -> list[str]:
    """Remove the lock files under ``<state>/locks`` that no process holds (runs killed outright leave them),
    each while holding it, so a run that opens the same name at that moment retries on a fresh file. Returns
    the names removed. Call it after the folder and record checks that read them."""
    removed: list[str] = []
    for p in sorted((Path(state) / LOCKS).glob("run-p*.lock")):
        try:
            fd = os.open(p, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            p.unlink()
            removed.append(p.name)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


def recover_interrupted(state: Path, toolchain: str, say: Say) -> list[dict]:
    """Find runs of ``toolchain`` whose journal says "running" but whose process is gone (killed without a
    chance to write its end), rewrite each record as "interrupted" (the node it was building as well),
    say so, and return them. Records of runs still alive are left alone."""
    rec_dir = state / "records"
    found = []
    for p in sorted(rec_dir.glob(f"build-cu{toolchain}-*.json")):
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if rec.get("status") != "running" or _process_alive(rec.get("pid"), rec.get("proc_start"), rec.get("host"),
                                                            rec.get("lock"), state):
            continue
        try:                      # it may have ended between the read and the check: only a record still running
            if json.loads(p.read_text()).get("status") != "running":
                continue
        except (OSError, ValueError):
            continue
        node = next((n for n in rec.get("nodes", []) if n.get("status") == "building"), None)
        if node is not None:
            node["status"] = "interrupted"
        rec["status"] = "interrupted"
        rec["error"] = (f"The build process (pid {rec.get('pid')}) ended without recording an exit (killed: "
                        f"SIGKILL, the OOM killer or a lost machine)"
                        + (f" while building {node['name']}" if node else "") + ".")
        text = json.dumps(rec, indent=2) + "\n"
        write_atomic(p, text)
        latest = rec_dir / f"latest-cu{toolchain}.json"
        try:
            if json.loads(latest.read_text()).get("run_id") == rec.get("run_id"):
                write_atomic(latest, text)
        except (OSError, ValueError):
            pass
        say(f"previous run {rec.get('run_id')} (started {rec.get('started')}) was interrupted"
            + (f" while building {node['name']}" if node else "")
            + f": its process ended without recording an exit; {p} now says so")
        found.append(rec)
    return found


def remove_stale_exports(folder: Path, say: Say, pattern: str = ".export-*",
                         what: str = "export folder(s) of killed runs beside the wheelhouse",
                         locks: Path | None = None) -> list[str]:
    """Remove the ``pattern`` folders in ``folder`` (``.export-*`` beside the wheelhouse, ``.secrets-*`` in the
    state folder) that no live build owns: the owner's pid is in the name (``.export-<node>-p<pid>-<random>``)
    and its run lock in ``locks`` (``<state>/locks``) says whether it lives; folders without a pid predate that
    naming and are stale. Returns the names removed."""
    import re as _re

    removed: list[str] = []
    if not folder.is_dir():
        return removed
    for p in sorted(folder.glob(pattern)):
        m = _re.search(r"-p(\d+)-[^-]*$", p.name)
        if m and (int(m.group(1)) == os.getpid() or _pid_alive(int(m.group(1)), locks)):
            continue          # its build is still running
        shutil.rmtree(p, ignore_errors=True)
        if not p.exists():
            removed.append(p.name)
    if removed:
        say(f"removed {len(removed)} stale {what}: {', '.join(removed)}")
    return removed

