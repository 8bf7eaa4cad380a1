"""``scalelong compare``: train several skip methods side by side and write one report; what
every study shares (``scalelong sweep`` too): running many runs, the divergence rule, the report.

Every method of a seed starts from the same trunk weights (the skip module is built after the
backbone's initialisation), sees the same batches in the same order and the same noise, so
the methods differ only in how the skips are scaled. Claims rest on several seeds: the table
gives means with 95% t-intervals over seeds, and speed-ups are paired per seed against the
baseline of that seed.

A run that diverges is a result, never an abort: :func:`run_all` finishes the other runs, and
:func:`divergence` says of each run whether and how it broke (non-finite steps, a loss that
never falls, a hidden-feature norm that explodes). Finished runs of the same config are reused,
so re-running a study resumes it; ``jobs`` > 1 trains that many runs at a time in worker
processes that divide the cores (:func:`scalelong.launch.pool_map`).
"""

from __future__ import annotations

import base64
import copy
import html
import math
import re
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import scipy.stats
import torch

from scalelong.build import check_models
from scalelong.config import Config, config_to_dict, read_yaml, validate
from scalelong.errors import ScaleLongError
from scalelong.fd_mnist import CONFIDENT, real_digit_score
from scalelong.launch import PoolStopped, pool_map
from scalelong.plots import Records, as_float, load_metrics, plot_digit_score, series, write_plots
from scalelong.runs import RunDir, config_differences
from scalelong.skips import METHODS
from scalelong.train import TrainingInterrupted, TrainingStopped, train


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (NaN half-width for fewer than 2 values)."""
    xs = [v for v in values if math.isfinite(v)]
    if not xs:
        return math.nan, math.nan
    if len(xs) == 1:
        return xs[0], math.nan
    t = scipy.stats.t.ppf(0.975, df=len(xs) - 1)  # two-sided 95%
    return statistics.fmean(xs), float(t) * statistics.stdev(xs) / math.sqrt(len(xs))


def fmt_ci(values: Sequence[float], digits: int = 3, unit: str = "") -> str:
    mean, half = mean_ci(values)
    if math.isnan(mean):
        return "n/a"
    return f"{mean:.{digits}g}{unit}" + ("" if math.isnan(half) else f" ± {half:.2g}")


def average_records(runs: Sequence[Records]) -> list[dict]:
    """One record per step holding the mean over runs of every key logged at that step."""
    by_step: dict[int, dict[str, list[float]]] = {}
    for records in runs:
        for r in records:
            slot = by_step.setdefault(int(r["step"]), {})
            for k, v in r.items():
                if k != "step":
                    slot.setdefault(k, []).append(as_float(v))
    return [
        {"step": s, **{k: statistics.fmean(v) for k, v in kv.items()}} for s, kv in sorted(by_step.items())
    ]


DIGIT_KEYS = ("digits/confident", "digits/entropy")  # the digit score an fd-mnist evaluation logs
DIGIT_HEADER = "confident digits"  # the first digit-score column of the study tables


def _last(records: Records, key: str) -> float:
    _, values = series(records, key)
    finite = [v for v in values if math.isfinite(v)]
    return finite[-1] if finite else math.nan


def _mean_of(records: Records, key: str) -> float:
    finite = [v for v in series(records, key)[1] if math.isfinite(v)]
    return statistics.fmean(finite) if finite else math.nan


@dataclass
class TargetResult:
    """Steps each method needs to reach the baseline's final value of a lower-is-better metric."""

    target: float  # the baseline's last finite value
    steps: dict[str, int | None]  # first logged step at or below target; None if never reached
    speedup: dict[str, float | None]  # baseline's steps / method's steps


def steps_to_target(records_by_method: Mapping[str, Records], baseline: str, key: str = "fd") -> TargetResult:
    """Steps to reach the baseline's final ``key`` (e.g. Frechet distance) and the speed-up.

    The baseline's own count is the first step at which it reached its final value (which can
    be earlier than its last step when the metric is not monotone), so the baseline's speed-up is 1.
    """
    if baseline not in records_by_method:
        raise ScaleLongError(f"baseline {baseline!r} not among the methods {sorted(records_by_method)}")
    _, base_values = series(records_by_method[baseline], key)
    finite = [v for v in base_values if math.isfinite(v)]
    if not finite:
        raise ScaleLongError(f"the baseline {baseline!r} has no finite {key!r} values")
    target = finite[-1]
    steps: dict[str, int | None] = {}
    for method, records in records_by_method.items():
        # NaN compares False, so a diverged evaluation never counts as reaching the target.
        steps[method] = next((s for s, v in zip(*series(records, key), strict=True) if v <= target), None)
    base_steps = steps[baseline]
    speedup = {m: (base_steps / s if s and base_steps else None) for m, s in steps.items()}
    return TargetResult(target, steps, speedup)


# ----------------------------------------------------------------------------- divergence


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
        and not math.isfinite(as_float(logged[-1].get("loss")))
    ):
        found.append(
            Divergence("nonfinite", int(logged[-1]["step"]), "its last logged steps were all non-finite")
        )
    losses = [(s, v) for s, v in zip(*series(records, "loss"), strict=True) if math.isfinite(v)]
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
    steps, norms = series(records, "feature_norm")
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


