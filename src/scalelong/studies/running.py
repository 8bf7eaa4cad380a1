"""Running a study: every run an ordinary training run, checked before the first starts,
trained one after another or ``jobs`` at a time, reused once it has concluded.

A run that diverges is a result, never an abort: :func:`run_all` finishes the other runs, and a
run that fails is reported in one line. Finished runs of the same config are reused, so
re-running a study resumes it; ``jobs`` > 1 trains that many runs at a time in worker processes
that divide the cores, each on its own GPU where there are GPUs
(:func:`scalelong.training.launch.place_runs`, :func:`scalelong.training.launch.pool_map`); with a
:class:`~scalelong.studies.cluster.ClusterOptions` every run is a job of a cluster's scheduler
(:mod:`scalelong.studies.cluster`). Either way the run directory is the unit of truth: what
finished is reused, what was interrupted resumes from its last checkpoint.
"""

from __future__ import annotations

import copy
import socket
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from scalelong.errors import ScaleLongError
from scalelong.runlog.lock import holder, lock_state
from scalelong.skips import METHODS
from scalelong.training.build import check_models
from scalelong.training.config import Config, config_to_dict, save_config, validate
from scalelong.training.launch import (
    PoolStopped,
    launch_processes,
    place_runs,
    pool_map,
    sigterm_as_interrupt,
)
from scalelong.training.runs import RunDir, config_differences
from scalelong.training.train import TrainingInterrupted, TrainingStopped, train

if TYPE_CHECKING:
    from scalelong.studies.cluster import ClusterOptions
    from scalelong.studies.progress import StudyProgress

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
    # trained | stopped (the non-finite policy) | reused | failed | training (another live process
    # holds its lock: a second study in the same folder leaves the run to it); on a cluster also
    # interrupted (its job ended before the run did: it resumes when the study is run again),
    # submitted (--no-wait) and running (a job of an earlier submission has it)
    status: str
    message: str = ""  # one line: where it stopped, or why it failed
    threads: int = 0  # torch threads it trained with (0: not trained now)

    @property
    def unfinished(self) -> bool:
        """Whether the run is still to be (or being) trained: interrupted, submitted, running or
        training (elsewhere)."""
        return self.status in ("interrupted", "submitted", "running", "training")


def concluded(run: RunDir) -> bool:
    """Whether a run ended with a result: it completed, or the non-finite policy stopped it (its
    summary records where). Interrupted and failed runs are not: a study trains them on."""
    summary = run.summary or {}
    return run.finished or (summary.get("status") == "stopped" and "stopped" in summary)


def stored_config(run: RunDir) -> dict | None:
    """The config of the run in ``run`` (:meth:`RunDir.stored_config`: config.yaml, or the newest
    checkpoint's when that file is missing, empty or damaged, as training recovers it), quietly;
    None when the folder holds no run whose config can be read."""
    if not run.config_file.is_file() and not (run.path.is_dir() and run.checkpoints()):
        return None
    try:
        return run.stored_config(warn=lambda message: None)
    except ScaleLongError:
        return None


def reusable(run: RunDir, cfg: Config) -> bool:
    """A concluded run (:func:`concluded`) of this very config, up to :data:`STUDY_FREE_KEYS`."""
    if not concluded(run):
        return False
    stored = stored_config(run)
    return stored is not None and not config_differences(stored, config_to_dict(cfg), free=STUDY_FREE_KEYS)


def trained_elsewhere(run: RunDir) -> str:
    """``pid N on host H (since ...) trains it`` when a live process other than this one holds the
    lock of ``run`` (one on another host counts as live: this host cannot see it); "" otherwise."""
    state, record = lock_state(run.lock_file)
    if state != "live" or not record:
        return ""
    why = f"{holder(record)} trains it"
    if record["host"] != socket.gethostname():  # a job killed outright leaves its lock behind
        why += f" (if no process there trains it any more, delete {run.lock_file} and run this again)"
    return why


