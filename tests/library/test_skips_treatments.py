"""The skip treatments beside the paper's five: skip-norm (a LayerNorm on each skip, U-ViT PR #31),
merge-norm (a LayerNorm after each skip_linear, Hunyuan-DiT) and cs-init (cs's coefficients moved
into the skip half of skip_linear at initialisation, the control for cs). Each goes through the
one SkipScaling and passes the contract every method has."""

import copy
import json

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_uvit_overrides
from scalelong.adapters import apply_scalelong, load_uvit_checkpoint
from scalelong.cli import main
from scalelong.diagnostics import Diagnostics
from scalelong.diffusion import VPSDE, training_loss
from scalelong.errors import ScaleLongError
from scalelong.models import UNet, UViT
from scalelong.skips import METHODS, PAPER_METHODS, SkipScaling, skip_coefficients, skip_table
from scalelong.studies.running import parse_methods
from scalelong.training.config import load_config

NEW = ("skip-norm", "merge-norm", "cs-init")
D, DEPTH, N = 32, 6, 3  # width, depth, long skips


def uvit(method: str = "none", kappa: float = 0.5, **kw) -> UViT:
    torch.manual_seed(0)
    return UViT(8, 2, 1, D, DEPTH, 2, skip_method=method, kappa=kappa, **kw)


def batch(n: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 1, 8, 8, generator=g), torch.rand(n, generator=g) * 999