# ----------------------------------------------------------------------------- running a study

# Keys that do not change what a run computes: a finished run that differs only in them is reused.
STUDY_FREE_KEYS = (
    "name",
    "out_dir",
    "data.path",
    "data.num_workers",
    "train.compile",
    "train.tensorboard",
    "train.wandb",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "sample.",
)


@dataclass
class RunOutcome:
    """What became of one run of a study."""

    name: str
    status: str  # trained | stopped (the non-finite policy) | reused | failed
    message: str = ""  # one line: where it stopped, or why it failed
    threads: int = 0  # torch threads it trained with (0: not trained now)


def concluded(run: RunDir) -> bool:
    """Whether a run ended with a result: it completed, or the non-finite policy stopped it (its
    summary records where). Interrupted and failed runs are not: a study trains them on."""
    summary = run.summary or {}
    return run.finished or (summary.get("status") == "stopped" and "stopped" in summary)


def reusable(run: RunDir, cfg: Config) -> bool:
    """A concluded run (:func:`concluded`) of this very config, up to :data:`STUDY_FREE_KEYS`."""
    return concluded(run) and not config_differences(
        read_yaml(run.config_file), config_to_dict(cfg), free=STUDY_FREE_KEYS
    )


def check_run_dirs(cfgs: Iterable[Config]) -> None:
    """Before any run starts: no run directory may hold a run another config can't resume."""
    for cfg in cfgs:
        run = RunDir(cfg.run_dir)
        if run.config_file.is_file():
            diff = config_differences(read_yaml(run.config_file), config_to_dict(cfg))
            if diff:
                raise ScaleLongError(
                    f"{run} holds a run of another config ({diff[0]}); remove it or choose another name"
                )
        elif run.path.is_dir() and any(run.path.iterdir()):
            raise ScaleLongError(f"{run} exists but holds no run (no config.yaml); remove it or rename")


def train_run(cfg: Config, progress: bool = False, train_kwargs: Mapping | None = None) -> RunOutcome:
    """Train one run of a study, here or in a worker: its outcome, never an exception (but an
    interrupt). ``train_kwargs`` go to :func:`scalelong.train.train` (hooks)."""
    threads = torch.get_num_threads()
    try:
        train(cfg, progress=progress, **dict(train_kwargs or {}))
    except TrainingInterrupted:
        raise
    except TrainingStopped as e:
        return RunOutcome(cfg.name, "stopped", f"stopped at step {e.step} ({e.kind})", threads)
    except Exception as e:  # a user error, or a bug, of one run must not end the others
        kind = "" if isinstance(e, ScaleLongError) else f"{type(e).__name__}: "
        return RunOutcome(cfg.name, "failed", kind + " ".join(str(e).split()), threads)
    return RunOutcome(cfg.name, "trained", "", threads)


def run_all(
    cfgs: Sequence[Config], jobs: int = 1, progress: bool = True, train_kwargs: Mapping | None = None
) -> list[RunOutcome]:
    """Train every config and return the outcomes in order; finished runs are reused (see
    :func:`reusable`), unfinished ones resume.

    ``jobs`` 1 trains one after another in this process; ``jobs`` J > 1 trains J at a time in
    spawned workers with ``cores // J`` torch threads each (``train_kwargs`` must then pickle).
    A run that stops or fails is reported in one line and the others go on.
    """
    check_run_dirs(cfgs)
    outcomes = {i: RunOutcome(c.name, "reused") for i, c in enumerate(cfgs) if reusable(RunDir(c.run_dir), c)}
    todo = [i for i in range(len(cfgs)) if i not in outcomes]
    check_models(cfgs[i] for i in todo)  # here, once per model config, so no worker needs to
    if outcomes:
        print(f"{len(outcomes)} of {len(cfgs)} runs are finished already and reused")
    args = [(cfgs[i], progress and jobs == 1, train_kwargs) for i in todo]
    for done, (j, result) in enumerate(pool_map(train_run, args, jobs), start=1):
        name = cfgs[todo[j]].name
        if isinstance(result, (TrainingInterrupted, PoolStopped)):
            raise result
        if isinstance(result, BaseException):  # the worker process itself failed
            result = RunOutcome(name, "failed", f"{type(result).__name__}: {' '.join(str(result).split())}")
        outcomes[todo[j]] = result
        line = f"[{done}/{len(todo)}] {name}: " + (
            f"failed: {result.message}" if result.status == "failed" else result.message or result.status
        )
        print(line, file=sys.stderr if result.status == "failed" else sys.stdout, flush=True)
    return [outcomes[i] for i in range(len(cfgs))]


@dataclass
class StudyRun:
    """One run of a study read back from its directory, with the verdict of :func:`divergence`."""

    name: str
    records: list[dict]
    summary: dict
    breaks: list[Divergence]
    error: str = ""  # why it could not run (its records are then left out)
    path: Path | None = None  # its run directory
    seed: int | None = None  # its train.seed (None: not read, the run could not be)


def read_run(run_dir: str | Path, rule: DivergenceRule = DEFAULT_RULE, error: str = "") -> StudyRun:
    """The run of ``run_dir`` as a study sees it; ``error``: it failed, so only its name counts."""
    run = RunDir(run_dir)
    if error or not run.metrics_file.is_file():
        return StudyRun(run.name, [], {}, [], error or "no metrics", run.path)
    records, summary = load_metrics(run), run.summary or {}
    cfg = run.config()
    breaks = divergence(records, summary.get("stopped"), cfg.optim.warmup_steps, rule)
    return StudyRun(run.name, records, summary, breaks, path=run.path, seed=cfg.train.seed)


