"""`scalelong sample | fid-stats | eval` and the training-time evaluator, on a tiny untrained run."""

from __future__ import annotations

import json
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import run_cli_on_cpu as cli
from scalelong.cli import main
from scalelong.training.build import build_model
from scalelong.training.checkpoint import save_checkpoint
from scalelong.training.config import config_to_dict, load_config, save_config
from scalelong.training.evaluation import TrainingEvaluator
from scalelong.training.runs import RunDir

TINY = [
    "model.uvit.img_size=32",
    "model.uvit.patch_size=8",
    "model.uvit.in_channels=1",
    "model.uvit.embed_dim=16",
    "model.uvit.depth=2",
    "model.uvit.num_heads=2",
    "sample.sampler=dpm_solver",
    "sample.steps=3",
    "eval.steps=3",
    "eval.num_samples=16",
    "eval.batch_size=8",
    "eval.final_num_samples=24",
]


def write_checkpoint(run_dir: Path, cfg, step: int) -> Path:
    """A weights-only checkpoint (as ``save_checkpoint`` writes it, checksums included)."""
    torch.manual_seed(step)
    model = build_model(cfg.model)
    return save_checkpoint(run_dir / "checkpoints", step, model, model, config_to_dict(cfg))


@pytest.fixture()
def run(tmp_path: Path):
    cfg = load_config(None, [*TINY, "name=tiny", f"out_dir={tmp_path}", "eval.every=10"])
    cfg.run_dir.mkdir(parents=True)
    save_config(cfg, cfg.run_dir / "config.yaml")
    write_checkpoint(cfg.run_dir, cfg, 10)
    return cfg


def test_sample_writes_pngs_resumes_and_ignores_batch_size(run, tmp_path, capsys) -> None:
    out = tmp_path / "samples"
    rc, stdout, _ = cli(capsys, "sample", run.run_dir, "--n", 5, "--out", out, "--batch-size", 2)
    assert rc == 0 and "5 images (5 new)" in stdout
    first = np.load(out / "samples.npz")["images"]
    assert first.shape == (5, 32, 32, 1) and first.dtype == np.uint8 and first.std() > 0
    for i in (1, 4):
        (out / f"{i:06d}.png").unlink()
    kept = (out / "000000.png").stat().st_mtime_ns
    rc, stdout, _ = cli(capsys, "sample", run.run_dir, "--n", 5, "--out", out, "--batch-size", 5)
    assert rc == 0 and "5 images (2 new)" in stdout
    assert (out / "000000.png").stat().st_mtime_ns == kept
    np.testing.assert_array_equal(np.load(out / "samples.npz")["images"], first)  # same seeds, other batches
    rc, _, err = cli(capsys, "sample", run.run_dir, "--n", 5, "--out", out, "--sampler", "ddim")
    assert rc == 2 and err.count("\n") == 1 and "other settings (sampler: 'dpm_solver' -> 'ddim')" in err


def test_sample_draws_again_a_png_that_does_not_decode(run, tmp_path, capsys) -> None:
    from PIL import Image

    out = tmp_path / "samples"
    assert cli(capsys, "sample", run.run_dir, "--n", 3, "--out", out)[0] == 0
    first = np.load(out / "samples.npz")["images"]
    (out / "000000.png").write_bytes(b"not a png")
    cut = out / "000002.png"
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])  # opens, fails to load
    rc, stdout, err = cli(capsys, "sample", run.run_dir, "--n", 3, "--out", out)
    assert rc == 0 and "3 images (2 new)" in stdout and "Traceback" not in err
    warning = only_line(stdout, "warning:")
    assert "2 image(s) do not decode as PNG (000000.png, 000002.png); drawing them again" in warning
    for i in (0, 2):
        with Image.open(out / f"{i:06d}.png") as image:
            image.load()
    np.testing.assert_array_equal(np.load(out / "samples.npz")["images"], first)  # the same seeds again