def perturb(module: torch.nn.Module, seed: int = 2) -> None:
    """Move every parameter of ``module`` away from its init, so copies and round trips mean something."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))


def merge_inputs(model: UViT) -> tuple[dict, dict, dict]:
    """Hooks recording, per skip index i: the encoder output (what skip i is), the skip half of what
    its out-block's skip_linear concatenates, and skip_linear's output and what the block goes on with
    (norm1's input)."""
    encoder, merged, after = {}, {}, {}
    for i, blk in enumerate(model.in_blocks, start=1):
        blk.register_forward_hook(lambda m, a, out, i=i: encoder.__setitem__(i, out.detach().clone()))
    for j, blk in enumerate(model.out_blocks):
        i = model.num_skips - j  # out-block j merges skip N - j
        blk.skip_linear.register_forward_pre_hook(
            lambda m, a, i=i: merged.__setitem__(i, a[0][..., D:].detach().clone())
        )
        blk.skip_linear.register_forward_hook(
            lambda m, a, out, i=i: after.setdefault(i, {}).__setitem__("linear", out.detach().clone())
        )
        blk.norm1.register_forward_pre_hook(
            lambda m, a, i=i: after.setdefault(i, {}).__setitem__("block", a[0].detach().clone())
        )
    return encoder, merged, after


# ----------------------------------------------------------------------------- what each one computes


def test_skip_norm_merges_the_layer_norm_of_each_skip():
    model = uvit("skip-norm")
    perturb(model.skip_scaling)  # a trained affine map, different per skip
    encoder, merged, after = merge_inputs(model)
    model(*batch())
    for i in range(1, N + 1):
        norm = model.skip_scaling.norms[i - 1]
        expected = F.layer_norm(encoder[i], (D,), norm.weight, norm.bias)
        torch.testing.assert_close(merged[i], expected, rtol=0, atol=1e-6)
        assert torch.equal(after[i]["block"], after[i]["linear"])  # nothing after the merge
    assert model.skip_scaling.coefficients() == [None] * N
    with pytest.raises(ScaleLongError, match="^method 'skip-norm' normalises the skips .* no coefficients$"):
        skip_coefficients("skip-norm", N)


def test_merge_norm_merges_the_skip_as_it_is_and_normalises_skip_linear_s_output():
    model = uvit("merge-norm")
    perturb(model.skip_scaling)
    encoder, merged, after = merge_inputs(model)
    model(*batch())
    for i in range(1, N + 1):
        assert torch.equal(merged[i], encoder[i])  # coefficient 1: the skip itself
        norm = model.skip_scaling.norms[i - 1]
        expected = F.layer_norm(after[i]["linear"], (D,), norm.weight, norm.bias)
        torch.testing.assert_close(after[i]["block"], expected, rtol=0, atol=1e-6)
    assert model.skip_scaling.coefficients() == [1.0] * N == skip_coefficients("merge-norm", N)


@pytest.mark.parametrize("kappa", [0.5, 0.7])
@pytest.mark.parametrize("init", ["release", "xavier"])
def test_cs_init_is_the_skip_scale_init_option_bit_for_bit(kappa, init):
    method = uvit("cs-init", kappa, skip_linear_init=init)
    option = uvit("none", kappa, skip_linear_init=init, skip_linear_skip_scale_init="cs")
    a, b = method.state_dict(), option.state_dict()
    assert list(a) == list(b) == list(uvit("none").state_dict())  # the release's names, nothing added
    assert all(torch.equal(a[k], b[k]) for k in a)
    x, t = batch()
    assert torch.equal(method(x, t), option(x, t))
    # and it is the reparameterised model: skip i's half of skip_linear starts kappa^(i-1) smaller
    plain = uvit("none", kappa, skip_linear_init=init)
    for j, blk in enumerate(method.out_blocks):
        i = N - j
        expected = plain.out_blocks[j].skip_linear.weight[:, D:] * kappa ** (i - 1)
        assert torch.equal(blk.skip_linear.weight[:, D:], expected)
    assert method.skip_scaling.coefficients() == [1.0] * N
    assert method.skip_scaling.merge_weight_scales() == skip_coefficients("cs", N, kappa)
    with pytest.raises(ValueError, match="scaled twice"):
        uvit("cs-init", skip_linear_skip_scale_init="cs")


def test_a_conv_unet_s_skip_norm_is_a_group_norm_of_the_skip_before_the_concatenation():
    torch.manual_seed(0)
    kw = dict(img_size=8, in_channels=1, base_channels=16, channel_mult=(1, 2), num_res_blocks=1)
    model = UNet(**kw, attn_resolutions=(), norm_groups=8, skip_method="skip-norm")
    perturb(model.skip_scaling)
    skips, merged = [], {}
    model.conv_in.register_forward_hook(lambda m, a, out: skips.append(out.detach().clone()))
    for block in model.down:
        block.register_forward_hook(lambda m, a, out: skips.append(out.detach().clone()))
    model.skip_scaling.probe = lambda i, skip, coef, out: merged.__setitem__(i, (coef, out.detach().clone()))
    model(torch.randn(2, 1, 8, 8), torch.rand(2) * 999)
    assert sorted(merged) == list(range(1, model.num_skips + 1))
    for i, skip in enumerate(skips, start=1):
        norm = model.skip_scaling.norms[i - 1]
        assert norm.num_groups == 8 and norm.num_channels == skip.shape[1]
        coef, out = merged[i]
        assert coef is None
        torch.testing.assert_close(out, F.group_norm(skip, 8, norm.weight, norm.bias, eps=1e-6))
    assert "GroupNorm(8) on the skip" in skip_table(model)


# ----------------------------------------------------------------------------- the contract of every method


@pytest.mark.parametrize("method", PAPER_METHODS + ("cs-init",))
def test_methods_without_a_norm_add_no_state_and_leave_the_merge_alone(method):
    model = uvit(method)
    keys = list(model.state_dict())
    assert not any(k.startswith("skip_scaling.norms.") for k in keys)
    h = torch.randn(2, 5, D)
    assert model.skip_scaling.after_merge(h, 1) is h  # the very same tensor: none stays bit-identical
    if method == "none":
        assert keys == list(uvit("cs").state_dict())  # none, sqrt2, cs: no tensor of their own


def test_none_is_bit_identical_with_both_entry_points_bypassed():
    model = uvit("none")
    x, t = batch()
    out = model(x, t)
    model.skip_scaling.forward = lambda skip, index: skip
    model.skip_scaling.after_merge = lambda merged, index: merged
    assert torch.equal(out, model(x, t))


@pytest.mark.parametrize("method", ["skip-norm", "merge-norm"])
def test_the_norms_are_state_of_the_model_start_at_identity_and_train(method):
    model = uvit(method)
    extra = set(model.state_dict()) - set(uvit("none").state_dict())
    assert extra == {f"skip_scaling.norms.{k}.{p}" for k in range(N) for p in ("weight", "bias")}
    for norm in model.skip_scaling.norms:
        assert isinstance(norm, torch.nn.LayerNorm) and norm.normalized_shape == (D,)
        assert torch.equal(norm.weight, torch.ones(D)) and torch.equal(norm.bias, torch.zeros(D))
    model(*batch()).square().mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.skip_scaling.parameters())


