"""The statistics of a study: means with t-intervals over seeds, the one estimator of a method
against its baseline (:func:`contrast`), and intervals of divergence rates.

A seed gives every method the same initial trunk weights, the same batches in the same order and
the same noise, so two runs of one seed share much of their variation: a method is compared with
its baseline seed by seed wherever both ran that seed, and only where they share no seed as two
independent samples.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95  # every interval of a study


def _stats():
    """scipy.stats, imported on first use: a process of a study that reports nothing (a pool
    worker, a scheduler job, a dry run) does not pay its second of import."""
    import scipy.stats

    return scipy.stats


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean of the finite ``values`` and the half-width of its 95% t-interval (NaN half-width
    for fewer than 2 values)."""
    xs = [v for v in values if math.isfinite(v)]
    if not xs:
        return math.nan, math.nan
    if len(xs) == 1:
        return xs[0], math.nan
    t = _stats().t.ppf(0.5 + CONFIDENCE / 2, df=len(xs) - 1)  # two-sided
    return statistics.fmean(xs), float(t) * statistics.stdev(xs) / math.sqrt(len(xs))


def fmt_ci(values: Sequence[float], digits: int = 3, unit: str = "") -> str:
    """``mean ± half-width`` of :func:`mean_ci` (the mean alone for one value; ``n/a`` for none)."""
    mean, half = mean_ci(values)
    if math.isnan(mean):
        return "n/a"
    return f"{mean:.{digits}g}{unit}" + ("" if math.isnan(half) else f" ± {half:.2g}")


@dataclass(frozen=True)
class Contrast:
    """A method against its baseline, as :func:`contrast` estimates it."""

    estimate: float  # the mean difference a - b; with ratio, the geometric-mean ratio a / b
    low: float  # the 95% interval, on the scale of the estimate; NaN from one pair (no interval)
    high: float
    paired: bool  # True: over the seeds both sides ran; False: Welch's, the two sides independent
    ratio: bool  # estimated on the logs and given as a ratio
    n: int  # the pairs (paired), or the values of the smaller side (unpaired)

    def excludes_null(self) -> bool:
        """Whether the interval excludes no effect: 0 for a difference, 1 for a ratio."""
        null = 1.0 if self.ratio else 0.0
        return self.low > null or self.high < null  # NaN bounds (no interval) exclude nothing


def contrast(
    a: Sequence[float],
    b: Sequence[float],
    seeds_a: Sequence[int | None] | None = None,
    seeds_b: Sequence[int | None] | None = None,
    ratio: bool = False,
) -> Contrast | None:
    """The one estimator of a method (values ``a``, one per seed, run with ``seeds_a``) against
    its baseline (``b``, ``seeds_b``): a difference on the linear scale, or with ``ratio`` a
    ratio on the log scale. Values that are not finite (or, for a ratio, not positive) are left
    out; a seed of None pairs with nothing.

    * **Paired by seed value**, over the seeds S that both sides ran with a usable value:
      d_s = a_s - b_s (for a ratio d_s = log a_s - log b_s), the estimate mean(d) and the 95%
      interval mean(d) ± t(0.975, n - 1) sd(d) / sqrt(n), n = |S|. For a ratio both are given
      back through exp: the geometric mean of the per-seed ratios and its interval. One shared
      seed gives its one difference, without an interval (NaN bounds).
    * **Unpaired (Welch)**, only when the two sides share no seed: mean(a) - mean(b) (of the
      logs, for a ratio) with Welch's 95% interval, t on the Welch-Satterthwaite degrees of
      freedom; it needs two values on each side.

    None when nothing can be compared.
    """

    def usable(v: float) -> bool:
        return math.isfinite(v) and (v > 0 or not ratio)

    scale = math.log if ratio else float
    back = math.exp if ratio else float

    def by_seed(values: Sequence[float], seeds: Sequence[int | None] | None) -> dict[int, float]:
        if seeds is None:
            return {}
        return {s: scale(v) for s, v in zip(seeds, values, strict=True) if s is not None and usable(v)}

    xa, xb = by_seed(a, seeds_a), by_seed(b, seeds_b)
    shared = [s for s in xa if s in xb]
    if shared:
        mean, half = mean_ci([xa[s] - xb[s] for s in shared])
        return Contrast(back(mean), back(mean - half), back(mean + half), True, ratio, len(shared))
    xs, ys = ([scale(v) for v in values if usable(v)] for values in (a, b))
    if len(xs) < 2 or len(ys) < 2:
        return None
    with warnings.catch_warnings():  # sides without spread: scipy warns, the interval is the point
        warnings.simplefilter("ignore", RuntimeWarning)
        ci = _stats().ttest_ind(xs, ys, equal_var=False).confidence_interval(CONFIDENCE)
    mean, n = statistics.fmean(xs) - statistics.fmean(ys), min(len(xs), len(ys))
    return Contrast(back(mean), back(float(ci.low)), back(float(ci.high)), False, ratio, n)