def test_sample_refuses_an_out_it_cannot_tell_is_its_own(run, tmp_path, capsys) -> None:
    listed = tmp_path / "listed"
    listed.mkdir()
    (listed / "sampling.json").write_text("[1, 2]")  # valid JSON, not the object of settings
    rc, _, err = cli(capsys, "sample", run.run_dir, "--n", 2, "--out", listed)
    assert rc == 2 and "sampling.json holds a JSON list, not the object" in only_line(err, "error:")
    theirs = tmp_path / "theirs"
    assert cli(capsys, "sample", run.run_dir, "--n", 2, "--out", theirs)[0] == 0
    (theirs / "sampling.json").unlink()  # numbered PNGs nothing says were drawn with these settings
    (theirs / "samples.npz").unlink()
    rc, _, err = cli(capsys, "sample", run.run_dir, "--n", 2, "--out", theirs)
    line = only_line(err, "error:")
    assert rc == 2 and "holds 2 numbered PNG(s) (000000.png, ...) but no sampling.json" in line
    assert "choose an empty --out or remove the files" in line
    assert sorted(p.name for p in theirs.iterdir()) == ["000000.png", "000001.png"]  # nothing written
    assert (listed / "sampling.json").read_text() == "[1, 2]"


def test_eval_fd_mnist_and_bad_stats_fail_fast(run, tmp_path, capsys) -> None:
    rc, stdout, _ = cli(capsys, "eval", run.run_dir, "--n", 16, "--metric", "fd-mnist")
    assert rc == 0 and stdout.startswith("fd-mnist ")
    (result,) = [json.loads(p.read_text()) for p in (run.run_dir / "eval").iterdir()]
    assert result["fd_samples"] == 16 and result["fd"] > 0 and result["checkpoint"] == "step-000010"
    # the statistics are read before the checkpoint: with neither, the error names the statistics
    for p in (run.run_dir / "checkpoints" / "step-000010").iterdir():
        p.unlink()
    rc, _, err = cli(capsys, "eval", run.run_dir, "--fid-stats", tmp_path / "nope.npz", "--metric", "fid")
    assert rc == 2 and err.count("\n") == 1 and "nope.npz" in err


def test_fid_stats_then_eval_reads_the_metric_from_the_file(run, tmp_path, capsys) -> None:
    stats = tmp_path / "mnist.npz"
    config = run.run_dir / "config.yaml"
    rc, stdout, _ = cli(capsys, "fid-stats", config, "--out", stats, "--metric", "fd-mnist", "--limit", 200)
    assert rc == 0 and "statistics of 200 mnist images" in stdout
    rc, stdout, _ = cli(capsys, "eval", run.run_dir, "--n", 8, "--fid-stats", stats, "--steps", 2)
    assert rc == 0 and stdout.startswith("fd-mnist ") and "2 steps" in stdout


def test_eval_scores_against_the_statistics_the_run_was_scored_against(run, tmp_path, capsys) -> None:
    """Without --fid-stats, `scalelong eval RUN` reads the run's own eval.fid_stats (what its
    training-time evaluations used), so the line `scalelong train` suggests works for FID runs."""
    stats = tmp_path / "mnist-100.npz"
    rc, _, _ = cli(
        capsys,
        "fid-stats",
        run.run_dir / "config.yaml",
        "--out",
        stats,
        "--metric",
        "fd-mnist",
        "--limit",
        100,
    )
    assert rc == 0
    scored = load_config(run.run_dir / "config.yaml", [f"eval.fid_stats={stats}", "eval.metric=fd-mnist"])
    save_config(scored, run.run_dir / "config.yaml")
    rc, stdout, err = cli(capsys, "eval", run.run_dir, "--n", 8, "--steps", 2)
    assert rc == 0, err
    (result,) = [json.loads(p.read_text()) for p in (run.run_dir / "eval").iterdir()]
    assert result["reference"] == str(stats), result


