"""Noise schedules and the training loss. The backbone knows nothing of these.

A schedule maps a time ``t`` to the marginal x_t = alpha(t) x_0 + sigma(t) eps and to the
time value the network is fed. Two schedules share that interface:

* :class:`VPSDE`: continuous variance-preserving SDE, linear beta(t) on t in [0, 1]
  (Song et al. 2021, Eq. 11); the ScaleLong / U-ViT recipe uses beta 0.1 -> 20, network
  time t * 999.
* :class:`DiscreteDDPM`: the 1000-step DDPM chain (Ho et al. 2020) with "linear" or
  Stable Diffusion's "scaled_linear" betas; t is the integer step, fed to the network as is.

What the network outputs is the schedule's ``prediction`` (as diffusers' ``prediction_type``):

* ``eps``: the noise (Ho et al. 2020), the ScaleLong / U-ViT recipe;
* ``v``: v = alpha eps - sigma x0 (Salimans & Ho 2022, Sec. 4). Its loss weights the x0 error by
  1 + SNR instead of SNR, so the high-noise levels that decide a sample's global shape are learnt
  too: with ``eps`` an error e at time t becomes an x0 error e * sigma / alpha, which at the end
  of the VP-SDE (alpha(1) ~ 0.0065) is a 150-fold amplification.
* ``x0``: the clean image itself, trained with the v-loss (the x0 error weighted by 1 / sigma^2,
  sigma floored at :data:`X0_LOSS_SIGMA_MIN`), as in "Back to Basics: Let Denoising Generative
  Models Denoise" (Li & He 2025). Predicting noise or v, a network must copy every pixel of the
  noise in x_t to its output, and what it misses stays in the sample as specks; a clean image
  lies on the data manifold, which a small or coarsely patched network can represent.
* ``edm``: EDM's preconditioning (Karras et al. 2022, Sec. 5) in VP form: with s = sigma / alpha
  the x0 estimate is c_skip(s) x_t / alpha + c_out(s) F, c_skip = sd^2 / (s^2 + sd^2),
  c_out = s sd / sqrt(s^2 + sd^2), sd = :data:`EDM_SIGMA_DATA`, and F is trained with a plain MSE
  (EDM's loss weight 1 / c_out^2 on the x0 error). At low noise the input passes through the skip
  and the network only corrects it; at high noise F predicts the image, as with ``x0``.

How the squared errors of different noise levels are weighed is the schedule's ``loss_weighting``:

* ``default``: a plain MSE on what the network outputs (the v-loss for ``x0``, see above);
* ``min_snr``: Min-SNR-gamma (Hang et al., ICCV 2023): whatever the network outputs, the x0 error
  is weighted by min(SNR, gamma). Left alone, the near-clean levels, where the error is small but
  its weight 1 + SNR huge, dominate the gradient and the levels that shape a sample learn slowly.

Samplers always receive epsilon (:func:`output_to_epsilon`), so every sampler serves both.
"""

from __future__ import annotations

import torch

from scalelong.errors import ScaleLongError

PREDICTIONS = ("eps", "v", "x0", "edm")
EDM_SIGMA_DATA = 0.5  # EDM's sigma_data (Karras et al. 2022, Table 1)
TIME_SAMPLINGS = ("uniform", "logsnr_normal")
LOSS_WEIGHTINGS = ("default", "min_snr")
# x0-prediction's loss is the v-loss, (x0 error / sigma)^2; sigma is floored here so that the
# weight, 1 / sigma^2, stays finite near t = 0 (as JiT floors its noise level).
X0_LOSS_SIGMA_MIN = 0.05


def _check_prediction(prediction: str) -> str:
    if prediction not in PREDICTIONS:
        choices = ", ".join(PREDICTIONS)
        raise ScaleLongError(f"prediction={prediction!r} is not supported; choose one of {choices}")
    return prediction


def _check_weighting(loss_weighting: str, min_snr_gamma: float) -> tuple[str, float]:
    if loss_weighting not in LOSS_WEIGHTINGS:
        choices = ", ".join(LOSS_WEIGHTINGS)
        raise ScaleLongError(f"loss_weighting={loss_weighting!r} is not supported; choose one of {choices}")
    if not min_snr_gamma > 0:
        raise ScaleLongError(f"min_snr_gamma must be > 0, got {min_snr_gamma}")
    return loss_weighting, float(min_snr_gamma)


