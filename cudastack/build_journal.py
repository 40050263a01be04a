"""The run journal's recovery side: a build record left "running" by a process that is gone (SIGKILL, the OOM
killer, a lost machine) is rewritten as "interrupted", and the ``.export-<node>-p<pid>-*`` and
``.secrets-p<pid>-*`` folders such runs leave are removed unless their pid is alive (pid plus start time from
/proc/<pid>/stat, proc(5), so a recycled pid is not taken for the run). The journal itself is written by
:func:`cudastack.build.run_build`; the record's format is in :mod:`cudastack.build`'s docstring, and callers
may import these names from there.

Why pid + start time and not an ``flock``: a lock file the run holds for its whole life (flock(2): the
kernel drops it when the holder dies, SIGKILL included, with no recycled-pid question) is the better answer
and the one to move to; today the record, the export folders and the secrets folders are all keyed by pid,
and moving the three to one lock file is a change of its own (not made yet).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

from stackprobe.atomic import write_atomic

Say = Callable[[str], None]


def _proc_start(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot, field 22 of /proc/<pid>/stat: proc(5)), or
    None when no such process exists. With the pid it tells a live process from a recycled pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _process_alive(pid, start, host) -> bool:
    """Whether the run that wrote a journal (``pid``, ``start``, ``host``) still runs. A journal from another
    host counts as alive (it cannot be checked from here)."""
    import socket

    if host and host != socket.gethostname():
        return True
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
        if rec.get("status") != "running" or _process_alive(rec.get("pid"), rec.get("proc_start"), rec.get("host")):
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
                         what: str = "export folder(s) of killed runs beside the wheelhouse") -> list[str]:
    """Remove the ``pattern`` folders in ``folder`` (``.export-*`` beside the wheelhouse, ``.secrets-*`` in the
    state folder) that no live build owns: the owner's pid is in the name (``.export-<node>-p<pid>-<random>``);
    folders without one predate that naming and are stale. Returns the names removed."""
    import re as _re

    removed: list[str] = []
    if not folder.is_dir():
        return removed
    for p in sorted(folder.glob(pattern)):
        m = _re.search(r"-p(\d+)-[^-]*$", p.name)
        if m and (int(m.group(1)) == os.getpid() or _proc_start(int(m.group(1))) is not None):
            continue          # its build is still running
        shutil.rmtree(p, ignore_errors=True)
        if not p.exists():
            removed.append(p.name)
    if removed:
        say(f"removed {len(removed)} stale {what}: {', '.join(removed)}")
    return removed

