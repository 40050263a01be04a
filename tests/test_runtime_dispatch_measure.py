"""The dispatch probe's rank-side measurement (``SglangDispatchProbe.measure``) in this process, eager (no CUDA),
against a stand-in TP group: two communicators, ``ca_comm`` (a row the probe can switch off) and ``pynccl_comm``
(a fallback), dispatched as SGLang's group does (custom allreduce first unless it is ``disabled``). The group logs
every ``all_reduce`` it serves, the capture's enter and exit and the rank's barriers in one list, so each phase
shows in it: the on / off / floor units built inside one ``tp.graph_capture()``, the correctness checks (each
unit replayed, its output poisoned with NaN, replayed again and compared with the exact sum), the warm-up and the
paired rounds in rotating order.

Claims and their failing twins:

* the whole call order is pinned: leaving a phase out, or running the off unit without switching its path off,
  changes the log;
* the checks pass on the exact sum and fail on a wrong one, on a result that is not refreshed by a replay (the NaN
  poison stays) and on an integer result; an in-place path (no tensor back) is not checked (None);
* with no path to switch off (the fallback serves) there is no off unit: no checks, no samples;
* the capture is left once, after the floor unit, also when building a unit fails; where it cannot be entered the
  reason is recorded and the units run eager;
* a unit served by more than one path says so (``on_mixed``).
"""
from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import pytest

from stackprobe.runtime.dispatch import OFF, ON, SglangDispatchProbe

torch = pytest.importorskip("torch")

CFG = {"rows": 2, "hidden": 8, "calls": 2, "warmup": 1, "replays": 2, "rounds": 3}
WS, RANK = 2, 1
CA, NCCL = "ca_comm.all_reduce", "pynccl_comm.all_reduce"


class Comm:
    """One communicator: the exact out-of-place sum over ``WS`` ranks of the probe's fill, or a planted fault."""

    def __init__(self, name: str, mode: str = "ok"):
        self.name, self.mode, self.disabled, self.buf = name, mode, False, None

    def reduce(self, x):
        if self.mode == "raise":
            raise RuntimeError("planted: the path fails")
        if self.mode == "inplace":
            return None
        total = (x.float() - RANK) * WS + WS * (WS - 1) // 2      # sum over ranks r of (i % 7) + r
        if self.mode == "wrong":
            return torch.zeros_like(total)
        if self.mode == "int":
            return total.to(torch.int32)
        if self.mode == "stale":      # written on its first call only: a replay that does not run the path
            if self.buf is None:
                self.buf = total
            return self.buf
        return total


class Capture:
    def __init__(self, log: list):
        self.log, self.stream = log, object()

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, *exc):
        self.log.append("exit")
        return False


class StandInTP:
    device = "cpu"

    def __init__(self, log: list, ca: str | None = "ok", capture: bool = False, alternate: bool = False):
        self.log, self.capture, self.alternate, self.observer, self.n = log, capture, alternate, None, 0
        self.ca_comm = Comm("ca_comm", ca) if ca is not None else None
        self.pynccl_comm = Comm("pynccl_comm")

    def graph_capture(self):
        if not self.capture:
            raise RuntimeError("no device stream on CPU")
        return Capture(self.log)

    def all_reduce(self, x):
        self.n += 1
        ca_ok = self.ca_comm is not None and not self.ca_comm.disabled and not (self.alternate and self.n % 2 == 0)
        comm = self.ca_comm if ca_ok else self.pynccl_comm
        self.log.append(comm.name)
        if self.observer is not None:
            self.observer.append(f"{comm.name}.all_reduce")
        return comm.reduce(x)


class StandInProbe(SglangDispatchProbe):
    @contextlib.contextmanager
    def observe(self, tp, calls):
        tp.observer = calls
        try:
            yield
        finally:
            tp.observer = None


def measure(tp: StandInTP) -> dict:
    ctx = SimpleNamespace(rank=RANK, world_size=WS, barrier=lambda: tp.log.append("barrier"))
    return StandInProbe().measure(tp, ctx, CFG, cuda=False)


def expected_log(captured: bool = False) -> list:
    """The order of every phase with a switchable custom allreduce (``ca_comm``) and pynccl behind it."""
    n, r = CFG["calls"], CFG["replays"]
    on, off = ["ca_comm"] * n, ["pynccl_comm"] * n
    build = (["enter"] if captured else []) + on + off + (["exit"] if captured else [])   # floor: no all_reduce
    checks = on + on + off + off                 # each unit replayed, poisoned with NaN, replayed again
    warmup = (on + off) * CFG["warmup"]
    unit = {"on": on * r, "off": off * r, "floor": []}
    rounds = []
    for order in (("on", "off", "floor"), ("off", "floor", "on"), ("floor", "on", "off")):    # rotating
        for u in order:
            rounds += ["barrier"] + unit[u]
    return build + checks + warmup + rounds