def broken_runs(runs: Iterable[StudyRun]) -> list[str]:
    """Markdown list items: each run that diverged (criterion, step, numbers) or failed."""
    lines = []
    for r in runs:
        if r.error:
            lines.append(f"- `{r.name}`: failed: {r.error}")
        lines += [f"- `{r.name}`: {d}" for d in r.breaks]
    return lines


# ----------------------------------------------------------------------------- the comparison


@dataclass
class MethodSummary:
    method: str
    final_fd: list[float]  # per seed
    fd_change: list[float]  # final FD / the baseline's of the same seed - 1, per seed (paired)
    final_loss: list[float]
    feature_osc_std: list[float]  # mean sliding-window std of the hidden-feature norm
    spikes: list[float]
    steps_to_target: list[int | None]
    speedup: list[float | None]
    breaks: list[list[Divergence]] = field(default_factory=list)  # per seed; empty: healthy
    confident: list[float] = field(default_factory=list)  # digit score of the last evaluation, per seed
    entropy: list[float] = field(default_factory=list)  # its class balance, per seed
    feature_norm: list[float] = field(default_factory=list)  # last logged hidden-feature norm, per seed


def _targets(records_by_method: Mapping[str, Records], baseline: str, key: str) -> TargetResult:
    try:
        return steps_to_target(records_by_method, baseline, key)
    except ScaleLongError:  # no finite baseline value (no evaluation, or it diverged): no target
        return TargetResult(math.nan, dict.fromkeys(records_by_method), dict.fromkeys(records_by_method))


def summarise(
    runs: Mapping[str, Sequence[Records]],
    baseline: str,
    fd_key: str = "fd",
    breaks: Mapping[str, Sequence[list[Divergence]]] | None = None,
) -> list[MethodSummary]:
    """Per-method summaries from ``runs[method][seed] -> records``; speed-ups paired by seed.
    ``breaks[method][seed]``: the run's :func:`divergence` (default: none)."""
    seeds = min(len(r) for r in runs.values())
    targets = [_targets({m: runs[m][s] for m in runs}, baseline, fd_key) for s in range(seeds)]
    base_fd = [_last(r, fd_key) for r in runs[baseline]]
    return [
        MethodSummary(
            method=method,
            final_fd=[_last(r, fd_key) for r in per_seed],
            fd_change=[_last(r, fd_key) / b - 1 for r, b in zip(per_seed, base_fd, strict=False)],
            final_loss=[_last(r, "loss") for r in per_seed],
            feature_osc_std=[_mean_of(r, "osc/feature_norm_std") for r in per_seed],
            spikes=[_last(r, "spikes") for r in per_seed],
            steps_to_target=[t.steps[method] for t in targets],
            speedup=[t.speedup[method] for t in targets],
            breaks=[list(b) for b in (breaks or {}).get(method, [[] for _ in per_seed])],
            confident=[_last(r, DIGIT_KEYS[0]) for r in per_seed],
            entropy=[_last(r, DIGIT_KEYS[1]) for r in per_seed],
            feature_norm=[_last(r, "feature_norm") for r in per_seed],
        )
        for method, per_seed in runs.items()
    ]


def has_digits(*columns: Sequence[float]) -> bool:
    """Whether any value of the digit-score columns is finite (the runs were evaluated with fd-mnist)."""
    return any(math.isfinite(v) for column in columns for v in column)


def digit_headers(real: Mapping | None = None) -> list[str]:
    """The headers of the two digit-score columns, with the real digits' values as the yardstick."""
    real = real_digit_score() if real is None else real
    return [f"{DIGIT_HEADER} (real {real['confident']:.2f})", f"class balance (real {real['entropy']:.2f})"]


def digit_legend(real: Mapping | None = None, markdown: bool = True) -> str:
    """One paragraph that says how to read the digit-score columns (``markdown`` False: plain text)."""
    real = real_digit_score() if real is None else real
    text = (
        f"**Digit score** of the samples of the last evaluation (beside FD, which mixes shape, stroke "
        f"width and class balance in one number): *confident digits* is the share of samples the "
        f"FD-MNIST classifier assigns to one class with p >= {CONFIDENT:g}; *class balance* is the "
        "entropy of the classes it assigns over log(10): 1 when every digit is equally frequent, 0 when "
        f"all samples are one digit. Held-out real digits score {real['confident']:.2f} and "
        f"{real['entropy']:.2f}; a few hundred samples of a perfect model read about 0.99 on balance."
    )
    return text if markdown else text.replace("*", "")


