"""Probes that misbehave on purpose, for the orchestration and correctness tests (no tests here; the workers
import these).

They run in real worker processes, one per rank, exactly like the GPU probes:

* :class:`HangProbe`: starts a child in its process group and a detached grandchild in a new session (so only
  the run marker can find it), prints their pids (and writes them with the rank's pid to
  ``$STACKPROBE_TEST_PIDFILE`` when set), then sleeps far past any timeout;
* :class:`CrashProbe`: rank 1 prints a line and raises; rank 0 waits in a barrier that never completes;
* :class:`WrongResultProbe`: a real gloo allreduce whose result is then corrupted by one;
* :class:`StaleOutputProbe` (CPU analogue of case C21): a real gloo allreduce out of place that writes its output
  on the first call only and leaves it stale afterwards;
* :class:`EmptyProbe` (CPU analogue of case C22): an op that does no work at all;
* :class:`StaleUnderCaptureProbe` (GPU, case C21): NCCL allreduce out of place that runs eagerly but records
  nothing while a CUDA graph is being captured.
"""
import os
import subprocess
import sys
import time

from stackprobe.runtime.bench import Op
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
        pidfile = os.environ.get("STACKPROBE_TEST_PIDFILE")
        if pidfile:
            with open(f"{pidfile}.{ctx.rank}", "w") as f:
                f.write(f"{os.getpid()} {child.pid} {detached.pid}\n")
        ctx.log("hanging now")
        time.sleep(600)
        return {}


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
        return {}


def _gloo(ctx, nbytes, after=None, calls=None, stale_after_first=False, empty=False):
    import torch
    import torch.distributed as dist
    dtype = getattr(torch, ctx.config.dtype)
    n = nbytes // torch.empty((), dtype=dtype).element_size()
    inp = torch.empty(n, dtype=dtype)
    out = torch.empty(n, dtype=dtype)
    state = {"calls": 0}

    def run():
        state["calls"] += 1
        if empty:
            return
        if stale_after_first and state["calls"] > 1:
            return  # writes nothing: the output keeps whatever was there
        dist.all_reduce(inp)  # in place on the input, then copied out: an out-of-place op
        out.copy_(inp)
        if after:
            after(out)
    return Op(inp, out, run, graphable=False)


class _CpuFixture(Probe):
    device = "cpu"
    min_world_size = 1

    def candidates(self, ctx, wanted):
        return [{"backend": self.name, "label": self.label, "kind": "backend", "info": {},
                 "make": lambda nbytes: self.make(ctx, nbytes)}]


class WrongResultProbe(_CpuFixture):
    name = "fixture-wrong"
    label = "gloo allreduce plus one"

    def make(self, ctx, nbytes):
        return _gloo(ctx, nbytes, after=lambda t: t.add_(1))


class StaleOutputProbe(_CpuFixture):
    name = "fixture-stale"
    label = "gloo allreduce that writes its output on the first call only"

    def make(self, ctx, nbytes):
        return _gloo(ctx, nbytes, stale_after_first=True)


class EmptyProbe(_CpuFixture):
    name = "fixture-empty"
    label = "an op that does nothing"

    def make(self, ctx, nbytes):
        return _gloo(ctx, nbytes, empty=True)


class StaleUnderCaptureProbe(Probe):
    name = "fixture-stale-under-capture"
    label = "NCCL allreduce (out of place) that records nothing under CUDA graph capture"
    device = "cuda"

    def candidates(self, ctx, wanted):
        import torch
        from stackprobe.runtime.probes import nccl_comm
        comm, info = nccl_comm(ctx, "stale")
        dtype = getattr(torch, ctx.config.dtype)

        def make(nbytes):
            n = nbytes // torch.empty((), dtype=dtype).element_size()
            inp = torch.empty(n, dtype=dtype, device=ctx.device)
            out = torch.empty_like(inp)

            def run():
                if torch.cuda.is_current_stream_capturing():
                    return  # the planted defect: eager calls work, captured calls write nothing
                comm.all_reduce(inp, out)
            return Op(inp, out, run)
        return [{"backend": self.name, "label": self.label, "kind": "backend", "info": info, "make": make}]


class DetachScrubProbe(Probe):
    """Case C49: every rank starts ``setsid env -i sleep 600`` (a new session and an empty environment: neither
    the process group nor the run marker finds it), writes its pid to ``$STACKPROBE_TEST_PIDFILE.<rank>`` and
    returns at once, so the run ends ``ok`` with the sleeper orphaned."""
    name = "fixture-detach-scrub"
    label = "leaves a detached, environment-scrubbed grandchild"
    device = "cpu"

    def run(self, ctx):
        p = subprocess.Popen(["setsid", "env", "-i", "sleep", "600"])
        with open(f"{os.environ['STACKPROBE_TEST_PIDFILE']}.{ctx.rank}", "w") as f:
            f.write(f"{p.pid}\n")
        time.sleep(0.5)       # setsid and env exec in place: the pid is the sleeper's
        return {"baseline": None, "sweep": [], "backends": []}
