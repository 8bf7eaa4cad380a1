"""A study's runs as jobs of a cluster's scheduler: SLURM, through submitit.

``scalelong sweep ... --executor slurm`` submits every run that is not finished as one job of one
SLURM job array (one call to the scheduler; ``--jobs J`` caps the jobs running at once), each
job one run on one node with ``--gpus-per-run`` GPUs. submitit pickles the call (the run's config
and :class:`ScheduledCall`), writes the sbatch script, and hands back each job's result; its job
folder lies in the study folder (``<study>/slurm/<job id>/``: the sbatch script, the job's log).
``--executor local`` runs the same jobs through submitit's LocalExecutor: real processes of this
machine, no scheduler, to try the path before a cluster sees it.

The run directory stays the unit of truth, as for the local pool: a run whose job ended early
(pre-empted, at its time limit, cancelled, its node lost) keeps its last complete checkpoint,
and submitting the same study again reuses what finished and resumes the rest. SLURM warns a
job ``signal_delay_s`` seconds before its time limit (and, where the cluster is set up for it,
before a pre-emption) with SIGUSR2: submitit then requeues the job with the same call
(:meth:`ScheduledCall.__submitit_checkpoint__`), :class:`ScheduledCall` ends the run the way
Ctrl-C does, and the requeued job resumes it. A plain SIGTERM (``scancel``, a pre-emption
without the warning) ends the run the same clean way, without the requeue.

submitit is an optional dependency (``pip install scalelong[slurm]``), imported where a job is
submitted or waited on. Nothing here imports the rest of the study library: the caller
(:func:`scalelong.studies.running.run_all`) hands in the function each job runs.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from scalelong.errors import ScaleLongError

EXECUTORS = ("slurm", "local")
LEDGER = "submitted.jsonl"  # in the job folder: one line per job submitted (run, job id, host)
# Scheduler states of a job that is queued or running, so its run must not be submitted again.
ACTIVE_STATES = {"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING", "SUSPENDED"}
ACTIVE_STATES |= {"REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT"}


def import_submitit():
    """submitit, or one error line naming the extra that installs it."""
    try:
        import submitit
    except ImportError:
        raise ScaleLongError(
            "--executor slurm and --executor local submit runs through submitit, which is not "
            "installed: pip install 'scalelong[slurm]' (or pip install submitit)"
        ) from None
    return submitit


def parse_time(text: str) -> int:
    """An sbatch ``--time`` (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in whole minutes."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not m:
        raise ScaleLongError(
            f"--time {text!r}: give minutes or sbatch's [D-]HH:MM:SS, e.g. --time 240 or --time 4:00:00"
        )
    days, a, b, c = (int(x) if x is not None else None for x in m.groups())
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        seconds = days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    elif c is not None:  # HH:MM:SS
        seconds = a * 3600 + b * 60 + c
    elif b is not None:  # MM:SS
        seconds = a * 60 + b
    else:  # minutes
        seconds = a * 60
    if seconds <= 0:
        raise ScaleLongError(f"--time {text!r} must be longer than 0")
    return math.ceil(seconds / 60)


def parse_sbatch(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``--sbatch account=proj --sbatch qos=high`` -> (("account", "proj"), ("qos", "high")):
    more sbatch parameters, written into each job's script as ``#SBATCH --account=proj``."""
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().removeprefix("--")
        if not key or not re.fullmatch(r"[A-Za-z][\w-]*", key):
            raise ScaleLongError(
                f"--sbatch {item!r}: give KEY=VALUE (or KEY alone for a flag), e.g. account=proj"
            )
        pairs.append((key, value.strip() if sep else ""))
    return tuple(pairs)


def _hms(minutes: int) -> str:
    days, rest = divmod(minutes, 1440)
    return (f"{days}-" if days else "") + f"{rest // 60}:{rest % 60:02d}:00"


@dataclass(frozen=True)
class ClusterOptions:
    """How a study's runs are submitted (the command line's ``--executor`` and what goes with it)."""

    executor: str = "slurm"  # slurm | local (submitit's LocalExecutor: jobs as processes of this machine)
    folder: Path | None = None  # submitit's job folder; None: ``slurm/`` beside the study's ``runs/``
    partition: str | None = None  # sbatch --partition; None: the cluster's default
    time_min: int = 240  # sbatch --time of each job; a run that needs longer is requeued and resumes
    sbatch: tuple[tuple[str, str], ...] = ()  # more sbatch parameters (parse_sbatch)
    setup: tuple[str, ...] = ()  # shell lines each job runs first, e.g. "module load cuda"
    wait: bool = True  # wait for the jobs and write the report; False: submit and return
    signal_delay_s: int = 120  # the warning before the time limit: time to end a run cleanly
    poll_s: float | None = None  # how often the waiting process looks at the jobs (None: 30 s, local 1 s)
    name: str = "scalelong"  # the jobs' name in squeue
    extra: dict = field(default_factory=dict)  # more submitit parameters, passed as they are

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ScaleLongError(f"--executor {self.executor!r}: choose pool, {' or '.join(EXECUTORS)}")

    def check_jobs(self, jobs: int | None, runs: int) -> None:
        """Refuse a cap of ``jobs`` on ``runs`` jobs that nothing would hold: submitit's local executor
        starts each job the moment it is submitted (it has no array parallelism), so local jobs run
        ``jobs`` at a time only while this process waits and submits the next as one ends."""
        if self.executor == "local" and not self.wait and jobs is not None and jobs < runs:
            raise ScaleLongError(
                f"--jobs {jobs} with --executor local --no-wait: submitit's local executor starts all {runs} "
                f"jobs at once, and only a command that waits starts them {jobs} at a time; drop --no-wait "
                "(and keep the command running, e.g. under nohup or in tmux), or drop --jobs"
            )

    def job_folder(self, runs_dir: Path) -> Path:
        return Path(self.folder) if self.folder is not None else Path(runs_dir).parent / "slurm"

    def parameters(self, jobs: int | None, gpus_per_run: int, gpus: bool, runs: int | None = None) -> dict:
        """submitit's ``update_parameters`` of every job: one task on one node, ``gpus_per_run``
        GPUs when the runs train on GPUs (``gpus``), the time limit and the rest. SLURM: at most
        ``jobs`` of the array's ``runs`` jobs running at once (``jobs`` None: all of them)."""
        p: dict = {
            "name": self.name,
            "timeout_min": self.time_min,
            "nodes": 1,
            "tasks_per_node": 1,
            "gpus_per_node": gpus_per_run if gpus else 0,
        }
        if self.executor == "slurm":
            p["slurm_signal_delay_s"] = self.signal_delay_s
            if self.partition:
                p["slurm_partition"] = self.partition
            if jobs or runs:  # no --jobs: the whole array, not submitit's default cap of 256
                p["slurm_array_parallelism"] = jobs or runs
            if self.sbatch:
                p["slurm_additional_parameters"] = {k: (v if v else True) for k, v in self.sbatch}
            if self.setup:
                p["slurm_setup"] = list(self.setup)
        elif self.setup:
            p["local_setup"] = list(self.setup)
        return {**p, **self.extra}

    def describe(self, runs: int, jobs: int | None, gpus_per_run: int, gpus: bool = True) -> str:
        """The plan line, with the sbatch parameters each job gets."""
        each = f"{gpus_per_run} GPU{'s' if gpus_per_run > 1 else ''}" if gpus else "no GPU"
        said = f"{runs} run{'' if runs == 1 else 's'}"
        if self.executor == "local":
            cap = f"{jobs} at a time" if jobs else "all at once"
            return (
                f"{said} as submitit jobs on this machine (--executor local), {cap}, {each} "
                f"each, time limit {_hms(self.time_min)}"
            )
        flags = [f"--time={_hms(self.time_min)}", "--nodes=1", "--ntasks-per-node=1"]
        if self.partition:
            flags.insert(0, f"--partition={self.partition}")
        if gpus:
            flags.append(f"--gpus-per-node={gpus_per_run}")
        flags.append(f"--array=0-{max(runs - 1, 0)}" + (f"%{jobs}" if jobs else ""))
        flags.append(f"--signal=USR2@{self.signal_delay_s}")
        flags += [f"--{k}={v}" if v else f"--{k}" for k, v in self.sbatch]
        cap = f"at most {jobs} at once" if jobs else "as many at once as the scheduler allows"
        return f"{said} as one SLURM job array, {cap}, {each} each; sbatch {' '.join(flags)}"


# ----------------------------------------------------------------------------- in the job


def warning_signal() -> int:
    """The signal SLURM sends a submitit job before its time limit (SIGUSR2 unless
    ``SUBMITIT_PREEMPT_SIGNAL`` names another)."""
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), signal.SIGUSR2)


