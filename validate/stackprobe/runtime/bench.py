"""Timing and correctness harness for one collective at a sweep of message sizes (runs inside a rank).

Definitions follow nccl-tests (``doc/PERFORMANCE.md``): for a message of ``S`` bytes taking ``t`` seconds,
``algbw = S / t``; for allreduce ``busbw = algbw * 2(n-1)/n`` with ``n`` ranks (0 when ``n == 1``).
Bandwidths are in GB/s (1e9 bytes/s), times in microseconds per call.

Each size is measured

* **eager**: ``warmup`` calls, then ``repeats`` trials of ``iters`` back-to-back calls, each trial timed with
  CUDA events on the current stream (``time.perf_counter`` on CPU) after a barrier;
* **graph**: ``graph_calls`` calls captured into one ``torch.cuda.CUDAGraph`` (a decode step captures many,
  e.g. 122 for a 61-layer model with 2 allreduces per layer), then ``repeats`` trials of ``graph_replays``
  replays; the per-call time is the trial time / (replays * graph_calls).

Correctness: every rank's input is the small integers ``(i % 7) + rank`` (exact in bf16 up to 8 ranks), so the
reference sum is ``n * (i % 7) + n(n-1)/2``. Eager: one call checked. Graph: a second graph captures
``graph_calls`` iterations of ``[restore input if the op is in place] ; op ; acc += out`` in fp32, so every one
of the captured calls is checked (``acc == graph_calls * reference``).
"""
from __future__ import annotations

import math
import statistics
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Op:
    """One collective at one message size, set up by a probe.

    ``inp``: this rank's contribution (1-D tensor, ``bytes / itemsize`` elements), filled by the harness.
    ``out``: where ``run()`` leaves the reduced result (may be ``inp`` when ``in_place``).
    ``run``: one collective call, enqueued on the current CUDA stream (so CUDA graph capture records it).
    ``graphable``: False where the device has no CUDA graphs (CPU) or the backend says it cannot be captured.
    """

    inp: object
    out: object
    run: Callable[[], None]
    in_place: bool = False
    graphable: bool = True
    out_fn: Callable[[], object] | None = None  # when the output tensor is only known after run()

    def output(self):
        return self.out_fn() if self.out_fn else self.out


@dataclass
class BenchConfig:
    """Sweep and repeat settings. ``sizes`` in bytes, decode size first."""

    sizes: list[int]
    dtype: str = "bfloat16"
    warmup: int = 5
    iters: int = 50
    repeats: int = 5
    graph_calls: int = 122
    graph_replays: int = 10
    check_graph_all_sizes: bool = True

    def to_json(self) -> dict:
        return dict(self.__dict__)


def stats_us(samples: list[float]) -> dict:
    """Summary of per-call times (us): median, mean, min, max, stdev and spread = (max-min)/median in %."""
    med = statistics.median(samples)
    return {
        "median_us": med, "mean_us": statistics.fmean(samples), "min_us": min(samples), "max_us": max(samples),
        "stdev_us": statistics.pstdev(samples) if len(samples) > 1 else 0.0,
        "spread_pct": 100.0 * (max(samples) - min(samples)) / med if med > 0 else 0.0,
        "repeats": len(samples), "samples_us": samples,
    }


def bus_factor(world_size: int, collective: str = "allreduce") -> float:
    """nccl-tests bus bandwidth factor: allreduce 2(n-1)/n; allgather / reducescatter (n-1)/n."""
    n = world_size
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n if collective == "allreduce" else (n - 1) / n


def bandwidths(nbytes: int, us: float, world_size: int, collective: str = "allreduce") -> dict:
    algbw = nbytes / (us * 1e-6) / 1e9 if us > 0 else 0.0
    return {"algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(world_size, collective)}


def short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) < 2000 else text[:2000] + " ..."


