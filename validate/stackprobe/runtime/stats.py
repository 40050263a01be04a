"""Paired statistics of the runtime tier (stdlib only): the ratio of a candidate's per-call work to the
baseline's, its bootstrap 95% confidence interval, and the status read from that interval.

Samples come in pairs: index ``i`` of the baseline, candidate and floor lists was measured in the same round
(one process group, order rotating), or in the same round of alternated process groups. Work per call is
``time - floor`` (the floor is the harness's own per-call input write, measured in the same round).

The ratio statistic is ``mean(candidate work) / mean(baseline work)`` over the pairs; its interval is the
percentile bootstrap (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13): resample the pairs
with replacement ``resamples`` times and take the 2.5th and 97.5th percentiles of the statistic. The generator is
seeded, so a recorded report recomputes to the same interval.
"""
from __future__ import annotations

import math
import random
import statistics

FASTER, PARITY, SLOWER, INCONCLUSIVE = "faster", "parity", "slower", "inconclusive"
RESAMPLES = 2000
SEED = 20261130
# a unit whose work per call is at most this fraction of the floor holds no GPU work of its own (C22)
FLOOR_FRACTION = 0.05
# fewest pairs a status is read from: the percentile bootstrap's interval under-covers at small n (Efron &
# Tibshirani 1993, ch. 13 and 14: its coverage error is of order 1/sqrt(n)); four pairs (``--rounds 4``) give an
# interval far narrower than the truth, so below this n the status is ``inconclusive`` whatever the interval says
MIN_PAIRS = 8


def _percentile(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return math.nan
    pos = q * (len(sorted_vals) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def net(samples: list[float], floor: list[float] | None) -> list[float]:
    """Work per call: ``sample - floor`` pairwise (the samples themselves without a floor)."""
    if not floor:
        return list(samples)
    return [s - f for s, f in zip(samples, floor)]


def mean_ci(values: list[float], resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean and its percentile-bootstrap 95% interval."""
    if not values:
        return math.nan, math.nan, math.nan
    m = statistics.fmean(values)
    if len(values) == 1:
        return m, m, m
    rng = random.Random(seed)
    n = len(values)
    boots = sorted(statistics.fmean(values[rng.randrange(n)] for _ in range(n)) for _ in range(resamples))
    return m, _percentile(boots, 0.025), _percentile(boots, 0.975)


def ratio_ci(base: list[float], cand: list[float], resamples: int = RESAMPLES,
             seed: int = SEED) -> tuple[float, float, float]:
    """``(ratio, low, high)`` for ``mean(cand) / mean(base)`` over paired samples (same length, same rounds).
    Raises ``ValueError`` when the lists differ in length or are empty."""
    if len(base) != len(cand) or not base:
        raise ValueError(f"paired samples must have the same non-zero length (got {len(base)} and {len(cand)})")
    sb, sc = sum(base), sum(cand)
    ratio = sc / sb if sb > 0 else math.inf
    n = len(base)
    if n == 1:
        return ratio, ratio, ratio
    rng = random.Random(seed)
    boots = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        b = sum(base[i] for i in idx)
        boots.append(sum(cand[i] for i in idx) / b if b > 0 else math.inf)
    boots.sort()
    return ratio, _percentile(boots, 0.025), _percentile(boots, 0.975)


def status(low: float, high: float, tolerance: float, n: int | None = None) -> str:
    """The status read from a 95% interval ``[low, high]`` of the ratio:

    * ``faster``: ``high < 1 - tolerance``;
    * ``slower``: ``low > 1 + tolerance``;
    * ``parity``: the whole interval inside ``[1 - tolerance, 1 + tolerance]``;
    * ``inconclusive``: anything else (the interval straddles a tolerance edge, or is not finite).

    A row is never called slower unless its whole interval lies above ``1 + tolerance``. With ``n`` (the
    number of pairs) below :data:`MIN_PAIRS` it is ``inconclusive`` too.
    """
    if n is not None and n < MIN_PAIRS:
        return INCONCLUSIVE
    if not (math.isfinite(low) and math.isfinite(high)):
        return INCONCLUSIVE
    if high < 1.0 - tolerance:
        return FASTER
    if low > 1.0 + tolerance:
        return SLOWER
    if low >= 1.0 - tolerance and high <= 1.0 + tolerance:
        return PARITY
    return INCONCLUSIVE


def no_work(samples: list[float], floor: list[float], fraction: float = FLOOR_FRACTION) -> bool:
    """True when a unit's median work per call (paired with the floor, round by round) is at or below
    ``fraction`` of the floor's median time: the graph holds no GPU work of its own (an op that short-circuits,
    or captured nothing). Medians, so one preempted round does not decide it."""
    if not samples or not floor:
        return False
    return statistics.median(net(samples, floor)) <= fraction * statistics.median(floor)