@contextmanager
def _warning_as_interrupt(requeued: dict) -> Iterator[None]:
    """Within a submitit job: the scheduler's warning signal lets submitit requeue the job (its
    handler, which then exits the process from wherever the signal arrived), after which the run
    is ended as Ctrl-C ends it, cleanly, and ``requeued["code"]`` holds the exit code submitit
    chose. Elsewhere (no handler of submitit's installed): nothing changes."""
    signum = warning_signal()
    previous = signal.getsignal(signum)
    if not callable(previous):
        yield
        return

    def handler(number, frame):
        signal.signal(signum, signal.SIG_IGN)  # one warning is enough,
        signal.signal(
            signal.SIGTERM, signal.SIG_IGN
        )  # and the SIGTERM after it must not cut the winding down
        try:
            previous(number, frame)  # submitit: __submitit_checkpoint__, requeue, sys.exit
        except SystemExit as e:
            requeued["code"] = e.code
        except Exception as e:  # not requeued (e.g. timed out too many times): the run ends all the same
            requeued["why"] = " ".join(str(e).split())
        raise KeyboardInterrupt

    signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, previous)


class ScheduledCall:
    """``fn(*args)`` as a scheduler's job: picklable with ``fn`` (a module-level function), with
    ``threads`` torch threads (None: as many as the job's cores), and requeued with the same
    arguments after the scheduler's warning (:meth:`checkpoint`): the job that
    follows calls ``fn`` again, and a training run resumes from its last checkpoint."""

    def __init__(self, fn: Callable, threads: int | None = None):
        self.fn, self.threads = fn, threads

    def __call__(self, *args):
        import torch

        from scalelong.training.launch import cpu_cores, sigterm_as_interrupt

        torch.set_num_threads(self.threads or cpu_cores())
        requeued: dict = {}
        # submitit ignores SIGTERM in its jobs; a run ends on it as on Ctrl-C instead (scancel)
        with sigterm_as_interrupt(), _warning_as_interrupt(requeued):
            try:
                result = self.fn(*args)
            except BaseException:
                if "code" in requeued:
                    sys.exit(requeued["code"])  # requeued: this job ends without a result
                raise
        if "code" in requeued:  # the run ended cleanly after the warning: the requeued job resumes it
            sys.exit(requeued["code"])
        return result

    def __submitit_checkpoint__(self, *args):
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, *args)

    # submitit requeues at a time limit only a function with ``checkpoint`` (SignalHandler's check)
    checkpoint = __submitit_checkpoint__


