"""Paired timing and correctness checks for one collective at a sweep of message sizes (runs inside a rank).

Definitions follow nccl-tests (``doc/PERFORMANCE.md``): for a message of ``S`` bytes taking ``t`` seconds,
``algbw = S / t``; for allreduce ``busbw = algbw * 2(n-1)/n`` with ``n`` ranks (0 when ``n == 1``).
Bandwidths are in GB/s (1e9 bytes/s), times in microseconds per call.

**The timed unit.** Every op (the baseline, each candidate) is captured as ``graph_calls`` calls in one CUDA
graph, a decode step's worth (122 for a 61-layer model with two allreduces per layer). Each captured call is
preceded by one kernel that writes that call's own input: ``inp = src + k * step`` for call ``k = 1..N``
(``step`` is 1 on rank 0 and 0 elsewhere), so every call reduces a different tensor and the reduced values form
an arithmetic series. A *floor* unit captures the same N input writes and no collective: it is replayed in the
same rounds, so ``work = time - floor`` is what the collective itself costs, and an op whose graph holds no GPU
work shows up as ``work ~ 0`` (case C22). On CPU (no graphs) a unit is the same N-call sequence run eagerly.

**Paired rounds.** A round times one trial of every unit (``graph_replays`` replays each, after a barrier), in an
order that rotates from round to round (A B / B A for two units), so drift in clocks, NVLink or host load hits
baseline and candidates alike. ``rounds`` rounds give ``rounds`` paired samples per unit.

**Correctness that can fail** (case C21), per op and size, before timing and on the timed graph itself:

* eager: the output is poisoned (NaN, or a sentinel for integer types), one call runs, the result must equal the
  reference sum ``n * (i % 7) + n(n-1)/2`` (small integers: exact in bf16 for up to 8 ranks);
* sequence: the output is poisoned, the N-call sequence runs once (eagerly on CPU; as a separate CUDA graph on
  GPU) with an fp32 accumulator adding every call's output; the accumulator must equal the arithmetic series
  ``sum_k (ref + k)`` and the final output ``ref + N``;
* timed graph: the output is poisoned and the *timed* graph is replayed once; its output must be ``ref + N``.

An op that writes its output eagerly but not under capture leaves the poison (wrong-result); one that captured a
fixed input leaves ``ref + 1``, not ``ref + N``.
"""
from __future__ import annotations

import math
import statistics
import time
import traceback
from dataclasses import dataclass
from typing import Callable

FLOOR = "__floor__"
# largest integer every value of which a dtype holds exactly (significand bits + 1)
EXACT_INT = {"bfloat16": 256, "float16": 2048, "float32": 2**24, "float64": 2**53}


