"""The training-set posterior mean (diffusion.ideal_x0): right at the two ends of the noise
range, and a sampler fed it draws the training images back."""

import torch

from scalelong.data import embedded_mnist
from scalelong.diffusion import VPSDE, DiscreteDDPM, add_noise, ideal_epsilon_fn, ideal_x0
from scalelong.sampling import get_sampler, randn

IMAGES = embedded_mnist("train")[0][:64]


def test_ideal_x0_is_the_nearest_image_at_low_noise_and_the_mean_at_high_noise():
    sde = VPSDE()
    x0 = IMAGES[:8]
    t = torch.full((8,), 0.02)
    noisy = add_noise(sde, x0, t, torch.randn(x0.shape, generator=torch.Generator().manual_seed(0)))
    torch.testing.assert_close(ideal_x0(sde, IMAGES, noisy, t), x0, atol=1e-4, rtol=0)
    pure = torch.randn(4, 1, 32, 32, generator=torch.Generator().manual_seed(1))
    mean = IMAGES.mean(0, keepdim=True).expand(4, -1, -1, -1)
    at_one = ideal_x0(sde, IMAGES, pure, torch.ones(4))
    assert (at_one - mean).abs().mean() < 0.01 and (at_one - mean).abs().max() < 0.1  # alpha(1) ~ 0.0065


def _distance_to_nearest(samples: torch.Tensor) -> torch.Tensor:
    return torch.cdist(samples.flatten(1), IMAGES.flatten(1)).min(dim=1).values / 32


def test_samplers_fed_the_ideal_denoiser_draw_training_images():
    for schedule, sampler in [(VPSDE(), "dpm_solver"), (VPSDE(), "euler_maruyama"), (DiscreteDDPM(), "ddim")]:
        gens = [torch.Generator().manual_seed(i) for i in range(6)]
        x = randn((6, 1, 32, 32), gens)
        out = get_sampler(sampler)(ideal_epsilon_fn(schedule, IMAGES), schedule, x, 50, gens).clamp(-1, 1)
        assert _distance_to_nearest(out).max() < 0.02, sampler  # RMS pixel error to a training digit
        assert (
            len({int(torch.cdist(o.flatten()[None], IMAGES.flatten(1)).argmin()) for o in out}) > 2
        )  # not one image


def test_a_sign_error_does_not_draw_training_images():
    """The negative control: epsilon read with the wrong sign."""
    gens = [torch.Generator().manual_seed(i) for i in range(6)]
    x = randn((6, 1, 32, 32), gens)
    right = ideal_epsilon_fn(VPSDE(), IMAGES)
    out = get_sampler("dpm_solver")(lambda x, t: -right(x, t), VPSDE(), x, 50, gens).clamp(-1, 1)
    assert _distance_to_nearest(out).min() > 0.1