def test_every_phase_runs_in_order_and_the_off_unit_runs_with_its_path_off():
    log: list = []
    out = measure(StandInTP(log))
    assert log == expected_log()
    assert out["paths"] == {ON: CA, OFF: NCCL}
    assert out["checks"] == {ON: True, OFF: True}
    assert out["graph"] == "eager (no CUDA)"
    assert out["graph_capture"] == "not entered: RuntimeError: no device stream on CPU"
    assert set(out) == {"paths", "checks", "samples_us", "graph", "graph_capture", "finite"}
    assert {u: len(s) for u, s in out["samples_us"].items()} == {"on": 3, "off": 3, "floor": 3}
    assert out["finite"] is True and all(math.isfinite(v) and v >= 0 for s in out["samples_us"].values() for v in s)


def test_the_twin_a_path_that_ignores_being_switched_off_shows_in_the_log():
    """The log pins the off unit: with its path never off (as if ``switched_off`` did nothing) the order differs."""
    class Sticky(StandInProbe):
        def switched_off(self, tp, attr):
            return contextlib.nullcontext()

    log: list = []
    tp = StandInTP(log)
    ctx = SimpleNamespace(rank=RANK, world_size=WS, barrier=lambda: log.append("barrier"))
    out = Sticky().measure(tp, ctx, CFG, cuda=False)
    assert log != expected_log() and "pynccl_comm" not in log
    assert out["paths"] == {ON: CA, OFF: CA}


def test_the_capture_is_entered_once_and_left_after_the_floor_unit():
    log: list = []
    out = measure(StandInTP(log, capture=True))
    assert log == expected_log(captured=True)
    assert "graph_capture" not in out and out["checks"] == {ON: True, OFF: True}


def test_the_capture_is_left_when_building_a_unit_fails():
    log: list = []
    with pytest.raises(RuntimeError, match="planted"):
        measure(StandInTP(log, ca="raise", capture=True))
    assert log == ["enter", "ca_comm", "exit"]


@pytest.mark.parametrize(("mode", "check"), [("wrong", False), ("stale", False), ("int", False), ("inplace", None)])
def test_a_wrong_stale_or_integer_sum_fails_its_check_and_an_in_place_path_is_not_checked(mode, check):
    out = measure(StandInTP([], ca=mode))
    assert out["checks"] == {ON: check, OFF: True}
    assert set(out["samples_us"]) == {"on", "off", "floor"}     # the timing still runs; verdicts read the checks


def test_with_only_the_fallback_serving_there_is_no_off_unit_no_checks_and_no_samples():
    log: list = []
    out = measure(StandInTP(log, ca=None))
    assert log == ["pynccl_comm"] * CFG["calls"]
    assert out == {"paths": {ON: NCCL}, "checks": {}, "samples_us": {}, "graph": "eager (no CUDA)",
                   "graph_capture": "not entered: RuntimeError: no device stream on CPU"}


def test_a_unit_served_by_two_paths_says_so():
    out = measure(StandInTP([], alternate=True))
    assert out["paths"][ON] == CA and out["paths"]["on_mixed"] == {CA: 1, NCCL: 1}
    assert out["paths"][OFF] == NCCL and "off_mixed" not in out["paths"]


# --- on a GPU: the units are CUDA graphs -------------------------------------------------------------------------
class CudaCapture(Capture):
    """The group's capture on a real side stream, as ``GroupCoordinator.graph_capture`` gives one."""

    def __init__(self, log: list):
        super().__init__(log)
        self.stream = torch.cuda.Stream()


class CudaStandInTP(StandInTP):
    """The stand-in group on GPU 0: its sum is arithmetic on the device, so it is captured into the graph."""

    device = "cuda"

    def graph_capture(self):
        return CudaCapture(self.log)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")
@pytest.mark.parametrize(("mode", "check"), [("ok", True), ("wrong", False)])
def test_on_a_gpu_each_unit_is_a_cuda_graph_replayed_checked_and_timed(mode, check):
    """With ``cuda=True`` on a real GPU: the on / off / floor units are captured as CUDA graphs inside the group's
    capture and every later run is a graph replay: the group's Python ``all_reduce`` is called only while capturing
    (the log holds the capture-time calls, then the barriers), yet each check sees the replayed kernels overwrite the
    NaN poison with the exact sum (True), and a path that writes a wrong sum fails its check (the twin, False);
    every unit is timed (us per call, finite, >= 0)."""
    log: list = []
    ctx = SimpleNamespace(rank=RANK, world_size=WS, barrier=lambda: log.append("barrier"))
    out = StandInProbe().measure(CudaStandInTP(log, ca=mode), ctx, CFG, cuda=True)
    n = CFG["calls"]
    assert out["graph"] == "cuda" and "graph_capture" not in out
    assert out["paths"] == {ON: CA, OFF: NCCL}
    assert out["checks"] == {ON: check, OFF: True}
    assert log == ["enter"] + ["ca_comm"] * n + ["pynccl_comm"] * n + ["exit"] + ["barrier"] * (3 * CFG["rounds"])
    assert {u: len(s) for u, s in out["samples_us"].items()} == {"on": 3, "off": 3, "floor": 3}
    assert out["finite"] is True and all(v >= 0 for s in out["samples_us"].values() for v in s)