@pytest.mark.parametrize("method", ["skip-norm", "merge-norm"])
def test_state_dict_round_trip_and_an_ema_copy_with_its_own_norms(method):
    model = uvit(method)
    perturb(model.skip_scaling)
    x, t = batch()
    before = model(x, t)
    fresh = uvit(method)
    fresh.load_state_dict(model.state_dict())  # strict
    assert torch.equal(fresh(x, t), before)
    ema = copy.deepcopy(model)
    assert torch.equal(ema(x, t), before)
    own = {p.data_ptr() for p in model.parameters()}
    assert not any(p.data_ptr() in own for p in ema.skip_scaling.parameters())
    perturb(ema.skip_scaling, seed=3)
    assert not torch.allclose(ema(x, t), before)
    assert torch.equal(model(x, t), before)  # the original kept its norms


@pytest.mark.parametrize("method", ["skip-norm", "merge-norm"])
def test_a_checkpoint_without_norms_loads_and_leaves_them_at_identity(method, tmp_path):
    released = uvit("none")
    perturb(released)
    torch.save(released.state_dict(), tmp_path / "nnet.pth")
    shape = dict(img_size=8, patch_size=2, in_channels=1, embed_dim=D, depth=DEPTH, num_heads=2)
    model = load_uvit_checkpoint(tmp_path / "nnet.pth", {**shape, "skip_method": method})
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in released.state_dict().items())
    for norm in model.skip_scaling.norms:
        assert torch.equal(norm.weight, torch.ones(D)) and torch.equal(norm.bias, torch.zeros(D))


def test_backbones_without_a_merge_layer_refuse_in_one_line():
    kw = dict(img_size=8, in_channels=1, base_channels=16, channel_mult=(1,), num_res_blocks=1)
    for method, advice in (("merge-norm", "skip-norm"), ("cs-init", "cs")):
        with pytest.raises(ScaleLongError, match=f"one linear layer of its own.*use {advice}$") as e:
            UNet(**kw, attn_resolutions=(), norm_groups=8, skip_method=method)
        assert "\n" not in str(e.value)
        with pytest.raises(ScaleLongError, match=f"^model.skip.method={method} needs one merge layer"):
            load_config("cifar10_unet_ddpm", [f"model.skip.method={method}"])
        with pytest.raises(ScaleLongError, match="needs a backbone that merges each skip"):
            SkipScaling(method, 3)  # no merge layer declared
    with pytest.raises(ScaleLongError, match="^method 'skip-norm' needs the skip layout"):
        SkipScaling("skip-norm", 3, num_tokens=20)
    for method in NEW:
        with pytest.raises(ScaleLongError, match=f"^model.skip.method={method} is built into the package's"):
            load_config(None, ["model.type=diffusers_unet2d", f"model.skip.method={method}"])