def test_fid_offline_without_weights_is_one_line(run, tmp_path, capsys, monkeypatch) -> None:
    from pytorch_fid import inception

    from scalelong.metrics import frechet

    def offline(url, progress=True):  # what torch's downloader raises without a network
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))  # no cached weights
    monkeypatch.setattr(frechet, "_probe", lambda url, timeout=15.0: "URLError: Name or service not known")
    monkeypatch.setattr(inception, "load_state_dict_from_url", offline)
    rc, _, err = cli(capsys, "fid-stats", run.run_dir / "config.yaml", "--out", tmp_path / "s.npz")
    assert rc == 2 and err.count("\n") == 1, err
    assert inception.FID_WEIGHTS_URL in err and "--inception-weights" in err
    assert not (tmp_path / "s.npz").exists()


def test_training_evaluator_and_best_step(run) -> None:
    run_dir = run.run_dir
    evaluator = TrainingEvaluator(run, run_dir, "cpu")
    assert [s for s in range(1, 31) if evaluator.due(s)] == [10, 20, 30]
    ema = build_model(run.model).train()
    record = evaluator(10, ema)
    assert ema.training  # mode restored
    assert record["fd_metric"] == "fd-mnist" and record["fd_samples"] == 16 and record["fd"] > 0
    assert evaluator(10, ema)["fd"] == record["fd"]  # fixed evaluation seeds

    lines = [
        {"step": 10, "fd": 9.0, "fd_metric": "fd-mnist"},
        {"step": 20, "fd": 1.0, "fd_metric": "fd-mnist"},  # stale: its checkpoint does not exist
        {"step": 10, "fd": 5.0, "fd_metric": "fd-mnist"},  # re-logged after a resume: replaces 9.0
        {"step": 30, "fd": 0.5, "fd_metric": "fid"},  # another metric
        {"step": 30, "fd": "nan", "fd_metric": "fd-mnist"},
        {"step": 30, "loss": 0.1},
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert RunDir(run_dir).best_step("fd-mnist") == 10
    assert RunDir(run_dir).best_step("fd-mnist", require_checkpoint=False) == 20
    write_checkpoint(run_dir, run, 30)
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 30, "fd": 4.0, "fd_metric": "fd-mnist"}) + "\n")
    assert RunDir(run_dir).best_step("fd-mnist") == 30
    assert RunDir(run_dir).find_checkpoint("best") == RunDir(run_dir).checkpoint(30)  # --step best
    final = evaluator.finalize()
    assert final["best_step"] == 30 and final["fd_samples"] == 24 and final["fd_at_eval"] == 4.0
    assert json.loads((run_dir / "eval_final.json").read_text())["fd"] == final["fd"]


def flip_one_bit(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[-5] ^= 0x04  # inside the last tensor: still a valid safetensors file, one weight changed
    file.write_bytes(bytes(data))


def truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[:500])


def only_line(text: str, start: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith(start)]
    assert len(lines) == 1, text
    return lines[0]


