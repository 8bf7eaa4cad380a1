"""Two CPU processes (gloo) through ``accelerate launch``: identical weights on both processes,
one writer, and the same result as one process with the same global batch."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from conftest import tiny_uvit_overrides
from scalelong.config import load_config
from scalelong.train import train

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


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
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
    cmd += ["-m", "scalelong.cli", "train", "configs/demo.yaml", *overrides("two", tmp_path), "--no-progress"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "2 processes hold identical weights" in out.stdout
    assert out.stdout.count("final loss") == 1  # the main process reports and writes files

    run = tmp_path / "two"
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 4, 6]
    assert len(list((run / "tb").iterdir())) == 1
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000003", "step-000006"]
    assert json.loads((run / "summary.json").read_text())["status"] == "complete"
    assert not (run / ".lock").exists()  # the main process held the run's lock and released it
    trainer = torch.load(run / "checkpoints" / "step-000006" / "trainer.pt", weights_only=True)
    assert trainer["num_processes"] == 2 and len(trainer["rng"]) == 2

    one = train(load_config("configs/demo.yaml", overrides("one", tmp_path)), progress=False)
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