def summary_table(
    summaries: Sequence[MethodSummary], baseline: str, real_digits: Mapping | None = None
) -> str:
    """Markdown table of the comparison (mean ± 95% interval over seeds). The digit-score columns
    appear when the runs logged them (eval.metric fd-mnist); ``real_digits`` is their yardstick
    (default :func:`scalelong.fd_mnist.real_digit_score`)."""
    n = len(summaries[0].final_fd)
    digits = has_digits(*(s.confident for s in summaries), *(s.entropy for s in summaries))
    extra = digit_headers(real_digits) if digits else []
    lines = [
        " | ".join(
            [
                "| method",
                "final FD",
                f"final FD vs {baseline} (paired)",
                *extra,
                "final loss",
                "feature-norm osc. std",
                "loss spikes",
                f"steps to {baseline}'s final FD",
                f"speed-up vs {baseline}",
                "diverged |",
            ]
        ),
        "|---" * (9 + len(extra)) + "|",
    ]
    for s in summaries:
        reached = [x for x in s.steps_to_target if x is not None]
        steps = (
            f"{statistics.median(reached):.0f} ({len(reached)}/{n} seeds)"
            if reached
            else f"not reached (0/{n})"
        )
        speed = [x for x in s.speedup if x is not None]
        cells = [fmt_ci(s.confident, 2), fmt_ci(s.entropy, 2)] if digits else []
        lines.append(
            f"| {s.method} | {fmt_ci(s.final_fd)} | {fmt_ci([100 * x for x in s.fd_change], unit='%')} "
            + "".join(f"| {c} " for c in cells)
            + f"| {fmt_ci(s.final_loss)} | {fmt_ci(s.feature_osc_std)} "
            f"| {fmt_ci(s.spikes)} | {steps} | {fmt_ci(speed, unit='x') if speed else 'n/a'} "
            f"| {criteria(s.breaks or [[]] * n)} |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- reading a comparison

MIN_SEEDS = 5  # fewer seeds than this: no difference of a small-model comparison is evidence
DIGITS_FD = 200.0  # FD-MNIST at or below this ...
DIGITS_CONFIDENT = 0.5  # ... with at least this share of confident digits: the samples are digits
FIG1_ORDER = (("none",), ("sqrt2",), ("cs", "ls", "ls-nonshare"))  # the paper's Fig. 1, highest norm first


def _num(x: float) -> str:
    """A number as a sentence rounds it: whole from 100 on, three significant digits below."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _pct(x: float, sign: str = "") -> str:
    """A percentage as a sentence rounds it: whole from 10 on, one decimal below (``sign`` "+":
    always signed)."""
    return f"{x:{sign}.0f}%" if abs(x) >= 10 else f"{x:{sign}.1f}%"


def _and(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _mean(values: Sequence[float]) -> float:
    return mean_ci(values)[0]


def _over(seeds: int) -> str:
    return "1 seed" if seeds == 1 else f"mean over {seeds} seeds"


def _seeds_sentence(summaries: Sequence[MethodSummary], baseline: str, seeds: int, evaluated: bool) -> str:
    if seeds < MIN_SEEDS:
        return (
            f"With {seeds} seed{'' if seeds == 1 else 's'}, no difference in this table is evidence: on "
            f"small models seed-to-seed noise is larger than the effect, so train --seeds {MIN_SEEDS} or "
            "more before concluding."
        )
    others = [s for s in summaries if s.method != baseline]
    if not others or not evaluated:
        what = "there is no other method" if not others else "no run logged an FD to pair"
        return f"With {seeds} seeds a paired difference could be tested, but {what}."
    clear, unclear = [], []
    for s in others:
        mean, half = mean_ci(s.fd_change)
        text = f"{s.method} ({'n/a' if math.isnan(mean) else _pct(100 * mean, '+')}"
        text += ")" if math.isnan(half) else f" ± {_pct(100 * half)})"
        (clear if math.isfinite(half) and abs(mean) > half else unclear).append(text)
    head = f"With {seeds} seeds, the 95% interval of the paired change in final FD against {baseline}"
    if not unclear:
        return f"{head} excludes 0 for {_and(clear)}."
    if not clear:
        return f"{head} includes 0 for {_and(unclear)}: no difference in final FD is evidence."
    which = "that difference is" if len(unclear) == 1 else "those differences are"
    return f"{head} excludes 0 for {_and(clear)}; it includes 0 for {_and(unclear)}: {which} not evidence."


def _digits_sentence(summaries: Sequence[MethodSummary]) -> str:
    bar = f"final FD <= {DIGITS_FD:g} and at least {DIGITS_CONFIDENT:.0%} of the samples confident digits"
    failing = []
    for s in summaries:
        fd, confident = _mean(s.final_fd), _mean(s.confident)
        if fd <= DIGITS_FD and confident >= DIGITS_CONFIDENT:  # NaN fails both
            continue
        score = "no digit score" if math.isnan(confident) else f"{confident:.0%} confident"
        failing.append(f"{s.method} ({'no finite FD' if math.isnan(fd) else 'FD ' + _num(fd)}, {score})")
    if not failing:
        return f"Every method ended drawing digits ({bar})."
    if len(failing) == len(summaries):
        return f"No method ended drawing digits ({bar}): {_and(failing)}."
    return f"{_and(failing)} did not end drawing digits ({bar}); the others did."


def _fd_sentence(summaries: Sequence[MethodSummary], seeds: int) -> str:
    ranked = sorted((fd, s.method) for s in summaries if math.isfinite(fd := _mean(s.final_fd)))
    missing = [s.method for s in summaries if math.isnan(_mean(s.final_fd))]
    over = _over(seeds)
    (lo, lo_m), (hi, hi_m) = ranked[0], ranked[-1]
    if len(ranked) == 1:
        text = f"The final FD ({over}) is {_num(lo)} for {lo_m}"
    else:
        text = f"The final FD ({over}) is lowest for {lo_m} ({_num(lo)}) and highest for {hi_m} ({_num(hi)})"
        if len(ranked) > 2:
            text += "; " + ", ".join(f"{m} {_num(fd)}" for fd, m in ranked[1:-1])
    return text + (f"; {_and(missing)} ended with no finite FD." if missing else ".")


def fig1_order(norms: Mapping[str, float]) -> bool | None:
    """Whether the final hidden-feature norms order as in the paper's Fig. 1 (none highest, then
    sqrt2, then cs / ls); None when fewer than two of those three groups are present."""
    groups = [[norms[m] for m in group if m in norms] for group in FIG1_ORDER]
    groups = [g for g in groups if g]
    if len(groups) < 2:
        return None
    return all(min(high) > max(low) for high, low in zip(groups[:-1], groups[1:], strict=True))


def _norm_sentence(summaries: Sequence[MethodSummary], baseline: str, seeds: int) -> str:
    norms = {s.method: v for s in summaries if math.isfinite(v := _mean(s.feature_norm))}
    if not norms:
        return "No run logged the hidden-feature norm (diagnostics.every=0), so Fig. 1 cannot be read."
    base = norms.get(baseline, math.nan)
    if math.isfinite(base) and base > 0:
        ratios = ", ".join(f"{m} {v / base:.2f}x" for m, v in norms.items() if m != baseline)
        text = f"The hidden-feature norm at the end ({_over(seeds)}) is {_num(base)} for {baseline}"
        text += f"; as a ratio to it, {ratios}" if ratios else ""
    else:
        text = f"The hidden-feature norm at the end ({_over(seeds)}) is " + ", ".join(
            f"{m} {_num(v)}" for m, v in norms.items()
        )
    order = fig1_order(norms)
    paper = "the paper's Fig. 1 (none highest, then sqrt2, then cs and ls)"
    if order is None:
        return text + "."
    if order:
        return f"{text}: the order of {paper}."
    here = " > ".join(sorted(norms, key=norms.__getitem__, reverse=True))
    return f"{text}: not the order of {paper}, but {here}."


def _speed_sentences(
    summaries: Sequence[MethodSummary], baseline: str, eval_every: int, steps: int
) -> list[str]:
    base = next(s for s in summaries if s.method == baseline)
    reached = [x for x in base.steps_to_target if x is not None]
    if not reached:
        return [f"{baseline} ended with no finite FD, so there is no target to measure speed-ups against."]
    at = statistics.median(reached)
    parts = []
    for s in summaries:
        if s.method == baseline:
            continue
        speed = [x for x in s.speedup if x is not None]
        n, k = len(s.speedup), len(speed)
        if not speed:
            parts.append(f"{s.method} never reached it")
            continue
        partial = f" ({k}/{n} seeds got there)" if k < n else ""
        parts.append(f"{s.method} {statistics.fmean(speed):.2f}x{partial}")
    first = f"{baseline} first reached its final FD at step {at:.0f}"
    first += " (median over seeds)" if len(reached) > 1 else ""
    first += f"; speed-up to that FD: {_and(parts)}." if parts else "."
    if at <= eval_every:
        second = (
            f"That was its first evaluation (every {eval_every} steps), so no speed-up can show: "
            "evaluate more often (eval.every) or train longer."
        )
    else:
        smallest = at / (at - eval_every)
        second = (
            f"With evaluations every {eval_every} of {steps} steps, the smallest speed-up that can show is "
            f"{at:.0f} / {at - eval_every:.0f} = {smallest:.2f}x"
        )
        second += (
            ", so 1.5x cannot be resolved: evaluate more often (eval.every) or train longer."
            if smallest > 1.5
            else "."
        )
    return [first, second]


def reading(
    summaries: Sequence[MethodSummary], baseline: str, eval_every: int, steps: int, seeds: int
) -> str:
    """One paragraph that reads a comparison's table aloud, from its numbers: what the seed count
    allows (with fewer than 5 no difference is evidence; with 5 or more, which paired final-FD
    changes have 95% intervals that exclude 0), whether every method ended drawing digits (final
    FD <= 200 and at least half the samples confident digits), the final FD of each method, the
    hidden-feature norm at the end against the paper's Fig. 1, the speed-up to the baseline's
    final FD with the smallest one the evaluation spacing can show (evaluations every E steps,
    the baseline there at step S: S / (S - E)), and the runs that diverged.

    ``eval_every`` and ``steps`` are the config's ``eval.every`` and ``train.steps``; ``seeds`` is
    the number of seeds per method.
    """
    evaluated = eval_every > 0 and any(math.isfinite(v) for s in summaries for v in s.final_fd)
    sentences = [_seeds_sentence(summaries, baseline, seeds, evaluated)]
    if evaluated:
        if has_digits(*(s.confident for s in summaries)):  # fd-mnist: the samples can be read as digits
            sentences.append(_digits_sentence(summaries))
        sentences.append(_fd_sentence(summaries, seeds))
    else:
        losses = sorted((v, s.method) for s in summaries if math.isfinite(v := _mean(s.final_loss)))
        why = "No run was evaluated (eval.every=0)" if eval_every <= 0 else "No run ended with a finite FD"
        text = f"{why}, so there is no FD, digit score or speed-up to read"
        if losses:
            text += f"; the final loss is lowest for {losses[0][1]} ({losses[0][0]:.3g})"
            if len(losses) > 1:
                text += f" and highest for {losses[-1][1]} ({losses[-1][0]:.3g})"
        sentences.append(text + ".")
    sentences.append(_norm_sentence(summaries, baseline, seeds))
    if evaluated:
        sentences += _speed_sentences(summaries, baseline, eval_every, steps)
    broken = []
    for s in summaries:
        if any(s.breaks):
            count, _, named = criteria(s.breaks).partition(" ")  # "2/5 (loss)"
            broken.append(f"{s.method} in {count} seeds" + (f" {named}" if named else ""))
    sentences.append(f"Diverged: {_and(broken)}." if broken else "No run diverged.")
    return " ".join(sentences)


def method_config(base: Config, method: str, seed: int, out_dir: Path) -> Config:
    cfg = copy.deepcopy(base)
    cfg.model.skip.method = method
    cfg.train.seed = seed
    cfg.out_dir = str(out_dir)
    cfg.name = f"{method}-seed{seed}"
    return cfg


def comparison_configs(base: Config, methods: Sequence[str], seeds: int, report_dir: Path) -> list[Config]:
    """Every run of a comparison, seed by seed, under ``report_dir/runs``: seed ``train.seed + k``."""
    return [
        method_config(base, m, base.train.seed + k, report_dir / "runs")
        for k in range(seeds)
        for m in methods
    ]


def check_plan(cfgs: Sequence[Config]) -> None:
    """What a study checks before its first run, writing nothing: every run's config is valid,
    no run folder holds a run of another config (:func:`check_run_dirs`) and every model accepts
    its input shape (:func:`scalelong.build.check_models`)."""
    for cfg in cfgs:
        try:
            validate(copy.deepcopy(cfg))  # validation resolves defaults in place; the plan stays as built
        except ScaleLongError as e:
            raise ScaleLongError(f"run {cfg.name}: {e}") from None
    check_run_dirs(cfgs)
    check_models(cfgs)


def plan_table(cfgs: Sequence[Config]) -> str:
    """The runs of a study, one line each: name, skip method, seed, lr, U-ViT depth, and what the
    study will do with it (``new``; ``resume`` an unfinished run; ``reuse`` a finished one)."""
    rows = [("run", "method", "seed", "lr", "depth", "action")]
    for cfg in cfgs:
        run = RunDir(cfg.run_dir)
        action = "reuse" if reusable(run, cfg) else "resume" if run.config_file.is_file() else "new"
        depth = str(cfg.model.uvit.depth) if cfg.model.type == "uvit" else "-"
        rows.append(
            (cfg.name, cfg.model.skip.method, str(cfg.train.seed), f"{cfg.optim.lr:g}", depth, action)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def parse_methods(text: str) -> list[str]:
    methods = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise ScaleLongError(f"--methods {text!r}: choose from {', '.join(METHODS)}, comma separated")
    if len(set(methods)) != len(methods):
        raise ScaleLongError(f"--methods {text!r} names a method twice")
    return methods


@dataclass
class StudyResult:
    """Where a study's report is, its main table, and what became of each run."""

    report: Path
    table: str
    outcomes: list[RunOutcome]
    legend: str = ""  # how to read columns the table's headers cannot explain (the digit score)
    reading: str = ""  # the table in plain sentences (:func:`reading`)

    @property
    def failed(self) -> list[RunOutcome]:
        return [o for o in self.outcomes if o.status == "failed"]


