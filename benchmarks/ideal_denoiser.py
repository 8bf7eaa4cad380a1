"""A yardstick for the per-noise-level diagnostic: the x0 error of the ideal denoiser of the
embedded digits.

``scalelong.diffusion.ideal_x0`` is the exact posterior mean when x0 is one of the 4,000 training
digits, i.e. what a network trained on them converges to if it memorises them. Scored like the
training-time probe (256 held-out digits, ``noise_level_errors``' levels and noise seeds), next to
the mean image: a model above the ideal line at the middle levels (0.3-0.6) has not yet learnt
the shapes of digits. No training; seconds on a CPU.

    python -m benchmarks.ideal_denoiser
"""

from __future__ import annotations

import torch

from benchmarks.harness import markdown_table, write_result
from scalelong.data import embedded_mnist
from scalelong.diffusion import NOISE_LEVELS, VPSDE, add_noise, ideal_x0, mean_image_error


def main() -> None:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    train, _ = embedded_mnist("train")
    held_out = embedded_mnist("test")[0][:256]
    sde = VPSDE()
    errors = {}
    for k, level in enumerate(NOISE_LEVELS):  # the noise of level k from seed k, as the probe draws it
        noise = torch.randn(held_out.shape, generator=torch.Generator().manual_seed(k))
        t = torch.full((len(held_out),), sde.time_at(level))
        x_t = add_noise(sde, held_out, t, noise)
        errors[level] = (ideal_x0(sde, train, x_t, t) - held_out).square().mean().item()
    mean = mean_image_error(held_out)
    table = markdown_table(
        ["noise level", *[f"{lv:g}" for lv in NOISE_LEVELS]],
        [["ideal denoiser x0 MSE", *errors.values()], ["mean image", *[mean] * len(NOISE_LEVELS)]],
    )
    write_result(
        "ideal_denoiser", {"x0_mse": {str(k): v for k, v in errors.items()}, "mean_image": mean}, table
    )
    print(table)


if __name__ == "__main__":
    main()
