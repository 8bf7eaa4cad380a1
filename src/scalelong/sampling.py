"""Samplers: pure functions of one shared signature.

``sampler(eps_fn, schedule, x_T, steps, generator) -> x_0`` where ``eps_fn(x_t, t)`` returns the
epsilon prediction for times ``t`` in the schedule's own units (the caller binds the network,
its time input and any condition). ``generator`` is one ``torch.Generator`` or a list with one
per sample; with a list, sample i's noise depends on its own generator only, so results do not
depend on the batch size.

Every sampler serves both schedules: on the continuous :class:`VPSDE` it is implemented here;
on the :class:`DiscreteDDPM` chain it runs the matching diffusers scheduler (optional extra
``diffusers``), one table for all: :data:`DIFFUSERS_SCHEDULERS`. Network evaluations per call:
``steps`` (``steps + 1`` for ``euler_maruyama`` and ``ode_euler``, which end with a Tweedie
denoising step).
"""

from __future__ import annotations

import functools
import inspect
import math
import warnings
from collections.abc import Callable, Sequence

import torch

from scalelong.diffusion import (
    VPSDE,
    DiscreteDDPM,
    Schedule,
    epsilon_to_x0,
    output_to_epsilon,
    per_sample,
)
from scalelong.errors import ScaleLongError
from scalelong.models import conditioning

EpsFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Generators = torch.Generator | Sequence[torch.Generator] | None


def randn(shape: Sequence[int], generator: Generators, device: torch.device | str = "cpu") -> torch.Tensor:
    """Standard normal noise drawn on the CPU (device-independent); a generator list draws per sample."""
    if isinstance(generator, Sequence):
        if len(generator) != shape[0]:
            raise ScaleLongError(f"got {len(generator)} generators for a batch of {shape[0]}")
        z = torch.stack([torch.randn(tuple(shape[1:]), generator=g) for g in generator])
    else:
        z = torch.randn(tuple(shape), generator=generator)
    return z.to(device)


def _full(x: torch.Tensor, t: float) -> torch.Tensor:
    return torch.full((x.shape[0],), t, device=x.device, dtype=torch.float32)


# ----------------------------------------------------------------------------- discrete (diffusers)

# On the DiscreteDDPM chain every sampler hands off to the matching diffusers scheduler: its
# class, its options, and the sampler arguments its step() takes as well.
DIFFUSERS_SCHEDULERS: dict[str, tuple[str, dict, tuple[str, ...]]] = {
    "euler_maruyama": ("DDPMScheduler", {"clip_sample": False, "timestep_spacing": "trailing"}, ()),
    "ode_euler": ("EulerDiscreteScheduler", {"timestep_spacing": "trailing"}, ()),
    "ddim": (
        "DDIMScheduler",
        {"clip_sample": False, "set_alpha_to_one": True, "timestep_spacing": "trailing"},
        ("eta",),
    ),
    "dpm_solver": (
        "DPMSolverMultistepScheduler",
        # final_sigmas_type "zero" exists only for the ++ variant; Lu lambdas: logSNR-uniform
        # steps, as on the continuous schedule
        {"algorithm_type": "dpmsolver", "final_sigmas_type": "sigma_min", "use_lu_lambdas": True},
        (),
    ),
    "dpm_solver_pp": (
        "DPMSolverMultistepScheduler",
        {"algorithm_type": "dpmsolver++", "use_lu_lambdas": True},
        (),
    ),
}


@torch.no_grad()
def _diffusers_loop(scheduler, eps_fn: EpsFn, x: torch.Tensor, steps: int, generator: Generators, **kw):
    """Run a diffusers scheduler configured for our DDPM betas; x_T is N(0, I) as for every sampler."""
    scheduler.set_timesteps(steps)
    x = x * scheduler.init_noise_sigma
    gen = list(generator) if isinstance(generator, Sequence) else generator
    for t in scheduler.timesteps:
        eps = eps_fn(scheduler.scale_model_input(x, t), _full(x, float(t)))
        x = scheduler.step(eps, t, x, generator=gen, **kw).prev_sample
    return x


