"""Studies past one machine: one run per GPU (the device count faked where the pool reads it,
:func:`scalelong.training.launch.visible_gpus`), and a sweep as jobs of submitit's local executor (real
processes, no cluster), one job killed and one requeued midway, with the local pool's report."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import scalelong.studies.cluster
import scalelong.studies.running
import scalelong.studies.sweep.entry
import scalelong.training.launch
from conftest import TESTS, learning_uvit_overrides
from run_until_killed import waiting_run_all
from scalelong.cli import main
from scalelong.errors import ScaleLongError
from scalelong.studies.cluster import ClusterOptions, job_map, parse_sbatch, parse_time
from scalelong.studies.compare import method_config
from scalelong.studies.running import RunOutcome, run_all, train_run
from scalelong.training.config import load_config
from scalelong.training.launch import Placement, place_runs, pool_map
from scalelong.training.runs import RunDir


@pytest.fixture
def gpus(monkeypatch):
    """A machine with ``n`` GPUs, as the pool sees it."""

    def fake(n: int) -> list[str]:
        names = [str(i) for i in range(n)]
        monkeypatch.setattr(scalelong.training.launch, "visible_gpus", lambda: names)
        return names

    return fake


def test_jobs_place_each_worker_on_its_own_gpus(gpus):
    gpus(4)
    one = place_runs(4)
    assert one == Placement(4, one.threads, ("0", "1", "2", "3"), 1)
    assert str(one) == "4 workers, one GPU each: 0, 1, 2, 3"
    assert place_runs(4, runs=2).gpus == ("0", "1")  # no idle worker holds a GPU
    two = place_runs(2, gpus_per_run=2)
    assert two.gpus == ("0,1", "2,3")
    assert str(two) == "2 workers, 2 GPUs each (one process per GPU, through Accelerate): 0,1 | 2,3"
    assert str(place_runs(1)) == "one run at a time in this process, on GPU 0"
    assert str(place_runs(1, gpus_per_run=3)) == "one run at a time, on GPUs 0,1,2 (3 processes, Accelerate)"
    # train.device=cpu keeps the CPU's division of the cores, GPUs or not
    assert place_runs(2, device="cpu").gpus == () and str(place_runs(2, device="cpu")).endswith(
        "thread(s) each"
    )
    for jobs, per, message in [
        (5, 1, "--jobs 5 asks for 5 GPUs; 4 are visible here (0, 1, 2, 3): lower --jobs to 4"),
        (
            3,
            2,
            "--jobs 3 x --gpus-per-run 2 asks for 6 GPUs; 4 are visible here (0, 1, 2, 3): lower --jobs to 2",
        ),
    ]:
        with pytest.raises(ScaleLongError, match=message.replace("(", r"\(").replace(")", r"\)")):
            place_runs(jobs, per)
    gpus(0)
    with pytest.raises(ScaleLongError, match="--gpus-per-run 2: no GPU is visible here"):
        place_runs(1, gpus_per_run=2)
    with pytest.raises(ScaleLongError, match="train.device=cuda but no GPU is visible"):
        place_runs(1, device="cuda")


def sweep_args(tmp_path) -> list[str]:
    return ["sweep", "demo_uvit", *learning_uvit_overrides(tmp_path), "train.device=auto", "--no-progress"]


def test_too_many_gpus_is_one_error_line_and_nothing_is_written(gpus, tmp_path, capsys):
    gpus(2)
    grid = ["--methods", "none,cs,ls", "--lrs", "1e-3", "--depths", "4"]
    assert main([*sweep_args(tmp_path), *grid, "--jobs", "3"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --jobs 3 asks for 3 GPUs; 2 are visible here (0, 1): lower --jobs to 2\n"
    assert main([*sweep_args(tmp_path), *grid, "--jobs", "2", "--gpus-per-run", "2"]) == 2
    assert "error: --jobs 2 x --gpus-per-run 2 asks for 4 GPUs" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    # a dry run may check on a login node a study meant for a GPU machine: a warning, not a refusal
    assert main([*sweep_args(tmp_path), *grid, "--jobs", "3", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("\nwarning: --jobs 3 asks for 3 GPUs") and err.count("\n") == 2


def test_the_dry_run_says_where_each_run_goes(gpus, tmp_path, capsys):
    gpus(4)
    grid = ["--methods", "none,cs", "--lrs", "1e-3,2e-3", "--depths", "4", "--dry-run"]
    assert main([*sweep_args(tmp_path), *grid, "--jobs", "4"]) == 0
    assert "\n4 workers, one GPU each: 0, 1, 2, 3\n" in capsys.readouterr().out
    assert main([*sweep_args(tmp_path), *grid, "--jobs", "2", "--gpus-per-run", "2"]) == 0
    assert ": 0,1 | 2,3\n" in capsys.readouterr().out
    gpus(0)  # a CPU machine: as before, the cores divided
    assert main([*sweep_args(tmp_path), *grid, "--jobs", "2"]) == 0
    assert "\n2 workers on the CPU, " in capsys.readouterr().out
    assert not any(tmp_path.iterdir())


# What a worker reports of itself, after a pause long enough that each worker takes some of the
# items: its pid, its CUDA_VISIBLE_DEVICES and its torch threads. The workers run it through the
# builtin eval, which they unpickle without importing anything: a function of this module would
# make each of them import this module first, and all it imports (~2 s of CPU a worker).
WHERE_AM_I = (
    "__import__('time').sleep(0.5) or (__import__('os').getpid(), "
    "__import__('os').environ.get('CUDA_VISIBLE_DEVICES', ''), __import__('torch').get_num_threads())"
)


def test_each_pool_worker_sees_only_its_own_gpus():
    """Real spawned workers: CUDA_VISIBLE_DEVICES is each one's own, set before it runs anything."""
    seen = [result for _, result in pool_map(eval, [(WHERE_AM_I,)] * 4, jobs=2, threads=1, gpus=("3", "5,6"))]
    by_worker = {pid: env for pid, env, _ in seen}
    assert sorted(by_worker.values()) == ["3", "5,6"]  # two workers, each with its own GPUs
    assert all(by_worker[pid] == env for pid, env, _ in seen)  # every item of a worker on its GPUs
    assert {threads for *_, threads in seen} == {1}


