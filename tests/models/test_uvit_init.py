"""model.uvit.skip_linear_init: the release's init starves a narrow U-ViT's inner blocks of
gradient; xavier does not, and the release's stays the default."""

import pytest
import torch

from scalelong.errors import ScaleLongError
from scalelong.models import UViT
from scalelong.training.build import build_model
from scalelong.training.config import load_config


def _block_grad_norms(init: str) -> dict[str, float]:
    torch.manual_seed(0)
    net = UViT(
        img_size=16, patch_size=4, in_channels=1, embed_dim=64, depth=12, num_heads=4, skip_linear_init=init
    )
    x = torch.randn(8, 1, 16, 16)
    (net(x, torch.rand(8) * 999) - x).square().mean().backward()

    def norm(module: torch.nn.Module) -> float:
        return torch.cat([p.grad.flatten() for p in module.parameters()]).norm().item()

    return {"mid": norm(net.mid_block), "last": norm(net.out_blocks[-1])}


def test_xavier_lets_the_gradient_reach_the_middle_of_a_narrow_uvit():
    release, xavier = _block_grad_norms("release"), _block_grad_norms("xavier")
    # Release init at width 64: six skip_linears shrink the gradient ~0.23x each on its way in.
    assert release["mid"] < 1e-3 * release["last"]
    assert xavier["mid"] > 1e-2 * xavier["last"]
    assert xavier["mid"] > 100 * release["mid"]


def test_release_init_is_the_default_and_the_choice_is_validated():
    cfg = load_config(None, ["model.type=uvit"])
    assert cfg.model.uvit.skip_linear_init == "release"
    torch.manual_seed(0)
    a = build_model(cfg.model)
    torch.manual_seed(0)
    b = UViT(**{**vars(cfg.model.uvit), "skip_linear_init": "release"})
    assert torch.equal(a.out_blocks[0].skip_linear.weight, b.out_blocks[0].skip_linear.weight)
    assert a.out_blocks[0].skip_linear.weight.std() < 0.03  # trunc_normal(0.02)
    with pytest.raises(ScaleLongError, match="skip_linear_init"):
        load_config(None, ["model.uvit.skip_linear_init=kaiming"])
