"""The local Lipschitz ratio the paper bounds, measured: :func:`robustness` of a model per noise
level, under this package's schedules or a diffusers scheduler (:func:`noised`), whatever the
model returns (:func:`model_output`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from scalelong.diffusion import add_noise
from scalelong.errors import ScaleLongError


def model_output(out: object) -> torch.Tensor:
    """The prediction in what a model returned: a tensor, the first element of a tuple or list, or
    the ``.sample`` of a diffusers output object."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    sample = getattr(out, "sample", None)
    if isinstance(sample, torch.Tensor):
        return sample
    raise ScaleLongError(
        f"the model returned a {type(out).__name__}; expected a tensor, a tuple whose first element is "
        "one, or an output object with .sample"
    )


def noised(
    schedule: object, x0: torch.Tensor, t: float, noise: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_t, the time the network is fed) for one noise level ``t`` of the whole batch.

    ``schedule``: a schedule of :mod:`scalelong.diffusion` (``t`` its time: in [0, 1] for the
    VP-SDE, a step for the discrete chain), or a diffusers noise scheduler with ``alphas_cumprod``
    (``DDPMScheduler``, ``DDIMScheduler``, ...; ``t`` an integer timestep, fed as a long tensor).
    """
    n = x0.shape[0]
    if hasattr(schedule, "alpha_sigma") and hasattr(schedule, "model_time"):
        times = torch.full((n,), float(t))
        return add_noise(schedule, x0, times, noise), schedule.model_time(times).to(x0.device)
    acp = getattr(schedule, "alphas_cumprod", None)
    if not isinstance(acp, torch.Tensor):
        raise ScaleLongError(
            f"robustness needs a scalelong.diffusion schedule or a diffusers scheduler with alphas_cumprod "
            f"(DDPMScheduler, DDIMScheduler, ...); got {type(schedule).__name__}"
        )
    if isinstance(t, bool) or float(t) != int(t) or not 0 <= int(t) < len(acp):
        raise ScaleLongError(
            f"timestep {t!r}: with a diffusers scheduler ts are integer timesteps in 0..{len(acp) - 1}"
        )
    a = acp[int(t)].double()
    x_t = (a.sqrt() * x0.double() + (1 - a).sqrt() * noise.double()).to(x0.dtype)
    return x_t, torch.full((n,), int(t), dtype=torch.long, device=x0.device)


@torch.no_grad()
def robustness(
    model: nn.Module,
    schedule: object,
    x0: torch.Tensor,
    ts: Sequence[float],
    delta_scale: float = 1e-3,
    generator: torch.Generator | None = None,
    **cond: torch.Tensor,
) -> list[dict[str, float]]:
    """Empirical local Lipschitz ratio ||f(x_t + delta) - f(x_t)|| / ||delta|| per noise level.

    For each t in ``ts``: x_t = alpha(t) x0 + sigma(t) eps, delta = ``delta_scale`` * N(0, I), both
    drawn on the CPU from ``generator``; the ratio is computed per sample. Returns one row per t:
    ``{"t", "mean", "max"}`` over the batch. The paper bounds it by sum_i kappa_i M0^i + c0
    (see :func:`scalelong.diagnostics.theory.lipschitz_sum`).

    ``model`` is called as ``model(x_t, time, **cond)`` and may return a tensor, a tuple (its first
    element) or a diffusers output (its ``.sample``); for a checkpoint folder of ``scalelong
    train`` see :func:`scalelong.training.runs.checkpoint_robustness`. ``schedule`` is one of
    :mod:`scalelong.diffusion` (``ts`` its times) or a diffusers scheduler (``ts`` integer
    timesteps), see :func:`noised`; e.g. ``robustness(unet, DDPMScheduler(), x0, [10, 500, 990],
    encoder_hidden_states=text)``. The model runs in eval mode.
    """
    if not isinstance(model, nn.Module):
        raise ScaleLongError(
            f"robustness takes the model, got a {type(model).__name__}; for a checkpoint folder of "
            "`scalelong train` use scalelong.training.runs.checkpoint_robustness(path, schedule, x0, ts)"
        )
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    x0 = x0.to(device)
    rows = []
    try:
        for t_val in ts:
            noise = torch.randn(x0.shape, generator=generator)
            delta = delta_scale * torch.randn(x0.shape, generator=generator)
            x_t, tm = noised(schedule, x0, t_val, noise.to(device))
            moved = model_output(model(x_t + delta.to(device), tm, **cond)).float()
            diff = moved - model_output(model(x_t, tm, **cond)).float()
            ratio = diff.flatten(1).norm(dim=1).cpu() / delta.flatten(1).norm(dim=1)
            t_out = float(t_val) if tm.is_floating_point() else int(t_val)
            rows.append({"t": t_out, "mean": ratio.mean().item(), "max": ratio.max().item()})
    finally:
        model.train(was_training)
    return rows
