"""model.uvit.skip_linear_skip_scale_init=cs: cs's scaling moved from the skip into the skip half of
each out-block's skip_linear weight, a control for cs under method none."""

import pytest
import torch

from scalelong.errors import ScaleLongError
from scalelong.models import UViT
from scalelong.models import uvit as uvit_module
from scalelong.training import config as config_module
from scalelong.training.build import build_model
from scalelong.training.config import load_config

D, DEPTH = 32, 6  # 3 skips
SHAPE = dict(img_size=8, patch_size=2, in_channels=1, embed_dim=D, depth=DEPTH, num_heads=2)


def uvit(kappa: float = 0.5, **kwargs) -> UViT:
    torch.manual_seed(0)
    return UViT(**SHAPE, kappa=kappa, **kwargs)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 1, 8, 8, generator=g), torch.rand(4, generator=g) * 999


@pytest.mark.parametrize("init", ["release", "xavier"])
def test_the_skip_half_of_skip_i_starts_kappa_to_the_i_minus_1_smaller(init):
    plain = uvit(0.7, skip_linear_init=init)
    scaled = uvit(0.7, skip_linear_init=init, skip_linear_skip_scale_init="cs")
    for j in range(DEPTH // 2):
        index = DEPTH // 2 - j  # out_blocks[0] merges the innermost skip (3), out_blocks[2] skip 1
        w0, w1 = plain.out_blocks[j].skip_linear.weight, scaled.out_blocks[j].skip_linear.weight
        assert torch.equal(w1[:, :D], w0[:, :D])  # the x half: as without the option
        torch.testing.assert_close(w1[:, D:], w0[:, D:] * 0.7 ** (index - 1), rtol=0, atol=0)
    assert not torch.equal(plain.out_blocks[0].skip_linear.weight, scaled.out_blocks[0].skip_linear.weight)
    # nothing else moves, and the names and shapes are the release's
    a, b = plain.state_dict(), scaled.state_dict()
    assert list(a) == list(b) and all(a[k].shape == b[k].shape for k in a)
    assert all(
        torch.equal(a[k], b[k]) for k in a if not (k.startswith("out_blocks.") and "skip_linear.weight" in k)
    )
    UViT(**SHAPE).load_state_dict(b)  # strict: loads into a model without the option


@pytest.mark.parametrize("kappa", [0.5, 0.7])
def test_at_init_the_forward_is_cs_forward(kappa):
    x, t = batch()
    with torch.no_grad():
        cs = uvit(kappa, skip_method="cs")(x, t)
        moved = uvit(kappa, skip_linear_skip_scale_init="cs")(x, t)
        plain = uvit(kappa)(x, t)
    assert (cs - plain).abs().max() > 1e-3  # cs does change the output
    if kappa == 0.5:  # powers of two scale exactly: W (c s) and (c W) s are the same floats
        assert torch.equal(moved, cs)
    else:  # otherwise they differ by rounding only
        torch.testing.assert_close(moved, cs, rtol=1e-6, atol=1e-7)


def test_under_adamw_cs_moves_the_skip_path_kappa_times_more_slowly():
    """What the option does not reproduce: cs's gradient on the skip half is c times smaller,
    which Adam normalises away, so both move the weights by the same amount and cs's effective
    weight (c W) moves c times less."""
    lr = 1e-3

    def first_update(**kwargs) -> list[torch.Tensor]:
        net = uvit(0.5, **kwargs)
        before = [b.skip_linear.weight.detach().clone() for b in net.out_blocks]
        opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0)
        x, t = batch()
        (net(x, t) - x).square().mean().backward()
        opt.step()
        return [b.skip_linear.weight.detach() - w for b, w in zip(net.out_blocks, before, strict=True)]

    cs, moved = first_update(skip_method="cs"), first_update(skip_linear_skip_scale_init="cs")
    for j in range(DEPTH // 2):
        c = 0.5 ** (DEPTH // 2 - j - 1)
        assert cs[j][:, D:].abs().max().item() == pytest.approx(lr, rel=1e-3)  # Adam's first step: ~lr * sign
        torch.testing.assert_close(cs[j][:, D:], moved[j][:, D:], rtol=0, atol=0.05 * lr)
        effective_cs, effective_moved = c * cs[j][:, D:], moved[j][:, D:]
        assert effective_cs.abs().mean().item() == pytest.approx(
            c * effective_moved.abs().mean().item(), rel=0.05
        )


def test_the_option_is_validated_and_off_by_default():
    assert config_module.SKIP_SCALE_INITS == uvit_module.SKIP_SCALE_INITS
    cfg = load_config(None, ["model.type=uvit"])
    assert cfg.model.uvit.skip_linear_skip_scale_init == "none"
    with pytest.raises(ScaleLongError, match=r"skip_linear_skip_scale_init=.*choose one of none, cs"):
        load_config(None, ["model.uvit.skip_linear_skip_scale_init=kappa"])
    with pytest.raises(ScaleLongError, match="model.skip.method=cs the skips would be scaled twice"):
        load_config(None, ["model.skip.method=cs", "model.uvit.skip_linear_skip_scale_init=cs"])
    with pytest.raises(ValueError, match="scaled twice"):
        uvit(skip_method="sqrt2", skip_linear_skip_scale_init="cs")


def test_the_config_option_reaches_the_model_with_the_configs_kappa():
    overrides = [f"model.uvit.{k}={v}" for k, v in SHAPE.items()]
    overrides += [
        "model.skip.method=none",
        "model.skip.kappa=0.25",
        "model.uvit.skip_linear_skip_scale_init=cs",
    ]
    cfg = load_config(None, overrides)
    torch.manual_seed(0)
    built = build_model(cfg.model)
    plain = uvit(0.25)
    outer = built.out_blocks[-1].skip_linear.weight, plain.out_blocks[-1].skip_linear.weight  # skip 1
    inner = built.out_blocks[0].skip_linear.weight, plain.out_blocks[0].skip_linear.weight  # skip 3
    assert torch.equal(outer[0], outer[1])
    torch.testing.assert_close(inner[0][:, D:], inner[1][:, D:] * 0.25**2, rtol=0, atol=0)