@pytest.mark.parametrize("damage", [flip_one_bit, truncate])
def test_sample_and_eval_fall_back_from_damaged_newest_weights(run, tmp_path, capsys, damage) -> None:
    newest = write_checkpoint(run.run_dir, run, 20)
    damage(newest / "ema.safetensors")
    rc, out, err = cli(capsys, "sample", run.run_dir, "--n", 3, "--out", tmp_path / "latest")
    assert rc == 0, err
    warning = only_line(out, "warning:")
    assert "step-000020 is damaged (ema.safetensors" in warning and "using step-000010" in warning
    assert "from " in out and out.strip().endswith(f"in {tmp_path / 'latest'}") and "step-000010" in out
    rc, _, _ = cli(capsys, "sample", run.run_dir, "--n", 3, "--out", tmp_path / "ten", "--step", 10)
    latest, ten = (np.load(tmp_path / d / "samples.npz")["images"] for d in ("latest", "ten"))
    np.testing.assert_array_equal(latest, ten)  # the intact checkpoint's images, not the damaged one's

    rc, out, err = cli(capsys, "eval", run.run_dir, "--n", 8, "--metric", "fd-mnist", "--steps", 2)
    assert rc == 0, err
    assert "using step-000010" in only_line(out, "warning:") and "step-000010, 8 samples" in out
    (result,) = [json.loads(p.read_text()) for p in (run.run_dir / "eval").iterdir()]
    assert result["checkpoint"] == "step-000010"

    rc, _, err = cli(capsys, "sample", run.run_dir, "--n", 3, "--out", tmp_path / "x", "--step", 20)
    line = only_line(err, "error:")
    assert (
        rc == 2
        and "step-000020 is damaged" in line
        and "choose another --step (available: step-000010)" in line
    )
    damage(run.run_dir / "checkpoints" / "step-000010" / "ema.safetensors")
    for argv in (
        ["sample", "--n", 3, "--out", tmp_path / "none"],
        ["eval", "--n", 8, "--metric", "fd-mnist"],
    ):
        rc, out, err = cli(capsys, argv[0], run.run_dir, *argv[1:])
        line = only_line(err, "error:")
        assert rc == 2 and "Traceback" not in err and "warning:" not in out
        assert "every checkpoint in" in line and "step-000020: ema" in line and "step-000010: ema" in line
    assert not (tmp_path / "none").exists() and not (tmp_path / "x").exists()
    assert len(list((run.run_dir / "eval").iterdir())) == 1


def test_readers_never_write_into_a_run_another_process_trains(run, tmp_path, capsys) -> None:
    import os
    import socket

    lock = {"pid": os.getppid(), "host": socket.gethostname(), "start": None, "since": "now"}
    (run.run_dir / ".lock").write_text(json.dumps(lock))  # a live process of this host writes the run
    before = sorted(run.run_dir.rglob("*"))
    rc, out, err = cli(capsys, "eval", run.run_dir, "--n", 8, "--metric", "fd-mnist", "--steps", 2)
    assert rc == 0, err
    assert f"pid {os.getppid()}" in only_line(out, "warning:") and "not saved" in out
    assert out.strip().splitlines()[-1].startswith("fd-mnist ")
    rc, _, err = cli(capsys, "sample", run.run_dir, "--n", 2, "--out", run.run_dir / "mine")
    assert rc == 2 and "another process writes; choose another --out" in only_line(err, "error:")
    (run.run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    rc = main(["analyze", str(run.run_dir)])
    assert rc == 2 and "pass --out FOLDER" in only_line(capsys.readouterr().err, "error:")
    assert sorted(run.run_dir.rglob("*")) == [*before, run.run_dir / "metrics.jsonl"]
    assert main(["analyze", str(run.run_dir), "--out", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "loss.png").is_file()


def test_bad_sample_and_eval_inputs_are_one_line_and_write_nothing(run, tmp_path, capsys) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    for out in (tmp_path / "a-file", tmp_path / "a-file" / "below"):
        rc, _, err = cli(capsys, "sample", run.run_dir, "--n", 2, "--out", out)
        assert rc == 2 and "is a file, not a folder; choose another --out" in only_line(err, "error:")
    np.savez(tmp_path / "nan.npz", mu=np.full(128, np.nan), sigma=np.eye(128), metric=np.array("fd-mnist"))
    rc, out, err = cli(capsys, "eval", run.run_dir, "--n", 8, "--fid-stats", tmp_path / "nan.npz")
    assert rc == 2 and "NaN or infinite statistics" in only_line(err, "error:") and "nan" not in out
    assert not (run.run_dir / "eval").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "nan.npz", "tiny"]


def test_the_rescore_draws_only_the_seeds_its_evaluation_did_not(run, monkeypatch) -> None:
    """The best step's re-score (24 samples) reuses the 16 its evaluation drew and draws seeds 16-23
    alone, and scores what drawing all 24 again scores."""
    from scalelong.training import evaluation

    torch.manual_seed(10)  # the weights write_checkpoint saved at step 10: the evaluated EMA's
    ema = build_model(run.model)
    evaluator = TrainingEvaluator(run, run.run_dir, "cpu")
    record = evaluator(10, ema)
    with (run.run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 10, **record}) + "\n")

    drawn = []
    sample_features = evaluation.sample_features
    monkeypatch.setattr(
        evaluation,
        "sample_features",
        lambda m, c, f, seeds, *a: drawn.append(seeds) or sample_features(m, c, f, seeds, *a),
    )
    final = evaluator.finalize()
    base = evaluation.first_evaluation_seed(run)
    assert [list(s) for s in drawn] == [list(range(base + 16, base + 24))]
    assert final["fd_samples"] == 24 and final["fd_samples_reused"] == 16

    fresh = TrainingEvaluator(run, run.run_dir, "cpu")  # no evaluation of its own: draws all 24
    assert fresh.finalize()["fd_samples_reused"] == 0
    assert [list(s) for s in drawn[1:]] == [list(range(base, base + 24))]
    assert json.loads((run.run_dir / "eval_final.json").read_text())["fd"] == pytest.approx(
        final["fd"], rel=1e-5
    )


