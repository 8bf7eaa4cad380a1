"""The network's output parameterisation (diffusion.prediction): eps, v or x0; and the training
times (diffusion.time_sampling).

Both are read back as epsilon before any sampler sees them, so the checks are: the training
target and the conversion invert each other on both schedules, an exact v-predictor drives the
samplers to the right distribution, and v-prediction's loss keeps the x0 error bounded at the
noisiest time, where epsilon-prediction amplifies it ~150-fold (the demo's failure).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from scalelong.diffusion import (
    PREDICTIONS,
    VPSDE,
    X0_LOSS_SIGMA_MIN,
    DiscreteDDPM,
    add_noise,
    denoising_loss,
    edm_coefficients,
    epsilon_to_x0,
    input_free_loss,
    noise_level_errors,
    output_to_epsilon,
    prediction_target,
)
from scalelong.sampling import get_sampler, model_eps_fn, randn

MU, S = 0.3, 0.5


@pytest.mark.parametrize(
    "schedule",
    [VPSDE(prediction=p) for p in ("v", "x0", "edm")]
    + [DiscreteDDPM(prediction=p) for p in ("v", "x0", "edm")],
)
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


class ExactX0(nn.Module):
    """The posterior mean E[x0 | x_t] for Gaussian data N(MU, S^2 I) on the VP-SDE."""

    def forward(self, x: torch.Tensor, model_t: torch.Tensor) -> torch.Tensor:
        a, s = (v.double().view(-1, 1, 1, 1) for v in VPSDE().alpha_sigma(model_t.double() / 999.0))
        return (MU + a * S**2 * (x.double() - a * MU) / (a**2 * S**2 + s**2)).float()


class ExactEDM(ExactX0):
    """EDM's F for the same posterior mean: x0 = a x_t + b F."""

    def forward(self, x: torch.Tensor, model_t: torch.Tensor) -> torch.Tensor:
        a, b = (v.view(-1, 1, 1, 1) for v in edm_coefficients(VPSDE(), model_t / 999.0))
        return (super().forward(x, model_t) - a * x) / b


@pytest.mark.parametrize("prediction, net", [("x0", ExactX0()), ("edm", ExactEDM())])
def test_samplers_read_x0_and_edm_outputs(prediction, net):
    schedule = VPSDE(prediction=prediction)
    x = sample(net, schedule)
    assert abs(x.mean().item() - MU) < 0.02 and abs(x.std().item() - S) < 0.02
    wrong = sample(ExactEDM() if prediction == "x0" else ExactX0(), schedule)  # read the other way
    assert abs(wrong.mean().item() - MU) > 0.02 or abs(wrong.std().item() - S) > 0.02


def test_x0_loss_is_the_v_loss_with_a_floored_sigma():
    """Predicting x0, the loss is (x0 error / sigma)^2, i.e. v-prediction's loss of the same guess."""
    x0, noise = (
        torch.full((3, 1, 2, 2), 0.5),
        torch.randn(3, 1, 2, 2, generator=torch.Generator().manual_seed(0)),
    )
    t = torch.tensor([0.9, 0.3, 1e-4])
    x0_loss = denoising_loss(Zero(), VPSDE(prediction="x0"), x0, t, noise)
    sigma = VPSDE().alpha_sigma(t)[1]
    torch.testing.assert_close(x0_loss, 0.25 / sigma.clamp(min=X0_LOSS_SIGMA_MIN) ** 2)

    class V(nn.Module):  # the v that stands for the guess x0 = 0
        def forward(self, x, model_t):
            a, s = (v.view(-1, 1, 1, 1) for v in VPSDE().alpha_sigma(model_t / 999.0))
            return a * x / s

    v_loss = denoising_loss(V(), VPSDE(prediction="v"), x0, t, noise)
    torch.testing.assert_close(x0_loss[:2], v_loss[:2], rtol=1e-4, atol=1e-5)
    assert sigma[2] < X0_LOSS_SIGMA_MIN and x0_loss[2] == pytest.approx(0.25 / X0_LOSS_SIGMA_MIN**2)