def _scheduler(name: str, schedule: DiscreteDDPM, **options):
    try:
        import diffusers
    except ImportError as e:
        raise ScaleLongError(
            "sampling the discrete ddpm schedule uses diffusers: pip install 'scalelong[diffusers]'"
        ) from e
    with warnings.catch_warnings():  # diffusers marks the noise-prediction DPM-Solver as deprecated
        warnings.simplefilter("ignore", FutureWarning)
        return getattr(diffusers, name)(
            num_train_timesteps=schedule.num_steps, trained_betas=schedule.betas.tolist(), **options
        )


def _sampler(vpsde_sampler: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A sampler of the shared signature for both schedules: the function given integrates the
    continuous VP-SDE; on the discrete chain the call goes to its row of DIFFUSERS_SCHEDULERS."""
    name, signature = vpsde_sampler.__name__, inspect.signature(vpsde_sampler)

    @functools.wraps(vpsde_sampler)
    def sampler(*args, **kwargs) -> torch.Tensor:
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        a = call.arguments
        if isinstance(a["schedule"], DiscreteDDPM):
            scheduler, options, step_args = DIFFUSERS_SCHEDULERS[name]
            steps_with = {k: a[k] for k in step_args}
            sched = _scheduler(scheduler, a["schedule"], **options)
            return _diffusers_loop(sched, a["eps_fn"], a["x"], a["steps"], a["generator"], **steps_with)
        if not isinstance(a["schedule"], VPSDE):
            raise ScaleLongError(
                f"samplers need a VPSDE or DiscreteDDPM schedule, got {type(a['schedule']).__name__}"
            )
        return vpsde_sampler(*args, **kwargs)

    return sampler


# ----------------------------------------------------------------------------- samplers


@_sampler
@torch.no_grad()
def euler_maruyama(
    eps_fn: EpsFn,
    schedule: Schedule,
    x: torch.Tensor,
    steps: int = 1000,
    generator: Generators = None,
    t_end: float = 1e-3,
) -> torch.Tensor:
    """Euler-Maruyama on the reverse-time VP-SDE (Song et al. 2021, Eq. 6), Tweedie denoise at the end.

    On the discrete schedule: ancestral DDPM sampling (Ho et al. 2020, Alg. 2), diffusers' DDPMScheduler.
    """
    ts = torch.linspace(1.0, t_end, steps + 1, dtype=torch.float64)
    for i in range(steps):
        t, h = ts[i].item(), (ts[i] - ts[i + 1]).item()
        tt = _full(x, t)
        beta = per_sample(schedule.beta(tt), x)
        _, sigma = schedule.alpha_sigma(tt)
        eps = eps_fn(x, tt)
        # x_{t-h} = x_t + [1/2 beta x_t + beta * score] h + sqrt(beta h) z, score = -eps / sigma
        x = x + (0.5 * beta * x - beta * eps / per_sample(sigma, x)) * h
        x = x + (beta * h).sqrt() * randn(x.shape, generator, x.device)
    t = _full(x, t_end)
    return epsilon_to_x0(schedule, x, t, eps_fn(x, t))


@_sampler
@torch.no_grad()
def ode_euler(
    eps_fn: EpsFn,
    schedule: Schedule,
    x: torch.Tensor,
    steps: int = 500,
    generator: Generators = None,
    t_end: float = 1e-3,
) -> torch.Tensor:
    """Euler steps on the probability-flow ODE (Song et al. 2021, Eq. 13), Tweedie denoise at the end.

    On the discrete schedule: diffusers' EulerDiscreteScheduler (the same ODE in sigma = sigma_t / alpha_t).
    """
    ts = torch.linspace(1.0, t_end, steps + 1, dtype=torch.float64)
    for i in range(steps):
        t, h = ts[i].item(), (ts[i] - ts[i + 1]).item()
        tt = _full(x, t)
        beta = per_sample(schedule.beta(tt), x)
        _, sigma = schedule.alpha_sigma(tt)
        # dx/dt = -1/2 beta (x + score), score = -eps / sigma; stepping backwards in time by h
        x = x + 0.5 * beta * h * (x - eps_fn(x, tt) / per_sample(sigma, x))
    t = _full(x, t_end)
    return epsilon_to_x0(schedule, x, t, eps_fn(x, t))


@_sampler
@torch.no_grad()
def ddim(
    eps_fn: EpsFn,
    schedule: Schedule,
    x: torch.Tensor,
    steps: int = 50,
    generator: Generators = None,
    eta: float = 0.0,
    t_end: float = 1e-3,
) -> torch.Tensor:
    """DDIM (Song, Meng & Ermon 2021, Eq. 12) on a time-uniform grid; the last step returns the x_0 estimate.

    On the discrete schedule: diffusers' DDIMScheduler ("trailing" steps, no clipping).
    """
    ts = torch.linspace(1.0, t_end, steps, dtype=torch.float64)
    for i in range(steps):
        tt = _full(x, ts[i].item())
        a_s, s_s = (per_sample(v, x) for v in schedule.alpha_sigma(tt))
        eps = eps_fn(x, tt)
        x0 = (x - s_s * eps) / a_s
        if i == steps - 1:
            return x0
        a_t, s_t = (per_sample(v, x) for v in schedule.alpha_sigma(_full(x, ts[i + 1].item())))
        # eta = 0: deterministic; eta = 1: the ancestral (DDPM posterior) variance
        s_eta = eta * (s_t / s_s) * (1 - (a_s / a_t) ** 2).clamp(min=0).sqrt()
        x = a_t * x0 + (s_t**2 - s_eta**2).sqrt() * eps
        if eta > 0:
            x = x + s_eta * randn(x.shape, generator, x.device)
    return x


def _dpm_solver(
    eps_fn: EpsFn,
    sde: VPSDE,
    x: torch.Tensor,
    steps: int,
    data_prediction: bool,
    t_end: float,
    skip_type: str,
) -> torch.Tensor:
    """Multistep second-order DPM-Solver in log-SNR lambda (Lu et al. 2022b, DPM-Solver(++)-2M, Alg. 2)."""

    def lam(t: torch.Tensor) -> torch.Tensor:
        la = sde.log_alpha(t)
        return la - 0.5 * torch.log(-torch.expm1(2 * la))

    bounds = torch.tensor([1.0, t_end], dtype=torch.float64)
    if skip_type == "logSNR":
        # lam is half the log-SNR: log(alpha / sigma)
        ts = sde.t_of_log_snr(2.0 * torch.linspace(*lam(bounds).tolist(), steps + 1, dtype=torch.float64))
    elif skip_type == "time_uniform":
        ts = torch.linspace(1.0, t_end, steps + 1, dtype=torch.float64)
    else:
        raise ScaleLongError(f"skip_type={skip_type!r}: choose 'logSNR' or 'time_uniform'")
    lams, log_alphas = lam(ts), sde.log_alpha(ts)
    sigmas = torch.sqrt(-torch.expm1(2 * log_alphas))
    prev, prev_h = None, None
    for i in range(steps):
        tt = _full(x, ts[i].item())
        eps = eps_fn(x, tt)
        # the ++ variant extrapolates the data prediction, the original the noise prediction
        m = (x - sigmas[i].item() * eps) / math.exp(log_alphas[i].item()) if data_prediction else eps
        h = (lams[i + 1] - lams[i]).item()
        second = prev is not None and not (i == steps - 1 and steps < 15)  # lower order at the final step
        d = m + 0.5 * (m - prev) * (h / prev_h) if second else m  # D1 = (m0 - m1) / r0, r0 = h_prev / h
        if data_prediction:
            x = (sigmas[i + 1] / sigmas[i]).item() * x - math.exp(log_alphas[i + 1].item()) * math.expm1(
                -h
            ) * d
        else:
            x = (
                math.exp((log_alphas[i + 1] - log_alphas[i]).item()) * x
                - sigmas[i + 1].item() * math.expm1(h) * d
            )
        prev, prev_h = m, h
    return x


@_sampler
@torch.no_grad()
def dpm_solver(
    eps_fn: EpsFn,
    schedule: Schedule,
    x: torch.Tensor,
    steps: int = 50,
    generator: Generators = None,
    t_end: float = 1e-3,
    skip_type: str = "logSNR",
) -> torch.Tensor:
    """DPM-Solver-2M, noise prediction (Lu et al. 2022a/b); discrete: diffusers' DPMSolverMultistepScheduler.

    The recipe's 50-step sampler for class-conditional ImageNet 64.
    """
    return _dpm_solver(eps_fn, schedule, x, steps, False, t_end, skip_type)


@_sampler
@torch.no_grad()
def dpm_solver_pp(
    eps_fn: EpsFn,
    schedule: Schedule,
    x: torch.Tensor,
    steps: int = 50,
    generator: Generators = None,
    t_end: float = 1e-3,
    skip_type: str = "logSNR",
) -> torch.Tensor:
    """DPM-Solver++(2M), data prediction (Lu et al. 2022b); discrete: DPMSolverMultistepScheduler.

    The recipe's 50-step sampler for MS-COCO.
    """
    return _dpm_solver(eps_fn, schedule, x, steps, True, t_end, skip_type)


SAMPLERS: dict[str, Callable[..., torch.Tensor]] = {
    "euler_maruyama": euler_maruyama,
    "ode_euler": ode_euler,
    "ddim": ddim,
    "dpm_solver": dpm_solver,
    "dpm_solver_pp": dpm_solver_pp,
}


def get_sampler(name: str) -> Callable[..., torch.Tensor]:
    if name not in SAMPLERS:
        raise ScaleLongError(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLERS)}")
    return SAMPLERS[name]


def network_evaluations(name: str, steps: int) -> int:
    """Network evaluations one call of sampler ``name`` makes with ``steps`` steps (continuous schedule)."""
    return steps + 1 if name in ("euler_maruyama", "ode_euler") else steps


# ----------------------------------------------------------------------------- models


def model_eps_fn(net: torch.nn.Module, schedule, **cond: torch.Tensor) -> EpsFn:
    """Bind a network and its condition into ``eps_fn(x_t, t)`` (its output read as the schedule's
    ``prediction`` says)."""
    return lambda x, t: output_to_epsilon(schedule, x, t, net(x, schedule.model_time(t), **cond).float())


@torch.no_grad()
def generate(
    net: torch.nn.Module,
    schedule: Schedule,
    sampler: str,
    steps: int,
    seeds: Sequence[int],
    shape: Sequence[int],
    labels: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Images for the given per-sample seeds, clamped to [-1, 1]: (len(seeds), *shape) on ``device``.

    Sample i's initial noise and every later draw come from ``torch.Generator().manual_seed(seeds[i])``,
    so an image depends on its seed (and label) only, never on the batch it was drawn in.
    ``labels`` condition a class-conditional model (ignored by an unconditional one).
    """
    gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
    x = randn((len(gens), *shape), gens, device)
    if labels is None:
        labels = torch.zeros(len(gens), dtype=torch.long)
    cond = conditioning(net, labels.to(device))
    return get_sampler(sampler)(model_eps_fn(net, schedule, **cond), schedule, x, steps, gens).clamp(-1, 1)


__all__ = [
    "SAMPLERS",
    "EpsFn",
    "ddim",
    "dpm_solver",
    "dpm_solver_pp",
    "euler_maruyama",
    "generate",
    "get_sampler",
    "model_eps_fn",
    "network_evaluations",
    "ode_euler",
    "randn",
]
