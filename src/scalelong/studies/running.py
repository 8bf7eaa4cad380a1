"""Running a study: every run an ordinary training run, checked before the first starts,
trained one after another or ``jobs`` at a time, reused once it has concluded.

A run that diverges is a result, never an abort: :func:`run_all` finishes the other runs, and a
run that fails is reported in one line. Finished runs of the same config are reused, so
re-running a study resumes it; ``jobs`` > 1 trains that many runs at a time in worker processes
that divide the cores (:func:`scalelong.launch.pool_map`).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from scalelong.build import check_models
from scalelong.config import Config, config_to_dict, read_yaml, validate
from scalelong.errors import ScaleLongError
from scalelong.launch import PoolStopped, pool_map
from scalelong.runs import RunDir, config_differences
from scalelong.skips import METHODS
from scalelong.train import TrainingInterrupted, TrainingStopped, train

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
    """``--methods "none,cs"`` -> ``["none", "cs"]``: known skip methods, each once."""
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
    reading: str = ""  # the table in plain sentences (:func:`scalelong.studies.reading.reading`)

    @property
    def failed(self) -> list[RunOutcome]:
        return [o for o in self.outcomes if o.status == "failed"]
