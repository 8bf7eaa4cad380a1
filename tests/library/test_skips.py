import math

import pytest
import torch

from scalelong.errors import ScaleLongError
from scalelong.models import UViT
from scalelong.skips import SkipScaling, TokenGate, find_skip_scaling, skip_coefficients


def test_cs_coefficients_outermost_first():
    assert skip_coefficients("cs", 6, 0.5) == [1, 1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32]
    # the decoder meets them innermost first: 1/32 ... 1
    assert skip_coefficients("cs", 6, 0.5)[::-1] == [1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1]


def test_sqrt2_and_none_coefficients():
    assert skip_coefficients("sqrt2", 4) == pytest.approx([2**-0.5] * 4)
    assert skip_coefficients("none", 3) == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"method": "foo", "num_skips": 3}, "none, sqrt2, cs, ls, ls-nonshare"),
        ({"method": "cs", "num_skips": 3, "kappa": 1.5}, "(0, 1]"),
        ({"method": "cs", "num_skips": 3, "kappa": 0.0}, "(0, 1]"),
        ({"method": "cs", "num_skips": 0}, ">= 1"),
        ({"method": "ls", "num_skips": 3}, "num_tokens"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, words):
    with pytest.raises(
        ScaleLongError, match=".*" + words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        SkipScaling(**kwargs)
    assert issubclass(ScaleLongError, ValueError)


def test_token_gate_rejects_other_token_count():
    gate = TokenGate(num_tokens=40)
    with pytest.raises(ScaleLongError, match="40 tokens"):
        gate(torch.randn(2, 41, 8))


def test_ls_coefficients_shape_range_and_init():
    gate = TokenGate(num_tokens=257)
    coef = gate(torch.randn(4, 257, 64))
    assert coef.shape == (4, 257, 1)
    assert ((coef > 0) & (coef < 1)).all()
    # default init: sigmoid of a small pre-activation, so coefficients start near 0.5
    assert 0.35 < coef.min().item() and coef.max().item() < 0.65


def meta_uvit(**kw) -> UViT:
    """Shapes without weights: parameter counts need nothing more."""
    with torch.device("meta"):
        return UViT(**kw)


def test_parameter_counts_of_cifar10_uvit_s2():
    def count(method):
        return sum(p.numel() for p in meta_uvit(skip_method=method).parameters())

    base = count("none")
    assert base == 44_255_328
    assert count("ls") - base == 8_497
    assert count("ls-nonshare") - base == 50_982


def test_recipe_parameter_counts_of_other_datasets():
    def count(**kw):
        return sum(p.numel() for p in meta_uvit(**kw).parameters())

    assert count(img_size=64, patch_size=4) == 44_292_228  # CelebA 64, U-ViT-S/4
    imagenet = dict(img_size=64, patch_size=4, embed_dim=768, depth=16, num_heads=12, num_classes=1000)
    assert count(**imagenet) == 130_940_292  # ImageNet 64, U-ViT-M/4


def tiny_uvit(method, **kw):
    torch.manual_seed(0)
    return UViT(
        img_size=16, patch_size=2, in_channels=1, embed_dim=32, depth=6, num_heads=2, skip_method=method, **kw
    )


def test_none_is_bit_identical_to_bypassed_scaling():
    model = tiny_uvit("none")
    x, t = torch.randn(3, 1, 16, 16), torch.rand(3) * 999
    out = model(x, t)
    model.skip_scaling.forward = lambda skip, index: skip  # bypass the module entirely
    assert torch.equal(out, model(x, t))


def test_cs_merges_exactly_kappa_pow_i_minus_1_times_the_encoder_output():
    kappa = 0.7
    model = tiny_uvit("cs", kappa=kappa)
    encoder_out, merged = {}, {}
    for i, blk in enumerate(model.in_blocks, start=1):
        blk.register_forward_hook(lambda m, a, out, i=i: encoder_out.__setitem__(i, out.detach().clone()))
    for j, blk in enumerate(model.out_blocks):
        # out-block j (0-based) merges skip N - j; record what its skip_linear concatenates
        i = model.num_skips - j
        blk.skip_linear.register_forward_pre_hook(
            lambda m, a, i=i: merged.__setitem__(i, a[0][..., a[0].shape[-1] // 2 :].detach().clone())
        )
    model(torch.randn(2, 1, 16, 16), torch.rand(2) * 999)
    assert sorted(merged) == list(range(1, model.num_skips + 1))
    for i in merged:
        expected = encoder_out[i] * kappa ** (i - 1)
        assert torch.equal(merged[i], expected), i


def test_gradients_reach_ls_parameters():
    for method in ("ls", "ls-nonshare"):
        model = tiny_uvit(method)
        model(torch.randn(2, 1, 16, 16), torch.rand(2) * 999).square().mean().backward()
        grads = [p.grad for p in model.skip_scaling.parameters()]
        assert len(grads) == (4 if method == "ls" else 4 * model.num_skips)
        assert all(g is not None and g.abs().sum() > 0 for g in grads)


def test_index_convention_reaches_the_probe():
    model = tiny_uvit("cs", kappa=0.5)
    seen = []
    model.skip_scaling.probe = lambda index, skip, coef, out: seen.append((index, coef))
    model(torch.randn(1, 1, 16, 16), torch.rand(1) * 999)
    assert seen == [(3, 0.25), (2, 0.5), (1, 1.0)]
    assert math.isclose(model.skip_scaling.coefficients()[2], 0.25)


def test_find_skip_scaling_sees_through_wrappers():
    model = tiny_uvit("cs")
    for wrapped in (model, torch.compile(model), torch.nn.DataParallel(model)):
        assert find_skip_scaling(wrapped) is model.skip_scaling
    assert find_skip_scaling(torch.nn.Linear(2, 2)) is None
    two = torch.nn.ModuleList([model, tiny_uvit("none")])
    with pytest.raises(ScaleLongError, match="2 SkipScaling modules"):
        find_skip_scaling(two)