def plan_action(cfg: Config) -> str:
    """What a study would do with the run of ``cfg``: ``reuse`` a finished run (:func:`reusable`),
    leave it to the process that holds its lock (``training``), ``resume`` an unfinished one, or
    train a ``new`` one."""
    run = RunDir(cfg.run_dir)
    if reusable(run, cfg):
        return "reuse"
    if lock_state(run.lock_file)[0] == "live":
        return "training"
    return "resume" if stored_config(run) is not None else "new"


def _differences(diff: list[str]) -> str:
    return "; ".join(diff[:3]) + ("; ..." if len(diff) > 3 else "")


def check_run_dirs(cfgs: Iterable[Config]) -> None:
    """Before any run starts: every run folder can be a folder (no file where it or a folder
    above it would be), and none holds a run another config can't resume, or a concluded run
    (:func:`concluded`) that another config would relabel (it differs beyond
    :data:`STUDY_FREE_KEYS`: resuming it would rewrite its config, or train it on)."""
    for cfg in cfgs:
        run = RunDir(cfg.run_dir)
        for folder in (run.path, *run.path.parents):  # the first that exists must be a folder
            if folder.is_dir():
                break
            if folder.exists() or folder.is_symlink():
                raise ScaleLongError(
                    f"{folder} is not a folder, but run {cfg.name} would be written in {run}; "
                    "remove it or choose another output folder"
                )
        if not run.path.is_dir() or not any(p != run.lock_file for p in run.path.iterdir()):
            continue
        stored = stored_config(run)
        if stored is None:
            raise ScaleLongError(
                f"{run} exists but holds no run whose config can be read (config.yaml missing, empty or "
                "damaged, and no checkpoint stores it); remove it or choose another name"
            )
        new = config_to_dict(cfg)
        diff = config_differences(stored, new)
        if diff:
            raise ScaleLongError(
                f"{run} holds a run of another config ({_differences(diff)}); remove it or choose "
                "another name"
            )
        diff = config_differences(stored, new, free=STUDY_FREE_KEYS) if concluded(run) else []
        if diff:
            raise ScaleLongError(
                f"{run} holds a finished run of another config ({_differences(diff)}), which this study "
                "would relabel; remove that run folder or choose another name"
            )


def train_run(
    cfg: Config,
    progress: bool = False,
    train_kwargs: Mapping | None = None,
    processes: int = 1,
    ignore_signals: Sequence[int] = (),
) -> RunOutcome:
    """Train one run of a study, here or in a worker: its outcome, never an exception (but an
    interrupt). ``train_kwargs`` go to :func:`scalelong.training.train.train` (hooks). ``processes`` > 1:
    the run spans that many processes of this machine (one per visible GPU, through Accelerate),
    started as ``scalelong train --num-processes`` starts them (:func:`train_in_processes`)."""
    if processes > 1:
        if train_kwargs:
            raise ScaleLongError("hooks (train_kwargs) reach only a run trained in this process")
        outcome = train_in_processes(cfg, processes, ignore_signals)
    else:
        outcome = _train_here(cfg, progress, train_kwargs)
    if outcome.status == "failed":
        # refused because another process took the run's lock after the study looked (a second study
        # in the same folder): that process trains it, which is no failure of this study
        why = trained_elsewhere(RunDir(cfg.run_dir))
        if why:
            return RunOutcome(cfg.name, "training", f"not trained here: {why}", outcome.threads)
    return outcome


def _train_here(cfg: Config, progress: bool, train_kwargs: Mapping | None) -> RunOutcome:
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


