"""Confidence intervals and paired differences (analysis/stats.py) against values computed by hand."""

import math
import statistics

import pytest

from analysis.stats import fmt_interval, paired_difference, t_interval, t_quantile, verdict


def test_t_quantiles_are_the_tabled_values():
    assert t_quantile(3) == pytest.approx(4.303, abs=5e-4)  # t_{0.975, 2}
    assert t_quantile(2) == pytest.approx(12.706, abs=5e-4)  # t_{0.975, 1}
    assert t_quantile(5) == pytest.approx(2.776, abs=5e-4)  # t_{0.975, 4}


def test_t_interval_by_hand():
    # mean 2, s = 1, n = 3: half-width 4.3027 / sqrt(3) = 2.4841
    ci = t_interval([1.0, 2.0, 3.0])
    assert (ci.mean, ci.n) == (2.0, 3)
    assert (ci.low, ci.high) == pytest.approx((2 - 2.48414, 2 + 2.48414), abs=1e-5)
    assert fmt_interval(ci) == "2.0000 [-0.4841, 4.4841]"


def test_one_value_has_a_mean_but_no_interval():
    ci = t_interval([1.5])
    assert ci.mean == 1.5 and math.isnan(ci.low) and not ci.excludes_zero
    assert fmt_interval(ci) == "1.5000" and fmt_interval(t_interval([])) == "—"
    assert verdict(ci).startswith("cannot be resolved: only 1 paired seed")


def test_paired_difference_uses_only_shared_seeds():
    # differences 0.1, 0.2, 0.0 over seeds 1..3 (seed 4 has no partner): mean 0.1, s 0.1
    diff = paired_difference({1: 1.5, 2: 1.7, 3: 1.6}, {1: 1.4, 2: 1.5, 3: 1.6, 4: 9.0})
    assert diff.n == 3 and diff.mean == pytest.approx(0.1)
    assert diff.half_width == pytest.approx(4.302653 * 0.1 / math.sqrt(3), abs=1e-6)
    assert not diff.excludes_zero and verdict(diff).startswith("not resolved: the 95% interval [-0.1484, +0.3484]")


def test_a_consistent_difference_is_resolved_though_the_means_overlap():
    # The seeds move both cells together: the unpaired intervals overlap, the paired one excludes 0.
    ref = {1: 2.0, 2: 2.5, 3: 3.0}
    cell = {1: 1.70, 2: 2.18, 3: 2.69}  # differences -0.30, -0.32, -0.31
    assert t_interval(list(cell.values())).high > t_interval(list(ref.values())).low
    diff = paired_difference(cell, ref)
    assert (diff.low, diff.high) == pytest.approx((-0.31 - 0.024841, -0.31 + 0.024841), abs=1e-5)
    assert verdict(diff) == "resolved: lower by 0.3100 nats, the 95% interval excludes 0"


def test_the_smallest_resolved_difference_is_the_paired_intervals_half_width():
    from analysis.stats import smallest_resolved_difference

    # 3 seeds, s = 0.01: 4.303 * sqrt(2) * 0.01 / sqrt(3)
    assert smallest_resolved_difference(0.01, 3) == pytest.approx(4.302653 * 2**0.5 * 0.01 / 3**0.5, rel=1e-6)
    # the same half-width as a t-interval of per-seed differences whose spread is sqrt(2) s
    diffs = [0.0, 0.02 * 2**0.5, -0.02 * 2**0.5, 0.0]
    s = statistics.stdev(diffs) / 2**0.5
    assert smallest_resolved_difference(s, 4) == pytest.approx(t_interval(diffs).half_width)
    assert (
        smallest_resolved_difference(0.01, 10)
        < smallest_resolved_difference(0.01, 5)
        < smallest_resolved_difference(0.01, 3)
    )
