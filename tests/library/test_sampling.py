"""Samplers against an exact answer: Gaussian data N(mu, s^2 I) has a closed-form epsilon predictor.

Under either schedule x_t ~ N(alpha mu, (alpha^2 s^2 + sigma^2) I), so the optimal predictor is
eps*(x_t, t) = sigma (x_t - alpha mu) / (alpha^2 s^2 + sigma^2). A correct sampler driven by it
must return samples with mean mu and standard deviation s; each test also shows that a broken
predictor (sign error, wrong schedule, wrong mean) fails the same tolerance.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from scalelong.diffusion import VPSDE, DiscreteDDPM
from scalelong.errors import ScaleLongError
from scalelong.sampling import DIFFUSERS_SCHEDULERS, SAMPLERS, generate, randn

MU, S, TOL = 0.3, 0.5, 0.02
# enough steps for each solver's discretisation error to sit well inside TOL
STEPS = {"euler_maruyama": 1000, "ode_euler": 200, "ddim": 200, "dpm_solver": 25, "dpm_solver_pp": 25}
SCHEDULES = {
    "vpsde": (VPSDE(), VPSDE(0.1, 10.0)),
    "ddpm": (DiscreteDDPM(), DiscreteDDPM(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012)),
}


def exact_eps(schedule, mu: float = MU, s: float = S, sign: float = 1.0):
    def eps(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        a, sg = (v.double().view(-1, 1, 1, 1) for v in schedule.alpha_sigma(t.double()))
        return (sign * sg * (x.double() - a * mu) / (a**2 * s**2 + sg**2)).float()

    return eps


def draw(sampler: str, schedule, eps) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    x = randn((2000, 1, 4, 4), gen)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # numpy 2 notices inside diffusers
        return SAMPLERS[sampler](eps, schedule, x, STEPS[sampler], gen)


def matches(x: torch.Tensor) -> bool:
    return bool(torch.isfinite(x).all()) and abs(x.mean() - MU) < TOL and abs(x.std() - S) < TOL


@pytest.mark.parametrize("schedule_name", list(SCHEDULES))
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_sampler_recovers_gaussian(sampler: str, schedule_name: str) -> None:
    schedule, wrong_schedule = SCHEDULES[schedule_name]
    x = draw(sampler, schedule, exact_eps(schedule))
    assert abs(x.mean().item() - MU) < TOL, x.mean()
    assert abs(x.std().item() - S) < TOL, x.std()
    # the same check rejects deliberately broken predictors
    assert not matches(draw(sampler, schedule, exact_eps(schedule, sign=-1.0)))
    assert not matches(draw(sampler, schedule, exact_eps(wrong_schedule)))
    assert not matches(draw(sampler, schedule, exact_eps(schedule, mu=0.0)))


@pytest.mark.parametrize("schedule_name", list(SCHEDULES))
def test_stochastic_ddim_recovers_gaussian(schedule_name: str) -> None:
    schedule = SCHEDULES[schedule_name][0]
    gen = torch.Generator().manual_seed(0)
    x = SAMPLERS["ddim"](exact_eps(schedule), schedule, randn((2000, 1, 4, 4), gen), 200, gen, eta=0.5)
    assert matches(x), (x.mean(), x.std())


def test_dpm_solver_50_steps_matches_euler_maruyama_1000() -> None:
    """The recipe's fast sampler and the reference sampler agree on the exact model."""
    sde = VPSDE()
    gen = torch.Generator().manual_seed(1)
    x = randn((2000, 1, 4, 4), gen)
    fast = SAMPLERS["dpm_solver"](exact_eps(sde), sde, x, 50, gen)
    slow = SAMPLERS["euler_maruyama"](exact_eps(sde), sde, x, 1000, gen)
    assert abs(fast.std() - slow.std()) < 0.01 and abs(fast.mean() - slow.mean()) < 0.01


class _Gaussian(torch.nn.Module):
    """A 'network' that is the exact predictor of N(0.3 y, 0.1^2 I) for class y (inside [-1, 1])."""

    num_classes = 3

    def __init__(self, schedule):
        super().__init__()
        self.schedule = schedule

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a, sg = (v.view(-1, 1, 1, 1) for v in self.schedule.alpha_sigma(t / 999.0))
        mu = y.float().view(-1, 1, 1, 1) * 0.3
        return sg * (x - a * mu) / (a**2 * 0.1**2 + sg**2)


def test_generate_is_batch_independent_and_class_conditional() -> None:
    sde = VPSDE()
    net = _Gaussian(sde)
    seeds, labels = list(range(6)), torch.tensor([0, 1, 2, 0, 1, 2])
    full = generate(net, sde, "euler_maruyama", 50, seeds, (1, 4, 4), labels)
    halves = torch.cat(
        [
            generate(net, sde, "euler_maruyama", 50, seeds[i : i + 3], (1, 4, 4), labels[i : i + 3])
            for i in (0, 3)
        ]
    )
    torch.testing.assert_close(full, halves)
    big = generate(net, sde, "dpm_solver", 20, range(300), (1, 4, 4), torch.arange(300) % 3)
    means = [big[torch.arange(300) % 3 == c].mean().item() for c in range(3)]
    assert means == pytest.approx([0.0, 0.3, 0.6], abs=0.01)


def test_unknown_sampler_is_a_user_error() -> None:
    with pytest.raises(ScaleLongError, match="unknown sampler"):
        generate(_Gaussian(VPSDE()), VPSDE(), "heun", 10, [0], (1, 4, 4))


@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_every_sampler_has_a_discrete_hand_off_and_rejects_other_schedules(sampler: str) -> None:
    assert sampler in DIFFUSERS_SCHEDULERS
    with pytest.raises(ScaleLongError, match="VPSDE or DiscreteDDPM"):
        SAMPLERS[sampler](exact_eps(VPSDE()), object(), torch.zeros(1, 1, 2, 2), 2)