class Harness:
    """Runs the sweep for one op factory. ``ctx`` is the rank context (``rank``, ``world_size``, ``device``,
    ``barrier()``, ``log()``); ``make_op(nbytes) -> Op`` builds the op for one size."""

    def __init__(self, ctx, config: BenchConfig):
        import torch
        self.torch = torch
        self.ctx = ctx
        self.cfg = config
        self.dtype = getattr(torch, config.dtype)
        self.cuda = ctx.device.startswith("cuda")

    # --- data --------------------------------------------------------------------------------------
    def fill(self, t) -> None:
        torch = self.torch
        idx = torch.arange(t.numel(), device=t.device) % 7
        t.copy_((idx + self.ctx.rank).to(t.dtype))

    def reference(self, numel: int, device):
        torch = self.torch
        n = self.ctx.world_size
        idx = torch.arange(numel, device=device) % 7
        return (n * idx + n * (n - 1) // 2).to(torch.float32)

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    # --- timing ------------------------------------------------------------------------------------
    def _time(self, fn: Callable[[], None], calls_per_trial: int) -> list[float]:
        torch = self.torch
        samples = []
        for _ in range(self.cfg.repeats):
            self.sync()
            self.ctx.barrier()
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1000.0 / calls_per_trial)
            else:
                t0 = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - t0) * 1e6 / calls_per_trial)
        return samples

    def check(self, got, want) -> tuple[bool, float]:
        got = got.float()
        if got.shape != want.shape:
            return False, math.inf
        err = (got - want).abs().max().item() if got.numel() else 0.0
        return (err == 0.0 and bool(self.torch.isfinite(got).all().item())), err

    # --- one size ----------------------------------------------------------------------------------
    def measure_size(self, make_op: Callable[[int], Op], nbytes: int, check_graph: bool) -> dict:
        torch, cfg, ctx = self.torch, self.cfg, self.ctx
        rec: dict = {"bytes": nbytes}
        op = make_op(nbytes)
        numel = op.inp.numel()
        ref = self.reference(numel, op.inp.device)
        src = op.inp.clone()
        self.fill(src)
        # eager correctness
        op.inp.copy_(src)
        op.run()
        self.sync()
        ok, err = self.check(op.output(), ref)
        rec["eager_correct"], rec["eager_max_abs_err"] = ok, err
        # eager timing
        for _ in range(cfg.warmup):
            op.run()

        def eager_trial():
            for _ in range(cfg.iters):
                op.run()

        if op.in_place:
            op.inp.zero_()  # repeated in-place sums of zeros stay finite
        s = stats_us(self._time(eager_trial, cfg.iters))
        s["calls_per_repeat"] = cfg.iters
        s.update(bandwidths(nbytes, s["median_us"], ctx.world_size))
        rec["eager"] = s
        if not (self.cuda and op.graphable):
            rec["graph"] = {"status": "not-applicable",
                            "reason": "no CUDA graphs on this device" if not self.cuda else "backend not capturable"}
            return rec
        # graph timing: graph_calls calls in one graph
        try:
            if op.in_place:
                op.inp.zero_()
            g = torch.cuda.CUDAGraph()
            self.sync()
            with torch.cuda.graph(g):
                for _ in range(cfg.graph_calls):
                    op.run()
            self.sync()
            g.replay()
            self.sync()

            def graph_trial():
                for _ in range(cfg.graph_replays):
                    g.replay()

            s = stats_us(self._time(graph_trial, cfg.graph_replays * cfg.graph_calls))
            s["calls_per_repeat"] = cfg.graph_replays * cfg.graph_calls
            s["calls_per_graph"] = cfg.graph_calls
            s.update(bandwidths(nbytes, s["median_us"], ctx.world_size))
            s["status"] = "ok"
            rec["graph"] = s
            del g
        except Exception as exc:  # capture failure is a result
            self.sync_quiet()
            rec["graph"] = {"status": "capture-failed", "error": short_error(exc),
                            "traceback": traceback.format_exc()[-3000:]}
            return rec
        # graph correctness: every captured call checked through an fp32 accumulator
        if check_graph:
            try:
                acc = torch.zeros(numel, dtype=torch.float32, device=op.inp.device)
                op.inp.copy_(src)
                g2 = torch.cuda.CUDAGraph()
                self.sync()
                with torch.cuda.graph(g2):
                    for _ in range(cfg.graph_calls):
                        if op.in_place:
                            op.inp.copy_(src)
                        op.run()
                        acc.add_(op.output())
                acc.zero_()
                op.inp.copy_(src)
                self.sync()
                ctx.barrier()
                g2.replay()
                self.sync()
                ok, err = self.check(acc, ref * cfg.graph_calls)
                rec["graph_correct"], rec["graph_max_abs_err"] = ok, err
                del g2
            except Exception as exc:
                self.sync_quiet()
                rec["graph_correct"] = False
                rec["graph_check_error"] = short_error(exc)
        return rec

    def sync_quiet(self):
        try:
            self.sync()
        except Exception:
            pass

    def sweep(self, make_op: Callable[[int], Op], label: str = "") -> list[dict]:
        """Measure every size in ``config.sizes``; a size that raises is recorded with its error and the
        sweep stops (the backend's state is unknown after a failure)."""
        out = []
        for i, nbytes in enumerate(self.cfg.sizes):
            t0 = time.perf_counter()
            try:
                rec = self.measure_size(make_op, nbytes, self.cfg.check_graph_all_sizes or i == 0)
            except Exception as exc:
                out.append({"bytes": nbytes, "error": short_error(exc), "traceback": traceback.format_exc()[-3000:]})
                self.ctx.log(f"{label} {nbytes} B: error {short_error(exc)}")
                break
            out.append(rec)
            g = rec.get("graph", {})
            self.ctx.log(f"{label} {nbytes} B: eager {rec['eager']['median_us']:.1f} us, graph "
                         f"{g.get('median_us', float('nan')):.1f} us ({g.get('status', '')}), correct "
                         f"{rec.get('eager_correct')}/{rec.get('graph_correct', '-')} [{time.perf_counter() - t0:.1f} s]")
        return out