def tiny_configs(tmp_path, methods=("none", "cs"), device="auto"):
    overrides = [*learning_uvit_overrides(tmp_path), f"train.device={device}", "train.steps=4"]
    return [
        method_config(load_config("configs/demo_uvit.yaml", overrides), m, 0, tmp_path / "runs")
        for m in methods
    ]


def test_run_all_hands_each_worker_its_gpus_and_each_run_its_processes(gpus, tmp_path, monkeypatch, capsys):
    gpus(4)
    seen = {}

    def fake_pool(fn, args, jobs, threads, gpus):
        seen.update(fn=fn, args=args, jobs=jobs, threads=threads, gpus=gpus)
        for i, (cfg, *_) in enumerate(args):
            yield i, RunOutcome(cfg.name, "trained")

    monkeypatch.setattr(scalelong.studies.running, "pool_map", fake_pool)
    outcomes = run_all(tiny_configs(tmp_path, ("none", "cs", "ls")), jobs=2, progress=False, gpus_per_run=2)
    assert [o.status for o in outcomes] == ["trained"] * 3
    assert seen["fn"] is train_run and seen["jobs"] == 2 and seen["gpus"] == ("0,1", "2,3")
    assert [a[3] for a in seen["args"]] == [2, 2, 2]  # each run on 2 processes, one per GPU
    out = capsys.readouterr().out
    assert "3 runs: 2 workers, 2 GPUs each (one process per GPU, through Accelerate): 0,1 | 2,3\n" in out
    # train.device=cpu: the CPU's pool as before, whatever GPUs there are
    run_all(tiny_configs(tmp_path / "cpu", device="cpu"), jobs=2, progress=False)
    assert seen["gpus"] == () and "2 runs: 2 workers on the CPU" in capsys.readouterr().out
    # more runs at once than cores: one thread each, said once for the study
    monkeypatch.setattr(scalelong.training.launch, "cpu_cores", lambda: 2)
    run_all(tiny_configs(tmp_path / "cpu3", ("none", "cs", "ls"), device="cpu"), jobs=3, progress=False)
    assert (seen["jobs"], seen["threads"], seen["gpus"]) == (3, 1, ())
    assert capsys.readouterr().err == "--jobs 3 on 2 cores: one thread each, the runs share the cores\n"


