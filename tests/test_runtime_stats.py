"""Paired statistics of the runtime tier: the bootstrap interval of the ratio and the status read from it."""
import math

import pytest

from stackprobe.runtime import stats


def test_ratio_and_interval_of_a_known_paired_sample():
    base = [10.0, 10.2, 9.8, 10.1, 9.9, 10.0, 10.3, 9.7]
    cand = [b * 0.8 for b in base]                      # exactly 0.8 in every pair: a zero-width interval
    r, lo, hi = stats.ratio_ci(base, cand)
    assert r == pytest.approx(0.8) and lo == pytest.approx(0.8) and hi == pytest.approx(0.8)
    noisy = [c + (0.3 if i % 2 else -0.3) for i, c in enumerate(cand)]
    r, lo, hi = stats.ratio_ci(base, noisy)
    assert lo < r < hi and hi - lo > 0.005 and 0.75 < lo and hi < 0.85


def test_pairing_cancels_a_drift_that_hits_both():
    drift = [10.0 * (1 + 0.2 * i) for i in range(20)]   # the host slows down 5x over the rounds
    cand = [d * 0.9 for d in drift]
    r, lo, hi = stats.ratio_ci(drift, cand)
    assert stats.status(lo, hi, 0.05) == "faster" and hi - lo < 1e-9
    # the same numbers unpaired (candidate rounds shuffled against the baseline's) give a wide interval
    _, lo2, hi2 = stats.ratio_ci(drift, list(reversed(cand)))
    assert hi2 - lo2 > 0.1


def test_bootstrap_is_deterministic_and_the_seed_matters():
    base = [float(i % 5 + 10) for i in range(30)]
    cand = [b + (i % 3) * 0.5 for i, b in enumerate(base)]
    assert stats.ratio_ci(base, cand) == stats.ratio_ci(base, cand)
    assert stats.ratio_ci(base, cand, seed=1) != stats.ratio_ci(base, cand, seed=2)


def test_unpaired_or_empty_samples_are_refused():
    with pytest.raises(ValueError, match="same non-zero length"):
        stats.ratio_ci([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        stats.ratio_ci([], [])


@pytest.mark.parametrize("low,high,status", [
    (0.80, 0.94, "faster"), (0.80, 0.95, "inconclusive"),      # upper bound must be below 1 - tolerance
    (0.96, 1.04, "parity"), (0.95, 1.05, "parity"),
    (1.051, 1.20, "slower"), (1.05, 1.20, "inconclusive"),      # lower bound must be above 1 + tolerance
    (0.97, 1.06, "inconclusive"), (0.90, 1.10, "inconclusive"),
    (math.nan, 1.0, "inconclusive"), (0.9, math.inf, "inconclusive")])
def test_status_from_the_interval(low, high, status):
    assert stats.status(low, high, 0.05) == status


def test_a_row_that_is_not_slower_is_never_called_slower():
    # every interval whose lower bound is at or below 1 + tolerance
    for lo in (0.5, 0.9, 1.0, 1.03, 1.05):
        for hi in (lo, lo + 0.01, lo + 0.2, 3.0):
            assert stats.status(lo, hi, 0.05) != "slower"


def test_no_work_against_the_floor():
    floor = [1.2, 1.18, 1.21, 1.19]
    assert stats.no_work([1.21, 1.19, 1.22, 1.2], floor)          # the graph holds only the harness's writes
    assert not stats.no_work([9.0, 9.1, 8.9, 9.05], floor)        # a real collective
    assert stats.net([9.0, 9.1], [1.0, 1.1]) == pytest.approx([8.0, 8.0])


def test_a_status_on_too_few_pairs_is_inconclusive():
    """Issue "statistics on four points": the same clearly-faster interval gives a status from MIN_PAIRS pairs
    on, and inconclusive below it."""
    from stackprobe.runtime.stats import FASTER, INCONCLUSIVE, MIN_PAIRS, status
    assert status(0.5, 0.6, 0.05) == FASTER
    assert status(0.5, 0.6, 0.05, n=MIN_PAIRS) == FASTER
    assert status(0.5, 0.6, 0.05, n=4) == INCONCLUSIVE
