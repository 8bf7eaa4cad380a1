"""Two CPU processes (gloo) through ``accelerate launch``: identical weights on both processes,
one writer, and the same result as one process with the same global batch, also when each
process accumulates micro-batches."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import TESTS, tiny_uvit_overrides
from scalelong.data import embedded_mnist
from scalelong.metrics.frechet import mnist_reference_stats, save_stats
from scalelong.training.config import load_config
from scalelong.training.evaluation import TrainingEvaluator
from scalelong.training.runs import RunDir, load_model
from scalelong.training.train import train

STEPS = 6


def overrides(name, out_dir):
    return tiny_uvit_overrides(name, out_dir, steps=STEPS) + [
        "model.skip.method=ls",
        "data.hflip=true",
        "train.batch_size=8",
        "train.log_every=2",
        "train.checkpoint_every=3",
        "train.device=cpu",
        "sample.num_images=0",
    ]


def launch_two(train_args: list[str], script: list[str] | None = None) -> subprocess.CompletedProcess:
    """``scalelong train`` on two CPU processes through ``accelerate launch``; ``script``: a test
    script and its first arguments, run instead of ``-m scalelong.cli``."""
    # `accelerate launch --cpu` starts one process unless MPI is set up; `--multi_gpu` starts
    # torchrun-style processes, and train.device=cpu makes Accelerate use gloo on the CPU.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    cmd += [
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        "0",
    ]
    cmd += script or ["-m", "scalelong.cli"]
    cmd += ["train", "configs/demo_uvit.yaml", *train_args, "--no-progress"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


# The evaluation at the last step only: the training log keeps its three records, and each
# process samples its share of the seeds twice (the evaluation's 11, then the final re-score's
# 4 beyond them).
EVALUATION = [
    f"eval.every={STEPS}",
    "eval.num_samples=11",
    "eval.steps=2",
    "eval.batch_size=4",
    "eval.final_num_samples=15",
]
RECORD_EVAL_SEEDS = str(TESTS / "record_eval_seeds.py")


def fd_mnist_reference(folder: Path) -> str:
    """A file for eval.fid_stats holding the statistics fd-mnist uses without one (the 5,000
    embedded digits): computed once in this process, where each launched process would compute
    them again (seconds)."""
    mu, sigma = mnist_reference_stats("train")
    digits = len(embedded_mnist("train")[0])
    return str(save_stats(folder / "fd-mnist-train.npz", mu, sigma, "fd-mnist", digits))


@pytest.mark.slow
def test_two_processes_train_and_evaluate_like_one(tmp_path):
    """One launch of two processes (a launch is three Python processes, seconds each) checked
    twice: its training against one process with the same global batch, its evaluation against
    one process sampling every seed."""
    # two processes x two micro-batches of 2 (train.grad_accum; the first backward skips the
    # all-reduce) against one process running the global batch of 8 at once
    seeds = tmp_path / "seeds"
    evaluation = [*EVALUATION, f"eval.fid_stats={fd_mnist_reference(tmp_path)}"]
    args = [*overrides("two", tmp_path), *evaluation, "train.grad_accum=2"]
    out = launch_two(args, script=[RECORD_EVAL_SEEDS, str(seeds)])
    assert out.returncode == 0, out.stderr[-3000:]
    assert_trained_like_one_process(out, tmp_path / "two", evaluation, tmp_path)
    assert_evaluation_split_like_one_process(tmp_path / "two", seeds, tmp_path)


def assert_trained_like_one_process(
    out: subprocess.CompletedProcess, run: Path, evaluation: list[str], tmp_path: Path
) -> None:
    """Identical weights on both processes, one writer, and the weights and losses of one process
    with the same config."""
    assert "2 processes hold identical weights" in out.stdout
    assert out.stdout.count("final loss") == 1  # the main process reports and writes files
    assert out.stdout.count("re-scored: fd-mnist") == 1  # ... and says what the run scored
    assert "Grad strides do not match" not in out.stderr  # DDP's note on the mlp_conv weight, silenced

    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 4, 6]
    assert len(list((run / "tb").iterdir())) == 1
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000003", "step-000006"]
    assert json.loads((run / "summary.json").read_text())["status"] == "complete"
    assert not (run / ".lock").exists()  # the main process held the run's lock and released it
    trainer = torch.load(run / "checkpoints" / "step-000006" / "trainer.pt", weights_only=True)
    assert trainer["num_processes"] == 2 and len(trainer["rng"]) == 2

    one = train(
        load_config("configs/demo_uvit.yaml", [*overrides("one", tmp_path), *evaluation]), progress=False
    )
    for weights in ("model.safetensors", "ema.safetensors"):
        a = load_file(one.checkpoint / weights)
        b = load_file(run / "checkpoints" / "step-000006" / weights)
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5, msg=k)
    losses = [
        [json.loads(line)["loss"] for line in (d / "metrics.jsonl").read_text().splitlines()]
        for d in (one.run_dir, run)
    ]
    torch.testing.assert_close(torch.tensor(losses[1]), torch.tensor(losses[0]), rtol=1e-5, atol=1e-6)


def assert_evaluation_split_like_one_process(run_dir: Path, seeds: Path, tmp_path: Path) -> None:
    """Each process samples its share of the evaluation seeds (11: 5 and 6), the main process
    gathers the features: the distances equal those of one process sampling all of them."""
    # per process: the evaluation at step 6 (11 samples), then the final re-score's 4 more (15 in
    # all; the first 11 are the evaluation's), as offsets from the first evaluation seed
    drawn = [
        [json.loads(line) for line in (seeds / f"seeds-{r}.jsonl").read_text().splitlines()] for r in (0, 1)
    ]
    base = drawn[0][0][0]
    offsets = [[[s - base for s in call] for call in calls] for calls in drawn]
    assert offsets == [[[0, 1, 2, 3, 4], [11, 12]], [[5, 6, 7, 8, 9, 10], [13, 14]]]
    run = RunDir(run_dir)
    (record,) = run.eval_records().values()
    best = json.loads(run.summary_file.read_text())["best"]
    assert record["step"] == STEPS and record["fd_samples"] == 11
    assert best["best_step"] == STEPS and best["fd_samples"] == 15 and best["fd_at_eval"] == record["fd"]

    cfg = run.config()
    ema = load_model(run.checkpoint(STEPS), cfg.model, "ema")
    one = TrainingEvaluator(cfg, tmp_path / "elsewhere", "cpu")  # one process
    assert one(STEPS, ema)["fd"] == pytest.approx(record["fd"], rel=1e-6)
    assert one(STEPS, ema, n=15)["fd"] == pytest.approx(best["fd"], rel=1e-6)


def test_cpu_processes_launches_data_parallel_processes_of_a_share_of_the_cores(tmp_path, monkeypatch):
    from scalelong import cli
    from scalelong.cli.training import cpu_processes
    from scalelong.training import launch

    launched = []
    monkeypatch.setattr(
        launch, "launch_processes", lambda n, args, run_dir=None: launched.append((n, args)) or 0
    )
    monkeypatch.setattr(launch, "cpu_cores", lambda: 2)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    args = [
        "train",
        "configs/demo_uvit.yaml",
        *overrides("cpu", tmp_path),
        "train.cpu_processes=4",
        "--no-progress",
    ]
    assert cli.main(args) == 0
    ((n, child),) = launched
    assert n == 2  # at most one per core
    assert child[:2] == ["train", "configs/demo_uvit.yaml"] and child[-3:] == [
        "--no-progress",
        "--num-processes",
        "1",
    ]
    assert not (tmp_path / "cpu").exists()  # the parent trains nothing itself

    launched.clear()
    monkeypatch.setenv("WORLD_SIZE", "2")  # a launched process does not launch again
    assert cpu_processes(load_config("configs/demo_uvit.yaml", ["train.cpu_processes=2"])) == 1
    monkeypatch.delenv("WORLD_SIZE")
    assert cpu_processes(load_config("configs/demo_uvit.yaml", ["train.cpu_processes=1"])) == 1


def test_launched_cpu_processes_share_the_cores(monkeypatch):
    from scalelong.training import launch

    seen = []

    class Done:
        returncode = 0

        def __init__(self, cmd, env, **_):  # preexec_fn, where signals are ignored
            seen.append(env["OMP_NUM_THREADS"])

        def poll(self):
            return 0

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(launch.subprocess, "Popen", Done)
    monkeypatch.setattr(launch, "cpu_cores", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert launch.launch_processes(4, ["train", "demo"]) == 0
    assert seen == ["2"] * 4
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the caller's own choice stands
    seen.clear()
    launch.launch_processes(2, ["train", "demo"])
    assert seen == ["3", "3"]
