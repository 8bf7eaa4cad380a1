"""The divergence rule: whether and how a run of a study broke, judged from its logged records.

A run that diverges is a result, never an abort: a study finishes its other runs and reports
which criterion fired for each run that broke, at which step, with the numbers.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from scalelong import metric_names as names
from scalelong.plots import Records, as_float, series


@dataclass(frozen=True)
class DivergenceRule:
    """The named thresholds of :func:`divergence`."""

    loss_fraction: float = 0.8  # (b) the loss must end below this fraction of the input-free loss
    start_points: int = 3  # (b) runs without loss_input_free: the start is the mean of this many first losses
    smooth: int = 3  # (b) trailing mean over this many logged losses
    feature_growth: float = 100.0  # (c) the hidden-feature norm may end at most this multiple of its first

    def describe(self) -> str:
        """The rule in one paragraph, with its thresholds (for reports)."""
        return (
            "A run counts as **diverged** when (a) *nonfinite*: it stopped on non-finite steps "
            "(train.max_nonfinite_steps in a row), or its last logged steps were all non-finite; or "
            f"(b) *loss*: its loss, averaged over its last {self.smooth} logged values, does not end below "
            f"{self.loss_fraction:g} x the input-free loss over the same steps (`loss_input_free`: the loss "
            "of the best output that ignores the noisy input): the network has learnt nothing from its "
            "input or has collapsed back, though no step is non-finite (runs logged without "
            f"`loss_input_free`: its smoothed loss after warm-up never falls below {self.loss_fraction:g} x "
            f"the mean of its first {self.start_points} logged losses); or (c) *feature_norm*: its "
            "hidden-feature norm ends non-finite or above "
            f"{self.feature_growth:g} x its first logged value. Loss spikes are counted, not divergence."
        )


DEFAULT_RULE = DivergenceRule()


@dataclass(frozen=True)
class Divergence:
    """One criterion of :func:`divergence` that fired."""

    criterion: str  # nonfinite | loss | feature_norm
    step: int  # where it showed
    detail: str  # one line, with the numbers

    def __str__(self) -> str:
        return f"{self.criterion} at step {self.step}: {self.detail}"


def _trailing_mean(values: Sequence[float], window: int) -> list[float]:
    return [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def divergence(
    records: Records,
    stopped: Mapping | None = None,
    warmup_steps: int = 0,
    rule: DivergenceRule = DEFAULT_RULE,
) -> list[Divergence]:
    """Whether and how a run diverged, judged from its logged records: every criterion of ``rule``
    that fires (see :meth:`DivergenceRule.describe`), in the order (a) nonfinite, (b) loss,
    (c) feature_norm; an empty list for a healthy run.

    ``stopped`` is the ``stopped`` entry of the run's summary.json (the non-finite policy ended
    it there). A criterion without data is not judged: (b) needs ``rule.start_points`` finite
    losses and one logged after ``warmup_steps``, (c) needs ``feature_norm`` (``diagnostics.every``).
    """
    found = []
    logged = [r for r in records if "nonfinite_steps" in r]
    if stopped:
        found.append(Divergence("nonfinite", int(stopped["step"]), "stopped on non-finite steps in a row"))
    elif (
        logged
        and as_float(logged[-1]["nonfinite_steps"]) > 0
        and not math.isfinite(as_float(logged[-1].get(names.LOSS)))
    ):
        found.append(
            Divergence("nonfinite", int(logged[-1]["step"]), "its last logged steps were all non-finite")
        )
    losses = [(s, v) for s, v in zip(*series(records, names.LOSS), strict=True) if math.isfinite(v)]
    free = dict(zip(*series(records, "loss_input_free"), strict=True))
    if free:  # judged past warm-up, on runs not stopped: a run cut short has not had its chance
        paired = [
            (s, v, free[s]) for s, v in losses if s > warmup_steps and math.isfinite(free.get(s, math.nan))
        ]
        if paired and not stopped:
            tail = paired[-rule.smooth :]
            loss = statistics.fmean(v for _, v, _ in tail)
            reference = statistics.fmean(f for _, _, f in tail)
            if not loss < rule.loss_fraction * reference:
                found.append(
                    Divergence(
                        "loss",
                        tail[-1][0],
                        f"loss ends at {loss:.3g}, {loss / reference:.2f} x the input-free loss "
                        f"{reference:.3g} (limit {rule.loss_fraction:g} x)",
                    )
                )
    elif len(losses) >= rule.start_points:
        start = statistics.fmean(v for _, v in losses[: rule.start_points])
        after = [(s, v) for s, v in losses if s > warmup_steps]
        smoothed = _trailing_mean([v for _, v in after], rule.smooth)
        judged = [(s, v) for (s, _), v in zip(after, smoothed, strict=True)]
        lowest = min((v for _, v in judged), default=math.nan)
        if judged and lowest >= rule.loss_fraction * start:
            detail = f"smoothed loss never fell below {rule.loss_fraction:g} x its start {start:.3g}"
            found.append(Divergence("loss", judged[-1][0], f"{detail} (lowest after warm-up {lowest:.3g})"))
    steps, norms = series(records, names.FEATURE_NORM)
    first = next((v for v in norms if math.isfinite(v)), None)
    if first is not None and not norms[-1] <= rule.feature_growth * first:  # NaN fails <= too
        at = next(s for s, v in zip(steps, norms, strict=True) if not v <= rule.feature_growth * first)
        found.append(
            Divergence(
                "feature_norm",
                at,
                f"hidden-feature norm ends at {norms[-1]:.3g}, {norms[-1] / first:.3g} x its first "
                f"{first:.3g} (limit {rule.feature_growth:g} x)",
            )
        )
    return found


def criteria(breaks: Iterable[Sequence[Divergence]]) -> str:
    """``k/K`` runs diverged, with the criteria that fired and how often (``1/3 (loss)``)."""
    breaks = list(breaks)
    k = sum(bool(b) for b in breaks)
    counts: dict[str, int] = {}
    for b in breaks:
        for d in b:
            counts[d.criterion] = counts.get(d.criterion, 0) + 1
    named = ", ".join(c if n == k else f"{c} {n}" for c, n in counts.items())
    return f"{k}/{len(breaks)}" + (f" ({named})" if named else "")