@pytest.mark.slow
def test_a_run_on_two_gpus_trains_through_two_processes_and_is_reused(gpus, tmp_path, capsys):
    """--gpus-per-run 2 on a machine that shows two GPUs (faked: here the two processes train on
    the CPU, with gloo): one run of two Accelerate processes, which the study then reuses."""
    gpus(2)
    cfgs = tiny_configs(tmp_path, ("ls",))
    assert [o.status for o in run_all(cfgs, jobs=1, progress=False, gpus_per_run=2)] == ["trained"]
    run = tmp_path / "runs" / "ls-seed0"
    trainer = torch.load(run / "checkpoints" / "step-000004" / "trainer.pt", weights_only=True)
    assert trainer["num_processes"] == 2
    assert json.loads((run / "summary.json").read_text())["status"] == "complete"
    assert [o.status for o in run_all(cfgs, jobs=1, progress=False, gpus_per_run=2)] == ["reused"]


def test_cluster_options_map_to_sbatch(tmp_path):
    assert [parse_time(t) for t in ("90", "30:30", "4:00:00", "1-00", "1-02:30", "2-00:00:01")] == [
        90, 31, 240, 1440, 1590, 2881,
    ]  # fmt: skip
    for bad in ("", "4h", "0", "1:2:3:4"):
        with pytest.raises(ScaleLongError, match="--time"):
            parse_time(bad)
    assert parse_sbatch(["account=proj", "--qos=high", "exclusive"]) == (
        ("account", "proj"), ("qos", "high"), ("exclusive", ""),
    )  # fmt: skip
    with pytest.raises(ScaleLongError, match="--sbatch '=x'"):
        parse_sbatch(["=x"])
    options = ClusterOptions(partition="gpu", time_min=90, sbatch=(("account", "proj"), ("exclusive", "")))
    assert options.parameters(8, 2, gpus=True) == {
        "name": "scalelong", "timeout_min": 90, "nodes": 1, "tasks_per_node": 1, "gpus_per_node": 2,
        "slurm_signal_delay_s": 120, "slurm_partition": "gpu", "slurm_array_parallelism": 8,
        "slurm_additional_parameters": {"account": "proj", "exclusive": True},
    }  # fmt: skip
    assert options.parameters(None, 1, gpus=False)["gpus_per_node"] == 0  # train.device=cpu: no GPU asked
    assert options.describe(24, 8, 2).endswith(
        "sbatch --partition=gpu --time=1:30:00 --nodes=1 --ntasks-per-node=1 --gpus-per-node=2 "
        "--array=0-23%8 --signal=USR2@120 --account=proj --exclusive"
    )
    assert options.job_folder(tmp_path / "s" / "runs") == tmp_path / "s" / "slurm"
    with pytest.raises(ScaleLongError, match="--executor 'pbs'"):
        ClusterOptions(executor="pbs")


