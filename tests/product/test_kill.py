"""kill -9 of a run on two CPU processes (``scalelong train --num-processes 2``): of the command
that launched them, or of one of them, at a few moments (before the first checkpoint, between
checkpoints, in the middle of writing one), and a process that raises.

Each time, within a few seconds no process of the run is alive and the run's lock is free; a dead
process is one line on the console, the run's summary says what ended it and ``workers.log``
holds the processes' output; and the same command resumes the run to weights bitwise equal to
those of the run trained without a kill. The processes wait to be killed where
``tests/run_until_killed.py`` makes them (its ``AT``), and say so with a file.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from conftest import TESTS, tiny_uvit_overrides
from run_until_killed import parse_at
from scalelong.training.runs import RunDir

# One worker runs this module (`--dist loadgroup`): the straight run is made once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("test_kill")]

STEPS = 6
SCRIPT = str(TESTS / "run_until_killed.py")
DEADLINE_S = 10.0  # what "a few seconds" may take on a loaded machine


def train_args(name: str, out_dir: Path) -> list[str]:
    """``scalelong train`` of a tiny 6-step run on two CPU processes, checkpoints at steps 3 and 6."""
    overrides = tiny_uvit_overrides(name, out_dir, steps=STEPS) + [
        "train.batch_size=8",
        "train.log_every=2",
        "train.checkpoint_every=3",
        "train.device=cpu",
        "train.tensorboard=false",
        "sample.num_images=0",
    ]
    return ["train", "configs/demo_uvit.yaml", *overrides, "--num-processes", "2", "--no-progress"]


def env(marks: Path | None = None) -> dict:
    extra = {"RUN_UNTIL_KILLED_MARKS": str(marks)} if marks else {}
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **extra)


def train(name: str, out_dir: Path) -> subprocess.CompletedProcess:
    """The command, run to its end."""
    command = [sys.executable, "-m", "scalelong.cli", *train_args(name, out_dir)]
    return subprocess.run(command, env=env(), capture_output=True, text=True, timeout=300)


def weights(run: Path) -> dict[str, torch.Tensor]:
    ckpt = run / "checkpoints" / f"step-{STEPS:06d}"
    return {
        f"{kind}.{k}": v
        for kind in ("model", "ema")
        for k, v in load_file(ckpt / f"{kind}.safetensors").items()
    }


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The final weights of the run trained without a kill."""
    root = tmp_path_factory.mktemp("straight")
    out = train("straight", root)
    assert out.returncode == 0, out.stderr
    return weights(root / "straight")


class Launch:
    """The command started through ``run_until_killed.py AT``, and its processes once they wait."""

    def __init__(self, at: str, root: Path, name: str = "killed"):
        self.root, self.name, self.run = root, name, root / name
        self.marks = root / "marks"
        self.marks.mkdir()
        self.proc = subprocess.Popen(
            [sys.executable, SCRIPT, at, *train_args(name, root)],
            env=env(self.marks),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.launcher = psutil.Process(self.proc.pid)
        self.workers: dict[int, psutil.Process] = {}

    def wait_until_waiting(self, at: str) -> None:
        """Until the processes that wait at AT wait (their marks exist); then note every process of
        the run that is left (a process that fails at AT may have ended)."""
        what, _, at_rank = parse_at(at)
        ranks = (0,) if what in ("save", "fail") else (0, 1) if at_rank is None else (at_rank,)
        end = time.monotonic() + 240
        while not all((self.marks / f"rank-{r}").exists() for r in ranks):
            assert self.proc.poll() is None, self.proc.communicate()
            assert time.monotonic() < end, "the run's processes did not reach the point to kill them at"
            time.sleep(0.2)
        for p in self.launcher.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                rank = p.environ().get("RANK")
                self.workers[int(rank) if rank is not None else -p.pid] = p

    def alive(self) -> list[psutil.Process]:
        """The processes of the run (the command's included) that still run."""
        found = []
        for p in [self.launcher, *self.workers.values()]:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p)
            except psutil.NoSuchProcess:
                pass
        return found

    def assert_all_end(self) -> None:
        """Within a deadline poll, no process of the run is alive."""
        end = time.monotonic() + DEADLINE_S
        while [p for p in self.alive() if p is not self.launcher] and time.monotonic() < end:
            time.sleep(0.1)
        ranks = {p.pid: rank for rank, p in self.workers.items()}
        left = [(p.pid, ranks[p.pid]) for p in self.alive() if p is not self.launcher]
        assert not left, f"processes of the run still alive {DEADLINE_S} s later (pid, rank): {left}"

    def end(self) -> None:
        """Kill whatever is left (a test that failed must not leave processes behind)."""
        for p in self.alive():
            p.kill()
        self.proc.wait(timeout=60)

    def summary(self) -> dict:
        return json.loads((self.run / "summary.json").read_text())

    def checkpoints(self) -> list[str]:
        """What the run's checkpoints folder holds, partial checkpoints included."""
        folder = self.run / "checkpoints"
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@pytest.fixture
def launch(tmp_path):
    """Start the command with ``launch(AT)``; whatever is left of it is killed at the end."""
    started: list[Launch] = []

    def start(at: str) -> Launch:
        started.append(Launch(at, tmp_path))
        return started[-1]

    yield start
    for each in started:
        each.end()