# ----------------------------------------------------------------------------- submitting, waiting


class JobEnded(ScaleLongError):
    """A job ended without a result (killed, cancelled, its node lost): its run resumes later."""


class JobFailed(ScaleLongError):
    """A job whose call raised: the error's last line and where the job's log is."""


def _ledger(folder: Path) -> dict[str, dict]:
    """The latest submission of each run, from the job folder's ledger."""
    latest: dict[str, dict] = {}
    path = folder / LEDGER
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            entry = json.loads(line)
            latest[entry["run"]] = entry
        except (ValueError, KeyError, TypeError):  # a line cut short by a kill
            continue
    return latest


def _running(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (a zombie, ended but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc: the signal test is all there is
        return True


def active_jobs(options: ClusterOptions, folder: Path, names: Sequence[str]) -> dict[str, str]:
    """Of the runs ``names``, those whose job of an earlier submission is still queued or running:
    run name -> job id (SLURM: the scheduler's state of that job; local: its controller process
    on this host). A state the scheduler cannot tell counts as ended."""
    latest = {
        n: e for n, e in _ledger(folder).items() if n in set(names) and e.get("executor") == options.executor
    }
    if not latest:
        return {}
    active = {}
    if options.executor == "local":
        for name, e in latest.items():
            if e.get("host") == socket.gethostname() and _running(int(e["job"])):
                active[name] = e["job"]
        return active
    submitit = import_submitit()
    jobs = {name: submitit.SlurmJob(folder=folder / "%j", job_id=e["job"]) for name, e in latest.items()}
    for name, job in jobs.items():
        try:
            state = job.watcher.get_state(job.job_id, mode="force")
        except Exception:  # no sacct here: the scheduler cannot say
            state = "UNKNOWN"
        if state.split()[0] in ACTIVE_STATES:
            active[name] = job.job_id
    return active


def make_executor(options: ClusterOptions, folder: Path, parameters: dict):
    """submitit's executor for ``options.executor``, its parameters set; one error line where
    there is no SLURM or a parameter is unknown."""
    submitit = import_submitit()
    try:
        executor = submitit.AutoExecutor(folder=folder / "%j", cluster=options.executor)
    except RuntimeError as e:  # SlurmExecutor: "Could not detect srun"
        raise ScaleLongError(
            f"--executor slurm: no SLURM on this machine ({' '.join(str(e).split())}); submit from the "
            "cluster's login node, or try the jobs here with --executor local"
        ) from None
    try:
        executor.update_parameters(**parameters)
    except (ValueError, TypeError, NameError) as e:  # NameError: submitit's unknown parameter
        raise ScaleLongError(
            f"submitit refused the job parameters: {' '.join(str(e).split())[:300]}"
        ) from None
    return executor


def _record(folder: Path, options: ClusterOptions, names: Sequence[str], jobs: Sequence) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    host, now = socket.gethostname(), time.strftime("%Y-%m-%d %H:%M:%S")
    lines = [
        json.dumps({"run": n, "job": str(j.job_id), "executor": options.executor, "host": host, "time": now})
        for n, j in zip(names, jobs, strict=True)
    ]
    with open(folder / LEDGER, "a") as f:
        f.write("".join(line + "\n" for line in lines))


def _outcome(job) -> object:
    """A finished job's result, or the :class:`JobEnded` / :class:`JobFailed` standing for it."""
    from submitit.core.utils import FailedJobError, UncompletedJobError

    log = job.paths.stdout
    try:
        return job.result()
    except FailedJobError as e:
        lines = [line for line in str(e).splitlines() if line.strip() and not line.startswith("-" * 10)]
        error = next((line for line in reversed(lines[:-3]) if not line.startswith(" ")), "an error")
        return JobFailed(f"job {job.job_id} failed: {error.strip()}; log: {log}")
    except UncompletedJobError:
        return JobEnded(f"job {job.job_id} ended without finishing its run ({job.state}); log: {log}")


def job_map(
    fn: Callable,
    args: Sequence[tuple],
    names: Sequence[str],
    options: ClusterOptions,
    folder: Path,
    jobs: int | None = None,
    gpus_per_run: int = 1,
    gpus: bool = True,
    threads: int | None = None,
) -> Iterator[tuple[int, object]]:
    """``(i, fn(*args[i]))`` for every i, each call a job of the scheduler, in the order they finish;
    a job that ended without a result or whose call raised yields a :class:`JobEnded` or
    :class:`JobFailed` in its place. ``names``: one per call, for the ledger (:func:`active_jobs`).

    SLURM: every call submitted at once as one job array (``jobs``: at most that many running;
    None: all of them); local: ``jobs`` at a time while this waits (None: all at once). With
    ``options.wait`` False the calls are submitted and ``(i, "submitted")`` comes back for each
    (local jobs then all at once: :meth:`ClusterOptions.check_jobs` refuses a ``jobs``). Ctrl-C
    while waiting stops the waiting, not the jobs of a cluster, with one line on how to read what
    they leave.
    """
    options.check_jobs(jobs, len(args))
    executor = make_executor(options, folder, options.parameters(jobs, gpus_per_run, gpus, len(args)))
    call = ScheduledCall(fn, threads)
    throttle = options.executor == "local" and options.wait and jobs
    first = min(jobs, len(args)) if throttle else len(args)

    def submit(indices: Sequence[int]) -> list:
        try:
            if options.executor == "slurm":
                with executor.batch():  # one job array: one call to the scheduler
                    submitted = [executor.submit(call, *args[i]) for i in indices]
            else:
                submitted = [executor.submit(call, *args[i]) for i in indices]
        except (RuntimeError, OSError) as e:  # sbatch's refusal (its stderr), or no sbatch at all
            why = " ".join(str(e).split())[:300] or type(e).__name__
            raise ScaleLongError(f"the scheduler refused the jobs: {why}") from None
        _record(folder, options, [names[i] for i in indices], submitted)
        return submitted

    running = dict(zip(range(first), submit(range(first)), strict=True))
    ids = sorted({str(j.job_id).split("_")[0] for j in running.values()})
    where = f"SLURM job array {', '.join(ids)}" if options.executor == "slurm" else "local jobs"
    print(f"submitted {first} of {len(args)} runs as {where}; job logs in {folder}", flush=True)
    if not options.wait:
        for i in range(len(args)):
            yield i, "submitted"
        return
    queued = list(range(first, len(args)))
    poll = options.poll_s if options.poll_s is not None else (1.0 if options.executor == "local" else 30.0)
    try:
        while running:
            done = [i for i, job in running.items() if job.done()]
            for i in done:
                result = _outcome(running.pop(i))
                if queued:
                    k = queued.pop(0)
                    running[k] = submit([k])[0]
                yield i, result
            if not done:
                time.sleep(poll)
    except KeyboardInterrupt:
        left = len(running) + len(queued)
        go_on = (
            "go on (squeue shows them, scancel stops them)"
            if options.executor == "slurm"
            else ("were interrupted with this process")
        )
        raise ScaleLongError(
            f"stopped waiting: the {left} jobs not finished {go_on}; the same command with --report-only "
            "writes the report of what has finished, and the same command again resubmits what did not"
        ) from None
