"""The network's output parameterisation (diffusion.prediction): eps or v.

Both are read back as epsilon before any sampler sees them, so the checks are: the training
target and the conversion invert each other on both schedules, an exact v-predictor drives the
samplers to the right distribution, and v-prediction's loss keeps the x0 error bounded at the
noisiest time, where epsilon-prediction amplifies it ~150-fold (the demo's failure).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from scalelong.config import PREDICTION_NAMES, load_config
from scalelong.diffusion import (
    PREDICTIONS,
    VPSDE,
    DiscreteDDPM,
    add_noise,
    epsilon_to_x0,
    noise_level_errors,
    output_to_epsilon,
    prediction_target,
)
from scalelong.errors import ScaleLongError
from scalelong.sampling import get_sampler, model_eps_fn, randn

MU, S = 0.3, 0.5


@pytest.mark.parametrize("schedule", [VPSDE(prediction="v"), DiscreteDDPM(prediction="v")])
def test_target_and_conversion_invert_each_other(schedule):
    gen = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(64, 1, 4, 4, generator=gen), torch.randn(64, 1, 4, 4, generator=gen)
    t = schedule.sample_t(64, gen)
    x_t = add_noise(schedule, x0, t, noise)
    v = prediction_target(schedule, x0, t, noise)
    eps = output_to_epsilon(schedule, x_t, t, v)
    torch.testing.assert_close(eps, noise, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(epsilon_to_x0(schedule, x_t, t, eps), x0, atol=2e-3, rtol=1e-3)
    assert not torch.allclose(v, noise, atol=0.1)  # v is not the noise: the test can tell them apart


class ExactV(nn.Module):
    """The exact v-predictor for Gaussian data N(MU, S^2 I), fed the network time of ``schedule``."""

    def __init__(self, schedule, sign: float = 1.0):
        super().__init__()
        self.schedule, self.sign = schedule, sign

    def forward(self, x: torch.Tensor, model_t: torch.Tensor) -> torch.Tensor:
        t = model_t / 999.0 if isinstance(self.schedule, VPSDE) else model_t
        a, s = (v.double().view(-1, 1, 1, 1) for v in self.schedule.alpha_sigma(t.double()))
        eps = s * (x.double() - a * MU) / (a**2 * S**2 + s**2)
        return (self.sign * (eps - s * x.double()) / a).float()  # v = (eps - sigma x_t) / alpha


def sample(net, schedule) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    x = randn((2000, 1, 4, 4), gen)
    return get_sampler("dpm_solver")(model_eps_fn(net, schedule), schedule, x, 25, gen)


@pytest.mark.parametrize("schedule", [VPSDE(prediction="v"), DiscreteDDPM(prediction="v")])
def test_samplers_read_v_outputs(schedule):
    x = sample(ExactV(schedule), schedule)
    assert abs(x.mean().item() - MU) < 0.02 and abs(x.std().item() - S) < 0.02
    wrong = sample(ExactV(schedule, sign=-1.0), schedule)
    assert abs(wrong.mean().item() - MU) > 0.02 or abs(wrong.std().item() - S) > 0.02


class Zero(nn.Module):
    def forward(self, x, t, **cond):
        return torch.zeros_like(x)


def test_eps_prediction_amplifies_error_at_high_noise_v_does_not():
    x0 = torch.full((8, 1, 4, 4), 0.5)
    eps_err = noise_level_errors(Zero(), VPSDE(), x0, levels=(0.1, 1.0))
    v_err = noise_level_errors(Zero(), VPSDE(prediction="v"), x0, levels=(0.1, 1.0))
    # A network that outputs nothing: with eps its x0 estimate is x_t / alpha(1) ~ 150 x_t.
    assert eps_err[1.0]["eps_mse"] == pytest.approx(1.0, abs=0.3)
    assert eps_err[1.0]["x0_mse"] > 1e4
    # With v it is alpha x_t ~ 0: the error of predicting zero, x0^2 = 0.25.
    assert v_err[1.0]["x0_mse"] == pytest.approx(0.25, abs=0.01)
    assert eps_err[0.1]["x0_mse"] < eps_err[1.0]["x0_mse"]


def test_config_names_the_prediction():
    assert PREDICTION_NAMES == PREDICTIONS
    assert load_config(None, ["diffusion.prediction=v"]).diffusion.prediction == "v"
    with pytest.raises(
        ScaleLongError, match="diffusion.prediction='x0' is not supported; choose one of eps, v"
    ):
        load_config(None, ["diffusion.prediction=x0"])
