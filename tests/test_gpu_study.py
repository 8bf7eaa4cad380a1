"""benchmarks/gpu_study.sh: the depth study's script, at toy size on the CPU, so that it runs unchanged
on the day a GPU is there; and the study's own command line checked without training."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu_study.sh"


# the script's settings: only those a test passes may reach it
SETTINGS = ("METHODS", "DEPTHS", "LRS", "SEEDS", "STEPS", "BATCH", "JOBS", "EXTRA", "FIG1_LR", "OUT", "NAME")


def study(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in SETTINGS and k != "GPU_STUDY_TOY"}
    environ |= {"PY": sys.executable, **env}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=environ, capture_output=True, text=True, timeout=300
    )


def test_the_studys_command_line_validates_without_a_gpu(tmp_path):
    """--dry-run: every run of the real study (width 512, patch 2, bf16 on cuda) checked, none trained."""
    done = study("--dry-run", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    names = [f"d{d}-lr0.0005-{m}-seed0" for d in (12, 24) for m in ("none", "sqrt2", "cs", "ls")]
    assert f"8 runs in {tmp_path / 'out' / 'gpu-study-sweep' / 'runs'}" in out
    assert all(f"{n}  " in out for n in names)
    for line in ("embed_dim: 512", "num_heads: 8", "patch_size: 2", "device: cuda", "mixed_precision: bf16"):
        assert f"    {line}\n" in out or f"  {line}\n" in out, line
    assert "  steps: 1500\n" in out and "  batch_size: 32\n" in out and "  checkpoint_every: 0\n" in out
    assert "model: uvit, 44,513,294 parameters" in out
    assert not (tmp_path / "out").exists()  # nothing written


@pytest.mark.slow
def test_the_settings_reach_the_studys_plan(tmp_path):
    done = study("--dry-run", "--out", str(tmp_path), DEPTHS="12,24,36", STEPS="600", LRS="2e-4,5e-4")
    assert done.returncode == 0, done.stderr
    assert "24 runs in" in done.stdout and "d36-lr0.0002-ls-seed0" in done.stdout
    assert "  steps: 600\n" in done.stdout


@pytest.mark.slow
def test_toy_study_finishes_every_run_and_reports_even_after_a_failure(tmp_path):
    done = study("--toy", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    sweep = tmp_path / "gpu-study-sweep"
    runs = sorted(p.name for p in (sweep / "runs").iterdir())
    assert runs == [f"d{d}-lr0.01-{m}-seed0" for d in (2, 4) for m in ("cs", "none")]
    for name in runs:
        summary = json.loads((sweep / "runs" / name / "summary.json").read_text())
        assert summary["status"] == "complete" and summary["steps"] == 4, name
    for name in ("report.md", "report.html", "fig1.png", "out_blocks_d2.png", "out_blocks_d4.png"):
        assert (sweep / name).is_file(), name
    assert "![Fig. 1 at lr 0.01](fig1.png)" in (sweep / "report.md").read_text()
    assert done.stdout.rstrip().endswith(f"report: {sweep / 'report.md'}\n        {sweep / 'report.html'}")

    # a sweep that fails before its new runs: the report of the finished ones is written all the same
    (sweep / "report.md").unlink()
    (sweep / "fig1.png").unlink()
    blocker = sweep / "runs" / "d2-lr0.01-sqrt2-seed0"
    blocker.mkdir()
    (blocker / "notes.txt").write_text("not a run\n")
    done = study("--toy", "--out", str(tmp_path), METHODS="none,cs,sqrt2")
    assert done.returncode == 2
    assert "exists but holds no run" in done.stderr and "sweep ended with status 2" in done.stdout
    report = (sweep / "report.md").read_text()
    assert "4 cells with 1 seed(s) each" in report and (sweep / "fig1.png").is_file()
    assert f"report: {sweep / 'report.md'}" in done.stdout
