"""benchmarks/gpu_study.sh: the lr basin (and the depth study) at the release's width, run at toy size
on the CPU, so that it runs unchanged on the day a GPU is there; and the studies' own command lines
checked without training."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from scalelong.cli import main

SCRIPT = REPO / "benchmarks" / "gpu_study.sh"


# the script's settings: only those a test passes may reach it
SETTINGS = (
    "STUDY", "METHODS", "NORM_ARM", "DEPTHS", "LRS", "SEEDS", "STEPS", "BATCH", "JOBS", "EXTRA", "FIG1_LR",
    "OUT", "NAME",
)  # fmt: skip


def study(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in SETTINGS and k != "GPU_STUDY_TOY"}
    environ |= {"PY": sys.executable, **env}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=environ, capture_output=True, text=True, timeout=300
    )


def dry_run(
    folder: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str, **env: str
) -> subprocess.CompletedProcess:
    """``gpu_study.sh --dry-run ARGS`` with these settings: the script builds its command line and
    hands it to a stand-in for Python (PY) that records it; that command, ``python -m scalelong.cli
    ...``, then runs as scalelong's main() in this process, in the folder the script runs it in.
    A dry run trains nothing: a Python process of its own would spend seconds starting up on a
    command that then takes a fraction of one. Its exit code and output."""
    recorder, argv_file = folder / "python", folder / "argv"
    recorder.write_text(f"#!/usr/bin/env bash\nprintf '%s\\0' \"$@\" > '{argv_file}'\n")
    recorder.chmod(0o755)
    script = study("--dry-run", *args, PY=str(recorder), **env)
    assert script.returncode == 0, script.stderr
    argv = argv_file.read_text().split("\0")[:-1]
    assert argv[:2] == ["-m", "scalelong.cli"] and argv[-1] == "--dry-run", argv
    capsys.readouterr()
    with monkeypatch.context() as m:
        m.chdir(REPO)  # where the script runs its commands
        code = main(argv[2:])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, out, err)


def has(out: str, *lines: str) -> None:
    for line in lines:
        assert f"    {line}\n" in out or f"  {line}\n" in out, line


def test_the_basins_command_line_validates_without_a_gpu(tmp_path, monkeypatch, capsys):
    """--dry-run: every run of the real basin (width 512, patch 2, bf16 on cuda, the stability
    preset) checked, none trained."""
    done = dry_run(tmp_path, monkeypatch, capsys, "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    lrs = ("0.001", "0.002", "0.004")
    names = [f"d12-lr{lr}-{m}-seed0" for lr in lrs for m in ("none", "cs", "skip-norm")]
    assert f"9 runs in {tmp_path / 'out' / 'gpu-basin-sweep' / 'runs'}" in out
    assert all(f"{n}  " in out for n in names)
    has(out, "embed_dim: 512", "num_heads: 8", "patch_size: 2", "device: cuda", "mixed_precision: bf16")
    has(out, "lr_schedule: constant", "warmup_steps: 200", "weight_decay: 0.03", "- 0.99", "every: 0")
    has(out, "noise_levels_at_start: true", "noise_levels_raw: true", "noise_levels_every: 0")
    assert "  steps: 1800\n" in out and "  batch_size: 32\n" in out and "  checkpoint_every: 0\n" in out
    assert "model: uvit, 44,513,294 parameters" in out
    assert not (tmp_path / "out").exists()  # nothing written


@pytest.mark.slow
def test_the_settings_reach_the_studys_plan(tmp_path, monkeypatch, capsys):
    # a narrow model through EXTRA (the last overrides): what is checked here is the plan; at the
    # release's width the model checks go to the meta device, seconds per command (checked above)
    small = "model.uvit.embed_dim=32 model.uvit.patch_size=8"
    out = ("--out", str(tmp_path))
    done = dry_run(tmp_path, monkeypatch, capsys, *out, NORM_ARM="merge-norm", LRS="1.5e-3,3e-3", EXTRA=small)
    assert done.returncode == 0, done.stderr
    assert "6 runs in" in done.stdout and "d12-lr0.003-merge-norm-seed0" in done.stdout
    # the depth study: the demo recipe
    done = dry_run(tmp_path, monkeypatch, capsys, *out, STUDY="depth", EXTRA=small)
    assert done.returncode == 0, done.stderr
    names = [f"d{d}-lr0.0005-{m}-seed0" for d in (12, 24) for m in ("none", "sqrt2", "cs", "ls")]
    assert f"8 runs in {tmp_path / 'gpu-study-sweep' / 'runs'}" in done.stdout
    assert all(f"{n}  " in done.stdout for n in names)
    assert "  steps: 1500\n" in done.stdout and "  lr_schedule: cosine\n" in done.stdout
    settings = dict(STUDY="depth", DEPTHS="12,24,36", STEPS="600", LRS="2e-4,5e-4", EXTRA=small)
    done = dry_run(tmp_path, monkeypatch, capsys, *out, **settings)
    assert done.returncode == 0, done.stderr
    assert "24 runs in" in done.stdout and "d36-lr0.0002-ls-seed0" in done.stdout
    assert "  steps: 600\n" in done.stdout
    done = study("--dry-run", STUDY="width")
    assert done.returncode == 2 and "STUDY=width: choose basin or depth" in done.stderr


@pytest.mark.slow
def test_toy_basin_finishes_every_run_and_reports_even_after_a_failure(tmp_path):
    done = study("--toy", "--out", str(tmp_path), METHODS="none,skip-norm")
    assert done.returncode == 0, done.stderr
    sweep = tmp_path / "gpu-basin-sweep"
    runs = sorted(p.name for p in (sweep / "runs").iterdir())
    assert runs == [f"d2-lr{lr}-{m}-seed0" for lr in ("0.01", "1000") for m in ("none", "skip-norm")]
    for name in runs:
        summary = json.loads((sweep / "runs" / name / "summary.json").read_text())
        if "lr1000" in name:  # far past the edge: non-finite within the 4 steps, stopped early
            assert summary["status"] == "stopped", name
        else:
            assert summary["status"] == "complete" and summary["steps"] == 4, name
        first = json.loads((sweep / "runs" / name / "metrics.jsonl").read_text().splitlines()[0])
        assert first["step"] == 0 and "noise/raw/x0_mse@0.50" in first  # the untrained model, the cap
    for name in ("report.md", "report.html", "basin.png", "fig1.png", "map.json"):
        assert (sweep / name).is_file(), name
    report = (sweep / "report.md").read_text()
    assert (
        "## The lr basin" in report and "of the 4 runs: 4 runs, the run's own step-0 measurement." in report
    )
    assert "| failed at 0.01 | failed at 1000 |" in report and "LR sensitivity (trained weights)" in report
    basin = {b["method"]: b for b in json.loads((sweep / "map.json").read_text())["basin"]}
    assert basin.keys() == {"none", "skip-norm"} and basin["none"]["failed"][1]["failed"] == 1
    assert done.stdout.rstrip().endswith(f"report: {sweep / 'report.md'}\n        {sweep / 'report.html'}")

    # a sweep that fails before its new runs: the report of the finished ones is written all the same
    (sweep / "report.md").unlink()
    (sweep / "basin.png").unlink()
    blocker = sweep / "runs" / "d2-lr0.01-cs-seed0"
    blocker.mkdir()
    (blocker / "notes.txt").write_text("not a run\n")
    done = study("--toy", "--out", str(tmp_path), METHODS="none,skip-norm,cs")
    assert done.returncode == 2
    assert "exists but holds no run" in done.stderr and "sweep ended with status 2" in done.stdout
    report = (sweep / "report.md").read_text()
    assert "4 cells with 1 seed(s) each" in report and (sweep / "basin.png").is_file()
    assert f"report: {sweep / 'report.md'}" in done.stdout
