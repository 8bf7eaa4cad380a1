"""The paper's bounds, checked numerically (ScaleLong, Huang et al. 2023, Sec. 3).

* feature norm:  ||h_i||^2  ~  c1 ||x_t||^2 sum_{j >= i} kappa_j^2 + c2
* robustness:    ||f(x_t + delta) - f(x_t)|| <= ||delta|| (sum_i kappa_i M0^i + c0)

:func:`feature_bound_experiment` measures ||h_i||^2 at initialisation across depths and
methods, fits c1 and c2 by least squares and reports R^2, on the theorem's own network
(:class:`ReLUUNet`) or on a U-ViT. ``python -m scalelong.diagnostics.theory`` prints both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import scipy.stats
import torch
from torch import nn

from scalelong.models import UViT
from scalelong.skips import DEFAULT_KAPPA, SkipScaling, find_skip_scaling


def sum_squared_from(coefficients: Sequence[float]) -> list[float]:
    """sum_{j >= i} kappa_j^2 for every i (outermost first): the feature-norm factor of the bound."""
    out, acc = [], 0.0
    for c in reversed(coefficients):
        acc += c * c
        out.append(acc)
    return out[::-1]


def lipschitz_sum(coefficients: Sequence[float], m0: float) -> float:
    """sum_i kappa_i M0^i (i = 1 outermost): the skip part of the robustness bound."""
    return sum(k * m0**i for i, k in enumerate(coefficients, start=1))


def theory_sums(coefficients: Sequence[float], m0: float = 1.0) -> dict[str, object]:
    """Both factors of the bounds for one set of coefficients (outermost first)."""
    return {"sum_sq_from": sum_squared_from(coefficients), "lipschitz_sum": lipschitz_sum(coefficients, m0)}


@torch.no_grad()
def measured_coefficients(model: nn.Module, *inputs: object, **kwargs: object) -> list[float]:
    """Mean coefficient of every skip (outermost first) on one forward pass; works for LS too (NaN
    under skip-norm, which has no coefficient)."""
    scaling = find_skip_scaling(model)
    if scaling is None:
        raise ValueError("the model has no SkipScaling")
    seen: dict[int, float] = {}
    previous = scaling.probe

    def probe(index: int, skip: torch.Tensor, coef: torch.Tensor | float | None, out: torch.Tensor) -> None:
        if coef is None:  # skip-norm normalises the skip: no coefficient
            seen[index] = math.nan
        else:
            seen[index] = coef.float().mean().item() if isinstance(coef, torch.Tensor) else float(coef)

    scaling.probe = probe
    try:
        model(*inputs, **kwargs)
    finally:
        scaling.probe = previous
    return [seen[i] for i in range(1, scaling.num_skips + 1)]


class ReLUUNet(nn.Module):
    """The UNet of the theorem: N encoder blocks, a middle block, N decoder blocks, width n.

    Every block is ``phi(x) = W relu(x)`` with W of shape (n, n) drawn at Kaiming initialisation
    (N(0, 2 / n), no bias). The recursion, with skip i = 1 the outermost::

        s_0 = x_t                           (the input, a vector of width n)
        s_i = a_i(s_{i-1})                  encoder, i = 1 .. N
        h_{N+1} = m(s_N)                    middle block
        h_i = kappa_i s_i + b_{i+1}(h_{i+1})   decoder hidden feature at level i, i = N .. 1
        f(x_t) = b_1(h_1)

    (with b_{N+1} the identity, since h_{N+1} is already the middle block's output). The
    scaled skip is added to the decoder stream, the merge the paper's analysis uses; the skip
    passes through :class:`SkipScaling`, so every method and the diagnostics apply unchanged.

    Why ReLU before the weight: then every block's output is zero-mean given its input, so the
    skip and the decoder stream are nearly orthogonal at width n and, since a Kaiming block
    keeps E||phi(x)||^2 = ||x||^2 for symmetric x, ||h_i||^2 ~ ||x_t||^2 (sum_{j>=i} kappa_j^2 + 1):
    the bound's form with c1 = 1, c2 = ||x_t||^2 for a fixed input.
    """

    def __init__(
        self, width: int = 256, num_skips: int = 8, method: str = "none", kappa: float = DEFAULT_KAPPA["uvit"]
    ):
        super().__init__()
        self.width = width
        self.enc = nn.ModuleList(_relu_block(width) for _ in range(num_skips))
        self.mid = _relu_block(width)
        self.dec = nn.ModuleList(_relu_block(width) for _ in range(num_skips))  # dec[i - 1] is b_i
        self.skip_scaling = SkipScaling(method, num_skips, kappa)

    @property
    def num_skips(self) -> int:
        return len(self.enc)

    def diagnostic_blocks(self) -> dict[str, nn.Module]:
        """Named blocks in forward order (the interface :class:`~scalelong.diagnostics.Diagnostics` reads)."""
        blocks = {f"enc.{i}": b for i, b in enumerate(self.enc)}
        blocks["mid"] = self.mid
        blocks.update((f"dec.{i}", self.dec[i]) for i in reversed(range(self.num_skips)))
        return blocks

    def hidden(self, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """([h_1, ..., h_N], f(x)) for x of shape (B, n)."""
        skips = []
        for a in self.enc:
            x = a(x)
            skips.append(x)
        h = self.mid(x)
        hs: list[torch.Tensor] = []
        for i in range(self.num_skips, 0, -1):  # innermost first
            stream = h if i == self.num_skips else self.dec[i](h)
            h = self.skip_scaling(skips.pop(), i) + stream
            hs.append(h)
        return hs[::-1], self.dec[0](h)

    def forward(self, x: torch.Tensor, t: torch.Tensor | None = None) -> torch.Tensor:
        return self.hidden(x)[1]


def _relu_block(width: int) -> nn.Sequential:
    linear = nn.Linear(width, width, bias=False)
    nn.init.kaiming_normal_(linear.weight, nonlinearity="relu")  # N(0, 2 / fan_in)
    return nn.Sequential(nn.ReLU(), linear)


@torch.no_grad()
def uvit_decoder_features(
    model: nn.Module, x: torch.Tensor, t: torch.Tensor, **cond: torch.Tensor
) -> list[torch.Tensor]:
    """U-ViT decoder hidden features [h_1, ..., h_N]: h_i is the output of the out-block that
    merges skip i (out_blocks[N - i], since the out-blocks take the skips innermost first)."""
    outs: list[torch.Tensor] = []
    handles = [b.register_forward_hook(lambda m, a, o: outs.append(o)) for b in model.out_blocks]
    try:
        model(x, t, **cond)
    finally:
        for h in handles:
            h.remove()
    return outs[::-1]


@dataclass
class BoundFit:
    """Least-squares fit of y = c1 X + c2 with X = ||x_t||^2 sum_{j>=i} kappa_j^2, y = ||h_i||^2."""

    c1: float
    c2: float
    r2: float
    rows: list[dict[str, float | int | str]]


def fit_feature_bound(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, float]:
    """(c1, c2, R^2) of the ordinary least-squares line y = c1 x + c2 (R^2 is NaN for a constant y)."""
    fit = scipy.stats.linregress(x, y)
    r2 = fit.rvalue**2 if max(y) > min(y) else math.nan
    return float(fit.slope), float(fit.intercept), float(r2)


@torch.no_grad()
def feature_bound_experiment(
    kind: str = "relu",
    depths: Sequence[int] = (4, 8, 12, 16),
    methods: Sequence[str] = ("none", "sqrt2", "cs"),
    kappa: float = DEFAULT_KAPPA["uvit"],
    width: int = 256,
    batch: int = 32,
    repeats: int = 1,
    seed: int = 0,
) -> BoundFit:
    """Measure ||h_i||^2 at initialisation for every depth, method and level i; fit the bound.

    ``kind="relu"``: :class:`ReLUUNet` of ``width`` with ``depth`` skips, x_t ~ N(0, I).
    ``kind="uvit"``: U-ViT (8x8 images, patch 2, D = ``width``, 4 heads) of ``depth`` blocks
    besides the middle one (depth // 2 skips), x_t ~ N(0, I) and t uniform in [0, 999].
    Each (depth, repeat) shares one input and one initialisation across methods, so only the
    coefficients differ. y is the batch mean of ||h_i||^2, X the batch mean of ||x_t||^2 times
    sum_{j >= i} kappa_j^2, both averaged over ``repeats`` initialisations: a single finite-width
    draw drifts (each block's ReLU keeps 1/2 +- O(n^-1/2) of the energy, compounding with
    depth), and the bound is a statement about the typical network.
    """
    acc: dict[tuple[int, str, int], list[float]] = {}
    for depth in depths:
        for method in methods:
            for rep in range(repeats):
                key = seed * 1_000_000 + depth * 1000 + rep
                torch.manual_seed(key)  # same weights for every method of a (depth, repeat)
                g = torch.Generator().manual_seed(key)  # and the same input
                if kind == "relu":
                    x = torch.randn(batch, width, generator=g)
                    model = ReLUUNet(width, depth, method, kappa)
                    hs = model.hidden(x)[0]
                elif kind == "uvit":
                    x = torch.randn(batch, 3, 8, 8, generator=g)
                    t = torch.rand(batch, generator=g) * 999
                    model = UViT(8, 2, 3, width, depth, 4, skip_method=method, kappa=kappa)
                    hs = uvit_decoder_features(model, x, t)
                else:
                    raise ValueError(f"kind must be 'relu' or 'uvit', got {kind!r}")
                x_sq = x.flatten(1).square().sum(1).mean().item()
                sums = sum_squared_from(model.skip_scaling.coefficients())
                for i, (h, s) in enumerate(zip(hs, sums, strict=True), start=1):
                    h_sq = h.flatten(1).square().sum(1).mean().item()
                    acc.setdefault((depth, method, i), []).append((x_sq * s, h_sq))
    rows: list[dict[str, float | int | str]] = []
    for (depth, method, i), pairs in acc.items():
        xs, ys = zip(*pairs, strict=True)
        rows.append(
            {"depth": depth, "method": method, "i": i, "x": sum(xs) / len(xs), "h_sq": sum(ys) / len(ys)}
        )
    c1, c2, r2 = fit_feature_bound([r["x"] for r in rows], [r["h_sq"] for r in rows])
    return BoundFit(c1, c2, r2, rows)


def _summary(fit: BoundFit) -> str:
    by: dict[tuple[int, str], list[float]] = {}
    for r in fit.rows:
        by.setdefault((int(r["depth"]), str(r["method"])), []).append(float(r["h_sq"]))
    lines = [f"  fit: c1 = {fit.c1:.4g}, c2 = {fit.c2:.4g}, R^2 = {fit.r2:.4f} ({len(fit.rows)} points)"]
    lines += [f"  depth {d:>2} {m:<6} mean ||h_i||^2 = {sum(v) / len(v):.4g}" for (d, m), v in by.items()]
    return "\n".join(lines)


def main() -> None:
    """Print the feature-bound fit on the theorem's ReLU UNet and on a U-ViT, at initialisation."""
    relu = feature_bound_experiment("relu", width=512, repeats=4)
    print("ReLU UNet (width 512, Kaiming, 4 initialisations), skips N = depth:\n" + _summary(relu))
    uvit = feature_bound_experiment("uvit", depths=(8, 12, 16), width=64, repeats=2)
    print("U-ViT (D = 64, 8x8 images, patch 2), N = depth // 2 skips:\n" + _summary(uvit))


if __name__ == "__main__":
    main()