def test_logsnr_normal_time_sampling():
    sde = VPSDE(time_sampling="logsnr_normal", logsnr_mean=-1.5, logsnr_std=2.0)
    t = torch.tensor([0.05, 0.3, 0.5, 0.9], dtype=torch.float64)
    torch.testing.assert_close(sde.t_of_log_snr(sde.log_snr(t)), t)
    draws = sde.sample_t(20000, torch.Generator().manual_seed(0))
    lam = sde.log_snr(draws.double())
    assert lam.mean().item() == pytest.approx(-1.5, abs=0.05) and lam.std().item() == pytest.approx(
        2.0, abs=0.05
    )
    assert draws.min() >= sde.t_min and draws.max() <= 1.0
    uniform = VPSDE().sample_t(20000, torch.Generator().manual_seed(0))
    assert (uniform > 0.7).float().mean() > 0.25 > (draws > 0.7).float().mean()  # less time on pure noise


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


@pytest.mark.parametrize("prediction", PREDICTIONS)
def test_input_free_loss_is_the_loss_of_the_best_guess_that_ignores_x_t(prediction):
    gen = torch.Generator().manual_seed(0)
    x0 = 0.3 + 0.5 * torch.randn(4096, 1, 2, 2, generator=gen)
    noise, schedule = torch.randn(x0.shape, generator=gen), VPSDE(prediction=prediction)
    t = schedule.sample_t(len(x0), gen)
    mean = x0.mean(dim=0)
    free = input_free_loss(schedule, x0, t, noise, mean).mean()
    if prediction == "eps":
        assert free.item() == pytest.approx(1.0, abs=0.03)  # the output 0 against unit noise

    class Guess(nn.Module):  # the same guess through the network path: the training loss agrees
        def __init__(self, image):
            super().__init__()
            self.image = image

        def forward(self, x, model_t):
            return prediction_target(schedule, self.image.expand_as(x), model_t / 999.0, torch.zeros_like(x))

    torch.testing.assert_close(
        denoising_loss(Guess(mean), schedule, x0, t, noise).mean(), free, rtol=1e-4, atol=1e-5
    )
    worse = denoising_loss(Guess(mean + 0.2), schedule, x0, t, noise).mean()
    if prediction != "eps":  # (the epsilon guess is 0 whatever the image)
        assert worse > free  # the mean image is the best input-free guess


class GuessX0(nn.Module):
    """The output that stands for the x0 estimate ``guess`` under ``schedule``'s prediction."""

    def __init__(self, schedule, guess: torch.Tensor):
        super().__init__()
        self.schedule, self.guess = schedule, guess

    def forward(self, x, model_t):
        t = model_t / 999.0 if isinstance(self.schedule, VPSDE) else model_t
        a, s = (v.view(-1, 1, 1, 1) for v in self.schedule.alpha_sigma(t))
        eps = (x - a * self.guess) / s  # the noise this guess implies; x_t is then reproduced
        return prediction_target(self.schedule, self.guess.expand_as(x), t, eps)


@pytest.mark.parametrize("prediction", PREDICTIONS)
@pytest.mark.parametrize("kind", [VPSDE, DiscreteDDPM])
def test_min_snr_weighs_the_x0_error_by_min_snr_gamma_whatever_the_output(prediction, kind):
    """Min-SNR-gamma (Hang et al. 2023): loss = min(SNR, gamma) * x0 error, for eps, v, x0 and edm."""
    schedule = kind(prediction=prediction, loss_weighting="min_snr", min_snr_gamma=5.0)
    gen = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(6, 1, 4, 4, generator=gen), torch.randn(6, 1, 4, 4, generator=gen)
    t = torch.tensor([0.02, 0.1, 0.3, 0.5, 0.7, 0.9], dtype=torch.float64)
    t = (t if kind is VPSDE else (t * 999).round()).float()
    guess = x0 + 0.3  # x0 error 0.09 per pixel
    loss = denoising_loss(GuessX0(schedule, guess), schedule, x0, t, noise)
    alpha, sigma = schedule.alpha_sigma(t.double())
    snr = (alpha / sigma) ** 2
    assert snr.min() < 0.5 and snr.max() > 50  # both branches of the min are exercised
    torch.testing.assert_close(loss.double(), 0.09 * snr.clamp(max=5.0), rtol=2e-3, atol=1e-6)
    default = kind(prediction=prediction)  # negative control: the plain loss weighs the levels otherwise
    plain = denoising_loss(GuessX0(default, guess), default, x0, t, noise)
    assert not torch.allclose(plain.double(), loss.double(), rtol=0.1)