def test_sample_refuses_a_seed_beyond_2_to_the_31_in_one_line(run, tmp_path, capsys) -> None:
    """torch refused 2**64 with a traceback, after the checkpoint was loaded and --out created."""
    for seed, words in [(2**64, f"must be < 2**31 = 2147483648, got {2**64}"), (-1, "must be >= 0, got -1")]:
        rc, out, err = cli(capsys, "sample", run.run_dir, "--n", 2, "--out", tmp_path / "s", "--seed", seed)
        assert rc == 2 and "Traceback" not in out + err
        assert f"argument --seed: {words}" in only_line(err, "error:") and len(err.splitlines()) == 1
    assert not (tmp_path / "s").exists()
    rc, out, err = cli(capsys, "sample", run.run_dir, "--n", 2, "--out", tmp_path / "s", "--seed", 2**31 - 1)
    assert rc == 0, err


def test_a_run_config_this_version_refuses_is_named_with_its_file(run, tmp_path, capsys) -> None:
    """A hand-edited config.yaml (or one of another version): the error names the file to repair, not
    a key that reads as a mistake on the command line."""
    config = run.run_dir / "config.yaml"
    config.write_text(config.read_text() + "foo: 1\n")
    for argv in (["sample", "--n", 2, "--out", tmp_path / "s"], ["eval", "--n", 8, "--metric", "fd-mnist"]):
        rc, out, err = cli(capsys, argv[0], run.run_dir, *argv[1:])
        line = only_line(err, "error:")
        assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in out + err
        assert line.startswith(f"error: {config}: unknown config key 'foo'; known keys here: name, ")
        assert line.endswith("; repair that file (it must hold a config this version of scalelong reads)")
    config.write_text(config.read_text().replace("foo: 1\n", "").replace("seed: 0", "seed: -1"))
    rc, _, err = cli(capsys, "sample", run.run_dir, "--n", 2, "--out", tmp_path / "s")
    assert rc == 2 and only_line(err, "error:").startswith(f"error: {config}: train.seed=-1 is out of range")
    # without config.yaml the newest checkpoint's copy is read: the error says that one is refused
    config.unlink()
    save_checkpoint(run.run_dir / "checkpoints", 20, build_model(run.model), build_model(run.model),
                    {**config_to_dict(run), "foo": 1})  # fmt: skip
    rc, out, err = cli(capsys, "sample", run.run_dir, "--n", 2, "--out", tmp_path / "s")
    assert rc == 2 and "config.yaml is missing; using the config stored in step-000020" in out
    assert only_line(err, "error:").startswith(
        f"error: the config stored in a checkpoint of {run.run_dir} (config.yaml is missing or damaged): "
        "unknown config key 'foo'"
    )
    assert not (tmp_path / "s").exists()
