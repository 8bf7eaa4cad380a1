"""The digit score beside FD-MNIST: confident digits, class histogram and balance, with real digits
as the yardstick; in `scalelong eval`, the training-time evaluation and the study tables."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from scalelong.cli import main
from scalelong.data import embedded_mnist
from scalelong.errors import ScaleLongError
from scalelong.metrics.fd_mnist import (
    digit_score,
    digit_score_of_features,
    digit_score_of_probs,
    format_digit_score,
    real_digit_score,
)
from scalelong.metrics.frechet import fd_mnist_features
from scalelong.studies.compare import summarise, summary_table
from scalelong.studies.summary import Cell, CellSummary, SeedSummary, StudyRun
from scalelong.studies.sweep import cell_table
from scalelong.training import evaluation
from scalelong.training.build import build_model
from scalelong.training.checkpoint import save_checkpoint
from scalelong.training.config import config_to_dict, load_config, save_config
from scalelong.training.evaluation import TrainingEvaluator


@pytest.fixture(scope="module")
def held_out():
    return embedded_mnist("test")


def test_the_yardstick_is_the_held_out_real_digits(held_out):
    real = real_digit_score()
    assert real["n"] == len(held_out[0]) == 1000
    assert sum(real["histogram"]) == 1000 and min(real["histogram"]) >= 90  # ~100 of every digit
    assert 0.9 <= real["confident"] <= 1.0 and real["entropy"] >= 0.99
    real["histogram"][0] = -1  # a copy: the cached yardstick cannot be changed from outside
    assert real_digit_score()["histogram"][0] >= 90


def test_real_digits_score_near_the_yardstick_and_damage_scores_low(held_out):
    images, labels = held_out
    every_other = digit_score(images[::2])  # 500 real digits, all classes
    assert every_other["confident"] >= 0.9 and every_other["entropy"] >= 0.95
    assert every_other["confident"] == pytest.approx(real_digit_score()["confident"], abs=0.03)

    noise = digit_score(torch.rand(500, 1, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1)
    assert noise["confident"] < 0.05 and noise["entropy"] < 0.6
    threes = digit_score(images[labels == 3])  # clear digits, but one class: balance tells
    assert threes["confident"] >= 0.9 and threes["entropy"] < 0.1 and threes["histogram"][3] >= 95
    blank = digit_score(-torch.ones(20, 1, 32, 32))  # the background alone
    assert blank["confident"] == 0.0 and blank["entropy"] == 0.0 and max(blank["histogram"]) == 20


def test_the_score_from_fd_mnist_features_equals_the_score_of_the_images(held_out):
    images = held_out[0][::10]
    direct, via_features = digit_score(images), digit_score_of_features(fd_mnist_features()(images))
    assert via_features["histogram"] == direct["histogram"] and via_features["n"] == 100
    assert via_features["confident"] == direct["confident"]
    assert via_features["entropy"] == pytest.approx(direct["entropy"])


def test_known_answer_and_bad_inputs():
    probs = torch.full((4, 10), 0.0)
    for row, (label, p) in enumerate([(0, 0.95), (0, 0.5), (1, 0.91), (1, 0.89)]):
        probs[row] = (1 - p) / 9
        probs[row, label] = p
    score = digit_score_of_probs(probs)
    assert score["confident"] == 0.5  # 0.95 and 0.91 reach 0.9
    assert score["histogram"] == [2, 2, 0, 0, 0, 0, 0, 0, 0, 0]
    assert score["entropy"] == pytest.approx(math.log(2) / math.log(10))  # two classes of ten, evenly
    assert digit_score_of_probs(torch.eye(10))["entropy"] == pytest.approx(1.0)
    nan = digit_score_of_probs(torch.full((3, 10), math.nan))  # a diverged model's samples
    assert math.isnan(nan["confident"]) and math.isnan(nan["entropy"])
    with pytest.raises(ScaleLongError, match=r"\(N, 1, 32, 32\), got \(2, 3, 32, 32\)"):
        digit_score(torch.zeros(2, 3, 32, 32))
    with pytest.raises(ScaleLongError, match="NaN"):
        digit_score(torch.full((2, 1, 32, 32), math.nan))
    real = {"confident": 0.964, "entropy": 0.9999}
    line = format_digit_score({"confident": 0.831, "entropy": 0.5}, real)
    assert line == "confident 0.83 (real digits 0.96), class balance 0.50 (real digits 1.00)"


# ----------------------------------------------------------------------------- where FD-MNIST is reported

TINY = [
    "model.uvit.img_size=32",
    "model.uvit.in_channels=1",
    "model.uvit.patch_size=8",
    "model.uvit.embed_dim=16",
    "model.uvit.depth=2",
    "model.uvit.num_heads=2",
    "eval.steps=2",
    "eval.num_samples=12",
    "eval.batch_size=8",
    "eval.every=10",
]


@pytest.fixture()
def run(tmp_path: Path):
    cfg = load_config(None, [*TINY, "name=tiny", f"out_dir={tmp_path}"])
    cfg.run_dir.mkdir(parents=True)
    save_config(cfg, cfg.run_dir / "config.yaml")
    model = build_model(cfg.model)
    save_checkpoint(cfg.run_dir / "checkpoints", 10, model, model, config_to_dict(cfg))
    return cfg


def count_draws(monkeypatch) -> list[int]:
    """Patch the sampler the evaluation calls; the list grows by the batch size of each draw."""
    draws, generate = [], evaluation.generate

    def counted(model, schedule, sampler, steps, seeds, *args, **kwargs):
        draws.append(len(seeds))
        return generate(model, schedule, sampler, steps, seeds, *args, **kwargs)

    monkeypatch.setattr(evaluation, "generate", counted)
    return draws


def test_eval_prints_and_saves_the_digit_score_of_the_fd_samples(run, capsys, monkeypatch):
    draws = count_draws(monkeypatch)
    argv = ["eval", str(run.run_dir), "--n", "12", "--metric", "fd-mnist", "--no-progress", "--device", "cpu"]
    assert main(argv) == 0
    assert draws == [8, 4]  # the 12 samples of FD, drawn once: the digit score reuses them
    (line,) = capsys.readouterr().out.splitlines()
    real = real_digit_score()
    assert line.startswith("fd-mnist ") and "12 samples, dpm_solver 2 steps); digits: confident " in line
    assert f"(real digits {real['confident']:.2f}), class balance " in line
    (saved,) = [json.loads(p.read_text()) for p in (run.run_dir / "eval").iterdir()]
    assert saved["digits"]["n"] == 12 and sum(saved["digits"]["histogram"]) == 12
    assert 0 <= saved["digits"]["confident"] <= 1 and 0 <= saved["digits"]["entropy"] <= 1
    assert saved["digits_real"]["confident"] == real["confident"]


def test_training_evaluation_logs_the_digit_score_beside_fd(run, monkeypatch):
    draws = count_draws(monkeypatch)
    ema = build_model(run.model)
    record = TrainingEvaluator(run, run.run_dir, "cpu")(10, ema)
    assert draws == [8, 4]
    assert record["fd"] > 0 and 0 <= record["digits/confident"] <= 1 and 0 <= record["digits/entropy"] <= 1
    # the figures are those of the very samples FD scored, seen as images
    seeds = range(
        run.train.seed * evaluation.EVAL_SEED_OFFSET, run.train.seed * evaluation.EVAL_SEED_OFFSET + 12
    )
    images = evaluation.sample_features(ema, run, lambda x: x, seeds, "dpm_solver", 2, 8, "cpu")
    score = digit_score(images)
    assert (record["digits/confident"], record["digits/entropy"]) == pytest.approx(
        (score["confident"], score["entropy"])
    )


def test_the_study_tables_show_the_digit_score_with_the_real_digits_beside_it():
    def records(fd, confident, entropy):
        return [{"step": 10, "fd": fd, "loss": 1.0, "digits/confident": confident, "digits/entropy": entropy}]

    def study(runs):
        return {
            m: [StudyRun(f"{m}-seed{k}", r, {}, [], seed=k) for k, r in enumerate(rs)]
            for m, rs in runs.items()
        }

    runs = {
        "none": [records(100.0, 0.4, 0.8), records(120.0, 0.6, 0.9)],
        "cs": [records(90.0, 0.7, 0.95)] * 2,
    }
    real = {"confident": 0.964, "entropy": 0.9999}
    table = summary_table(summarise(study(runs), "none"), "none", real).splitlines()
    head = [c.strip() for c in table[0].split("|")[1:-1]]
    assert head[3:5] == ["confident digits (real 0.96)", "class balance (real 1.00)"]
    assert table[1] == "|---" * len(head) + "|"
    none = [c.strip() for c in table[2].split("|")[1:-1]]
    assert none[3].startswith("0.5 ± 1.3") and none[4].startswith("0.85 ± 0.64")  # t(0.975, 1) x sd / sqrt 2
    # without an fd-mnist evaluation the columns stay out
    plain = {
        m: [[{k: v for k, v in r.items() if not k.startswith("digits/")} for r in seed] for seed in seeds]
        for m, seeds in runs.items()
    }
    assert "confident" not in summary_table(summarise(study(plain), "none"), "none", real)

    seed = SeedSummary(0, final_fd=90.0, feature_osc=1.0, spikes=0.0, confident=0.7, entropy=0.95)
    cell = CellSummary(Cell(12, 1e-2, "cs"), [seed], "fd")
    rows = cell_table([cell], "FD (fd-mnist)", real).splitlines()
    assert "| final FD (fd-mnist) | confident digits (real 0.96) | class balance (real 1.00) |" in rows[0]
    assert rows[2].startswith(
        "| cs | 0.01 | 1 | 90 | 0.7 | 0.95 | n/a | 1 | 0 | 0/1 |"
    )  # no feature growth logged
