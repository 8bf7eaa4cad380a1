import json
import subprocess
import sys

import pytest

from conftest import run_cli, tiny_uvit_overrides


@pytest.mark.parametrize(
    "override, words",
    [
        ("model.skip.metod=cs", "unknown config key 'model.skip.metod'"),
        ("model.skip.kappa=1.5", "kappa must be a number in (0, 1]"),
        ("model.skip.method=foo", "unknown skip method 'foo'"),
        ("train.steps=ten", "'train.steps' must be of type int"),
        ("model.uvit.patch_size=5", "divisible by patch_size"),
    ],
)
def test_bad_config_one_line_exit_2_no_run_dir(tmp_path, capsys, override, words):
    out = tmp_path / "runs"
    code, stdout, stderr = run_cli(capsys, "train", "configs/demo_uvit.yaml", f"out_dir={out}", override)
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], stderr
    assert "Traceback" not in stderr + stdout
    assert not out.exists()


def test_missing_config_file(tmp_path):
    """The installed entry point (a real process): the error is one line on stderr, exit 2."""
    proc = subprocess.run(
        [sys.executable, "-m", "scalelong.cli", "train", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: config file not found: {tmp_path / 'nope.yaml'}"


def test_info_prints_parameter_count_and_skip_table(capsys):
    code, stdout, stderr = run_cli(capsys, "info", "configs/cifar10_uvit_s2.yaml", "model.skip.method=cs")
    assert code == 0, stderr
    assert "44,255,328 parameters" in stdout
    rows = [line.split() for line in stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["1", "2", "3", "4", "5", "6"]
    assert [float(r[3]) for r in rows] == [1, 0.5, 0.25, 0.125, 0.0625, 0.03125]
    assert all(r[1] == "257x512" and r[2] == "built-in" for r in rows)


def test_train_end_to_end_prints_where_outputs_are(tmp_path, capsys):
    code, stdout, stderr = run_cli(
        capsys,
        "train",
        "configs/demo_uvit.yaml",
        "--no-progress",
        *tiny_uvit_overrides("cli", tmp_path, steps=5),
    )
    assert code == 0, stderr
    assert "metrics:" in stdout and "samples:" in stdout
    assert (tmp_path / "cli" / "metrics.jsonl").is_file()
    assert "fd-mnist" not in stdout and "scalelong eval" not in stdout  # nothing was evaluated


def test_train_prints_its_last_score_and_digit_score(tmp_path, capsys):
    """A run that evaluates ends by saying what it scored, with FD-MNIST's digit score beside it,
    the best step's re-score where one was asked for, and how to score more samples where not."""
    evaluation = ["eval.every=5", "eval.num_samples=8", "eval.steps=2", "eval.batch_size=8"]
    args = ["train", "configs/demo_uvit.yaml", "--no-progress", *tiny_uvit_overrides("ev", tmp_path, steps=5)]
    code, stdout, stderr = run_cli(capsys, *args, *evaluation)
    assert code == 0, stderr
    line = next(x for x in stdout.splitlines() if x.startswith("fd-mnist "))
    fd = float(line.split()[1])
    record = [json.loads(x) for x in (tmp_path / "ev" / "metrics.jsonl").read_text().splitlines()]
    logged = next(r for r in record if "fd" in r)
    assert fd == pytest.approx(logged["fd"], abs=0.05)
    assert "(step 5, 8 samples, dpm_solver 2 steps)" in line
    assert f"confident {logged['digits/confident']:.2f} (real digits 0.96)" in line
    assert f"scalelong eval {tmp_path / 'ev'} --n 1000" in stdout
    code, stdout, stderr = run_cli(capsys, *args, *evaluation, "eval.final_num_samples=6", "--overwrite")
    assert code == 0, stderr
    assert "best step 5 re-scored: fd-mnist " in stdout
    assert "(6 samples, all the evaluation's)" in stdout  # its first 6 of 8: nothing drawn again
    assert "scalelong eval" not in stdout


def test_a_seed_beyond_2_to_the_31_is_one_line_and_trains_nothing(tmp_path, capsys):
    """torch.manual_seed refused it with a traceback once the run had started."""
    args = ["train", "configs/demo_uvit.yaml", *tiny_uvit_overrides("seed", tmp_path, steps=2)]
    code, stdout, stderr = run_cli(capsys, *args, "train.seed=100000000000000000000", "--no-progress")
    assert code == 2 and "Traceback" not in stdout + stderr
    assert stderr.strip().splitlines() == [
        "error: train.seed=100000000000000000000 is out of range: a seed lies in [0, 2**31) = "
        "[0, 2147483647]; choose one there"
    ]
    assert not (tmp_path / "seed").exists()


def test_a_broken_ddpm_chain_is_refused_before_overwrite_removes_the_run(tmp_path, capsys):
    """diffusion.num_steps=0 passed the setup and crashed at step 1, after --overwrite had removed the
    run it was to replace: now the old run stays as it was."""
    from scalelong.training.config import load_config, save_config

    old = load_config("configs/demo_uvit.yaml", tiny_uvit_overrides("old", tmp_path, steps=2))
    old.run_dir.mkdir()
    save_config(old, old.run_dir / "config.yaml")
    (old.run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    before = {p: p.read_bytes() for p in old.run_dir.iterdir()}
    ddpm = ["diffusion.schedule=ddpm", "diffusion.time_sampling=uniform", "diffusion.num_steps=0"]
    args = ["train", "configs/demo_uvit.yaml", *tiny_uvit_overrides("old", tmp_path, steps=2), *ddpm]
    code, stdout, stderr = run_cli(capsys, *args, "--overwrite", "--no-progress")
    assert code == 2 and "Traceback" not in stdout + stderr
    (line,) = stderr.strip().splitlines()
    assert line.startswith(
        "error: diffusion.num_steps=0 must lie in [2, 1,000,000] for diffusion.schedule=ddpm"
    )
    assert {p: p.read_bytes() for p in old.run_dir.iterdir()} == before


def test_info_refuses_a_uvit_without_context_tokens_in_one_line(capsys):
    """torch.zeros(1, -1, 8) in the model check raised a RuntimeError traceback."""
    args = ["info", "configs/demo_uvit.yaml", "model.uvit.context_dim=8", "model.uvit.context_tokens=-1"]
    code, stdout, stderr = run_cli(capsys, *args)
    assert code == 2 and "Traceback" not in stdout + stderr
    assert stderr.strip().splitlines() == ["error: model.uvit.context_tokens must be > 0, got -1"]