def test_apply_scalelong_refuses_them_before_touching_the_model():
    diffusers = pytest.importorskip("diffusers")
    unet = diffusers.UNet2DModel(
        sample_size=8, in_channels=1, out_channels=1, block_out_channels=(8, 16), layers_per_block=1,
        down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
        norm_num_groups=4,
    )  # fmt: skip
    keys = list(unet.state_dict())
    for method in NEW:
        with pytest.raises(
            ScaleLongError, match=r"^apply_scalelong supports the methods none, sqrt2, cs, ls, ls"
        ):
            apply_scalelong(unet, method)
        assert not hasattr(unet, "scalelong") and list(unet.state_dict()) == keys
        assert not any(m._forward_pre_hooks for m in unet.modules())


def test_the_names_reach_validation_the_table_and_the_study_commands():
    assert METHODS == PAPER_METHODS + NEW
    with pytest.raises(
        ScaleLongError,
        match="choose one of none, sqrt2, cs, ls, ls-nonshare, skip-norm, merge-norm, cs-init$",
    ):
        load_config(None, ["model.skip.method=layernorm"])
    assert parse_methods("none,skip-norm,merge-norm,cs-init,cs") == ["none", *NEW, "cs"]
    rows = {m: skip_table(uvit(m, 0.5)).splitlines()[3] for m in NEW}  # skip 2 of 3
    assert rows["skip-norm"].endswith("skip-norm: LayerNorm on the skip")
    assert rows["merge-norm"].endswith("  1, LayerNorm after the merge")
    assert rows["cs-init"].endswith("  1, merge weights x0.5 at init")


# ----------------------------------------------------------------------------- diagnostics and training


def diagnosed(method: str) -> dict:
    model = uvit(method)
    with Diagnostics(model, every=1) as diag:
        diag.arm(1)
        loss = training_loss(model, VPSDE(), batch(4)[0]).mean()
        loss.backward()
        return diag.collect(1, loss.item())


def test_the_diagnostics_see_the_merged_skip_and_no_coefficient_under_skip_norm():
    rec = diagnosed("skip-norm")
    for i in range(1, N + 1):
        assert not any(k.startswith(f"skip/{i}/coef_") for k in rec)
        # the merged skip is the LayerNorm's output: per token zero mean, unit variance over D
        assert rec[f"skip/{i}/norm_out"] == pytest.approx((17 * D) ** 0.5, rel=1e-2)  # 17 tokens
        assert rec[f"skip/{i}/norm_in"] > 0 and rec[f"skip/{i}/absmax_in"] > 0
    assert rec["nonfinite_values"] == 0
    for method in ("merge-norm", "cs-init"):
        rec = diagnosed(method)
        for i in range(1, N + 1):
            assert rec[f"skip/{i}/coef_mean"] == rec[f"skip/{i}/coef_min"] == rec[f"skip/{i}/coef_max"] == 1.0
            assert rec[f"skip/{i}/norm_out"] == rec[f"skip/{i}/norm_in"]


@pytest.mark.parametrize("method", NEW)
def test_scalelong_train_trains_each_at_toy_size_and_analyze_reads_it(method, tmp_path, capsys):
    overrides = tiny_uvit_overrides(method, tmp_path, steps=6, method=method)
    overrides += ["diagnostics.every=2", "train.log_every=2", "train.tensorboard=false", "train.device=cpu"]
    assert main(["train", "demo_uvit", *overrides]) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / method / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in records if "feature_norm" in r]
    assert [r["step"] for r in logged] == [2, 4, 6]
    assert all(isinstance(r["loss"], float) and r["nonfinite_values"] == 0 for r in logged)
    assert all(0 < r["feature_norm"] < 1e4 and 1 < r["fp16/headroom"] for r in logged)
    capsys.readouterr()
    assert main(["analyze", str(tmp_path / method)]) == 0
    out = capsys.readouterr().out
    assert "feature_norm.png" in out and "coefficients_" not in out and "fp16 headroom" not in out