def run_comparison(
    base: Config,
    methods: Sequence[str],
    seeds: int,
    report_dir: Path,
    progress: bool = True,
    jobs: int = 1,
    train_kwargs: Mapping | None = None,
) -> StudyResult:
    """Train every method for every seed (reusing finished runs; ``jobs`` at a time) and write
    the report. Runs that diverge or fail are recorded in it; the others are trained all the same."""
    cfgs = comparison_configs(base, methods, seeds, report_dir)
    outcomes = run_all(cfgs, jobs, progress, train_kwargs)
    studies: dict[str, list[StudyRun]] = {m: [] for m in methods}
    for cfg, outcome in zip(cfgs, outcomes, strict=True):
        error = outcome.message if outcome.status == "failed" else ""
        studies[cfg.model.skip.method].append(read_run(cfg.run_dir, error=error))
    report, table = write_report(studies, methods[0], report_dir, base)
    legend = digit_legend(markdown=False) if DIGIT_HEADER in table else ""
    return StudyResult(report, table, outcomes, legend, study_reading(studies, methods[0], base))


# ----------------------------------------------------------------------------- reports


def _embed(path: Path, caption: str = "") -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    caption = html.escape(caption or path.stem)
    img = f'<img src="data:image/png;base64,{data}" alt="{caption}">'
    return f"<figure>{img}<figcaption>{caption}</figcaption></figure>"


