"""The guard of one probe's process group: ``python -m stackprobe.runtime.guard PGID RUN_ID [SCRATCH]``.

Started by :mod:`stackprobe.runtime.orchestrate` beside the ranks, in a new session (so a signal to the
suite's own process group does not reach it first) and with a parent-death signal (``PR_SET_PDEATHSIG`` =
SIGTERM). It sleeps. When the suite ends normally it is told to exit (SIGUSR1). When the suite dies any other
way (SIGKILL, a crash, Ctrl-C that skipped cleanup), the kernel sends it SIGTERM and it kills the ranks'
process group (``killpg(PGID, SIGKILL)``: ranks and any compiler or helper they started in that group) and then
every process whose environment carries ``STACKPROBE_RUN_ID=RUN_ID`` (children that left the group, e.g. a JIT
compiler started in a new session), and removes the run's scratch folder ``SCRATCH`` (spec, store, rank logs),
so a killed run leaves none behind. Standard library only.
"""
from __future__ import annotations

import os
import signal
import sys
import time


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pgid, run_id = int(argv[0]), argv[1]
    scratch = argv[2] if len(argv) > 2 else None
    from .orchestrate import processes_with_marker
    from .children import set_parent_death_signal
    from .worker import orphaned

    state = {"kill": False, "done": False}

    def on_term(signum, frame):
        state["kill"] = True

    def on_done(signum, frame):
        state["done"] = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGHUP, on_term)
    signal.signal(signal.SIGUSR1, on_done)
    set_parent_death_signal(signal.SIGTERM)
    if orphaned():
        state["kill"] = True
    while not (state["kill"] or state["done"]):
        signal.pause() if hasattr(signal, "pause") else time.sleep(0.2)
    if state["done"]:
        return 0
    for _ in range(5):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        strays = [p for p in processes_with_marker(run_id) if p != os.getpid()]
        for pid in strays:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if not strays:
            break
        time.sleep(0.2)
    if scratch and os.path.basename(scratch).startswith("stackprobe-rt-"):
        import shutil
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