@dataclass
class Op:
    """One collective at one message size, set up by a probe.

    ``inp``: this rank's contribution (1-D tensor, ``bytes / itemsize`` elements), written by the harness.
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
    """Sweep and round settings. ``sizes`` in bytes, decode size first.

    ``rounds``: paired rounds at the decode size (the verdict's samples); ``sweep_rounds``: at the other sizes
    (the plot's); ``graph_calls``: calls per captured graph; ``graph_replays``: replays per timed trial;
    ``warmup``: untimed replays of every unit before the rounds. Defaults are justified in
    :mod:`stackprobe.runtime.__main__`.
    """

    sizes: list[int]
    dtype: str = "bfloat16"
    warmup: int = 3
    rounds: int = 30
    sweep_rounds: int = 5
    graph_calls: int = 122
    graph_replays: int = 10

    def to_json(self) -> dict:
        return dict(self.__dict__)


def bus_factor(world_size: int, collective: str = "allreduce") -> float:
    """nccl-tests bus bandwidth factor: allreduce 2(n-1)/n; allgather / reducescatter (n-1)/n."""
    n = world_size
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n if collective == "allreduce" else (n - 1) / n


def bandwidths(nbytes: int, us: float, world_size: int, collective: str = "allreduce") -> dict:
    algbw = nbytes / (us * 1e-6) / 1e9 if us and us > 0 else 0.0
    return {"algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(world_size, collective)}


def short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) < 2000 else text[:2000] + " ..."


def check_exact_range(dtype: str, world_size: int, calls: int) -> None:
    """Raise ``ValueError`` when the checked values (``n*6 + n(n-1)/2 + calls``) would not be exact in ``dtype``."""
    top = world_size * 6 + world_size * (world_size - 1) // 2 + calls
    limit = EXACT_INT.get(dtype)
    if limit is not None and top > limit:
        raise ValueError(f"--graph-calls {calls} at world size {world_size} makes checked sums up to {top}, beyond "
                         f"the integers {dtype} holds exactly ({limit}); lower --graph-calls or use --dtype float32")


class Harness:
    """Runs paired measurements for op factories. ``ctx`` is the rank context (``rank``, ``world_size``,
    ``device``, ``barrier()``, ``log()``)."""

    def __init__(self, ctx, config: BenchConfig):
        import torch
        self.torch = torch
        self.ctx = ctx
        self.cfg = config
        self.dtype = getattr(torch, config.dtype)
        self.cuda = ctx.device.startswith("cuda")
        self.step = 1.0 if ctx.rank == 0 else 0.0
        check_exact_range(config.dtype, ctx.world_size, config.graph_calls)

    # --- data --------------------------------------------------------------------------------------
    def fill(self, t) -> None:
        torch = self.torch
        idx = torch.arange(t.numel(), device=t.device) % 7
        t.copy_((idx + self.ctx.rank).to(t.dtype))

    def reference(self, numel: int, device):
        """The reduced value of the unincremented inputs, fp32 (exact small integers)."""
        torch = self.torch
        n = self.ctx.world_size
        idx = torch.arange(numel, device=device) % 7
        return (n * idx + n * (n - 1) // 2).to(torch.float32)

    def poison(self, t) -> None:
        if t is None:
            return
        if t.dtype.is_floating_point:
            t.fill_(float("nan"))
        else:
            t.fill_(-12345)

    @staticmethod
    def _out(op: Op):
        """The output tensor to poison (None for in-place ops, whose input write replaces it anyway, and for
        ops whose output only exists after a call)."""
        if op.in_place:
            return None
        try:
            return op.output()
        except Exception:
            return None

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def sync_quiet(self):
        try:
            self.sync()
        except Exception:
            pass

    def check(self, got, want) -> tuple[bool, float]:
        if got is None:
            return False, math.inf
        got = got.float()
        if got.shape != want.shape:
            return False, math.inf
        finite = bool(self.torch.isfinite(got).all().item())
        if not finite:
            return False, math.inf
        err = (got - want).abs().max().item() if got.numel() else 0.0
        return err == 0.0, err

    # --- the N-call body -----------------------------------------------------------------------------
    def body(self, op: Op | None, src, inp, acc=None) -> None:
        """N calls: ``inp = src + k*step`` then the op (none for the floor), ``acc += output`` when given."""
        torch = self.torch
        for k in range(1, self.cfg.graph_calls + 1):
            torch.add(src, k * self.step, out=inp)
            if op is not None:
                op.run()
                if acc is not None:
                    acc.add_(op.output())

    # --- units -------------------------------------------------------------------------------------
    def prepare(self, name: str, op: Op | None, numel: int, device) -> dict:
        """Check ``op`` (eager, sequence) and build its timed unit. Returns a dict with ``name``, ``run``
        (one trial's worth of work, or None when it cannot be timed), checks and errors."""
        torch = self.torch
        u: dict = {"name": name, "run": None}
        inp = op.inp if op is not None else torch.empty(numel, dtype=self.dtype, device=device)
        src = torch.empty(numel, dtype=self.dtype, device=device)
        self.fill(src)
        u["src"], u["inp"], u["op"] = src, inp, op
        ref = self.reference(numel, device)
        N = self.cfg.graph_calls
        if op is not None:
            # eager: poisoned output, one call
            try:
                self.poison(self._out(op))
                inp.copy_(src)
                op.run()
                self.sync()
                ok, err = self.check(op.output(), ref)
                u["eager_correct"], u["eager_max_abs_err"] = ok, err
            except Exception as exc:
                self.sync_quiet()
                u["error"] = short_error(exc)
                u["traceback"] = traceback.format_exc()[-3000:]
                return u
        use_graph = self.cuda and (op is None or op.graphable)
        if not use_graph:
            if self.cuda and op is not None:
                u["graph"] = "not-capturable"
            if op is not None:
                ok, err = self._sequence_check(op, src, inp, ref, graph=False)
                u["sequence_correct"], u["sequence_max_abs_err"] = ok, err

            def run_eager():
                for _ in range(self.cfg.graph_replays):
                    self.body(op, src, inp)
            u["run"] = run_eager
            u["calls_per_trial"] = N * self.cfg.graph_replays
            if op is not None:
                ok, err = self._timed_check(op, lambda: self.body(op, src, inp), ref)
                u["timed_correct"], u["timed_max_abs_err"] = ok, err
            return u
        # CUDA graph: the accumulating check graph first, then the timed graph
        if op is not None:
            try:
                ok, err = self._sequence_check(op, src, inp, ref, graph=True)
                u["sequence_correct"], u["sequence_max_abs_err"] = ok, err
            except Exception as exc:
                self.sync_quiet()
                u["graph"] = "capture-failed"
                u["error"] = short_error(exc)
                u["traceback"] = traceback.format_exc()[-3000:]
                return u
        try:
            g = torch.cuda.CUDAGraph()
            self.sync()
            with torch.cuda.graph(g):
                self.body(op, src, inp)
            self.sync()
        except Exception as exc:
            self.sync_quiet()
            u["graph"] = "capture-failed"
            u["error"] = short_error(exc)
            u["traceback"] = traceback.format_exc()[-3000:]
            return u
        u["graph"] = "ok"
        u["graph_obj"] = g
        if op is not None:
            ok, err = self._timed_check(op, g.replay, ref)
            u["timed_correct"], u["timed_max_abs_err"] = ok, err

        def run_graph():
            for _ in range(self.cfg.graph_replays):
                g.replay()
        u["run"] = run_graph
        u["calls_per_trial"] = N * self.cfg.graph_replays
        return u

    def _sequence_check(self, op: Op, src, inp, ref, graph: bool) -> tuple[bool, float]:
        """Poisoned output, the N-call sequence once with an fp32 accumulator: ``acc`` must be the arithmetic
        series ``N*ref + step_total*N(N+1)/2`` and the output ``ref + N`` (``step_total = 1``: rank 0 steps)."""
        torch = self.torch
        N = self.cfg.graph_calls
        acc = torch.zeros(ref.numel(), dtype=torch.float32, device=ref.device)
        if graph:
            g = torch.cuda.CUDAGraph()
            self.sync()
            with torch.cuda.graph(g):
                self.body(op, src, inp, acc)
            self.sync()
            acc.zero_()
            self.poison(self._out(op))
            self.sync()
            self.ctx.barrier()
            g.replay()
            self.sync()
            del g
        else:
            self.poison(self._out(op))
            self.ctx.barrier()
            self.body(op, src, inp, acc)
        want_acc = ref * N + N * (N + 1) / 2
        ok1, e1 = self.check(acc, want_acc)
        ok2, e2 = self.check(op.output(), ref + N)
        return ok1 and ok2, max(e1, e2)

    def _timed_check(self, op: Op, replay: Callable[[], None], ref) -> tuple[bool, float]:
        """Poison the output, run the timed unit once; its output must be ``ref + N``."""
        self.sync()
        self.poison(self._out(op))
        self.sync()
        self.ctx.barrier()
        replay()
        self.sync()
        return self.check(op.output(), ref + self.cfg.graph_calls)

    # --- paired rounds -----------------------------------------------------------------------------
    def _trial(self, fn: Callable[[], None], calls: int) -> float:
        torch = self.torch
        self.sync()
        self.ctx.barrier()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1000.0 / calls
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6 / calls

    def rounds(self, units: list[dict], rounds: int) -> dict[str, list[float]]:
        """``rounds`` paired rounds over the timable units, order rotating each round. Returns per-call us
        samples per unit name (index i = round i for every unit)."""
        live = [u for u in units if u.get("run")]
        for _ in range(self.cfg.warmup):
            for u in live:
                u["run"]()
        self.sync()
        out: dict[str, list[float]] = {u["name"]: [] for u in live}
        k = len(live)
        for r in range(rounds):
            order = live[r % k:] + live[:r % k] if k else []  # two units: A B, B A, A B ...
            for u in order:
                out[u["name"]].append(self._trial(u["run"], u["calls_per_trial"]))
        return out

    def measure_size(self, makers: dict[str, Callable[[int], Op]], nbytes: int, rounds: int) -> dict:
        """Build every op at ``nbytes`` (plus the floor), check them, run the paired rounds. Returns
        ``{"bytes", "units": {name: {samples_us, checks...}}}``; an op whose factory or checks raise keeps its
        error and is left out of the rounds."""
        torch = self.torch
        rec: dict = {"bytes": nbytes, "units": {}}
        item = torch.empty((), dtype=self.dtype).element_size()
        if nbytes % item:
            raise ValueError(f"message size {nbytes} B is not a multiple of the element size {item} B")
        numel = nbytes // item
        device = self.ctx.device
        units = [self.prepare(FLOOR, None, numel, device)]
        for name, make in makers.items():
            try:
                op = make(nbytes)
            except Exception as exc:
                self.sync_quiet()
                units.append({"name": name, "run": None, "error": short_error(exc),
                              "traceback": traceback.format_exc()[-3000:]})
                continue
            units.append(self.prepare(name, op, numel, device))
        for u in units:
            if u["name"] == FLOOR:
                continue
            if u.get("run") and not all(u.get(c, True) for c in ("eager_correct", "sequence_correct",
                                                                 "timed_correct")):
                u["run"] = None  # wrong results are not timed
        samples = self.rounds(units, rounds)
        for u in units:
            d = {k: v for k, v in u.items() if k not in ("run", "src", "inp", "op", "graph_obj", "name")}
            if u["name"] in samples:
                d["samples_us"] = samples[u["name"]]
                d["calls_per_trial"] = u["calls_per_trial"]
            rec["units"][u["name"]] = d
        for u in units:
            u.pop("graph_obj", None)
        self.sync()
        return rec

    def sweep(self, makers: dict[str, Callable[[int], Op]], label: str = "") -> list[dict]:
        """:meth:`measure_size` at every size of the config (``rounds`` at the decode size, ``sweep_rounds``
        elsewhere). A size that raises is recorded with its error and the sweep stops."""
        out = []
        for i, nbytes in enumerate(self.cfg.sizes):
            t0 = time.perf_counter()
            try:
                rec = self.measure_size(makers, nbytes, self.cfg.rounds if i == 0 else self.cfg.sweep_rounds)
            except Exception as exc:
                self.sync_quiet()
                out.append({"bytes": nbytes, "error": short_error(exc), "traceback": traceback.format_exc()[-3000:]})
                self.ctx.log(f"{label} {nbytes} B: error {short_error(exc)}")
                break
            out.append(rec)
            parts = []
            for name, u in rec["units"].items():
                s = u.get("samples_us")
                parts.append(f"{name} {statistics.median(s):.2f} us" if s else f"{name} {u.get('error', 'untimed')[:80]}")
            self.ctx.log(f"{label} {nbytes} B: " + ", ".join(parts) + f" [{time.perf_counter() - t0:.1f} s]")
        return out