def _inline(text: str) -> str:
    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    text = re.sub(r"\*(.+?)\*", r"<i>\1</i>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)]+)\)")
_IMAGE_LINE = re.compile(r"^(?:!\[[^\]]*\]\([^)]+\)\s*)+$")

# Fits two 2x sample grids (548 px) side by side; tables wider than the page scroll in their box.
STYLE = (
    "body{font-family:sans-serif;max-width:1160px;margin:auto;padding:0 8px;line-height:1.4}"
    "td,th{border:1px solid #ccc;padding:4px 8px}table{border-collapse:collapse}"
    ".table{overflow-x:auto}img{max-width:100%}figure{margin:12px 0}"
    "figcaption{font-size:90%;color:#444}.gallery{display:flex;flex-wrap:wrap;gap:8px 12px}"
    ".gallery figure{margin:0}"
)


def markdown_html(md: str, folder: Path, title: str) -> str:
    """A self-contained HTML page of a report's markdown: headings, paragraphs, lists, tables,
    and its images (``![caption](file.png)`` in ``folder``) embedded, with the alt text as caption.
    A line of several images is a gallery: side by side, wrapping at the page width."""
    out, para, items, rows = [], [], [], []

    def flush() -> None:
        if para:
            out.append(f"<p>{_inline(' '.join(para))}</p>")
        if items:
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + "</ul>")
        if rows:
            head = "".join(f"<th>{_inline(c)}</th>" for c in _cells(rows[0]))
            body = "".join(
                "<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in _cells(r)) + "</tr>" for r in rows[2:]
            )
            out.append(f"<div class='table'><table><tr>{head}</tr>{body}</table></div>")
        para.clear(), items.clear(), rows.clear()

    for line in md.splitlines():
        heading = re.match(r"^(#{1,4}) (.*)", line)
        image = _IMAGE_LINE.match(line.strip())
        kind = "row" if line.startswith("|") else "item" if line.startswith("- ") else "text"
        if heading or image or not line.strip() or (kind != "row" and rows) or (kind != "item" and items):
            flush()
        if heading:
            n = len(heading.group(1))
            out.append(f"<h{n}>{_inline(heading.group(2))}</h{n}>")
        elif image:
            figures = [_embed(folder / name, alt) for alt, name in _IMAGE.findall(line)]
            out.append(figures[0] if len(figures) == 1 else f"<div class='gallery'>{''.join(figures)}</div>")
        elif kind == "row":
            rows.append(line)
        elif kind == "item":
            items.append(line[2:])
        elif line.strip():
            para.append(line.strip())
    flush()
    return (
        f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title><style>{STYLE}</style>"
        + "\n".join(out)
    )


