"""Confidence intervals over seeds: the mean with a Student-t interval, and paired differences.

Runs of two configurations with the same seed see the same data order and the same initial draw of
the random-number generator, so their difference cancels much of the seed-to-seed noise: the
paired interval (a t-interval of the per-seed differences) is narrower than comparing two means.
"""

import math
import statistics
from dataclasses import dataclass

from scipy import stats

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    """mean and its two-sided confidence interval [low, high] from n values; low = high = nan for n < 2."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    @property
    def excludes_zero(self) -> bool:
        """True when the interval lies wholly above or below 0 (never for n < 2)."""
        return self.low > 0 or self.high < 0


def t_quantile(n: int, confidence: float = CONFIDENCE) -> float:
    """t_{(1 + confidence) / 2, n - 1}: e.g. 4.303 for n = 3 values at 95%."""
    return float(stats.t.ppf((1 + confidence) / 2, n - 1))


def t_interval(values: list[float], confidence: float = CONFIDENCE) -> Interval:
    """mean ± t_{(1+c)/2, n-1} * s / sqrt(n), with s the sample standard deviation."""
    n = len(values)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = statistics.fmean(values)
    if n == 1:
        return Interval(mean, math.nan, math.nan, 1)
    half = t_quantile(n, confidence) * statistics.stdev(values) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def paired_difference(cell: dict[int, float], reference: dict[int, float]) -> Interval:
    """t-interval of cell[seed] - reference[seed] over the seeds both have (keys are seeds)."""
    seeds = sorted(set(cell) & set(reference))
    return t_interval([cell[s] - reference[s] for s in seeds])


def smallest_resolved_difference(seed_std: float, n: int, confidence: float = CONFIDENCE) -> float:
    """The paired difference n seeds resolve, given one configuration's seed-to-seed standard deviation: the
    half-width t_{(1+c)/2, n-1} * sqrt(2) * s / sqrt(n) of its interval when the two configurations' noise is
    independent (sqrt(2) s per-seed differences). Pairing by seed narrows it where the two configurations' seed
    noise moves together (the same seed draws the same data order and initial weights), and would widen it where
    it moved apart: a planning figure, not a bound. docs/ablation/noise_floor/ tabulates it."""
    return t_quantile(n, confidence) * math.sqrt(2) * seed_std / math.sqrt(n)


def fmt_interval(interval: Interval, digits: int = 4, signed: bool = False) -> str:
    """'3.1234 [3.1000, 3.1468]', or the bare mean when there is no interval, or '—' for no values."""
    if interval.n == 0:
        return "—"
    sign = "+" if signed else ""
    mean = f"{interval.mean:{sign}.{digits}f}"
    if interval.n < 2:
        return mean
    return f"{mean} [{interval.low:{sign}.{digits}f}, {interval.high:{sign}.{digits}f}]"


def verdict(interval: Interval, unit: str = "nats") -> str:
    """One clause on a paired difference: resolved (and which way) or not, and why."""
    if interval.n < 2:
        return f"cannot be resolved: only {interval.n} paired seed(s), an interval needs 2"
    pct = f"{CONFIDENCE:.0%}"
    if not interval.excludes_zero:
        return f"not resolved: the {pct} interval [{interval.low:+.4f}, {interval.high:+.4f}] includes 0"
    direction = "higher" if interval.mean > 0 else "lower"
    return f"resolved: {direction} by {abs(interval.mean):.4f} {unit}, the {pct} interval excludes 0"
