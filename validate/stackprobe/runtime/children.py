"""Starting children so that none outlives the suite, and catching the ones that try (standard library only).

* :func:`die_with_parent`: a ``preexec_fn`` that only calls ``prctl(PR_SET_PDEATHSIG, sig)`` (prctl(2)), with
  the libc function resolved BEFORE the fork (``ctypes.CDLL(None)``: the already-loaded libc, no
  ``ctypes.util.find_library``, which runs ``ldconfig``, and no import between fork and exec), then checks
  that the parent is still the one that forked it (the race prctl(2) describes). The process group is
  ``Popen(process_group=...)``'s job (Python >= 3.11), not the hook's.
* :func:`set_parent_death_signal`: the same call for the running process (a worker or the guard sets it again
  for itself after exec).
* :func:`become_subreaper` (``prctl(PR_SET_CHILD_SUBREAPER, 1)``, Linux >= 3.4): every descendant whose parent
  dies is re-parented to this process instead of init, so one that left the process group (``setsid``) AND
  scrubbed its environment (``env -i``, so the run marker is gone: case C49) still shows up in
  :func:`child_pids` and can be named and ended.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1            # <linux/prctl.h>
PR_SET_CHILD_SUBREAPER = 36     # <linux/prctl.h>


def _resolve_prctl():
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _resolve_prctl()        # resolved at import, in the parent: nothing is looked up after a fork


def set_parent_death_signal(sig: int) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)`` for this process; False where Linux's prctl is not available."""
    return _PRCTL is not None and _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def die_with_parent(sig: int):
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child gets ``sig`` when the process that forked it
    dies (SIGKILL included), and sends it to itself if that parent is already gone. None off Linux. The
    signal is tied to the thread that calls Popen (prctl(2)): call Popen from a thread that lives as long as
    the child should."""
    if _PRCTL is None:
        return None
    prctl, parent, kill, getppid, getpid = _PRCTL, os.getpid(), os.kill, os.getppid, os.getpid

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if getppid() != parent:
            kill(getpid(), sig)
    return preexec


def become_subreaper() -> bool:
    """Make this process the child subreaper of its descendants (``prctl(PR_SET_CHILD_SUBREAPER, 1)``).
    Idempotent; False where not available."""
    return _PRCTL is not None and _PRCTL(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _stat(pid_dir: Path) -> tuple[str, int] | None:
    try:
        stat = (pid_dir / "stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[0], int(fields[1])          # state, ppid (proc(5))


def child_pids(parent: int | None = None, *, zombies: bool = False) -> list[int]:
    """PIDs whose parent is ``parent`` (default: this process), from ``/proc/*/stat``; zombies (state Z)
    only with ``zombies=True``. Empty where there is no ``/proc``."""
    parent = os.getpid() if parent is None else parent
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    out = []
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        st = _stat(d)
        if st and st[1] == parent and (zombies or st[0] != "Z"):
            out.append(int(d.name))
    return sorted(out)


def reap(pids) -> None:
    """``waitpid`` each of ``pids`` without blocking (children of this process that have exited)."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
