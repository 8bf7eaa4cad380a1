"""Noise schedules and the training loss. The backbone knows nothing of these.

A schedule maps a time ``t`` to the marginal x_t = alpha(t) x_0 + sigma(t) eps and to the
time value the network is fed. Two schedules share that interface:

* :class:`VPSDE`: continuous variance-preserving SDE, linear beta(t) on t in [0, 1]
  (Song et al. 2021, Eq. 11); the ScaleLong / U-ViT recipe uses beta 0.1 -> 20, network
  time t * 999.
* :class:`DiscreteDDPM`: the 1000-step DDPM chain (Ho et al. 2020) with "linear" or
  Stable Diffusion's "scaled_linear" betas; t is the integer step, fed to the network as is.
"""

from __future__ import annotations

import torch

from scalelong.errors import ScaleLongError


def per_sample(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Per-sample values (B,) shaped to broadcast against ``like`` (B, ...), in its dtype."""
    return v.reshape(-1, *([1] * (like.ndim - 1))).to(like.dtype)


class VPSDE:
    """dx = -1/2 beta(t) x dt + sqrt(beta(t)) dw, beta(t) = beta_min + t (beta_max - beta_min)."""

    continuous = True

    def __init__(self, beta_min: float = 0.1, beta_max: float = 20.0, t_min: float = 1e-5):
        if not 0 < beta_min < beta_max:
            raise ScaleLongError(f"need 0 < beta_min < beta_max, got {beta_min}, {beta_max}")
        self.beta_min, self.beta_max, self.t_min = beta_min, beta_max, t_min

    def beta(self, t: torch.Tensor) -> torch.Tensor:
        return self.beta_min + t * (self.beta_max - self.beta_min)

    def log_alpha(self, t: torch.Tensor) -> torch.Tensor:
        """log of the mean coefficient: -1/4 t^2 (beta_max - beta_min) - 1/2 t beta_min."""
        return -0.25 * t**2 * (self.beta_max - self.beta_min) - 0.5 * t * self.beta_min

    def alpha_sigma(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        la = self.log_alpha(t.double())
        return la.exp().to(t.dtype), torch.sqrt(-torch.expm1(2 * la)).to(t.dtype)

    def model_time(self, t: torch.Tensor) -> torch.Tensor:
        return t * 999.0

    def sample_t(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """t ~ U(t_min, 1) on the CPU, so the draw does not depend on the device."""
        return self.t_min + (1.0 - self.t_min) * torch.rand(n, generator=generator)


class DiscreteDDPM:
    """The discrete DDPM chain; ``t`` holds integer steps 0 .. num_steps - 1 (as floats)."""

    continuous = False

    def __init__(
        self,
        num_steps: int = 1000,
        beta_schedule: str = "linear",
        beta_start: float = 1e-4,
        beta_end: float = 0.02,
    ):
        if beta_schedule == "linear":
            betas = torch.linspace(beta_start, beta_end, num_steps, dtype=torch.float64)
        elif beta_schedule == "scaled_linear":
            betas = torch.linspace(beta_start**0.5, beta_end**0.5, num_steps, dtype=torch.float64) ** 2
        else:
            raise ScaleLongError(
                f"unknown beta_schedule {beta_schedule!r}; choose 'linear' or 'scaled_linear'"
            )
        self.num_steps, self.beta_schedule = num_steps, beta_schedule
        self.beta_start, self.beta_end = beta_start, beta_end
        self.betas = betas
        self.alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)

    def alpha_sigma(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        acp = self.alphas_cumprod.to(t.device)[t.long()]
        return acp.sqrt().to(t.dtype), (1.0 - acp).sqrt().to(t.dtype)

    def model_time(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def sample_t(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.randint(0, self.num_steps, (n,), generator=generator).float()


Schedule = VPSDE | DiscreteDDPM


def add_noise(schedule: Schedule, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """x_t = alpha(t) x_0 + sigma(t) noise."""
    alpha, sigma = schedule.alpha_sigma(t.to(x0.device))
    return per_sample(alpha, x0) * x0 + per_sample(sigma, x0) * noise


def training_loss(
    net: torch.nn.Module,
    schedule: Schedule,
    x0: torch.Tensor,
    generator: torch.Generator | None = None,
    **cond: torch.Tensor,
) -> torch.Tensor:
    """Epsilon-prediction MSE averaged over pixels, one value per sample: (B,).

    Times and noise are drawn on the CPU from ``generator`` and then moved, so a seed gives
    the same draws on every device.
    """
    t = schedule.sample_t(x0.shape[0], generator).to(x0.device)
    noise = torch.randn(x0.shape, generator=generator).to(x0.device)
    return epsilon_loss(net, schedule, x0, t, noise, **cond)


def epsilon_loss(
    net: torch.nn.Module,
    schedule: Schedule,
    x0: torch.Tensor,
    t: torch.Tensor,
    noise: torch.Tensor,
    **cond: torch.Tensor,
) -> torch.Tensor:
    """The same loss for given times and noise (the trainer draws them for the global batch): (B,)."""
    pred = net(add_noise(schedule, x0, t, noise), schedule.model_time(t), **cond)
    return (pred.float() - noise.float()).square().flatten(1).mean(dim=1)


def epsilon_to_x0(schedule: Schedule, x_t: torch.Tensor, t: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """Tweedie's denoised estimate from an epsilon prediction."""
    alpha, sigma = schedule.alpha_sigma(t)
    return (x_t - per_sample(sigma, x_t) * eps) / per_sample(alpha, x_t)


__all__ = [
    "VPSDE",
    "DiscreteDDPM",
    "Schedule",
    "add_noise",
    "training_loss",
    "epsilon_loss",
    "epsilon_to_x0",
    "per_sample",
]
