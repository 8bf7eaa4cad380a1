"""The failure rule: whether and how a run of a study failed, judged from its logged records.

One rule for every table, figure and number of a study: a run fails when it ends on non-finite steps
or when its final held-out denoising error is no better than predicting the mean image (the loss
judges only a run that measured no held-out error). A failed run is a result, never an abort: a
study finishes its other runs and reports which criterion fired for each run that failed, at which
step, with the numbers.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from scalelong.diagnostics import metric_names as names
from scalelong.runlog.records import Records, as_float, series
from scalelong.studies.heldout import heldout_error, heldout_x0_error


@dataclass(frozen=True)
class DivergenceRule:
    """The named thresholds of :func:`divergence`."""

    loss_fraction: float = 0.8  # (b) the loss must end below this fraction of the input-free loss
    start_points: int = 3  # (b) runs without loss_input_free: the start is the mean of this many first losses
    smooth: int = 3  # (b) trailing mean over this many logged losses
    collapse_factor: float = 2.0  # an x0 failure's cause: its smoothed loss stayed past this x its lowest

    def describe(self) -> str:
        """The rule in one paragraph, with its thresholds (for reports)."""
        return (
            "A run **failed** when (a) *nonfinite*: it stopped on non-finite steps "
            "(train.max_nonfinite_steps in a row), or its last logged steps were all non-finite; or "
            "(x0) *x0*: its final held-out x0 error (the EMA's, on the fixed held-out images averaged over "
            "the noise levels, `noise/x0_mse@L`) is not finite or not below the mean image's error on the "
            "same images (`noise/x0_mse_mean_image`): the model denoises no better than predicting the "
            "average digit, whatever its loss did. A network that predicts the noise "
            "(`diffusion.prediction=eps`) is judged instead by (eps) *eps*: its final held-out noise "
            "error (`noise/eps_mse@L`, averaged the same way) is not finite or not below 1, the error of "
            "predicting no noise (its x0 error divides the noise's by alpha^2, thousands of times at the "
            "highest levels). Only a run that logged no held-out error is judged by "
            f"its loss instead, (b) *loss*: the mean of its last {self.smooth} logged losses does not end "
            f"below {self.loss_fraction:g} x the input-free loss over the same steps (`loss_input_free`: "
            "the loss of the best output that ignores the noisy input; runs logged without it: its "
            f"smoothed loss after warm-up never falls below {self.loss_fraction:g} x the mean of its "
            f"first {self.start_points} logged losses). Loss spikes and the growth of the hidden features "
            "are reported, not failures."
        )


DEFAULT_RULE = DivergenceRule()


@dataclass(frozen=True)
class Divergence:
    """One criterion of :func:`divergence` that fired."""

    criterion: str  # nonfinite | x0 | loss
    step: int | None  # where it showed (None: a map read back that does not say)
    detail: str  # one line, with the numbers

    def __str__(self) -> str:
        where = "" if self.step is None else f" at step {self.step}"
        return f"{self.criterion}{where}: {self.detail}"


def _trailing_mean(values: Sequence[float], window: int) -> list[float]:
    return [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def _nonfinite(records: Records, stopped: Mapping | None) -> Divergence | None:
    """(a): stopped by the non-finite policy, or its last logged steps all non-finite."""
    if stopped:
        cause = stopped.get("cause")
        detail = "stopped on non-finite steps in a row" + (f"; the last: {cause}" if cause else "")
        return Divergence("nonfinite", int(stopped["step"]), detail)
    logged = [r for r in records if "nonfinite_steps" in r]
    if (
        logged
        and as_float(logged[-1]["nonfinite_steps"]) > 0
        and not math.isfinite(as_float(logged[-1].get(names.LOSS)))
    ):
        return Divergence("nonfinite", int(logged[-1]["step"]), "its last logged steps were all non-finite")
    return None


def loss_collapse(
    records: Records, rule: DivergenceRule = DEFAULT_RULE
) -> tuple[int, float, float, float] | None:
    """Where a run's loss collapsed: the first logged step from which its smoothed loss (trailing
    mean of ``rule.smooth`` finite logged losses) stayed above ``rule.collapse_factor`` x its lowest
    before that step, to the end, as (step, lowest before, smoothed loss there, last smoothed loss).
    None for a run that never trained, or one that recovered: a spike it came back from is a spike,
    not a collapse."""
    losses = [(s, v) for s, v in zip(*series(records, names.LOSS), strict=True) if math.isfinite(v)]
    if len(losses) <= rule.smooth:
        return None
    smoothed = _trailing_mean([v for _, v in losses], rule.smooth)
    after = list(itertools.accumulate(reversed(smoothed), min))[::-1]  # the lowest from each step on
    lowest = smoothed[0]
    for i in range(1, len(smoothed)):
        if after[i] > rule.collapse_factor * lowest:
            return losses[i][0], lowest, smoothed[i], smoothed[-1]
        lowest = min(lowest, smoothed[i])
    return None


COLLAPSED = "; the loss collapsed at step "  # how _x0 tells a collapse in its detail, which cause() reads


NO_NOISE_ERROR = 1.0  # the held-out noise error of predicting no noise: the noise has unit variance


def heldout_failure(kind: str, step: int | None, error: float, baseline: float) -> Divergence | None:
    """(x0) or (eps) on a run's final held-out error: failed when it is not finite (a map writes a
    non-finite error as null) or not below ``baseline``, the best input-free guess's (the mean
    image's x0 error; :data:`NO_NOISE_ERROR` for the noise)."""
    if not math.isfinite(error):
        return Divergence(kind, step, f"its final held-out {kind} error is not finite")
    if error < baseline:
        return None
    of = (
        f"{baseline:g}, the error of predicting no noise"
        if kind == "eps"
        else f"the mean image's {baseline:.3g}"
    )
    return Divergence(kind, step, f"final held-out {kind} error {error:.3g} is not below {of}")