def write_markdown_report(md: str, report_dir: Path, title: str) -> Path:
    """``report.md`` and its self-contained ``report.html`` in ``report_dir``; the path of report.md."""
    (report_dir / "report.md").write_text(md)
    (report_dir / "report.html").write_text(markdown_html(md, report_dir, title))
    return report_dir / "report.md"


def seeds_note(seeds: int) -> str:
    return (
        f"**{seeds} seed(s) only:** on small models seed-to-seed noise is larger than the effect; "
        "use --seeds 5 or more before drawing a conclusion."
    )


def final_sample_grid(run_dir: str | Path) -> tuple[int, Path] | None:
    """The step and path of a run's last sample grid (``samples/step-XXXXXX.png``), None if it has none."""
    grids = []
    for path in (Path(run_dir) / "samples").glob("step-*.png"):
        step = path.stem.removeprefix("step-")
        if step.isdigit():
            grids.append((int(step), path))
    return max(grids, default=None)


def upscale(src: Path, dst: Path, min_width: int = 512, max_factor: int = 8) -> int:
    """Copy a PNG to ``dst`` enlarged by the smallest whole factor that makes it ``min_width`` wide,
    with nearest-neighbour pixels (a 32-pixel digit stays sharp); returns the factor."""
    from PIL import Image

    with Image.open(src) as image:
        factor = max(1, min(max_factor, math.ceil(min_width / image.width)))
        image.resize((image.width * factor, image.height * factor), Image.Resampling.NEAREST).save(dst)
    return factor


def sample_grid_section(
    studies: Mapping[str, Sequence[StudyRun]], report_dir: Path, base: Config
) -> list[str]:
    """The report's sample grids: each method's last grid of its first seed, side by side, enlarged."""
    shown, missing, factor = [], [], 1
    for method, runs in studies.items():
        found = final_sample_grid(runs[0].path) if runs and runs[0].path else None
        if found is None:
            missing.append(method)
            continue
        step, src = found
        dst = report_dir / f"samples_{re.sub(r'[^A-Za-z0-9_.-]', '_', method)}.png"
        factor = upscale(src, dst)
        shown.append(f"![{method}, step {step}]({dst.name})")
    if not shown:
        return ["## Samples", "The runs wrote no sample grids (sample.num_images is 0, or none finished)."]
    seeds = len(next(iter(studies.values())))
    which = f" of the seed-{base.train.seed} run ({seeds} seeds were trained)" if seeds > 1 else ""
    caption = (
        f"The last EMA sample grid of each method{which}, enlarged {factor}x with whole pixels. The same "
        "position starts from the same noise in every method, so the grids compare image by image."
    )
    if missing:
        caption += f" No grid: {', '.join(missing)}."
    return ["## Samples", caption, " ".join(shown)]