def train_in_processes(cfg: Config, processes: int, ignore_signals: Sequence[int] = ()) -> RunOutcome:
    """One run on ``processes`` processes of this machine (``scalelong train CONFIG
    --num-processes N``, its config written to a temporary file); the outcome is read back from
    the run's summary.json. This process interrupted raises :class:`TrainingInterrupted`, as
    in-process; a run whose processes ended early otherwise (one died, and the launcher stopped
    the others) failed, with the launcher's line."""
    run = RunDir(cfg.run_dir)

    def written() -> int | None:  # when summary.json was last written (None: it is not there)
        return run.summary_file.stat().st_mtime_ns if run.summary_file.is_file() else None

    before, code = written(), None
    # SIGTERM (a pool shutting down, a scheduler) here, as Ctrl-C: the processes get it in turn and
    # end their run cleanly (launch_processes) instead of training on for nobody
    with tempfile.TemporaryDirectory(prefix="scalelong-run-") as tmp, sigterm_as_interrupt():
        path = Path(tmp) / "config.yaml"
        save_config(cfg, path)
        try:
            code = launch_processes(
                processes, ["train", str(path), "--no-progress"], ignore_signals, run_dir=cfg.run_dir
            )
        except KeyboardInterrupt:
            pass
    # a summary left by an earlier attempt says nothing of this one (refused before it began)
    summary = (run.summary or {}) if written() not in (None, before) else {}
    status, error = summary.get("status"), " ".join(str(summary.get("error") or "").split())
    if code is None:
        raise TrainingInterrupted(error or f"{run} was interrupted; re-run the same command to resume")
    if code == 0 and status == "complete":
        return RunOutcome(cfg.name, "trained", "", torch.get_num_threads())
    if status == "stopped" and "stopped" in summary:
        stopped = summary["stopped"]
        return RunOutcome(cfg.name, "stopped", f"stopped at step {stopped['step']} ({stopped['kind']})")
    # "interrupted" with this process not interrupted (code not None): a process died (the OOM
    # killer's SIGKILL, a crash) and the launcher stopped the others; a failure of this run alone,
    # which the next start of the study resumes
    why = error or f"its {processes} processes ended with exit code {code} (their error line is above)"
    return RunOutcome(cfg.name, "failed", why)


def train_job(cfg: Config, train_kwargs: Mapping | None = None, processes: int = 1) -> RunOutcome:
    """:func:`train_run` as a scheduler's job runs it: a run that was interrupted (its job
    pre-empted, at its time limit, cancelled) is an outcome, ``interrupted``, which submitting the
    study again resumes; the processes of a run on several GPUs ignore the scheduler's warning
    signal, which this process acts on for them."""
    from scalelong.studies.cluster import warning_signal

    try:
        return train_run(cfg, False, train_kwargs, processes, ignore_signals=(warning_signal(),))
    except TrainingInterrupted as e:
        return RunOutcome(cfg.name, "interrupted", " ".join(str(e).split()), torch.get_num_threads())