def per_sample(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Per-sample values (B,) shaped to broadcast against ``like`` (B, ...), in its dtype."""
    return v.reshape(-1, *([1] * (like.ndim - 1))).to(like.dtype)


class VPSDE:
    """dx = -1/2 beta(t) x dt + sqrt(beta(t)) dw, beta(t) = beta_min + t (beta_max - beta_min)."""

    continuous = True

    def __init__(
        self,
        beta_min: float = 0.1,
        beta_max: float = 20.0,
        t_min: float = 1e-5,
        prediction: str = "eps",
        time_sampling: str = "uniform",
        logsnr_mean: float = 0.0,
        logsnr_std: float = 1.0,
        loss_weighting: str = "default",
        min_snr_gamma: float = 5.0,
    ):
        if not 0 < beta_min < beta_max:
            raise ScaleLongError(f"need 0 < beta_min < beta_max, got {beta_min}, {beta_max}")
        if time_sampling not in TIME_SAMPLINGS:
            raise ScaleLongError(
                f"time_sampling={time_sampling!r}; choose one of {', '.join(TIME_SAMPLINGS)}"
            )
        if not logsnr_std > 0:
            raise ScaleLongError(f"logsnr_std must be > 0, got {logsnr_std}")
        self.beta_min, self.beta_max, self.t_min = beta_min, beta_max, t_min
        self.prediction = _check_prediction(prediction)
        self.time_sampling, self.logsnr_mean, self.logsnr_std = time_sampling, logsnr_mean, logsnr_std
        self.loss_weighting, self.min_snr_gamma = _check_weighting(loss_weighting, min_snr_gamma)

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

    def log_snr(self, t: torch.Tensor) -> torch.Tensor:
        """lambda(t) = log(alpha^2 / sigma^2)."""
        la = self.log_alpha(t)
        return 2.0 * la - torch.log(-torch.expm1(2.0 * la))

    def t_of_log_snr(self, lam: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`log_snr` for the linear beta (closed form)."""
        log_alpha = -0.5 * torch.nn.functional.softplus(-lam)
        db = self.beta_max - self.beta_min
        return -4.0 * log_alpha / (self.beta_min + torch.sqrt(self.beta_min**2 - 4.0 * db * log_alpha))

    def sample_t(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Training times on the CPU (so the draw does not depend on the device): t ~ U(t_min, 1), or
        for ``logsnr_normal`` the t whose log-SNR is N(logsnr_mean, logsnr_std^2), clipped to
        [t_min, 1] (as EDM draws log sigma from a normal)."""
        if self.time_sampling == "uniform":
            return self.t_min + (1.0 - self.t_min) * torch.rand(n, generator=generator)
        lam = self.logsnr_mean + self.logsnr_std * torch.randn(n, generator=generator, dtype=torch.float64)
        return self.t_of_log_snr(lam).clamp(self.t_min, 1.0).float()

    def time_at(self, fraction: float) -> float:
        """The time ``fraction`` of the way from t_min to 1."""
        return self.t_min + (1.0 - self.t_min) * fraction


class DiscreteDDPM:
    """The discrete DDPM chain; ``t`` holds integer steps 0 .. num_steps - 1 (as floats)."""

    continuous = False

    def __init__(
        self,
        num_steps: int = 1000,
        beta_schedule: str = "linear",
        beta_start: float = 1e-4,
        beta_end: float = 0.02,
        prediction: str = "eps",
        loss_weighting: str = "default",
        min_snr_gamma: float = 5.0,
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
        self.prediction = _check_prediction(prediction)
        self.loss_weighting, self.min_snr_gamma = _check_weighting(loss_weighting, min_snr_gamma)

    def alpha_sigma(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        acp = self.alphas_cumprod.to(t.device)[t.long()]
        return acp.sqrt().to(t.dtype), (1.0 - acp).sqrt().to(t.dtype)

    def model_time(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def sample_t(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.randint(0, self.num_steps, (n,), generator=generator).float()

    def time_at(self, fraction: float) -> float:
        """The step ``fraction`` of the way through the chain (0: first, 1: last)."""
        return float(round(fraction * (self.num_steps - 1)))


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
    """The denoising loss at times and noise drawn from ``generator``, one value per sample: (B,).

    Times and noise are drawn on the CPU from ``generator`` and then moved, so a seed gives
    the same draws on every device.
    """
    t = schedule.sample_t(x0.shape[0], generator).to(x0.device)
    noise = torch.randn(x0.shape, generator=generator).to(x0.device)
    return denoising_loss(net, schedule, x0, t, noise, **cond)


def edm_coefficients(schedule: Schedule, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b) with x0 = a x_t + b F for ``prediction="edm"``: a = c_skip / alpha, b = c_out (B,),
    computed in float64 (s spans 1e-3 to 150 on the VP-SDE)."""
    alpha, sigma = (v.double() for v in schedule.alpha_sigma(t.double()))
    s, sd = sigma / alpha, EDM_SIGMA_DATA
    c_skip = sd**2 / (s**2 + sd**2)
    c_out = s * sd / torch.sqrt(s**2 + sd**2)
    return (c_skip / alpha).float(), c_out.float()


def prediction_target(
    schedule: Schedule, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor
) -> torch.Tensor:
    """What the network learns to output at x_t = alpha x0 + sigma noise: the noise, v, x0 or
    EDM's F."""
    if schedule.prediction == "eps":
        return noise
    if schedule.prediction == "x0":
        return x0
    if schedule.prediction == "edm":
        a, b = edm_coefficients(schedule, t.to(x0.device))
        x_t = add_noise(schedule, x0, t, noise)
        return (x0 - per_sample(a, x0) * x_t) / per_sample(b, x0)
    alpha, sigma = schedule.alpha_sigma(t.to(x0.device))
    return per_sample(alpha, x0) * noise - per_sample(sigma, x0) * x0


def output_to_epsilon(
    schedule: Schedule, x_t: torch.Tensor, t: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """The epsilon a network output stands for (alpha^2 + sigma^2 = 1, so eps = sigma x_t + alpha v;
    eps = (x_t - alpha x0) / sigma)."""
    if schedule.prediction == "eps":
        return out
    alpha, sigma = schedule.alpha_sigma(t.to(x_t.device))
    if schedule.prediction == "v":
        return per_sample(sigma, x_t) * x_t + per_sample(alpha, x_t) * out
    if schedule.prediction == "edm":  # F -> x0
        a, b = edm_coefficients(schedule, t.to(x_t.device))
        out = per_sample(a, x_t) * x_t + per_sample(b, x_t) * out
    return (x_t - per_sample(alpha, x_t) * out) / per_sample(sigma, x_t)


def denoising_loss(
    net: torch.nn.Module,
    schedule: Schedule,
    x0: torch.Tensor,
    t: torch.Tensor,
    noise: torch.Tensor,
    **cond: torch.Tensor,
) -> torch.Tensor:
    """MSE between the network output and :func:`prediction_target`, averaged over pixels: (B,);
    for x0-prediction weighted by 1 / max(sigma, X0_LOSS_SIGMA_MIN)^2 (the v-loss).

    For given times and noise (the trainer draws them for the global batch)."""
    pred = net(add_noise(schedule, x0, t, noise), schedule.model_time(t), **cond)
    target = prediction_target(schedule, x0, t, noise)
    return (pred.float() - target.float()).square().flatten(1).mean(dim=1) * loss_weight(schedule, t)


def loss_weight(schedule: Schedule, t: torch.Tensor) -> torch.Tensor:
    """Per-sample weight of the squared error of the network output (B,).

    ``default``: 1, or for x0-prediction 1 / max(sigma, floor)^2 (the v-loss). ``min_snr``: the
    weight that makes the loss min(SNR, gamma) times the x0 error, given that the output's squared
    error is the x0 error times SNR (eps), 1 + SNR (v), 1 (x0) or 1 / c_out^2 (edm)."""
    if schedule.loss_weighting == "default":
        if schedule.prediction != "x0":
            return torch.ones_like(t, dtype=torch.float32)
        sigma = schedule.alpha_sigma(t)[1].float()
        return sigma.clamp(min=X0_LOSS_SIGMA_MIN).square().reciprocal()
    alpha, sigma = (v.double() for v in schedule.alpha_sigma(t.double()))
    snr = (alpha / sigma).square()
    if schedule.prediction == "eps":
        per_x0 = snr
    elif schedule.prediction == "v":
        per_x0 = snr + 1
    elif schedule.prediction == "x0":
        per_x0 = 1.0
    else:  # edm: x0 error = c_out * F error
        per_x0 = edm_coefficients(schedule, t)[1].double().square().reciprocal()
    return (snr.clamp(max=schedule.min_snr_gamma) / per_x0).float()


@torch.no_grad()
def input_free_loss(
    schedule: Schedule, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor, mean_image: torch.Tensor
) -> torch.Tensor:
    """The loss of the best output that ignores x_t (knowing only t): E[target | t], the target
    of the data's ``mean_image`` (C, H, W) and zero noise; per sample (B,).

    A network whose loss does not fall clearly below this has learnt nothing from its input: for
    epsilon-prediction it is ~1 (the output 0), for v and x0 it follows from the images' variance.
    The trainer logs it next to the loss (``loss_input_free``); the divergence rule
    (:func:`scalelong.studies.divergence.divergence`) calls a run whose loss ends near it collapsed."""
    mean = mean_image.float().expand_as(x0)
    guess = prediction_target(schedule, mean, t, torch.zeros_like(noise))
    target = prediction_target(schedule, x0.float(), t, noise.float())
    return (guess - target).square().flatten(1).mean(dim=1) * loss_weight(schedule, t)


def epsilon_to_x0(schedule: Schedule, x_t: torch.Tensor, t: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """Tweedie's denoised estimate from an epsilon prediction."""
    alpha, sigma = schedule.alpha_sigma(t)
    return (x_t - per_sample(sigma, x_t) * eps) / per_sample(alpha, x_t)


# Noise levels of :func:`noise_level_errors`, as fractions of the schedule's time range.
NOISE_LEVELS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


@torch.no_grad()
def noise_level_errors(
    net: torch.nn.Module,
    schedule: Schedule,
    x0: torch.Tensor,
    levels: tuple[float, ...] = NOISE_LEVELS,
    seed: int = 0,
    batch_size: int = 256,
    **cond: torch.Tensor,
) -> dict[float, dict[str, float]]:
    """The network's denoising error at each noise level, on images ``x0`` (N, C, H, W).

    Returns ``{level: {"eps_mse": e, "x0_mse": x}}``: the mean squared error of the epsilon it
    implies and of Tweedie's x0 estimate (unclamped) at t = ``schedule.time_at(level)``. The noise
    of level k comes from ``seed + k``, so two models (or two steps) are scored on the same draws.
    The loss averaged over t hides where a model fails; this shows it: an x0 error above
    :func:`mean_image_error` means the network does worse than ignoring x_t altogether.
    """
    out = {}
    for k, level in enumerate(levels):
        gen = torch.Generator().manual_seed(seed + k)
        eps_se = x0_se = 0.0
        for start in range(0, len(x0), batch_size):
            x = x0[start : start + batch_size]
            c = {name: v[start : start + batch_size] for name, v in cond.items()}
            noise = torch.randn(x.shape, generator=gen).to(x.device)
            t = torch.full((len(x),), schedule.time_at(level), device=x.device)
            x_t = add_noise(schedule, x, t, noise)
            eps = output_to_epsilon(schedule, x_t, t, net(x_t, schedule.model_time(t), **c).float())
            eps_se += (eps - noise).square().sum().item()
            x0_se += (epsilon_to_x0(schedule, x_t, t, eps) - x).square().sum().item()
        out[level] = {"eps_mse": eps_se / x0.numel(), "x0_mse": x0_se / x0.numel()}
    return out


@torch.no_grad()
def ideal_x0(
    schedule: Schedule, images: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor, chunk: int = 4096
) -> torch.Tensor:
    """E[x0 | x_t] when x0 is drawn uniformly from ``images`` (N, C, H, W): the denoiser that knows
    its training set by heart, a softmax over -||x_t - alpha x_i||^2 / (2 sigma^2) (in float64).

    It is what a network trained on ``images`` converges to, so it is a yardstick for a model's
    per-noise-level error, and with :func:`ideal_epsilon_fn` a check that a sampler is right: it
    must draw the training images back."""
    alpha, sigma = (v.double().reshape(-1, 1) for v in schedule.alpha_sigma(t.double()))
    x = x_t.flatten(1).double()
    bank = images.flatten(1).double().to(x.device)
    logits = torch.cat(
        [
            (2 * alpha * x @ b.T - alpha**2 * b.square().sum(1)) / (2 * sigma**2)  # - ||x||^2 cancels
            for b in bank.split(chunk)
        ],
        dim=1,
    )
    return (logits.softmax(dim=1) @ bank).reshape(x_t.shape).to(x_t.dtype)


def ideal_epsilon_fn(schedule: Schedule, images: torch.Tensor):
    """``eps_fn(x_t, t)`` of :func:`ideal_x0`, for the samplers."""

    def eps_fn(x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        alpha, sigma = schedule.alpha_sigma(t)
        return (x_t - per_sample(alpha, x_t) * ideal_x0(schedule, images, x_t, t)) / per_sample(sigma, x_t)

    return eps_fn


def mean_image_error(x0: torch.Tensor) -> float:
    """x0 error of the per-pixel mean image: the best guess that ignores the noisy input."""
    return (x0 - x0.mean(dim=0, keepdim=True)).square().mean().item()


__all__ = [
    "VPSDE",
    "DiscreteDDPM",
    "Schedule",
    "add_noise",
    "PREDICTIONS",
    "EDM_SIGMA_DATA",
    "edm_coefficients",
    "TIME_SAMPLINGS",
    "LOSS_WEIGHTINGS",
    "training_loss",
    "denoising_loss",
    "input_free_loss",
    "loss_weight",
    "prediction_target",
    "output_to_epsilon",
    "epsilon_to_x0",
    "NOISE_LEVELS",
    "noise_level_errors",
    "mean_image_error",
    "ideal_x0",
    "ideal_epsilon_fn",
    "per_sample",
]
