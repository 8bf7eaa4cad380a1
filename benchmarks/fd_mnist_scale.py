"""How to read an FD-MNIST number: the distance of the 1,000 held-out real digits after
controlled damage, against the training digits (the reference of the demo and of `compare`).

The classifier behind FD-MNIST was trained on exactly these training digits, so its features
are sharp: strokes one pixel thicker, a blur of 0.8 pixels or a 2-pixel shift of real digits
already cost more than 100. A sample set near 20 is close to real digits in stroke width,
position and class balance; recognisable digits with the wrong stroke width score in the
hundreds. No training; seconds on a CPU.

    python -m benchmarks.fd_mnist_scale
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.harness import markdown_table, write_result
from scalelong.data import embedded_mnist
from scalelong.metrics.frechet import fd_mnist_features, fd_of_images, mnist_reference_stats

BACKGROUND = -1.0  # the digits' black, in [-1, 1]


def gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    radius = 3
    k = torch.exp(-(torch.arange(-radius, radius + 1).float() ** 2) / (2 * sigma**2))
    k = (k / k.sum()).to(x)
    x = F.conv2d(F.pad(x, (radius, radius, 0, 0), value=BACKGROUND), k.view(1, 1, 1, -1))
    return F.conv2d(F.pad(x, (0, 0, radius, radius), value=BACKGROUND), k.view(1, 1, -1, 1))


def shift(x: torch.Tensor, pixels: int) -> torch.Tensor:
    """Move every digit ``pixels`` right and down, filling with background."""
    padded = F.pad(x, (pixels, 0, pixels, 0), value=BACKGROUND)
    return padded[..., : x.shape[-2], : x.shape[-1]]


def corruptions(seed: int = 0) -> dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """Name -> f(images, labels) giving the damaged set, mildest of each kind first."""
    gen = torch.Generator().manual_seed(seed)

    def noise(sigma: float):
        return lambda x, y: (x + sigma * torch.randn(x.shape, generator=gen)).clamp(-1, 1)

    def classes(k: int):  # the digits 0 .. k-1 only, repeated to the same count
        return lambda x, y: x[y < k].repeat(-(-len(x) // int((y < k).sum())), 1, 1, 1)[: len(x)]

    return {
        "real (held out)": lambda x, y: x,
        "gaussian noise 0.1": noise(0.1),
        "gaussian noise 0.2": noise(0.2),
        "gaussian noise 0.4": noise(0.4),
        "binarised at 0": lambda x, y: torch.where(x > 0, 1.0, BACKGROUND),
        "shifted 1 px": lambda x, y: shift(x, 1),
        "shifted 2 px": lambda x, y: shift(x, 2),
        "blur 0.5 px": lambda x, y: gaussian_blur(x, 0.5),
        "blur 0.8 px": lambda x, y: gaussian_blur(x, 0.8),
        "blur 1.2 px": lambda x, y: gaussian_blur(x, 1.2),
        "strokes 1 px thicker (3x3 max)": lambda x, y: F.max_pool2d(x, 3, 1, 1),
        "strokes thinner (3x3 min)": lambda x, y: -F.max_pool2d(-x, 3, 1, 1),
        "centre 8x8 erased": lambda x, y: _erase_centre(x),
        "digits 0-8 only": classes(9),
        "digits 0-4 only": classes(5),
        "uniform noise": lambda x, y: torch.rand(x.shape, generator=gen) * 2 - 1,
    }


def _erase_centre(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x[..., 12:20, 12:20] = BACKGROUND
    return x


def scale(images: torch.Tensor, labels: torch.Tensor, seed: int = 0) -> dict[str, float]:
    """FD-MNIST of each damaged version of ``images`` against the training digits."""
    features, ref = fd_mnist_features(), mnist_reference_stats("train")
    return {name: fd_of_images(features, f(images, labels), ref) for name, f in corruptions(seed).items()}


def main() -> None:
    torch.set_num_threads(1)
    result = scale(*embedded_mnist("test"))
    rows = [[name, fd] for name, fd in result.items()]
    table = markdown_table(["1,000 held-out digits, damaged", "FD-MNIST"], rows)
    write_result("fd_mnist_scale", {"fd_mnist": result}, table)
    print(table)


if __name__ == "__main__":
    main()