def _submit(
    cfgs: Sequence[Config],
    todo: list[int],
    outcomes: dict[int, RunOutcome],
    cluster: ClusterOptions,
    jobs: int | None,
    gpus_per_run: int,
    train_kwargs: Mapping | None,
) -> tuple[list[int], Iterator[tuple[int, object]]]:
    """Submit the runs ``todo`` of ``cfgs`` as jobs (:func:`scalelong.studies.cluster.job_map`),
    but those a job of an earlier submission still has (into ``outcomes`` as ``running``), or a
    live process trains (its lock: ``training``). Returns the submitted indices and their outcomes
    as they come, in the order of the indices."""
    from scalelong.studies.cluster import JobEnded, active_jobs, job_map
    from scalelong.training.launch import cpu_cores

    folder = cluster.job_folder(Path(cfgs[todo[0]].out_dir))
    active = active_jobs(cluster, folder, [cfgs[i].name for i in todo])
    for i in todo:
        name = cfgs[i].name
        if name in active:
            why, status = f"job {active[name]} of an earlier submission has it", "running"
        else:  # this host's live process, or one elsewhere
            why, status = trained_elsewhere(RunDir(cfgs[i].run_dir)), "training"
        if why:
            outcomes[i] = RunOutcome(name, status, why)
            print(f"{name}: not submitted again: {why}")
    rest = [i for i in todo if i not in outcomes]
    if not rest:
        return rest, iter(())
    names = [cfgs[i].name for i in rest]
    # the local executor's jobs share this machine's cores, as the pool's workers do
    at_once = min(jobs or len(rest), len(rest))
    threads = max(1, cpu_cores() // at_once) if cluster.executor == "local" else None
    gpus = cfgs[0].train.device != "cpu"
    args = [(cfgs[i], train_kwargs, gpus_per_run) for i in rest]

    def outcomes_of(results: Iterator[tuple[int, object]]) -> Iterator[tuple[int, object]]:
        for j, result in results:
            if result == "submitted":
                result = RunOutcome(names[j], "submitted")
            elif isinstance(result, JobEnded):
                result = RunOutcome(names[j], "interrupted", f"{result}; the same command resumes it")
            yield j, result

    return rest, outcomes_of(
        job_map(train_job, args, names, cluster, folder, jobs, gpus_per_run, gpus, threads)
    )


def placement_line(
    cfgs: Sequence[Config],
    jobs: int | None = None,
    gpus_per_run: int = 1,
    cluster: ClusterOptions | None = None,
) -> str:
    """The plan's line on where the runs of ``cfgs`` would train (``jobs`` None: 1 here, no cap on
    a cluster; a cluster's jobs: those of the runs it would submit, new or resumed, as
    :func:`plan_action` tells); raises the one-line error that the study itself would."""
    if cluster is not None:
        runs = sum(plan_action(c) in ("new", "resume") for c in cfgs)
        if not runs:
            return f"nothing to submit: each of the {len(cfgs)} runs is finished or being trained"
        cluster.check_jobs(jobs, runs)
        gpus = cfgs[0].train.device != "cpu"
        return cluster.describe(runs, jobs, gpus_per_run, gpus)
    device = cfgs[0].train.device if cfgs else "auto"
    return str(place_runs(1 if jobs is None else jobs, gpus_per_run, device, len(cfgs)))


def run_all(
    cfgs: Sequence[Config],
    jobs: int | None = 1,
    progress: bool = True,
    train_kwargs: Mapping | None = None,
    gpus_per_run: int = 1,
    cluster: ClusterOptions | None = None,
) -> list[RunOutcome]:
    """Train every config and return the outcomes in order; finished runs are reused (see
    :func:`reusable`), unfinished ones resume.

    ``jobs`` 1 (or None) trains one after another in this process; ``jobs`` J > 1 trains J at a
    time in spawned workers with ``cores // J`` torch threads each and, where there are GPUs, GPUs
    of their own (``gpus_per_run`` each; :func:`scalelong.training.launch.place_runs`); ``train_kwargs``
    must then pickle. ``cluster``: every run a job of a scheduler
    (:func:`scalelong.studies.cluster.job_map`; ``jobs``: at most that many at once; a run whose
    job ends early is ``interrupted``, and ``submitted`` without waiting). A run that stops or
    fails is reported in one line and the others go on. A run whose lock another live process
    holds (a second study in the same folder, here or on a cluster) is left to it: ``training``,
    in one line, and no failure.
    """
    if jobs is not None and jobs < 1:
        raise ScaleLongError(f"--jobs must be >= 1, got {jobs}")
    place = None
    if cluster is None and cfgs:  # GPUs asked for that are not here: one line before anything else
        place = place_runs(jobs or 1, gpus_per_run, cfgs[0].train.device)
    check_run_dirs(cfgs)
    outcomes = {i: RunOutcome(c.name, "reused") for i, c in enumerate(cfgs) if reusable(RunDir(c.run_dir), c)}
    todo = [i for i in range(len(cfgs)) if i not in outcomes]
    if outcomes:
        print(f"{len(outcomes)} of {len(cfgs)} runs are finished already and reused")
    if cluster is None:  # a run whose lock another process holds (a second study in the same folder)
        for i in todo:  # is left to it (a cluster's are, where they are submitted: _submit)
            why = trained_elsewhere(RunDir(cfgs[i].run_dir))
            if why:
                outcomes[i] = RunOutcome(cfgs[i].name, "training", f"not trained here: {why}")
                print(f"{cfgs[i].name}: not trained here: {why}", flush=True)
        todo = [i for i in todo if i not in outcomes]
    check_models(cfgs[i] for i in todo)  # here, once per model config, so no worker needs to
    if not todo:
        return [outcomes[i] for i in range(len(cfgs))]
    results: Iterator[tuple[int, object]]
    shown: StudyProgress | None = None  # a cluster's executor keeps its own output
    if cluster is not None:
        todo, results = _submit(cfgs, todo, outcomes, cluster, jobs, gpus_per_run, train_kwargs)
    else:
        place = place.for_runs(len(todo))
        if place.workers > 1 or place.gpus:
            print(f"{len(todo)} runs: {place}", flush=True)
        solo = place.workers == 1
        # the study's progress lines replace a run's own bar, in this process as in workers
        args = [(cfgs[i], False, train_kwargs, gpus_per_run) for i in todo]
        results = pool_map(train_run, args, place.workers, None if solo else place.threads, place.gpus)
        if progress:
            from scalelong.studies.progress import StudyProgress

            shown = StudyProgress([(cfgs[i].name, cfgs[i].run_dir, cfgs[i].train.steps) for i in todo])
    try:
        _collect(cfgs, todo, results, outcomes, shown)
    finally:
        if shown is not None:
            shown.close()
    return [outcomes[i] for i in range(len(cfgs))]


def _collect(
    cfgs: Sequence[Config],
    todo: list[int],
    results: Iterator[tuple[int, object]],
    outcomes: dict[int, RunOutcome],
    shown: StudyProgress | None,
) -> None:
    """Each run's outcome into ``outcomes`` as it comes, and its line (with the run's last numbers
    where ``shown`` follows the study's progress)."""
    for done, (j, result) in enumerate(results, start=1):
        name = cfgs[todo[j]].name
        if isinstance(result, (TrainingInterrupted, PoolStopped)):
            raise result
        if isinstance(result, BaseException):  # the worker process itself failed
            said = " ".join(str(result).split())
            if not isinstance(result, ScaleLongError):  # a user's error says itself; a bug shows its kind
                said = f"{type(result).__name__}: {said}"
            result = RunOutcome(name, "failed", said)
        outcomes[todo[j]] = result
        if result.status in ("submitted", "running"):
            continue  # said once for all of them where they were submitted
        line = f"[{done}/{len(todo)}] {name}: " + (
            f"{result.status}: {result.message}"
            if result.status in ("failed", "interrupted")
            else result.message or result.status
        )
        file = sys.stderr if result.status == "failed" else sys.stdout
        if shown is None:
            print(line, file=file, flush=True)
        else:
            numbers = shown.finished(name)
            shown.note(f"{line} ({numbers})" if numbers else line, file)


def check_plan(cfgs: Sequence[Config]) -> None:
    """What a study checks before its first run, writing nothing: every run's config is valid,
    no run folder holds a run of another config (:func:`check_run_dirs`) and every model accepts
    its input shape (:func:`scalelong.training.build.check_models`)."""
    for cfg in cfgs:
        try:
            validate(copy.deepcopy(cfg))  # validation resolves defaults in place; the plan stays as built
        except ScaleLongError as e:
            raise ScaleLongError(f"run {cfg.name}: {e}") from None
    check_run_dirs(cfgs)
    check_models(cfgs)


def plan_table(cfgs: Sequence[Config]) -> str:
    """The runs of a study, one line each: name, skip method, seed, lr, U-ViT depth, and what the
    study will do with it (``new``; ``resume`` an unfinished run; ``reuse`` a finished one;
    ``training``: a process, here or on another host, holds the run's lock now)."""
    rows = [("run", "method", "seed", "lr", "depth", "action")]
    for cfg in cfgs:
        action = plan_action(cfg)
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
    reading: str = ""  # the table in plain sentences (:func:`scalelong.studies.compare.reading.reading`)
    reported: bool = True  # False: no report was written (jobs submitted without waiting, nothing finished)

    @property
    def failed(self) -> list[RunOutcome]:
        return [o for o in self.outcomes if o.status == "failed"]

    @property
    def unfinished(self) -> list[RunOutcome]:
        """Runs this study's jobs have still to finish: interrupted, submitted or running."""
        return [o for o in self.outcomes if o.unfinished and o.status != "training"]

    @property
    def elsewhere(self) -> list[RunOutcome]:
        """Runs another process trains (it holds their locks), which this study left to it."""
        return [o for o in self.outcomes if o.status == "training"]
