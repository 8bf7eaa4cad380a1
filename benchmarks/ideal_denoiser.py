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
from scalelong.diffusion import NOISE_LEVELS, VPSDE, ideal_x0, mean_image_error, noise_level_errors


class IdealX0(torch.nn.Module):
    """The training set's posterior mean as an x0-predicting network of the VP-SDE."""

    def __init__(self, images: torch.Tensor):
        super().__init__()
        self.images, self.sde = images, VPSDE(prediction="x0")

    def forward(self, x_t: torch.Tensor, model_t: torch.Tensor) -> torch.Tensor:
        return ideal_x0(self.sde, self.images, x_t, model_t / 999.0)  # VP-SDE network time is t * 999


def main() -> None:
    train, _ = embedded_mnist("train")
    held_out = embedded_mnist("test")[0][:256]
    ideal = IdealX0(train)
    errors = {lv: e["x0_mse"] for lv, e in noise_level_errors(ideal, ideal.sde, held_out).items()}
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
