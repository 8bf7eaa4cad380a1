"""Bad inputs a user can give: each one is one ``error:`` line on stderr, exit code 2, no
traceback, and nothing created on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO, run_cli, tiny_uvit_overrides
from scalelong.cli import main


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def refused(capsys, argv: list, *words: str) -> str:
    """Run ``scalelong ARGV`` in this process; assert one error line holding ``words``; return it."""
    code, out, err = run_cli(capsys, *argv)
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "override, words",
    [
        ("optim.lr=nan", ["'optim.lr' must be a finite number, got nan"]),
        ("optim.eps=nan", ["'optim.eps' must be a finite number"]),
        ("optim.lr=.inf", ["'optim.lr' must be a finite number, got inf"]),
        ("optim.lr=-.inf", ["'optim.lr' must be a finite number, got -inf"]),
        ("train.grad_clip=nan", ["'train.grad_clip' must be a finite number"]),
        ("optim.eps=0", ["optim.eps must be > 0"]),
        ("model.uvit.img_size=65536", ["model.uvit.img_size=65536 is larger than 4096"]),
        ("model.uvit.img_size=260 model.uvit.patch_size=1", ["67,600 tokens", "more than the 65,536"]),
    ],
)
@pytest.mark.parametrize("command", ["train", "info"])
def test_bad_numbers_in_the_config(tmp_path, capsys, monkeypatch, override, words, command):
    monkeypatch.chdir(tmp_path)
    config = REPO / "configs" / "demo_uvit.yaml"
    argv = [command, config, *tiny_uvit_overrides("bad", tmp_path / "runs"), *override.split()]
    refused(capsys, argv, *words)
    assert files_under(tmp_path) == []


def test_malformed_yaml_is_one_line_with_its_place(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  skip: {method: cs\ntrain:\n  steps: 3\n")
    line = refused(capsys, ["train", bad, f"out_dir={tmp_path / 'runs'}"], "not valid YAML", "line 3")
    assert str(bad) in line
    assert files_under(tmp_path) == ["bad.yaml"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--steps", "0"], ["--steps: must be >= 1, got 0"]),
        (["--steps", "-1"], ["--steps: must be >= 1, got -1"]),
        (["--n", "0"], ["--n: must be >= 1"]),
        (["--batch-size", "0"], ["--batch-size: must be >= 1"]),
        (["--step", "-3"], ["--step: must be >= 0"]),
        (["--steps", "many"], ["--steps: expected an integer, got 'many'"]),
    ],
)
def test_bad_sampling_arguments(tmp_path, capsys, args, words):
    argv = ["sample", tmp_path / "run", "--out", tmp_path / "out", *args]
    if "--n" not in args:
        argv += ["--n", "4"]
    refused(capsys, argv, *words)
    assert files_under(tmp_path) == []


def test_out_dir_that_is_a_file(tmp_path, capsys):
    (tmp_path / "runs").write_text("a file")
    config = REPO / "configs" / "demo_uvit.yaml"
    for out_dir in (tmp_path / "runs", tmp_path / "runs" / "deeper"):
        argv = ["train", config, *tiny_uvit_overrides("bad", out_dir), "--no-progress"]
        refused(capsys, argv, "is a file, not a folder", "choose another out_dir=")
    assert files_under(tmp_path) == ["runs"]


def test_a_batch_larger_than_the_data_is_found_before_the_run_directory(tmp_path, capsys):
    config = REPO / "configs" / "demo_uvit.yaml"
    argv = ["train", config, *tiny_uvit_overrides("big", tmp_path / "runs", steps=2), "--no-progress"]
    refused(capsys, [*argv, "train.batch_size=100000"], "fewer than one batch of train.batch_size=100000")
    assert files_under(tmp_path) == []
    assert main([str(a) for a in argv]) == 0  # the corrected command is not refused as "another config"
    assert "another config" not in capsys.readouterr().err


def test_contradicting_flags_and_an_emptied_config_yaml(tmp_path, capsys):
    config = REPO / "configs" / "demo_uvit.yaml"
    argv = ["train", config, *tiny_uvit_overrides("run", tmp_path / "runs"), "--no-progress"]
    refused(capsys, [*argv, "--overwrite", "--resume"], "--overwrite and --resume contradict")
    assert files_under(tmp_path) == []
    run = tmp_path / "runs" / "run"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("")  # cut to 0 bytes, and no checkpoint to take the config from
    refused(capsys, argv, "config.yaml is empty and no checkpoint", "--overwrite")
    assert files_under(tmp_path) == ["runs", "runs/run", "runs/run/config.yaml"]
    refused(capsys, [*argv, "--resume"], "config.yaml is empty")
    assert (run / "config.yaml").read_text() == ""
