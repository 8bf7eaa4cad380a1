"""The scripts of examples/ train, log, save and sample end to end at toy size, and resume.

Each trains in a fresh working folder for a few steps, as the script's main() in this process: its
metrics.jsonl must hold the diagnostics (finite hidden-feature norms, per-block and per-skip
keys) so that ``scalelong analyze`` draws them, its sample grid must exist, and its saved weights
must load back into a model with the same skip scaling; then it resumes. A bad argument is one
line and exit 2, before anything is built. That each script runs as a user runs it, ``python
examples/SCRIPT ...`` in a process of its own, is shown on a bad argument: a process that trains
spends seconds importing torch, diffusers and Accelerate first, so one short one per script.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO

pytestmark = pytest.mark.slow

EXAMPLES = REPO / "examples"
DIFFUSERS_TOY = [
    "--resolution", "16", "--block-out-channels", "16,32", "--layers-per-block", "1",
    "--norm-num-groups", "8", "--train-batch-size", "4", "--max-train-steps", "4",
    "--diagnostics-every", "2", "--logging-steps", "1", "--save-steps", "2",
    "--num-sample-images", "4", "--sample-steps", "3", "--lr-warmup-steps", "0",
]  # fmt: skip
UVIT_TOY = [
    "--img-size", "32", "--patch-size", "8", "--embed-dim", "32", "--depth", "4", "--num-heads", "2",
    "--batch-size", "4", "--max-train-steps", "4", "--diagnostics-every", "2", "--logging-steps", "1",
    "--save-steps", "2", "--num-sample-images", "4", "--sample-steps", "3", "--warmup-steps", "0",
]  # fmt: skip


def run_example(script: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def example_main(script: str, args: list[str], cwd: Path, monkeypatch, capsys) -> tuple[int, str, str]:
    """The script's ``main(args)`` in this process, in ``cwd``: its exit code, stdout and stderr."""
    spec = importlib.util.spec_from_file_location(Path(script).stem, EXAMPLES / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    capsys.readouterr()
    with monkeypatch.context() as m:
        m.chdir(cwd)
        code = module.main(args)
    out, err = capsys.readouterr()
    return code, out, err


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def assert_diagnostics_logged(run: Path, num_skips: int) -> None:
    logged = [r for r in records(run) if "feature_norm" in r]
    assert [r["step"] for r in logged] == [2, 4]  # every --diagnostics-every steps
    for r in logged:
        assert math.isfinite(r["feature_norm"]) and r["feature_norm"] > 0
        blocks = [k for k in r if k.startswith("block/") and k.endswith("/feature_norm")]
        assert len(blocks) >= 3 and all(math.isfinite(r[k]) for k in blocks)
        assert all(math.isfinite(r[f"skip/{i}/coef_mean"]) for i in range(1, num_skips + 1))
        assert f"skip/{num_skips + 1}/coef_mean" not in r
    assert [r["step"] for r in records(run) if "loss" in r] == [1, 2, 3, 4]


def assert_analyze_draws(run: Path) -> None:
    from scalelong.cli import main

    assert main(["analyze", str(run)]) == 0
    assert (run / "report" / "feature_norm.png").stat().st_size > 0


def test_the_diffusers_example_trains_logs_saves_samples_and_resumes(tmp_path, monkeypatch, capsys):
    from diffusers import UNet2DModel

    from scalelong import is_applied, load_scalelong

    args = ["--output-dir", "run", "--skip-method", "ls", *DIFFUSERS_TOY]
    code, out, err = example_main("train_diffusers_unet.py", args, tmp_path, monkeypatch, capsys)
    assert code == 0, err[-3000:]
    run = tmp_path / "run"
    assert "ScaleLong ls: 4 long skips, learned" in out
    assert_diagnostics_logged(run, num_skips=4)
    assert {"lr", "ema_decay"} <= set(records(run)[-1])
    assert list((run / "logs" / "train_diffusers_unet").glob("events.out.tfevents.*"))  # TensorBoard
    assert (run / "samples.png").stat().st_size > 0

    # The saved UNet is diffusers' plain model plus ScaleLong's files, holding the EMA of the gates.
    unet = load_scalelong(UNet2DModel.from_pretrained(run / "unet"), run / "unet")
    assert is_applied(unet) and unet.scalelong.method == "ls"
    x = torch.randn(2, 1, 16, 16)
    assert unet(x, torch.tensor([10, 900])).sample.shape == x.shape
    assert_analyze_draws(run)

    # Resuming from checkpoint-2 trains steps 3 and 4 again, and the log reads as one run.
    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed, ignore=shutil.ignore_patterns("checkpoint-4", "report"))
    args = [
        "--output-dir",
        "resumed",
        "--skip-method",
        "ls",
        *DIFFUSERS_TOY,
        "--resume-from-checkpoint",
        "latest",
    ]
    code, out, err = example_main("train_diffusers_unet.py", args, tmp_path, monkeypatch, capsys)
    assert code == 0, err[-3000:]
    assert "resumed from" in out and "checkpoint-2 at step 2" in out
    assert [r["step"] for r in records(resumed) if "loss" in r] == [1, 2, 3, 4]
    assert records(resumed)[:2] == records(run)[:2]

    # A checkpoint of another skip method is refused in one line, before anything is built.
    other = [a if a != "ls" else "cs" for a in args]
    code, _, err = example_main("train_diffusers_unet.py", other, tmp_path, monkeypatch, capsys)
    assert code == 2
    assert err.strip().splitlines() == [err.strip()]
    assert "--skip-method ls (now cs)" in err


