"""Probes that misbehave on purpose, for the orchestration tests (no tests here; the workers import these).

They run in real worker processes, one per rank, exactly like the GPU probes, but on CPU (gloo):

* :class:`HangProbe`: starts a child in its process group and a detached grandchild in a new session (so only
  the run marker can find it), prints their pids, then sleeps far past any timeout;
* :class:`CrashProbe`: rank 1 prints a line and raises; rank 0 waits in a barrier that never completes;
* :class:`WrongResultProbe`: a real gloo allreduce whose result is then corrupted by one.
"""
import subprocess
import sys
import time

from stackprobe.runtime.bench import Harness, Op
from stackprobe.runtime.probes import Probe

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


class HangProbe(Probe):
    name = "fixture-hang"
    label = "sleeps past the timeout"
    device = "cpu"

    def run(self, ctx):
        child = subprocess.Popen(SLEEPER)
        detached = subprocess.Popen(SLEEPER, start_new_session=True)
        ctx.log(f"child pid {child.pid} detached pid {detached.pid}")
        ctx.log("hanging now")
        time.sleep(600)
        return []


class CrashProbe(Probe):
    name = "fixture-crash"
    label = "rank 1 raises"
    device = "cpu"

    def run(self, ctx):
        if ctx.rank == 1:
            ctx.log("about to fail on purpose")
            raise RuntimeError("injected failure on rank 1")
        ctx.barrier()  # never completes: rank 1 is gone
        time.sleep(600)
        return []


class WrongResultProbe(Probe):
    name = "fixture-wrong"
    label = "gloo allreduce plus one"
    device = "cpu"

    def run(self, ctx):
        import torch
        import torch.distributed as dist
        h = Harness(ctx, ctx.config)

        def make_op(nbytes):
            buf = torch.empty(nbytes // 4, dtype=torch.float32)

            def run():
                dist.all_reduce(buf)
                buf.add_(1)
            return Op(buf, buf, run, in_place=True, graphable=False)

        return [{"backend": self.name, "label": self.label, "info": {}, "sweep": h.sweep(make_op, self.name),
                 "checks": {}, "failure": None}]
