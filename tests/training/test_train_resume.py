"""Checkpoints and resume: atomic full-state checkpoints, exact resume after SIGKILL, fallback
from a damaged checkpoint, config mismatch, Ctrl-C / SIGTERM.

The runs that are killed go through subprocesses; the straight run and every resume train in
this process (``cli``). All of them compute on one thread, so the weights of a resumed run and
of the straight run compare bit for bit.
"""

import contextlib
import hashlib
import io
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import TESTS, assert_bitwise_equal
from scalelong.cli import main
from scalelong.training.checkpoint import checkpoint_problem, list_checkpoints, save_checkpoint

# One worker runs this module (`--dist loadgroup`): the straight run (workdir) is made once.
pytestmark = pytest.mark.xdist_group("test_train_resume")

TINY = {
    "name": "straight",
    "model": {
        "type": "uvit",
        "skip": {"method": "ls"},
        "uvit": {
            "img_size": 32,
            "patch_size": 8,
            "in_channels": 1,
            "embed_dim": 32,
            "depth": 2,
            "num_heads": 2,
        },
    },
    "data": {"name": "mnist", "hflip": True},
    "optim": {"lr": 2e-3, "betas": [0.9, 0.999], "warmup_steps": 3},
    "train": {
        "steps": 12,
        "batch_size": 8,
        "ema_decay": 0.9,
        "log_every": 3,
        "checkpoint_every": 6,
        "device": "cpu",
        "tensorboard": False,
    },
    "sample": {"num_images": 0},
    "diagnostics": {"noise_levels": 8},  # the end-of-run probe on 8 held-out images, not 256
}
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``scalelong train config.yaml --no-progress ARGS`` in ``cwd``, in this process (a training
    process's start-up is seconds, the runs here a fraction of one): its code and output."""
    argv = ["train", "config.yaml", "--no-progress", *args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def start_hanging(name: str, cwd: Path) -> subprocess.Popen:
    """A run that waits after its step-6 checkpoint, to be killed there."""
    return subprocess.Popen(
        [sys.executable, str(TESTS / "run_until_killed.py"), "6"]
        + ["train", "config.yaml", "--no-progress", f"name={name}"],
        cwd=cwd,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, f"{path} did not appear"
        time.sleep(0.2)


def final_state(run: Path) -> dict:
    ckpt = run / "checkpoints" / "step-000012"
    return {
        "model": load_file(ckpt / "model.safetensors"),
        "ema": load_file(ckpt / "ema.safetensors"),
        "optimizer": torch.load(ckpt / "optimizer.pt", weights_only=True),
        "trainer": torch.load(ckpt / "trainer.pt", weights_only=True),
    }


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A folder with config.yaml and the straight 12-step run ``runs/straight``."""
    root = tmp_path_factory.mktemp("resume")
    (root / "config.yaml").write_text(yaml.safe_dump(TINY))
    out = cli(cwd=root)
    assert out.returncode == 0, out.stderr
    return root


@pytest.mark.slow
def test_checkpoint_holds_the_full_state(workdir):
    run = workdir / "runs" / "straight"
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step-000006", "step-000012"]
    ckpt = run / "checkpoints" / "step-000012"
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["step"] == 12 and meta["config"]["train"]["batch_size"] == 8
    assert sorted(meta["files"]) == ["ema.safetensors", "model.safetensors", "optimizer.pt", "trainer.pt"]
    trainer = torch.load(ckpt / "trainer.pt", weights_only=True)
    assert trainer["step"] == 12 and trainer["data"]["position"] == 12
    assert len(trainer["rng"]) == 1 and trainer["lr_schedule"]["lr"] == 2e-3
    optimizer = torch.load(ckpt / "optimizer.pt", weights_only=True)
    assert float(next(iter(optimizer["state"].values()))["step"]) == 12
    assert checkpoint_problem(ckpt) is None
    assert not any(p.name.startswith(".tmp") for p in (run / "checkpoints").iterdir())
    # EMA and weights differ (EMA lags), the LS gate trained
    model, ema = load_file(ckpt / "model.safetensors"), load_file(ckpt / "ema.safetensors")
    assert any(k.startswith("skip_scaling.") for k in model)
    assert not all(torch.equal(model[k], ema[k]) for k in model)


@pytest.mark.slow
def test_sigkill_after_step_6_then_resume_is_bitwise_exact(workdir):
    proc = start_hanging("killed", workdir)
    run = workdir / "runs" / "killed"
    wait_for(run / "checkpoints" / "step-000006", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run / "checkpoints" / "step-000012").exists()
    assert json.loads((run / ".lock").read_text())["pid"] == proc.pid  # a kill -9 leaves its lock
    out = cli("name=killed", cwd=workdir)  # the same command resumes
    assert out.returncode == 0, out.stderr
    assert "resuming" in out.stdout and "step-000006" in out.stdout
    takeover = [line for line in out.stdout.splitlines() if line.startswith("warning:")]
    assert len(takeover) == 1 and f"pid {proc.pid} on host" in takeover[0] and "no longer runs" in takeover[0]
    assert not (run / ".lock").exists()
    assert_bitwise_equal(final_state(workdir / "runs" / "straight"), final_state(run))
    # the metrics read as one run: every logged step once
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]
    assert steps == [3, 6, 9, 12]


def copy_run(workdir: Path, name: str) -> Path:
    """A copy of the straight 12-step run under another name."""
    run = workdir / "runs" / name
    shutil.copytree(workdir / "runs" / "straight", run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["name"] = name
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    return run


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its content."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def garbage_with_matching_checksums(checkpoint: Path, name: str) -> None:
    """Replace a file of a checkpoint by garbage and update meta.json to vouch for it."""
    data = b"\x80\x02 this is not a torch file" * 8
    (checkpoint / name).write_bytes(data)
    meta = json.loads((checkpoint / "meta.json").read_text())
    meta["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (checkpoint / "meta.json").write_text(json.dumps(meta))


@pytest.mark.slow
def test_truncated_newest_checkpoint_falls_back_to_the_one_before(workdir):
    straight = workdir / "runs" / "straight"
    run = copy_run(workdir, "damaged")
    weights = run / "checkpoints" / "step-000012" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    out = cli("name=damaged", cwd=workdir)
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stdout.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "step-000012" in warnings[0] and "truncated" in warnings[0]
    assert "resuming" in out.stdout and "from step-000006" in out.stdout
    assert_bitwise_equal(final_state(straight)["model"], final_state(run)["model"])


@pytest.mark.slow
def test_different_config_in_existing_run_dir_is_an_error(workdir, monkeypatch, capsys):
    # No training happens here, so the command runs in this process.
    monkeypatch.chdir(workdir)
    run = workdir / "runs" / "straight"
    before = sorted(str(p) for p in run.rglob("*"))
    assert main(["train", "config.yaml", "--no-progress", "optim.lr=1e-3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "another config" in err and "optim.lr" in err
    assert "Traceback" not in err
    assert sorted(str(p) for p in run.rglob("*")) == before
    # a finished run re-run with the same config is complete, not retrained
    assert main(["train", "config.yaml", "--no-progress"]) == 0
    assert "complete at step 12" in capsys.readouterr().out


def test_keep_last_k_and_refuse_nonfinite(tmp_path):
    w = {"w": torch.ones(3)}
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, w, w, {}, optimizer={}, trainer={}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000003", "step-000004"]
    with pytest.raises(Exception, match="non-finite values in ema.w"):
        save_checkpoint(tmp_path, 5, w, {"w": torch.tensor([1.0, float("nan")])}, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000003", "step-000004"]


def test_tracker_truncates_on_resume_and_skips_missing_tensorboard(tmp_path, monkeypatch, capsys):
    from scalelong.runlog.tracking import Tracker
    from scalelong.training.runs import RunDir

    run = RunDir(tmp_path)
    tracker = Tracker(run, {}, tensorboard=True)
    for step in (2, 4, 6):
        tracker.log({"step": step, "loss": 1.0 / step, "nonfinite_steps": 0})
    tracker.close()
    assert len(list(run.tb_dir.iterdir())) == 1
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if not installed
    with pytest.warns(UserWarning, match="tensorboard is not installed"):  # the library's way
        Tracker(run, {}, start_step=4, tensorboard=True).close()
    resumed = Tracker(run, {}, start_step=4, tensorboard=True, warn=print)  # the trainer's: one line
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "tensorboard is not installed" in out and resumed.tb is None
    resumed.log({"step": 6, "loss": float("nan")})
    records = run.metrics()
    assert [r["step"] for r in records] == [2, 4, 6] and math.isnan(records[-1]["loss"])
    assert run.metrics_file.read_text().splitlines()[-1] == '{"step": 6, "loss": "nan"}'  # JSON has no NaN


@pytest.mark.slow
def test_garbage_trainer_pt_with_matching_checksums_falls_back(workdir):
    run = copy_run(workdir, "garbage")
    garbage_with_matching_checksums(run / "checkpoints" / "step-000012", "trainer.pt")
    out = cli("name=garbage", cwd=workdir)
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stdout.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "step-000012" in warnings[0] and "trainer.pt does not load" in warnings[0]
    assert "resuming" in out.stdout and "from step-000006" in out.stdout
    assert_bitwise_equal(final_state(workdir / "runs" / "straight"), final_state(run))


@pytest.mark.slow
def test_every_checkpoint_damaged_stops_in_one_line_and_deletes_nothing(workdir):
    run = copy_run(workdir, "ruined")
    (run / "notes.txt").write_text("the user's own file")
    garbage_with_matching_checksums(run / "checkpoints" / "step-000006", "trainer.pt")
    weights = run / "checkpoints" / "step-000012" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    before = tree(run)
    for args in ((), ("--resume",)):
        done = cli("name=ruined", *args, cwd=workdir)
        code, out, err = done.returncode, done.stdout, done.stderr
        assert code == 2 and "Traceback" not in err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: every checkpoint in"), err
        assert "step-000012: model.safetensors is truncated" in lines[0]
        assert "step-000006: trainer.pt does not load" in lines[0] and "--overwrite" in lines[0]
        assert "warning:" not in out and "resuming" not in out
        assert tree(run) == before  # no restart, nothing deleted, no lock left


@pytest.mark.slow
def test_rerun_after_a_kill_behind_the_last_checkpoint_writes_the_summary(workdir):
    run = copy_run(workdir, "nosummary")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["steps"] == 12
    (run / "summary.json").unlink()  # killed after its final checkpoint, before the summary
    out = cli("name=nosummary", cwd=workdir)
    assert out.returncode == 0, out.stderr
    assert "complete at step 12" in out.stdout
    assert json.loads((run / "summary.json").read_text()) == summary


@pytest.mark.slow
def test_torn_metrics_line_empty_config_and_half_removed_checkpoint_resume(workdir):
    run = copy_run(workdir, "torn")
    shutil.rmtree(run / "checkpoints" / "step-000012")  # killed between steps 9 and 12
    shutil.copytree(run / "checkpoints" / "step-000006", run / "checkpoints" / ".old-step-000003")
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 13, "lo')  # cut short by the kill
    (run / "config.yaml").write_text("")  # and the config cut to 0 bytes
    out = cli("name=torn", cwd=workdir)
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stdout.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2, out.stdout
    assert "config.yaml is empty; using the config stored in step-000006" in warnings[0]
    assert "metrics.jsonl: its last line is cut short" in warnings[1]
    assert "from step-000006" in out.stdout
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]
    assert steps == [3, 6, 9, 12]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000006", "step-000012"]
    assert yaml.safe_load((run / "config.yaml").read_text())["name"] == "torn"
    assert_bitwise_equal(final_state(workdir / "runs" / "straight"), final_state(run))


@pytest.mark.slow
def test_two_trainers_on_one_run_one_clear_refusal_then_sigterm_leaves_the_last_checkpoint(workdir):
    """Both start at once; the one that gets the lock waits after its step-6 checkpoint, so the
    other always finds it busy. The refused one changes nothing, --overwrite included. SIGTERM
    then ends the holder with exit code 2 and one line, its step-6 checkpoint complete, its
    summary saying so and its lock released; the same command resumes it."""
    procs = [start_hanging("twice", workdir) for _ in range(2)]
    run = workdir / "runs" / "twice"
    end = time.monotonic() + 240
    while all(p.poll() is None for p in procs):
        assert time.monotonic() < end, "neither trainer ended"
        time.sleep(0.2)
    refused = next(p for p in procs if p.poll() is not None)
    holder = next(p for p in procs if p is not refused)
    out, err = refused.communicate()
    assert refused.returncode == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert f"is being trained by pid {holder.pid} on host {socket.gethostname()}" in lines[0]
    wait_for(run / "checkpoints" / "step-000006", holder)
    before = tree(run)
    for args in ((), ("--overwrite",)):  # a third trainer, in this process
        done = cli("name=twice", *args, cwd=workdir)
        code, err = done.returncode, done.stderr
        assert code == 2 and f"pid {holder.pid}" in err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert tree(run) == before
    holder.send_signal(signal.SIGTERM)
    _, err = holder.communicate(timeout=60)
    assert holder.returncode == 2 and not (run / ".lock").exists()
    assert err.strip().count("\n") == 0 and "interrupted at step 6" in err
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-000006"]
    assert checkpoint_problem(run / "checkpoints" / "step-000006") is None
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps"] == 6 and "interrupted" in summary["error"]
    out = cli("name=twice", cwd=workdir)
    assert out.returncode == 0, out.stderr
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]
    assert steps == [3, 6, 9, 12]  # each step logged once
    assert_bitwise_equal(final_state(workdir / "runs" / "straight"), final_state(run))