FIGURE_CAPTIONS = {
    "feature_norm": "**Fig. 1**: norm of the hidden features (mean over blocks) against step, mean over "
    "seeds. A norm that keeps growing, by decades on a log axis, is the instability long-skip scaling "
    "is meant to remove.",
    "noise_levels": "Denoising error per noise level at each method's last measurement, on held-out "
    "images: x0 error (left; above the dashed error of the mean image a level is not learnt) and "
    "epsilon error (right).",
}


PLOT_CAPTIONS = {  # one line under each of the other plots
    "loss": "training loss",
    "fd": "Frechet distance ({metric}) of EMA samples at each evaluation",
    "digits": "digit score at each evaluation: confident digits (left), class balance (right); "
    "held-out real digits dashed",
    "grad_oscillation": "gradient norm of the blocks (left) and its sliding-window std (right)",
}


def plot_caption(stem: str, base: Config) -> str:
    """The one-line caption of a report plot (its file's stem) for a study of ``base``."""
    return PLOT_CAPTIONS.get(stem, stem).format(metric=base.eval.metric)


def study_summaries(studies: Mapping[str, Sequence[StudyRun]], baseline: str) -> list[MethodSummary]:
    """:func:`summarise` of a study's runs, with each run's divergence verdict."""
    runs = {m: [r.records for r in rs] for m, rs in studies.items()}
    return summarise(runs, baseline, breaks={m: [r.breaks for r in rs] for m, rs in studies.items()})


def study_reading(studies: Mapping[str, Sequence[StudyRun]], baseline: str, base: Config) -> str:
    """:func:`reading` of a study of ``base`` (its eval.every, train.steps and seed count)."""
    seeds = len(next(iter(studies.values())))
    return reading(study_summaries(studies, baseline), baseline, base.eval.every, base.train.steps, seeds)


def write_report(
    studies: Mapping[str, Sequence[StudyRun]], baseline: str, report_dir: Path, base: Config
) -> tuple[Path, str]:
    """report.md, PNG plots (means over seeds), the sample grids and a self-contained report.html in
    ``report_dir``; returns the path of report.md and the summary table (markdown).

    The report reads top down: the summary table and its reading in plain sentences
    (:func:`reading`), the final samples of every method side by side, Fig. 1 (hidden-feature
    norm), the error per noise level, then the runs that broke, the training curves and the
    learned skip coefficients.
    """
    report_dir.mkdir(parents=True, exist_ok=True)
    runs = {m: [r.records for r in rs] for m, rs in studies.items()}
    summaries = study_summaries(studies, baseline)
    table = summary_table(summaries, baseline)
    averaged = {m: average_records([r for r in rr if r]) for m, rr in runs.items()}
    plots = write_plots(averaged, report_dir)
    if has_digits(*(s.confident for s in summaries)):
        plots.append(plot_digit_score(averaged, report_dir / "digits.png", real_digit_score()))
    by_name = {p.stem: p for p in plots}
    seeds = len(next(iter(runs.values())))
    depth = getattr(base.model, base.model.type, None)
    header = (
        f"{base.model.type} ({'depth ' + str(depth.depth) if hasattr(depth, 'depth') else ''}), "
        f"data {base.data.name}, {base.train.steps} steps, batch {base.train.batch_size}, "
        f"{seeds} seed(s) from {base.train.seed}. Values are means over seeds ± the half-width of a "
        "95% t-interval; speed-ups are paired per seed. FD is the Frechet distance "
        f"({base.eval.metric}) of EMA samples."
    )
    parts = [f"# ScaleLong comparison: {', '.join(runs)}", header, table]
    # Right under the table, so it is read first; it carries the seed-count warning too.
    parts.append(reading(summaries, baseline, base.eval.every, base.train.steps, seeds))
    if DIGIT_HEADER in table:
        parts.append(digit_legend())
    parts += sample_grid_section(studies, report_dir, base)
    for name, heading in (("feature_norm", "Fig. 1: hidden-feature norm"), ("noise_levels", "Noise levels")):
        if name in by_name:
            parts += [f"## {heading}", FIGURE_CAPTIONS[name], f"![{heading}]({by_name.pop(name).name})"]
    broken = broken_runs(r for rs in studies.values() for r in rs)
    if broken:
        parts += ["## Runs that diverged or failed", DEFAULT_RULE.describe(), "\n".join(broken)]
    order = ("fd", "digits", "loss", "grad_oscillation")  # the samples' scores first
    curves = sorted(
        (p for p in by_name.values() if not p.stem.startswith("coefficients_")),
        key=lambda p: order.index(p.stem) if p.stem in order else len(order),
    )
    if curves:
        parts += [
            "## Training curves",
            "Means over seeds.",
            "\n".join(f"![{plot_caption(p.stem, base)}]({p.name})" for p in curves),
        ]
    learned = [p for p in by_name.values() if p.stem.startswith("coefficients_")]
    if learned:
        parts += [
            "## Learned skip coefficients",
            "One panel per skip (skip 1 is the outermost, merged last, next to the output): the "
            "coefficient's mean over the batch, its min..max as a band, averaged over seeds.",
            "\n".join(f"![{p.stem.removeprefix('coefficients_')}]({p.name})" for p in learned),
        ]
    md = "\n\n".join(parts) + "\n"
    return write_markdown_report(md, report_dir, "ScaleLong comparison"), table