def _x0(records: Records, prediction: str = "x0") -> Divergence | None:
    """(x0): the final held-out x0 error (EMA) not finite or not below the mean image's; (eps), for
    a network that predicts the noise: its final held-out noise error not below 1, the error of
    predicting no noise (:func:`heldout_failure`). The detail says where the loss collapsed, if it
    did (:func:`loss_collapse`)."""
    step = last_probe_step(records)
    if prediction == "eps":
        kind, error, baseline = "eps", heldout_error(records, "eps"), NO_NOISE_ERROR
    else:
        kind, error = "x0", heldout_x0_error(records)
        baseline = next(
            (v for r in reversed(records) if math.isfinite(v := as_float(r.get(names.X0_MEAN_IMAGE)))),
            math.nan,
        )
    if math.isnan(error) or step is None or not math.isfinite(baseline):  # no probe, nothing to judge by
        return None
    found = heldout_failure(kind, step, error, baseline)
    if found and math.isfinite(error) and (collapse := loss_collapse(records)):
        at, lowest, value, last = collapse
        detail = f"{COLLAPSED}{at} (from its lowest {lowest:.3g} to {value:.3g}; it ended at {last:.3g})"
        found = Divergence(kind, step, found.detail + detail)
    return found


def _loss(records: Records, warmup_steps: int, rule: DivergenceRule) -> Divergence | None:
    """(b), for runs without a held-out error: the loss against the input-free loss, or its start."""
    losses = [(s, v) for s, v in zip(*series(records, names.LOSS), strict=True) if math.isfinite(v)]
    free = dict(zip(*series(records, "loss_input_free"), strict=True))
    if free:  # judged past warm-up: a run still in warm-up has not had its chance
        paired = [
            (s, v, free[s]) for s, v in losses if s > warmup_steps and math.isfinite(free.get(s, math.nan))
        ]
        if not paired:
            return None
        tail = paired[-rule.smooth :]
        loss = statistics.fmean(v for _, v, _ in tail)
        reference = statistics.fmean(f for _, _, f in tail)
        if loss < rule.loss_fraction * reference:
            return None
        return Divergence(
            "loss",
            tail[-1][0],
            f"loss ends at {loss:.3g}, {loss / reference:.2f} x the input-free loss "
            f"{reference:.3g} (limit {rule.loss_fraction:g} x)",
        )
    if len(losses) < rule.start_points:
        return None
    start = statistics.fmean(v for _, v in losses[: rule.start_points])
    after = [(s, v) for s, v in losses if s > warmup_steps]
    smoothed = _trailing_mean([v for _, v in after], rule.smooth)
    judged = [(s, v) for (s, _), v in zip(after, smoothed, strict=True)]
    lowest = min((v for _, v in judged), default=math.nan)
    if not judged or lowest < rule.loss_fraction * start:
        return None
    detail = f"smoothed loss never fell below {rule.loss_fraction:g} x its start {start:.3g}"
    return Divergence("loss", judged[-1][0], f"{detail} (lowest after warm-up {lowest:.3g})")