def assert_resumes_bitwise(launched: Launch, straight: dict) -> None:
    """The same command (without the waiting) resumes the run to the weights of the straight run."""
    out = train(launched.name, launched.root)
    assert out.returncode == 0, out.stderr[-3000:]
    resumed = weights(launched.run)
    assert resumed.keys() == straight.keys()
    for k in straight:
        assert torch.equal(resumed[k], straight[k]), k
    assert RunDir(launched.run).summary["status"] == "complete"
    assert not (launched.run / ".lock").exists()


# the launcher killed where every process waits: before the first checkpoint (step 2), between the
# two checkpoints (step 4), in the middle of writing the last one (step 6)
LAUNCHER_KILLS = {"2": [], "4": ["step-000003"], "save-6": ["step-000003"]}


@pytest.mark.parametrize("at", LAUNCHER_KILLS)
def test_a_killed_launcher_takes_its_processes_with_it(at, launch, straight):
    """kill -9 of the command: its processes notice at once, end their run the way SIGTERM ends it
    (last complete checkpoint kept, summary "interrupted", lock released) and exit."""
    launched = launch(at)
    launched.wait_until_waiting(at)
    assert {0, 1} <= set(launched.workers)
    launched.proc.kill()
    launched.proc.wait(timeout=60)
    launched.assert_all_end()
    assert not (launched.run / ".lock").exists()
    summary = launched.summary()
    assert summary["status"] == "interrupted", summary
    assert launched.checkpoints() == LAUNCHER_KILLS[at]  # no partial checkpoint left
    assert_resumes_bitwise(launched, straight)


def test_sigterm_to_the_launcher_ends_every_process_cleanly(launch):
    """SIGTERM to the command (a scheduler's): it passes SIGTERM on, each process ends its run
    cleanly, and the command ends in one line with exit code 2, as a run of one process does."""
    launched = launch("4")
    launched.wait_until_waiting("4")
    launched.proc.send_signal(signal.SIGTERM)
    _, err = launched.proc.communicate(timeout=120)
    launched.assert_all_end()
    assert launched.proc.returncode == 2 and err.strip().splitlines() == [
        "error: interrupted; the run directory holds the last complete checkpoint"
    ], err
    assert not (launched.run / ".lock").exists()
    assert launched.summary()["status"] == "interrupted" and launched.checkpoints() == ["step-000003"]


