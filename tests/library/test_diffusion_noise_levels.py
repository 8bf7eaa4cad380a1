"""The per-noise-level denoising diagnostic: exact on an oracle, logged by the trainer, plotted."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from conftest import tiny_uvit_overrides
from scalelong.diffusion import NOISE_LEVELS, VPSDE, DiscreteDDPM, mean_image_error, noise_level_errors
from scalelong.studies.plots import last_noise_levels, load_metrics, write_plots
from scalelong.training.config import load_config
from scalelong.training.evaluation import probe_images
from scalelong.training.train import train


class Oracle(nn.Module):
    """Knows the one clean image, so it returns the exact noise of any x_t."""

    def __init__(self, schedule, image: torch.Tensor):
        super().__init__()
        self.schedule, self.image = schedule, image

    def forward(self, x, model_t, **cond):
        t = model_t / 999.0 if isinstance(self.schedule, VPSDE) else model_t
        a, s = (v.view(-1, 1, 1, 1) for v in self.schedule.alpha_sigma(t))
        return (x - a * self.image) / s


@pytest.mark.parametrize("schedule", [VPSDE(), DiscreteDDPM()])
def test_oracle_scores_zero_and_noise_scores_one(schedule):
    image = torch.rand(1, 1, 8, 8) * 2 - 1
    x0 = image.expand(32, -1, -1, -1)
    exact = noise_level_errors(Oracle(schedule, image), schedule, x0, batch_size=10)
    assert set(exact) == set(NOISE_LEVELS)
    # the very noisiest DDPM step divides by alpha ~ 0.006: float32 rounding is amplified there
    assert all(e["eps_mse"] < 1e-6 and e["x0_mse"] < 1e-3 for e in exact.values())
    wrong = noise_level_errors(Oracle(schedule, -image), schedule, x0)
    assert all(e["x0_mse"] > 0.01 for e in wrong.values())


def test_same_draws_for_every_model_and_batch_size():
    x0 = torch.randn(20, 1, 4, 4)
    net = nn.Conv2d(1, 1, 3, padding=1)
    f = lambda x, t: net(x)  # noqa: E731
    a = noise_level_errors(f, VPSDE(), x0, seed=3, batch_size=20)
    b = noise_level_errors(f, VPSDE(), x0, seed=3, batch_size=7)
    assert a[0.5]["x0_mse"] == pytest.approx(b[0.5]["x0_mse"], rel=1e-5)


def test_mean_image_error_is_the_pixel_variance():
    x0 = torch.tensor([[1.0, 0.0], [3.0, 0.0]]).view(2, 1, 1, 2)
    assert mean_image_error(x0) == pytest.approx(0.5)  # pixel 0: values 1, 3 -> variance 1; pixel 1: 0


def test_probe_images_are_held_out_and_class_balanced():
    cfg = load_config("configs/demo_uvit.yaml")
    images, labels, held_out = probe_images(cfg, 100)
    assert held_out and images.shape == (100, 1, 32, 32)
    assert torch.bincount(labels, minlength=10).tolist() == [10] * 10


def test_trainer_logs_noise_levels_and_analyze_plots_them(tmp_path):
    cfg = load_config(
        "configs/demo_uvit.yaml",
        [*tiny_uvit_overrides("nl", tmp_path, steps=10), "diagnostics.noise_levels=32"]
        + ["diagnostics.noise_levels_every=5", "diffusion.prediction=v"],
    )
    train(cfg, progress=False)
    records = [json.loads(line) for line in (tmp_path / "nl" / "metrics.jsonl").read_text().splitlines()]
    probed = [r["step"] for r in records if "noise/x0_mse@1.00" in r]
    assert probed == [5, 10]
    last = records[-1]
    assert 0.05 < last["noise/x0_mse_mean_image"] < 0.5  # the variance of MNIST pixels in [-1, 1]
    assert all(last[f"noise/x0_mse@{lv:.2f}"] > 0 for lv in NOISE_LEVELS)
    step, errors, baseline = last_noise_levels(load_metrics(tmp_path / "nl"))
    assert (
        step == 10
        and sorted(errors["x0"]) == list(NOISE_LEVELS)
        and baseline == last["noise/x0_mse_mean_image"]
    )
    paths = write_plots({"none": load_metrics(tmp_path / "nl")}, tmp_path / "plots")
    assert tmp_path / "plots" / "noise_levels.png" in paths


def test_noise_levels_off(tmp_path):
    cfg = load_config(
        "configs/demo_uvit.yaml", [*tiny_uvit_overrides("noprobe", tmp_path, 5), "diagnostics.noise_levels=0"]
    )
    train(cfg, progress=False)
    text = (tmp_path / "noprobe" / "metrics.jsonl").read_text()
    assert "noise/" not in text


def test_the_untrained_model_and_the_raw_weights_are_measured_when_asked(tmp_path, capsys):
    cfg = load_config(
        "configs/demo_uvit.yaml",
        [*tiny_uvit_overrides("raw", tmp_path, steps=6), "diagnostics.noise_levels=16"]
        + [
            "diagnostics.noise_levels_raw=true",
            "diagnostics.noise_levels_at_start=true",
            "train.log_every=3",
        ],
    )
    train(cfg, progress=False)
    records = [json.loads(line) for line in (tmp_path / "raw" / "metrics.jsonl").read_text().splitlines()]
    probed = [r for r in records if "noise/x0_mse@0.50" in r]
    assert [r["step"] for r in probed] == [0, 6]  # the start, and the end
    start, end = probed
    levels = [f"{lv:.2f}" for lv in NOISE_LEVELS]
    # at step 0 the EMA is the initial model itself; after training the two differ
    assert all(start[f"noise/raw/x0_mse@{lv}"] == start[f"noise/x0_mse@{lv}"] for lv in levels)
    assert any(end[f"noise/raw/x0_mse@{lv}"] != end[f"noise/x0_mse@{lv}"] for lv in levels)
    # the raw model learnt in 6 steps at lr 5e-3 far more than an EMA of decay 0.995 followed it
    mean = lambda r, kind: sum(r[f"noise/{kind}x0_mse@{lv}"] for lv in levels) / len(levels)  # noqa: E731
    assert mean(end, "raw/") < mean(start, "raw/") and mean(end, "") < mean(start, "")
    from scalelong.cli import main

    assert main(["analyze", str(tmp_path / "raw")]) == 0  # a step-0 record reads and plots like any other
