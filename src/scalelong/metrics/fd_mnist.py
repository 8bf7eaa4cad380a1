"""FD-MNIST: a Fréchet distance that works offline, on features of a small digit classifier.

FID needs the 100 MB Inception network; for the embedded MNIST digits a compact CNN trained on
those digits gives a feature space that separates good and bad samples just as well and runs
in seconds on a CPU. The classifier ships in ``assets/fd_mnist.safetensors``; it was trained by

    python -m scalelong.metrics.fd_mnist            # ~2 min on one CPU thread, deterministic from --seed

on ``embedded_mnist('train')`` (4,000 digits) and is scored on ``embedded_mnist('test')`` (1,000).
Numbers are comparable only with the same asset: FD-MNIST is not FID.
"""

from __future__ import annotations

import argparse
import functools
import math
from pathlib import Path

import torch
from torch import nn

from scalelong.data import embedded_mnist, to_uint8
from scalelong.errors import ScaleLongError

ASSET = Path(__file__).parents[1] / "assets" / "fd_mnist.safetensors"
FEATURE_DIM = 128


class DigitNet(nn.Module):
    """Three conv blocks and a 128-wide hidden layer; ``features`` is that layer (post-ReLU)."""

    def __init__(self, width: int = 32, feature_dim: int = FEATURE_DIM, num_classes: int = 10):
        super().__init__()

        def block(c_in: int, c_out: int) -> list[nn.Module]:
            return [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]

        self.body = nn.Sequential(
            *block(1, width), *block(width, 2 * width), *block(2 * width, 2 * width), nn.Flatten()
        )  # (B, 1, 32, 32) -> (B, 2 * width * 16)
        self.hidden = nn.Sequential(nn.Linear(2 * width * 16, feature_dim), nn.ReLU())
        self.head = nn.Sequential(nn.Dropout(0.3), nn.Linear(feature_dim, num_classes))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 1, 32, 32) images in [-1, 1] -> (B, feature_dim)."""
        return self.hidden(self.body(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def load_classifier(path: Path = ASSET) -> DigitNet:
    """The shipped classifier in eval mode on the CPU."""
    from safetensors.torch import load_file

    if not path.is_file():
        raise ScaleLongError(
            f"FD-MNIST classifier not found at {path}; recreate it with: python -m scalelong.metrics.fd_mnist"
        )
    net = DigitNet()
    net.load_state_dict(load_file(path))
    return net.eval().requires_grad_(False)


@functools.lru_cache(maxsize=1)
def shipped_classifier() -> DigitNet:
    return load_classifier()


def _shift(x: torch.Tensor, gen: torch.Generator, max_shift: int = 2) -> torch.Tensor:
    """Random translation by up to ``max_shift`` pixels (pad with background, crop)."""
    n, _, h, w = x.shape
    padded = nn.functional.pad(x, (max_shift,) * 4, value=-1.0)
    dx, dy = torch.randint(0, 2 * max_shift + 1, (2, n), generator=gen)
    return torch.stack([padded[i, :, dy[i] : dy[i] + h, dx[i] : dx[i] + w] for i in range(n)])


@torch.no_grad()
def accuracy(net: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    net.eval()
    preds = torch.cat([net(chunk).argmax(1) for chunk in images.split(500)])
    return (preds == labels).float().mean().item()


def train_classifier(seed: int = 0, epochs: int = 15, batch_size: int = 64, lr: float = 2e-3) -> DigitNet:
    """Train :class:`DigitNet` on the 4,000 embedded training digits; deterministic from ``seed``."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    images, labels = embedded_mnist("train")
    net = DigitNet()
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    total = epochs * (len(images) // batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=total)
    for _ in range(epochs):
        net.train()
        perm = torch.randperm(len(images), generator=gen)
        for b in range(len(images) // batch_size):
            idx = perm[b * batch_size : (b + 1) * batch_size]
            loss = nn.functional.cross_entropy(net(_shift(images[idx], gen)), labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    return net.eval()


# ----------------------------------------------------------------------------- the digit score

CONFIDENT = 0.9  # a sample is a recognisable digit when the classifier gives one class p >= this


def digit_score(images: torch.Tensor, classifier: nn.Module | None = None, batch: int = 500) -> dict:
    """What the shipped classifier makes of a set of digit images: a readable companion to FD-MNIST.

    ``images``: (N, 1, 32, 32) in [-1, 1], scored as the 8-bit PNG pixels they would be saved as
    (as FD-MNIST scores them); ``classifier``: default the shipped one. Returns

    * ``confident``: the share of samples the classifier assigns to one class with p >= 0.9 (a
      recognisable digit; 0.96 for real held-out digits, 0 for noise);
    * ``histogram``: how many samples it assigns to each class 0..9 (its most probable class);
    * ``entropy``: the entropy of that histogram over log(10): 1.0 when every class is equally
      frequent, 0 when all samples are one class. Few samples read low: 256 uniformly drawn
      classes give about 0.99, 16 about 0.85;
    * ``n``: the number of samples.

    Compare with :func:`real_digit_score`, the same figures for real digits.
    """
    if images.ndim != 4 or tuple(images.shape[1:]) != (1, 32, 32) or len(images) == 0:
        raise ScaleLongError(
            f"the digit score needs digit images of shape (N, 1, 32, 32), got {tuple(images.shape)}"
        )
    if not torch.isfinite(images).all():
        raise ScaleLongError("the images hold NaN or infinite values; the digit score needs finite images")
    net = shipped_classifier() if classifier is None else classifier
    device = next(net.parameters()).device
    was_training = net.training
    net.eval()
    try:
        with torch.no_grad():
            pixels = to_uint8(images).float() / 127.5 - 1  # what a PNG of them holds, back in [-1, 1]
            probs = torch.cat([net(chunk.to(device)).softmax(1).cpu() for chunk in pixels.split(batch)])
    finally:
        net.train(was_training)
    return digit_score_of_probs(probs)


def digit_score_of_features(features: torch.Tensor, classifier: DigitNet | None = None) -> dict:
    """:func:`digit_score` from FD-MNIST features (the classifier's hidden layer, (N, 128)): its
    head gives the class probabilities, so the samples drawn for FD-MNIST are scored as they are."""
    net = shipped_classifier() if classifier is None else classifier
    head = net.head.eval()  # eval: its dropout passes the features through
    with torch.no_grad():
        weight = head[-1].weight
        logits = head(torch.as_tensor(features, dtype=weight.dtype).to(weight.device))
    return digit_score_of_probs(logits.softmax(1).cpu())


def digit_score_of_probs(probs: torch.Tensor) -> dict:
    """:func:`digit_score` from class probabilities (N, K). A set with non-finite probabilities
    (from non-finite samples) scores NaN, as its Fréchet distance does."""
    n, k = probs.shape
    if not torch.isfinite(probs).all():
        return {"confident": math.nan, "entropy": math.nan, "histogram": [0] * k, "n": n}
    top, label = probs.max(dim=1)
    histogram = torch.bincount(label, minlength=k)
    share = histogram[histogram > 0].double() / n
    entropy = float(-(share * share.log()).sum() / math.log(k))
    return {
        "confident": float((top >= CONFIDENT).double().mean()),
        "entropy": max(entropy, 0.0),  # -0.0 for a single class
        "histogram": histogram.tolist(),
        "n": n,
    }


@functools.lru_cache(maxsize=1)
def _real_digit_score() -> dict:
    return digit_score(embedded_mnist("test")[0])


def real_digit_score() -> dict:
    """The yardstick of :func:`digit_score`: the 1,000 held-out real digits (``embedded_mnist('test')``,
    the split the FD-MNIST reference leaves out): confident 0.96, entropy 1.00. Computed once per
    process (about a second)."""
    score = _real_digit_score()
    return {**score, "histogram": list(score["histogram"])}


def format_digit_score(score: dict, real: dict | None = None) -> str:
    """One line, e.g. ``confident 0.83 (real digits 0.96), class balance 0.97 (real digits 1.00)``."""
    real = real_digit_score() if real is None else real
    return (
        f"confident {score['confident']:.2f} (real digits {real['confident']:.2f}), "
        f"class balance {score['entropy']:.2f} (real digits {real['entropy']:.2f})"
    )


def main(argv: list[str] | None = None) -> None:
    """Train the classifier, report its held-out accuracy and write the asset."""
    from safetensors.torch import save_file

    p = argparse.ArgumentParser(description="Train the FD-MNIST feature classifier.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--out", type=Path, default=ASSET)
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # one thread: deterministic and polite on a shared machine
    torch.use_deterministic_algorithms(True)
    net = train_classifier(args.seed, args.epochs)
    acc = accuracy(net, *embedded_mnist("test"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in net.state_dict().items()}
    meta = {"test_accuracy": f"{acc:.4f}", "seed": str(args.seed), "epochs": str(args.epochs)}
    save_file(state, args.out, metadata=meta)
    args.out.chmod(0o644)  # a package asset, readable by all
    print(f"test accuracy {acc:.4f} on 1,000 held-out digits; wrote {args.out}")


if __name__ == "__main__":
    main()