def divergence(
    records: Records,
    stopped: Mapping | None = None,
    warmup_steps: int = 0,
    rule: DivergenceRule = DEFAULT_RULE,
    prediction: str = "x0",
) -> list[Divergence]:
    """Whether and how a run failed, judged from its logged records (:meth:`DivergenceRule.describe`):
    (a) nonfinite, then (x0) (or (eps)) where the run logged a held-out error after step 0, else (b) loss;
    an empty list for a run that trained.

    ``stopped`` is the ``stopped`` entry of the run's summary.json (the non-finite policy ended
    it there): such a run is judged by (a) alone. ``prediction``: what the network predicts
    (``diffusion.prediction``); one that predicts the noise is judged by (eps), not (x0). A
    criterion without data is not judged: (b) needs ``rule.start_points`` finite losses and one
    logged after ``warmup_steps``.
    """
    if (stopped_here := _nonfinite(records, stopped)) and stopped:
        return [stopped_here]
    found = [stopped_here] if stopped_here else []
    held_out = last_probe_step(records) is not None
    quality = _x0(records, prediction) if held_out else _loss(records, warmup_steps, rule)
    return found + ([quality] if quality else [])


def last_probe_step(records: Records) -> int | None:
    """The step of the last held-out x0 probe after step 0 (None: the run logged none)."""

    def probed(r: Mapping) -> bool:
        return any((p := names.parse_noise(k)) and p[0] == "x0" for k in r)

    return next((int(r["step"]) for r in reversed(records) if int(r["step"]) > 0 and probed(r)), None)


def feature_growth(records: Records, warmup_steps: int) -> float:
    """The last hidden-feature norm over its value at the end of warm-up (the first logged at or
    after ``warmup_steps``; the first logged at all when warm-up outlasts the log): growth measured
    from a point that depends neither on how often the norm is logged nor on the lr. inf where the
    last norm is not finite; NaN where the run logged none."""
    steps, norms = series(records, names.FEATURE_NORM)
    if not norms:
        return math.nan
    reference = next(
        (v for s, v in zip(steps, norms, strict=True) if s >= warmup_steps and math.isfinite(v)), None
    )
    if reference is None:
        reference = next((v for v in norms if math.isfinite(v)), None)
    if reference is None or reference <= 0:
        return math.nan
    return norms[-1] / reference if math.isfinite(norms[-1]) else math.inf


def cause(d: Divergence) -> str:
    """A failure's cause as a study counts it: the criterion, and for a run stopped on non-finite
    steps where its last skipped step went non-finite (``fp16 overflow in forward at
    out_blocks.0.skip_linear``, ``gradient overflow``, ``non-finite output ... at MODULE``); for an
    x0 (or eps) failure whose loss collapsed on the way (:func:`loss_collapse`), ``x0 after a loss
    collapse``."""
    if d.criterion in ("x0", "eps") and COLLAPSED in d.detail:
        return f"{d.criterion} after a loss collapse"
    if d.criterion != "nonfinite" or "; the last: " not in d.detail:
        return d.criterion
    return "nonfinite: " + skip_cause(d.detail.split("; the last: ", 1)[1])


def skip_cause(last: str) -> str:
    """Why a step was skipped, as a study counts it, from the trainer's line (summary.json
    ``last_skipped``, ``stopped.cause``): ``gradient overflow``, ``fp16 overflow in forward at
    MODULE``, ... without the step and the numbers."""
    if last.startswith("gradient overflow"):
        return "gradient overflow"
    return last.split(" (step ", 1)[0]


def causes(breaks: Iterable[Sequence[Divergence]]) -> dict[str, int]:
    """How many runs failed by each :func:`cause` (a run counts once, by its first criterion)."""
    out: dict[str, int] = {}
    for b in breaks:
        if b:
            out[cause(b[0])] = out.get(cause(b[0]), 0) + 1
    return out


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