# (AT, the rank killed (None: none, it raises), the checkpoints left, the summary's status):
# rank 1 killed before the first checkpoint while rank 0 waits for it in the next step's all-reduce
# (where gloo fails with "Connection reset by peer"); rank 0, the run's writer and lock holder,
# killed between checkpoints and in the middle of writing one (which it leaves half written); rank 1
# raising an exception
WORKER_DEATHS = {
    "2@1": (1, [], "interrupted"),
    "4": (0, ["step-000003"], "interrupted"),
    "save-6": (0, [".tmp-step-000006", "step-000003"], "interrupted"),
    "fail-4@1": (None, ["step-000003"], "failed"),
}


@pytest.mark.parametrize("at", WORKER_DEATHS)
def test_a_dead_process_stops_the_run_in_one_line(at, launch, straight):
    """One process dies: the command stops the others, prints one line (which rank, how it died,
    where the checkpoint and the processes' output are, the command to resume), writes the
    summary and exits 1; no traceback reaches the console."""
    killed, left, status = WORKER_DEATHS[at]
    launched = launch(at)
    launched.wait_until_waiting(at)
    if killed is not None:
        assert {0, 1} <= set(launched.workers)
        launched.workers[killed].send_signal(signal.SIGKILL)
    rank, how = (killed, "was killed by SIGKILL") if killed is not None else (1, "exited with code 1")
    _, err = launched.proc.communicate(timeout=120)
    launched.assert_all_end()
    assert launched.proc.returncode == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("error: ") and f"rank {rank} of 2 processes {how}" in line, line
    log = launched.run / "workers.log"
    assert str(launched.run) in line and str(log) in line and "--num-processes 2" in line, line
    assert "checkpoint" in line and "resume" in line, line
    assert not (launched.run / ".lock").exists()
    summary = launched.summary()
    assert summary["status"] == status and f"rank {rank} of 2 processes {how}" in summary["error"], summary
    assert launched.checkpoints() == left
    if at.startswith("fail"):  # the traceback is in the log, not on the console
        assert "RuntimeError: a failure planted after step 4" in log.read_text()
    assert_resumes_bitwise(launched, straight)


def test_a_refused_run_stays_one_line_and_untouched(tmp_path):
    """A user error ends every process with exit code 2: rank 0's own line is the only one, and the
    command writes nothing into the run (here: one another process, this one, holds)."""
    run = RunDir(tmp_path / "held")
    run.path.mkdir()
    run.acquire_lock()
    try:
        out = train("held", tmp_path)
        assert out.returncode == 2, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and f"is being trained by pid {os.getpid()}" in lines[0], out.stderr
        assert sorted(p.name for p in run.path.iterdir()) == [".lock"]  # no summary, no workers.log
    finally:
        run.release_lock()


# A process that watches its launcher as on a system without PR_SET_PDEATHSIG (it prints "watching"
# once it does), under a launcher that prints the process's pid and waits.
WATCHER = (
    "import time; from scalelong.training import launch; launch._prctl = lambda: None; "
    "launch.end_with_launcher(); "
    "print('watching', flush=True); time.sleep(120)"
)
WAITING_LAUNCHER = (
    "import os, subprocess, sys, time; from scalelong.training.launch import LAUNCHER_PID; "
    "env = dict(os.environ, **{LAUNCHER_PID: str(os.getpid())}); "
    f"p = subprocess.Popen([sys.executable, '-c', {WATCHER!r}], env=env); "
    "print(p.pid, flush=True); time.sleep(120)"
)


def test_without_pdeathsig_a_watcher_thread_ends_the_process_with_its_launcher():
    """Where the kernel cannot send a process SIGTERM when its launcher dies (not Linux), a thread
    of the process (:func:`scalelong.training.launch.end_with_launcher`) does, within about a second."""
    command = [sys.executable, "-c", WAITING_LAUNCHER]
    launcher = subprocess.Popen(command, env=env(), stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = psutil.Process(int(launcher.stdout.readline()))
        assert launcher.stdout.readline().strip() == "watching"
        launcher.kill()
        launcher.wait()
        end = time.monotonic() + DEADLINE_S
        while child.is_running() and child.status() != psutil.STATUS_ZOMBIE and time.monotonic() < end:
            time.sleep(0.1)
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    finally:
        launcher.kill()
        if child is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