def test_cluster_flags_errors_are_one_line(tmp_path, capsys, monkeypatch):
    grid = ["--methods", "none", "--lrs", "1e-3", "--depths", "4"]
    assert main([*sweep_args(tmp_path), *grid, "--partition", "gpu"]) == 2
    assert (
        capsys.readouterr().err
        == "error: --partition is for --executor slurm (or local), not this machine's pool\n"
    )
    monkeypatch.setitem(sys.modules, "submitit", None)  # not installed: the error names the extra
    assert main([*sweep_args(tmp_path), *grid, "--executor", "slurm"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'scalelong[slurm]'" in err
    monkeypatch.delitem(sys.modules, "submitit")
    pytest.importorskip("submitit")
    assert main([*sweep_args(tmp_path), *grid, "--executor", "slurm", "--time", "1:00:00"]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "--executor slurm: no SLURM on this machine" in err
        and "--executor local" in err
    )


def fake_slurm(folder: Path, monkeypatch) -> Path:
    """srun, sbatch and sacct on PATH that stand for a cluster: sbatch keeps each script it is given
    in the returned folder and answers as SLURM does; sacct says job 4242_0 waits, 4242_1 runs."""
    bin_, scripts = folder / "bin", folder / "sbatch"
    bin_.mkdir()
    scripts.mkdir()
    tools = {
        "srun": "exit 0",
        "sbatch": f'cp "$1" "{scripts}/" && echo "Submitted batch job 4242"',
        "sacct": 'printf "JobID|State|NodeList\\n4242_0|PENDING|None assigned\\n4242_1|RUNNING|node1\\n"',
    }
    for name, body in tools.items():
        (bin_ / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_ / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    return scripts


def test_slurm_submits_one_job_array_and_never_submits_a_run_twice(tmp_path, monkeypatch, capsys):
    """Through submitit's SLURM executor, with sbatch and sacct faked: the sbatch script of the job
    array says what the options asked for; submitted again while the jobs wait or run, nothing is."""
    pytest.importorskip("submitit")
    scripts = fake_slurm(tmp_path, monkeypatch)
    args = [*sweep_args(tmp_path / "study"), "--methods", "none,cs", "--lrs", "1e-3", "--depths", "4"]
    args += ["--executor", "slurm", "--partition", "gpu", "--time", "1:30:00", "--jobs", "1"]
    args += ["--sbatch", "account=proj", "--setup", "module load cuda", "--no-wait"]
    assert main(args) == 0
    out = capsys.readouterr().out
    folder = tmp_path / "study" / "t-sweep"
    assert f"submitted 2 of 2 runs as SLURM job array 4242; job logs in {folder / 'slurm'}\n" in out
    assert "2 runs submitted. The same command with --report-only" in out
    (script,) = scripts.iterdir()
    text = script.read_text()
    for line in ("--partition=gpu", "--time=90", "--array=0-1%1", "--signal=USR2@120", "--account=proj",
                 "--gpus-per-node=1", "--nodes=1", "--ntasks-per-node=1"):  # fmt: skip
        assert f"#SBATCH {line}\n" in text, line
    assert "\nmodule load cuda\n" in text and "-m submitit.core._submit" in text
    ledger = [json.loads(line) for line in (folder / "slurm" / "submitted.jsonl").read_text().splitlines()]
    assert [(e["run"], e["job"]) for e in ledger] == [
        ("d4-lr0.001-none-seed0", "4242_0"),
        ("d4-lr0.001-cs-seed0", "4242_1"),
    ]
    assert not list(folder.glob("runs/*/config.yaml"))  # nothing trained here

    assert main(args) == 0  # again, while one job waits and the other runs: nothing is submitted
    out = capsys.readouterr().out
    assert "d4-lr0.001-none-seed0: not submitted again: job 4242_0 of an earlier submission has it" in out
    assert "0 runs submitted; 2 still in jobs of an earlier submission." in out
    assert len(list(scripts.iterdir())) == 1


@pytest.fixture
def other():
    """A live process of this host other than this one, to hold a run's lock as a study's run does."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield process
    process.kill()
    process.wait()


def hold(run: Path, process) -> None:
    """The lock of the run folder ``run``, as ``process`` holds it while it trains that run."""
    run.mkdir(parents=True, exist_ok=True)
    record = {"pid": process.pid, "host": socket.gethostname(), "since": "2025-01-01 12:00:00"}
    (run / ".lock").write_text(json.dumps(record))


class FakeExecutor:
    """submitit's executor as :func:`job_map` uses it, starting nothing: the jobs it was handed."""

    def __init__(self, parameters: dict):
        self.parameters, self.submitted = parameters, []

    def submit(self, fn, *args):
        self.submitted.append(args)
        return SimpleNamespace(job_id=str(len(self.submitted)))

    @contextmanager
    def batch(self):
        yield


def test_local_jobs_without_waiting_refuse_a_cap_that_nothing_would_hold(tmp_path, monkeypatch, capsys):
    """submitit's LocalExecutor starts each job the moment it is submitted (it has no array
    parallelism): --jobs J holds for local jobs only because the waiting command submits the next
    one as one ends. With --no-wait nothing would hold a cap below the number of jobs, so it is
    refused in one line (in a dry run too), before anything is submitted or written."""
    executors: list[FakeExecutor] = []

    def fake(options, folder, parameters):
        executors.append(FakeExecutor(parameters))
        return executors[-1]

    monkeypatch.setattr(scalelong.studies.cluster, "make_executor", fake)
    grid = ["--methods", "none,cs", "--lrs", "1e-3", "--depths", "4", "--executor", "local", "--no-wait"]
    for extra in ([], ["--dry-run"]):
        assert main([*sweep_args(tmp_path), *grid, "--jobs", "1", *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: --jobs 1 with --executor local --no-wait")
        assert "starts all 2 jobs at once" in err and "drop --no-wait" in err and "drop --jobs" in err
    assert executors == [] and not any(tmp_path.iterdir())
    with pytest.raises(ScaleLongError, match="--jobs 1 with --executor local --no-wait"):  # the library too
        run_all(tiny_configs(tmp_path), jobs=1, progress=False, cluster=ClusterOptions("local", wait=False))
    assert executors == []
    # a cap the jobs do not reach, or none: every job at once, as the plan says
    for k, jobs in enumerate((["--jobs", "2"], [])):
        assert main([*sweep_args(tmp_path / str(k)), *grid, *jobs]) == 0
    assert [len(e.submitted) for e in executors] == [2, 2]


def test_slurm_without_jobs_sets_no_cap_on_its_array(tmp_path, monkeypatch):
    """submitit caps a job array at 256 running jobs unless told otherwise (its array_parallelism):
    without --jobs the array's %N is the number of jobs submitted, so only the scheduler limits it."""
    pytest.importorskip("submitit")
    scripts = fake_slurm(tmp_path, monkeypatch)
    n = 300
    names = [f"run{i}" for i in range(n)]
    submitted = job_map(
        _double, [(i,) for i in range(n)], names, ClusterOptions(wait=False), tmp_path / "jobs"
    )
    assert list(submitted) == [(i, "submitted") for i in range(n)]
    (script,) = scripts.iterdir()
    assert f"#SBATCH --array=0-{n - 1}%{n}\n" in script.read_text()


def test_a_dry_run_counts_in_its_array_only_the_runs_it_would_submit(tmp_path, monkeypatch, capsys, other):
    """Of four runs, one finished (reused) and one another process trains (its lock): the dry run's
    array holds the two that would be submitted, as the study itself submits them."""
    monkeypatch.setattr(
        scalelong.studies.running, "reusable", lambda run, cfg: run.path.name.endswith("-none-seed0")
    )
    grid = ["--methods", "none,sqrt2,cs,ls", "--lrs", "1e-3", "--depths", "4", "--dry-run"]
    hold(tmp_path / "t-sweep" / "runs" / "d4-lr0.001-cs-seed0", other)
    assert main([*sweep_args(tmp_path), *grid, "--executor", "slurm", "--jobs", "8"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[-1] for line in out.splitlines()[2:6]] == ["reuse", "new", "training", "new"]
    assert "\n2 runs as one SLURM job array, at most 8 at once," in out and " --array=0-1%8 " in out
    assert main([*sweep_args(tmp_path), *grid, "--executor", "local"]) == 0
    assert (
        "\n2 runs as submitit jobs on this machine (--executor local), all at once,"
        in capsys.readouterr().out
    )


@pytest.mark.slow
def test_report_only_reports_the_finished_runs_of_a_comparison(tmp_path, capsys):
    args = ["compare", "demo_uvit", *learning_uvit_overrides(tmp_path), "--steps", "4", "--no-progress"]
    assert main([*args, "--methods", "cs,none", "--report-only"]) == 2
    assert "no run of the baseline 'cs' has finished" in capsys.readouterr().err
    assert main([*args, "--methods", "cs"]) == 0  # the baseline's run, as a first job would leave it
    capsys.readouterr()
    assert main([*args, "--methods", "cs,none,ls", "--report-only"]) == 0
    out = capsys.readouterr().out
    assert "1 of 3 runs finished; the others: 2 new" in out
    report = (tmp_path / "t-compare" / "report.md").read_text()
    assert report.startswith("# ScaleLong comparison: cs\n") and "| cs |" in report
    assert not (tmp_path / "t-compare" / "runs" / "none-seed0").exists()  # nothing trained


# ----------------------------------------------------------------------------- a sweep as jobs


def until(condition, what: str, limit: float = 300) -> None:
    end = time.monotonic() + limit  # a guard against a hang, not a measure of speed
    while not condition():
        assert time.monotonic() < end, what
        time.sleep(0.2)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def numbers(sweep: Path) -> list[dict]:
    """Every cell's per-seed numbers and verdicts, as map.json holds them."""
    return json.loads((sweep / "map.json").read_text())["cells"]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads process states from /proc")
def test_a_sweep_of_local_jobs_killed_and_requeued_midway_reports_what_the_pool_reports(
    tmp_path, monkeypatch, capsys
):
    """Two runs submitted as submitit jobs (--no-wait), both waiting after their step-4 checkpoint:
    one is warned as SLURM warns at a time limit (SIGUSR2: submitit requeues it, the run resumes by
    itself), the other is killed outright, and the same command again resubmits that one alone,
    which resumes from its checkpoint. --report-only, while it still trains, reports what has
    finished; once it has, the same command reuses both runs, and the report is the report of the
    same sweep trained by the local pool, number for number."""
    pytest.importorskip("submitit")
    # one torch thread in every job, as in the pool's run here: the numbers can then match bitwise
    monkeypatch.setattr(scalelong.training.launch, "cpu_cores", lambda: 1)
    grid = ["--methods", "none,cs", "--lrs", "2e-2", "--depths", "4", "--no-progress"]

    def sweep(folder: Path, *flags: str) -> list[str]:
        overrides = [*learning_uvit_overrides(folder), "train.steps=8", "train.log_every=2"]
        return ["sweep", "configs/demo_uvit.yaml", *overrides, "train.checkpoint_every=4", *grid, *flags]

    command = sweep(tmp_path / "cluster", "--executor", "local", "--jobs", "2")
    folder = tmp_path / "cluster" / "t-sweep"

    def submit(at_step: int, until: Path | None = None) -> str:
        """The command with --no-wait, every run it submits waiting after ``at_step``."""
        with monkeypatch.context() as m:
            m.setattr(
                scalelong.studies.sweep.entry,  # where run_sweep looks run_all up
                "run_all",
                waiting_run_all(scalelong.studies.running.run_all, at_step, until),
            )
            assert main([*command, "--no-wait"]) == 0
        return capsys.readouterr().out

    def records(run: Path) -> list[int]:  # the steps of the run's log records
        metrics = run / "metrics.jsonl"
        return [
            json.loads(line)["step"]
            for line in (metrics.read_text() if metrics.is_file() else "").splitlines()
        ]

    def ledger() -> list[tuple[str, int]]:  # (run, job: for local jobs, the controller's pid)
        lines = (folder / "slurm" / "submitted.jsonl").read_text().splitlines()
        return [(e["run"], int(e["job"])) for e in map(json.loads, lines)]

    def complete(run: Path) -> bool:
        summary = run / "summary.json"
        return summary.is_file() and json.loads(summary.read_text())["status"] == "complete"

    # the jobs import the waiting hook from tests/, as the pool's workers would
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    out = submit(4)  # both wait after step 4 until they are signalled
    assert "submitted 2 of 2 runs as local jobs" in out and "--report-only writes the report" in out
    runs = {m: folder / "runs" / f"d4-lr0.02-{m}-seed0" for m in ("none", "cs")}
    until(lambda: all((r / "checkpoints" / "step-000004").is_dir() for r in runs.values()), "no step 4")
    pid = {m: json.loads((r / ".lock").read_text())["pid"] for m, r in runs.items()}
    assert main([*command, "--dry-run"]) == 0  # both jobs hold their runs' locks
    assert capsys.readouterr().out.count(" training\n") == 2

    os.kill(pid["none"], signal.SIGKILL)  # gone without a word: its lock and step 4 stay behind
    until(lambda: not alive(dict(ledger())[runs["none"].name]), "the killed job still runs")
    os.kill(pid["cs"], signal.SIGUSR2)  # the time-limit warning: submitit requeues, the run resumes
    # the same command again, while cs is requeued: none alone is submitted, and waits after step 6
    go = tmp_path / "go"
    out = submit(6, until=go)
    assert "d4-lr0.02-cs-seed0: not submitted again: job " in out and "submitted 1 of 1 runs" in out
    # meanwhile, here: the same sweep through the local pool, the reference
    assert main(sweep(tmp_path / "pool")) == 0
    capsys.readouterr()
    until(lambda: complete(runs["cs"]) and 6 in records(runs["none"]), "no requeue, or no resumed run")
    assert main([*command, "--report-only"]) == 0  # the partial report: what has finished
    assert "1 of 2 runs finished; the others: 1 training" in capsys.readouterr().out
    assert "1 cells with 1 seed(s) each" in (folder / "report.md").read_text()

    go.touch()
    until(lambda: complete(runs["none"]), "the resumed run did not finish")
    jobs = ledger()
    assert [run for run, _ in jobs] == [runs["none"].name, runs["cs"].name, runs["none"].name]
    until(lambda: not any(alive(job) for _, job in jobs), "a job's controller still runs")
    for run, job in jobs[1:]:  # the requeued job and the resubmitted one both went on from step 4
        assert (
            f"resuming {folder / 'runs' / run} from step-000004"
            in next((folder / "slurm" / str(job)).glob("*_log.out")).read_text()
        )
    assert records(runs["none"]) == [2, 4, 6, 8]  # nothing lost, nothing twice

    assert main(command) == 0  # the same command once more: both finished, reused, the report
    assert "2 of 2 runs are finished already and reused" in capsys.readouterr().out
    pool = tmp_path / "pool" / "t-sweep"
    assert (folder / "report.md").read_text() == (pool / "report.md").read_text()
    assert numbers(folder) == numbers(pool)


def _double(x):
    return 2 * x


def test_a_job_at_its_time_limit_is_checkpointed_and_requeued(tmp_path):
    """submitit's own decision at the warning signal of a job that reached its time limit: a
    ScheduledCall is checkpointable, so the job is requeued with the same call, not ended."""
    submitit = pytest.importorskip("submitit")
    from submitit.core.job_environment import SignalHandler
    from submitit.core.utils import JobPaths

    from scalelong.studies.cluster import ScheduledCall

    call = ScheduledCall(_double, threads=1)
    assert hasattr(call, "checkpoint")  # what submitit tests
    again = call.checkpoint(21)
    assert isinstance(again, submitit.helpers.DelayedSubmission)
    assert again.function is call and again.args == (21,)

    class Env:
        global_rank = 0
        requeued: list = []

        def _requeue(self, countdown):
            self.requeued.append(countdown)

    delayed = submitit.helpers.DelayedSubmission(call, 21)
    delayed.set_timeout(1, 3)
    handler = SignalHandler(Env(), JobPaths(tmp_path, job_id="7"), delayed)
    handler.has_timed_out = lambda: True  # a real time limit, not a preemption
    with pytest.raises(SystemExit):  # requeued: submitit exits the job (not UncompletedJobError)
        handler.checkpoint_and_try_requeue(signal.SIGUSR2)
    assert Env.requeued == [2]
    resumed = submitit.helpers.DelayedSubmission.load(tmp_path / "7_submitted.pkl")
    assert isinstance(resumed.function, ScheduledCall) and resumed.args == (21,)
    assert resumed.function.fn is _double and resumed.function.threads == 1


# ----------------------------------------------------------------------------- two processes, one study


def test_a_run_another_process_trains_is_left_to_it_not_failed(tmp_path, monkeypatch, capsys, other):
    """A second study in the same folder: the run whose lock another process holds is not trained
    here, nor is the one whose lock it takes between this study's look and the run's start (the
    run's refusal to train), and neither is a failure: one line each names who trains it."""
    cfgs = tiny_configs(tmp_path, ("none", "cs", "ls"))
    hold(Path(cfgs[1].run_dir), other)
    trained = []

    def fake_train(cfg, progress=False, **hooks):  # takes the run's lock first, as train does
        if cfg.name == "ls-seed0":  # the other process starts this run just after the study looked
            hold(Path(cfg.run_dir), other)
        with RunDir(cfg.run_dir).writing():
            trained.append(cfg.name)

    monkeypatch.setattr(scalelong.studies.running, "train", fake_train)
    outcomes = run_all(cfgs, jobs=1, progress=False)
    assert [o.status for o in outcomes] == ["trained", "training", "training"]
    assert trained == ["none-seed0"]
    out, err = capsys.readouterr()
    assert f"cs-seed0: not trained here: pid {other.pid} on host {socket.gethostname()} (since " in out
    assert f"ls-seed0: not trained here: pid {other.pid} on host " in out
    assert err == ""  # nothing failed


def test_a_cluster_study_leaves_a_run_another_process_trains_to_it(tmp_path, monkeypatch, capsys, other):
    """The same on a cluster: the run another process trains is not submitted, and the command
    says so apart from the runs still in jobs of an earlier submission."""
    executors: list[FakeExecutor] = []
    monkeypatch.setattr(
        scalelong.studies.cluster,
        "make_executor",
        lambda o, f, p: executors.append(FakeExecutor(p)) or executors[-1],
    )
    hold(tmp_path / "t-sweep" / "runs" / "d4-lr0.001-cs-seed0", other)
    grid = ["--methods", "none,cs", "--lrs", "1e-3", "--depths", "4", "--executor", "local", "--no-wait"]
    assert main([*sweep_args(tmp_path), *grid]) == 0
    out = capsys.readouterr().out
    assert f"d4-lr0.001-cs-seed0: not submitted again: pid {other.pid} on host " in out
    assert "1 run submitted; 1 being trained by another process. The same command with --report-only" in out
    assert [len(e.submitted) for e in executors] == [1]


@pytest.mark.slow
def test_a_second_sweep_in_the_same_folder_skips_what_the_first_trains(tmp_path, monkeypatch, capsys, other):
    """``scalelong sweep`` while another process trains one of its runs: the others train, the
    report holds them, one line says who trains the rest and what reports it later, and the exit
    code is 0; a run that really fails still makes it 2, with the usual last line."""
    args = [*sweep_args(tmp_path), "train.steps=4", "--lrs", "1e-3", "--depths", "4"]
    hold(tmp_path / "t-sweep" / "runs" / "d4-lr0.001-cs-seed0", other)
    assert main([*args, "--methods", "none,cs"]) == 0
    out = capsys.readouterr().out
    assert "d4-lr0.001-cs-seed0: not trained here: pid " in out
    assert (
        "1 of 2 runs are being trained by another process (listed above), not by this one; the report "
        "leaves them out until it ends: then the same command with --report-only (or the same command "
        "again) takes them in\n" in out
    )
    assert "| none |" in (tmp_path / "t-sweep" / "report.md").read_text()

    real = scalelong.studies.running.train

    def failing(cfg, *a, **k):
        if cfg.model.skip.method == "ls":
            raise RuntimeError("boom")
        return real(cfg, *a, **k)

    monkeypatch.setattr(scalelong.studies.running, "train", failing)
    assert main([*args, "--methods", "none,cs,ls"]) == 2
    captured = capsys.readouterr()
    assert "1 of 3 runs are being trained by another process" in captured.out
    assert captured.err.splitlines()[-1].startswith(
        "error: 1 of 3 runs failed (listed above and in the report)"
    )
