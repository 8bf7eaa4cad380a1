"""model.uvit.mlp_conv: a depthwise 3x3 convolution over the patch grid in every block's MLP.

It must reach exactly the 3x3 neighbourhood of a patch token, leave the conditioning tokens
alone, and change nothing (keys, counts, outputs) when it is off, as in the release."""

import pytest
import torch

from scalelong.errors import ScaleLongError
from scalelong.models import UViT
from scalelong.models.uvit import Mlp
from scalelong.training.build import build_model
from scalelong.training.config import load_config


def _changed_tokens(mlp: Mlp, token: int, extras: int = 2, grid: int = 4) -> set[int]:
    torch.manual_seed(0)
    x = torch.randn(1, extras + grid * grid, 8)
    y = x.clone()
    y[0, token] += 1.0
    diff = (mlp(y) - mlp(x)).abs().amax(-1)[0]
    return {i for i in range(diff.numel()) if diff[i] > 1e-6}


def test_the_convolution_reaches_the_3x3_neighbourhood_and_no_further():
    torch.manual_seed(0)
    extras, grid = 2, 4
    plain, conv = Mlp(8, 32), Mlp(8, 32, grid=grid)
    # Patch (row 1, col 1) is token 2 + 1 * 4 + 1 = 7; its neighbours are rows 0-2, cols 0-2.
    neighbours = {extras + r * grid + c for r in range(3) for c in range(3)}
    assert _changed_tokens(conv, 7) == neighbours
    assert _changed_tokens(plain, 7) == {7}  # the release's MLP acts on each token alone
    # A corner patch reaches its 4-neighbourhood only (zero padding, no wrap-around).
    corner = extras + grid * grid - 1
    assert _changed_tokens(conv, corner) == {corner, corner - 1, corner - grid, corner - grid - 1}
    # A conditioning token (time, label) is not part of the grid: it changes only itself.
    assert _changed_tokens(conv, 0) == {0}


def test_off_by_default_with_the_release_layout_and_exact_extra_parameters():
    cfg = load_config(None, ["model.type=uvit"])
    assert cfg.model.uvit.mlp_conv is False
    kw = dict(img_size=16, patch_size=4, in_channels=1, embed_dim=32, depth=4, num_heads=2)
    plain, conv = UViT(**kw), UViT(**kw, mlp_conv=True)
    assert not any("dwconv" in k for k in plain.state_dict())
    blocks, hidden = 4 + 1, 4 * 32
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(conv) - count(plain) == blocks * (9 * hidden + hidden)
    # The convolutions are the only new parameters; every release key is still there.
    shared = {k: v for k, v in conv.state_dict().items() if "dwconv" not in k}
    assert set(shared) == set(plain.state_dict())


def test_config_key_builds_the_convolution_and_is_validated():
    sizes = dict(img_size=16, patch_size=4, embed_dim=32, depth=4, num_heads=2, in_channels=1)
    sizes["mlp_conv"] = "true"
    cfg = load_config(None, ["model.type=uvit", *[f"model.uvit.{k}={v}" for k, v in sizes.items()]])
    net = build_model(cfg.model)
    assert net.mid_block.mlp.dwconv.weight.shape == (128, 1, 3, 3)
    out = net(torch.randn(2, 1, 16, 16), torch.rand(2) * 999)
    assert out.shape == (2, 1, 16, 16) and torch.isfinite(out).all()
    with pytest.raises(ScaleLongError, match="mlp_conv"):
        load_config(None, ["model.uvit.mlp_conv=sometimes"])