def test_the_plain_uvit_example_trains_saves_samples_and_resumes_exactly(tmp_path, monkeypatch, capsys):
    from safetensors.torch import load_file

    from scalelong import UViT

    args = ["--output-dir", "run", "--skip-method", "ls", *UVIT_TOY]
    code, _, err = example_main("train_uvit_plain.py", args, tmp_path, monkeypatch, capsys)
    assert code == 0, err[-3000:]
    run = tmp_path / "run"
    assert_diagnostics_logged(run, num_skips=2)
    digits = [r for r in records(run) if "digits/confident" in r]
    assert len(digits) == 1 and 0 <= digits[0]["digits/confident"] <= 1  # the digit score of the grid
    assert (run / "samples.png").stat().st_size > 0

    # The EMA weights, LS gates included, load into the U-ViT the saved arguments build.
    kwargs = json.loads((run / "model_args.json").read_text())
    model = UViT(**kwargs)
    state = load_file(run / "ema.safetensors")
    assert any(k.startswith("skip_scaling.") for k in state)
    model.load_state_dict(state)  # strict: every tensor present, none left over
    x = torch.randn(2, 1, 32, 32)
    assert model(x, torch.tensor([10.0, 900.0])).shape == x.shape
    assert_analyze_draws(run)

    # Stopped after step 2 and resumed: the same log and the same weights as the run never stopped.
    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed, ignore=shutil.ignore_patterns("step-000004", "report"))
    args = ["--output-dir", "resumed", "--skip-method", "ls", *UVIT_TOY, "--resume"]
    code, _, err = example_main("train_uvit_plain.py", args, tmp_path, monkeypatch, capsys)
    assert code == 0, err[-3000:]
    assert records(resumed) == records(run)
    final = "checkpoints/step-000004/model.safetensors"
    assert (resumed / final).read_bytes() == (run / final).read_bytes()

    # Without --resume, a folder that holds checkpoints is refused rather than mixed into (before
    # anything is built).
    code, _, err = example_main("train_uvit_plain.py", args[:-1], tmp_path, monkeypatch, capsys)
    assert code == 2 and "pass --resume" in err


@pytest.mark.parametrize(
    "script, args, says",
    [
        ("train_diffusers_unet.py", ["--skip-method", "scaled"], "invalid choice: 'scaled'"),
        ("train_diffusers_unet.py", ["--train-data-dir", "no-such-folder"], "is not a folder"),
        ("train_diffusers_unet.py", ["--resolution", "30"], "must be divisible by 8"),
        ("train_uvit_plain.py", ["--skip-method", "scaled"], "invalid choice: 'scaled'"),
        ("train_uvit_plain.py", ["--img-size", "30"], "divisible by --patch-size 4"),
    ],
)
def test_a_bad_argument_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, script, args, says):
    code, _, err = example_main(script, ["--output-dir", "run", *args], tmp_path, monkeypatch, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], err
    assert not (tmp_path / "run").exists()  # nothing written


@pytest.mark.parametrize(
    "script, args, says",
    [
        ("train_diffusers_unet.py", ["--resolution", "30"], "must be divisible by 8"),
        ("train_uvit_plain.py", ["--img-size", "30"], "divisible by --patch-size 4"),
    ],
)
def test_a_script_runs_as_a_user_runs_it(tmp_path, script, args, says):
    """``python examples/SCRIPT ARGS`` in a process of its own: the script's entry point reads the
    command line, and a bad argument ends it with one line and exit code 2."""
    done = run_example(script, ["--output-dir", "run", *args], tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], done.stderr
    assert not (tmp_path / "run").exists()  # nothing written