def percent(x: float) -> str:
    """A signed percentage as a sentence rounds it: whole from 10 on, one decimal below."""
    return f"{x:+.0f}%" if abs(x) >= 10 else f"{x:+.1f}%"


def fmt_contrast(c: Contrast | None, as_percent: bool = False, unit: str = "") -> str:
    """A contrast as the tables show it: a difference ``-0.1 (-0.15 to -0.05)``, a ratio
    ``0.79 (0.5 to 1.2)`` (``unit`` after its estimate, e.g. ``1.5x``), or with ``as_percent``
    a ratio as a change ``-3.9% (-9% to +1.5%)``. ``, unpaired`` marks Welch's interval; one pair
    reads ``(1 seed, no interval)``; nothing to compare, ``n/a``."""
    if c is None:
        return "n/a"
    if c.ratio and as_percent:
        point, lo, hi = (percent(100 * (x - 1)) for x in (c.estimate, c.low, c.high))
    elif c.ratio:
        point, lo, hi = f"{c.estimate:.2g}{unit}", f"{c.low:.2g}", f"{c.high:.2g}"
    else:
        point, lo, hi = f"{c.estimate:+.3g}{unit}", f"{c.low:+.2g}", f"{c.high:+.2g}"
    if math.isnan(c.low):  # one pair
        return f"{point} (1 seed, no interval)"
    return f"{point} ({lo} to {hi}{'' if c.paired else ', unpaired'})"


def rate_interval(k: int, n: int) -> tuple[float, float]:
    """Exact (Clopper-Pearson) 95% interval of a rate from ``k`` of ``n`` runs: with 5 seeds,
    0/5 still allows a rate up to 52%."""
    ci = _stats().binomtest(k, n).proportion_ci(CONFIDENCE, method="exact")
    return ci.low, ci.high


def fisher_p(k_a: int, n_a: int, k_b: int, n_b: int) -> float:
    """Two-sided Fisher exact p of ``k_a`` of ``n_a`` runs diverged against ``k_b`` of ``n_b``."""
    return float(_stats().fisher_exact([[k_a, n_a - k_a], [k_b, n_b - k_b]]).pvalue)


@dataclass(frozen=True)
class PairedOutcomes:
    """Failure of a method against its baseline over the seeds both ran: the paired 2x2 table."""

    both: int  # seeds where both failed
    only_baseline: int  # the baseline failed, the method trained: a rescue
    only_method: int  # the method failed, the baseline trained
    neither: int  # both trained

    @property
    def n(self) -> int:
        return self.both + self.only_baseline + self.only_method + self.neither

    @property
    def p(self) -> float:
        """The exact McNemar test, two-sided: the discordant seeds as a binomial(b + c, 1/2)."""
        discordant = self.only_baseline + self.only_method
        if not discordant:
            return 1.0
        return float(_stats().binomtest(self.only_baseline, discordant, 0.5).pvalue)


def paired_outcomes(failed: dict[int, bool], baseline: dict[int, bool]) -> PairedOutcomes:
    """The paired 2x2 table of two sides' failures (``failed[seed]``) over the seeds both ran."""
    shared = [s for s in failed if s in baseline]
    count = {(a, b): sum(failed[s] == a and baseline[s] == b for s in shared) for a in (0, 1) for b in (0, 1)}
    return PairedOutcomes(count[1, 1], count[0, 1], count[1, 0], count[0, 0])
