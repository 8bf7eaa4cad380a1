"""A study's runs read back, and the one per-seed summary that every table of a study reads.

:func:`read_run` reads a run directory with the verdict of the divergence rule;
:func:`summarise_run` turns it into a :class:`SeedSummary`, the numbers of that one seed. A
study groups seeds: :class:`MethodSummary` (a method of a comparison, with its steps to the
baseline's final FD) and :class:`CellSummary` (a cell of a map: depth, lr, method). Both compare
with a baseline group through :meth:`SeedGroup.against`, the one paired estimator
(:func:`scalelong.studies.statistics.contrast`), by seed value. The per-cell summaries
(:func:`summarise_cells`) are what a reading across learning rates works from.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

from scalelong.diagnostics import metric_names as names
from scalelong.errors import ScaleLongError
from scalelong.runlog.records import Records, as_float, load_metrics, series
from scalelong.studies.divergence import DEFAULT_RULE, Divergence, DivergenceRule, divergence, feature_growth
from scalelong.studies.heldout import heldout_error, heldout_x0_error, initial_x0_error
from scalelong.studies.statistics import Contrast, contrast
from scalelong.training.runs import RunDir


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
    warmup_steps: int = 0  # its optim.warmup_steps: where feature growth is measured from
    prediction: str = ""  # its diffusion.prediction: eps runs are judged by their noise error


def read_run(run_dir: str | Path, rule: DivergenceRule = DEFAULT_RULE, error: str = "") -> StudyRun:
    """The run of ``run_dir`` as a study sees it; ``error``: it failed, so only its name counts."""
    run = RunDir(run_dir)
    if error or not run.metrics_file.is_file():
        return StudyRun(run.name, [], {}, [], error or "no metrics", run.path)
    records, summary = load_metrics(run, print), run.summary or {}
    cfg = run.config()
    breaks = divergence(
        records, summary.get("stopped"), cfg.optim.warmup_steps, rule, cfg.diffusion.prediction
    )
    return StudyRun(
        run.name,
        records,
        summary,
        breaks,
        path=run.path,
        seed=cfg.train.seed,
        warmup_steps=cfg.optim.warmup_steps,
        prediction=cfg.diffusion.prediction,
    )


def broken_runs(runs: Iterable[StudyRun]) -> list[str]:
    """Markdown list items: each run that diverged (criterion, step, numbers) or failed."""
    lines = []
    for r in runs:
        if r.error:
            lines.append(f"- `{r.name}`: failed: {r.error}")
        lines += [f"- `{r.name}`: {d}" for d in r.breaks]
    return lines


# ----------------------------------------------------------------------------- values of one run


def _finite(records: Records, key: str) -> list[float]:
    """The finite values of ``key`` in step order."""
    return [v for v in series(records, key)[1] if math.isfinite(v)]


def last_value(records: Records, key: str) -> float:
    """The last finite value of ``key`` in step order (NaN if it has none)."""
    finite = _finite(records, key)
    return finite[-1] if finite else math.nan


def mean_value(records: Records, key: str) -> float:
    """The mean of the finite values of ``key`` (NaN if it has none)."""
    finite = _finite(records, key)
    return statistics.fmean(finite) if finite else math.nan


def least_value(records: Records, key: str) -> float:
    """The smallest finite value of ``key`` (NaN if it has none)."""
    return min(_finite(records, key), default=math.nan)


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


# ----------------------------------------------------------------------------- the per-seed summary


@dataclass(frozen=True)
class SeedSummary:
    """What a study reads from one run (one seed); NaN where the run did not log it."""

    seed: int | None = None  # its train.seed: what pairs it with the baseline's run
    final_fd: float = math.nan  # the last finite Frechet distance (``fd``)
    final_loss: float = math.nan
    feature_norm: float = math.nan  # the last logged hidden-feature norm (the paper's Fig. 1)
    feature_osc: float = math.nan  # mean sliding-window std of the hidden-feature norm
    feature_growth: float = math.nan  # the last hidden-feature norm over its value at the end of warm-up
    spikes: float = math.nan  # loss spikes by the end
    fp16_headroom: float = math.nan  # the least ``fp16/headroom`` of the run; below 1 fp16 overflows
    confident: float = math.nan  # digit score of the last evaluation (fd-mnist)
    entropy: float = math.nan  # its class balance
    x0_error: float = math.nan  # held-out x0 error of the last probe (:func:`heldout_x0_error`), EMA
    x0_error_raw: float = math.nan  # the same of the trained weights (``diagnostics.noise_levels_raw``)
    x0_error_start: float = math.nan  # of the untrained model, at step 0 (:func:`initial_x0_error`)
    x0_mean_image: float = math.nan  # the mean image's x0 error on the same held-out images
    eps_error: float = math.nan  # held-out error of the predicted noise (:func:`heldout_error`), EMA
    eps_error_raw: float = math.nan  # the same of the trained weights
    eps_error_start: float = math.nan  # of the untrained model, at step 0
    overflow_steps: float = math.nan  # steps an fp16 run's loss scaler skipped with a finite loss
    nonfinite_steps: float = math.nan  # steps skipped for a non-finite loss (or gradients, without a scaler)
    breaks: tuple[Divergence, ...] = ()  # the divergence rule's verdict; empty: healthy
    precision: str = ""  # what the run computed in (its provenance): fp32, bf16, fp16; "" unrecorded
    last_skipped: str = ""  # why its last skipped step was skipped (summary.json); "" none or unrecorded
    prediction: str = ""  # what the network predicts (diffusion.prediction); "" unrecorded


def summarise_run(run: StudyRun) -> SeedSummary:
    """The :class:`SeedSummary` of one run (a failed run: its seed and NaN)."""
    r = run.records
    return SeedSummary(
        seed=run.seed,
        final_fd=last_value(r, names.FD),
        final_loss=last_value(r, names.LOSS),
        feature_norm=last_value(r, names.FEATURE_NORM),
        feature_osc=mean_value(r, names.osc(names.FEATURE_NORM, "std")),
        feature_growth=feature_growth(r, run.warmup_steps),
        spikes=last_value(r, names.SPIKES),
        fp16_headroom=least_value(r, names.FP16_HEADROOM),
        confident=last_value(r, names.DIGITS_CONFIDENT),
        entropy=last_value(r, names.DIGITS_ENTROPY),
        x0_error=heldout_x0_error(r),
        x0_error_raw=heldout_x0_error(r, weights="raw"),
        x0_error_start=initial_x0_error(r),
        x0_mean_image=last_value(r, names.X0_MEAN_IMAGE),
        eps_error=heldout_error(r, "eps"),
        eps_error_raw=heldout_error(r, "eps", weights="raw"),
        eps_error_start=initial_x0_error(r, kind="eps"),
        overflow_steps=as_float(run.summary.get("overflow_steps")),
        nonfinite_steps=as_float(run.summary.get("nonfinite_steps")),
        breaks=tuple(run.breaks),
        precision=str((run.summary.get("provenance") or {}).get("precision") or ""),
        last_skipped=str(run.summary.get("last_skipped") or ""),
        prediction=run.prediction,
    )


VALUES = tuple(f.name for f in fields(SeedSummary) if f.type == "float")  # what a group tabulates


class SeedGroup:
    """The seeds of one group of runs (``runs``, one :class:`SeedSummary` per seed, in seed order):
    their values, their divergence verdicts and the contrast with a baseline group."""

    runs: list[SeedSummary]

    def values(self, key: str) -> list[float]:
        """``key`` (a float field of :class:`SeedSummary`, e.g. ``final_loss``) of every seed."""
        if key not in VALUES:
            raise ScaleLongError(f"no per-seed value {key!r}; choose from {', '.join(VALUES)}")
        return [getattr(r, key) for r in self.runs]

    @property
    def seeds(self) -> list[int | None]:
        return [r.seed for r in self.runs]

    @property
    def count(self) -> int:
        return len(self.runs)

    @property
    def breaks(self) -> list[list[Divergence]]:
        return [list(r.breaks) for r in self.runs]

    @property
    def diverged(self) -> int:
        return sum(bool(r.breaks) for r in self.runs)

    def against(self, baseline: SeedGroup, key: str, ratio: bool = False) -> Contrast | None:
        """``key`` of this group against ``baseline``'s, paired by seed value
        (:func:`scalelong.studies.statistics.contrast`); ``ratio``: on the log scale."""
        return contrast(self.values(key), baseline.values(key), self.seeds, baseline.seeds, ratio)


@dataclass
class MethodSummary(SeedGroup):
    """A method of a comparison: its seeds, and the step at which each reached the final FD of
    the baseline's run of the same seed (None: never, or no such run)."""

    method: str
    runs: list[SeedSummary]
    steps_to_target: list[int | None] = field(default_factory=list)  # per seed, as ``runs``

    def fd_change(self, baseline: MethodSummary) -> Contrast | None:
        """The final FD as a ratio to the baseline's (geometric mean over paired seeds)."""
        return self.against(baseline, "final_fd", ratio=True)

    def speedup(self, baseline: MethodSummary) -> Contrast | None:
        """The baseline's steps to its final FD over this method's, seed by seed (the seeds where
        both got there), as a geometric-mean ratio: 2 is twice as fast."""

        def steps(s: MethodSummary) -> list[float]:
            return [math.nan if x is None else float(x) for x in s.steps_to_target]

        return contrast(steps(baseline), steps(self), baseline.seeds, self.seeds, ratio=True)


@dataclass(frozen=True)
class Cell:
    """One point of a map: (depth, lr, method)."""

    depth: int | None  # model.uvit.depth; None for a backbone without one
    lr: float
    method: str

    def name(self, seed: int) -> str:
        """The run's folder name, e.g. ``d12-lr0.01-cs-seed0``."""
        depth = "" if self.depth is None else f"d{self.depth}-"
        return f"{depth}lr{self.lr:g}-{self.method}-seed{seed}"


@dataclass
class CellSummary(SeedGroup):
    """A cell of a map and its seeds; ``metric`` is the map's final metric, ``fd`` or ``loss``."""

    cell: Cell
    runs: list[SeedSummary]
    metric: str = names.LOSS

    @property
    def final(self) -> list[float]:
        """The final ``metric`` of every seed."""
        return self.values(f"final_{self.metric}")


def summarise_cells(runs: Mapping[Cell, Sequence[StudyRun]], metric: str) -> list[CellSummary]:
    """One :class:`CellSummary` per cell, its runs in the order given; ``metric``: ``fd`` or ``loss``."""
    return [CellSummary(cell, [summarise_run(r) for r in rs], metric) for cell, rs in runs.items()]
