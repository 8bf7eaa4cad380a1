"""The one apply_scalelong: dispatch by type, the declared-skips route and its errors, token counts
and LS sizes per backbone, and the warning on pretrained weights."""

import warnings

import pytest
import torch
from torch import nn

from adapter_fixtures import TinyUNet, declare_tiny, run_tiny, tiny_unet
from scalelong.adapters import (
    PretrainedWeightsWarning,
    SkipInput,
    apply_scalelong,
    is_applied,
    remove_scalelong,
)
from scalelong.errors import ScaleLongError
from scalelong.models import UViT


def pretrained_warnings(fn) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [w for w in caught if issubclass(w.category, PretrainedWeightsWarning)]


# ----------------------------------------------------------------------------- dispatch


def test_an_unknown_type_names_the_supported_ones_and_the_declared_route():
    with pytest.raises(ScaleLongError) as info:
        apply_scalelong(nn.Linear(2, 2), "cs")
    message = str(info.value)
    for name in (
        "UNet2DModel",
        "UTransformer2DModel",
        "UniDiffuserModel",
        "denoising_diffusion_pytorch Unet",
    ):
        assert name in message
    assert "skips=[SkipInput(" in message and "\n" not in message


def test_a_wrapper_is_pointed_at_the_model_it_holds():
    ddpm = pytest.importorskip("denoising_diffusion_pytorch")
    unet = ddpm.Unet(dim=8, dim_mults=(1, 2), channels=1, attn_dim_head=4, attn_heads=1)
    diffusion = ddpm.GaussianDiffusion(unet, image_size=8, timesteps=10)
    with pytest.raises(ScaleLongError, match=r"holds a Unet at 'model'"):
        apply_scalelong(diffusion, "cs")
    apply_scalelong(diffusion.model, "cs")  # the way round it suggests
    assert is_applied(diffusion) and is_applied(unet)


def test_subclasses_are_served_and_the_package_backbones_refused():
    ddpm = pytest.importorskip("denoising_diffusion_pytorch")

    class MyUnet(ddpm.Unet):
        pass

    model = MyUnet(dim=8, dim_mults=(1, 2), channels=1, attn_dim_head=4, attn_heads=1)
    apply_scalelong(model, "cs")
    assert model.scalelong.num_skips == 5
    uvit = UViT(img_size=8, patch_size=4, in_channels=1, embed_dim=16, depth=2, num_heads=2)
    with pytest.raises(ScaleLongError, match="already holds a SkipScaling"):
        apply_scalelong(uvit, "cs")


def test_shape_keywords_belong_to_declared_skips():
    ddpm = pytest.importorskip("denoising_diffusion_pytorch")
    unet = ddpm.Unet(dim=8, dim_mults=(1, 2), channels=1, attn_dim_head=4, attn_heads=1)
    with pytest.raises(ScaleLongError, match="pass them with skips="):
        apply_scalelong(unet, "ls", skip_channels=[8] * 5)
    with pytest.raises(ScaleLongError, match="pretrained must be"):
        apply_scalelong(unet, "cs", pretrained="yes")
    assert not is_applied(unet)


def test_remove_and_is_applied_without_scalelong():
    with pytest.raises(ScaleLongError, match="not applied"):
        remove_scalelong(tiny_unet())
    assert not is_applied(tiny_unet())


# ----------------------------------------------------------------------------- declared skips


def test_declared_skip_by_keyword_and_by_channel_slice_scale_only_the_skip():
    net = tiny_unet()
    seen = {}
    # what the parent hands dec0 (registered first, so it runs before the ScaleLong hook) and
    # what dec0 finally computes with (registered after)
    net.dec0.register_forward_pre_hook(lambda _m, args: seen.__setitem__("given", args[0]))
    apply_scalelong(net, "cs", 0.5, **declare_tiny(net))
    net.dec0.register_forward_pre_hook(lambda _m, args: seen.__setitem__("used", args[0]))
    run_tiny(net)
    given, used = seen["given"], seen["used"]
    assert torch.equal(used[:, :4], given[:, :4])  # the decoder stream: untouched
    assert torch.equal(used[:, 4:], given[:, 4:] * 1.0)  # skip 1: kappa ** 0
    # skip 2 (passed as skip=...) is scaled by 0.5 inside dec1
    inputs = {}
    net.dec1.conv.register_forward_pre_hook(lambda _m, args: inputs.__setitem__("cat", args[0]))
    s2 = net.enc1(net.enc0(torch.randn(1, 1, 8, 8)))
    net.dec1(net.mid(s2), skip=s2)
    assert torch.equal(inputs["cat"][:, 8:], s2 * 0.5)


def test_declared_arg_by_name_when_called_positionally_equals_the_uvit_adapter():
    pytest.importorskip("diffusers")
    from adapter_fixtures import run_utransformer, utransformer

    adapted = utransformer()
    apply_scalelong(adapted, "ls-nonshare", reduction=4)
    by_hand = utransformer()
    outs = by_hand.transformer_out_blocks
    skips = [SkipInput(outs[2 - k]["skip"], arg="skip") for k in range(3)]  # outermost first
    apply_scalelong(by_hand, "ls-nonshare", skips=skips, num_tokens=16, reduction=4)
    by_hand.scalelong.load_state_dict(adapted.scalelong.state_dict())
    assert torch.equal(run_utransformer(by_hand), run_utransformer(adapted))


def test_declared_skips_take_the_u_vit_kappa_on_tokens_and_the_unet_kappa_on_maps():
    net = tiny_unet()
    apply_scalelong(net, "cs", **declare_tiny(net))
    assert net.scalelong.kappa == 0.9
    net = tiny_unet()
    apply_scalelong(net, "cs", skips=declare_tiny(net)["skips"], num_tokens=16)
    assert net.scalelong.kappa == 0.5


@pytest.mark.parametrize(
    ("skips", "kwargs", "message"),
    [
        (lambda n: [], {}, "declares no skip input"),
        (lambda n: [SkipInput(nn.Conv2d(1, 1, 1))], {}, "must be a submodule of the model"),
        (lambda n: [SkipInput(n.dec1, arg="skp")], {}, "has no input named 'skp'"),
        (lambda n: [SkipInput(n.dec0, arg=3)], {}, "arg=3 is not one of them"),
        (lambda n: [SkipInput(n.dec0, arg=1.0)], {}, "must be a position"),
        (lambda n: [SkipInput(n.dec0, channels=slice(0, 8, 2))], {}, "contiguous slice"),
        (lambda n: [SkipInput(n.dec0, channels=(4, 8))], {}, "contiguous slice"),
        (lambda n: [SkipInput(n.dec1, "skip"), SkipInput(n.dec1, "skip")], {}, "same input as an earlier"),
        (lambda n: [SkipInput(n.dec1, "skip")], {"method": "ls"}, "needs the skip layout"),
        (lambda n: [SkipInput(n.dec1, "skip")], {"num_tokens": 16, "skip_channels": [8]}, "not both"),
        (lambda n: [SkipInput(n.dec1, "skip")], {"skip_channels": [8, 4]}, "give one per skip"),
    ],
)
def test_declaration_mistakes_are_refused_before_anything_changes(skips, kwargs, message):
    net = tiny_unet()
    kwargs = {"method": "cs", **kwargs}
    with pytest.raises(ScaleLongError, match=message) as info:
        apply_scalelong(net, skips=skips(net), **kwargs)
    assert "\n" not in str(info.value)
    assert not is_applied(net) and not hasattr(net, "scalelong")


def test_a_call_without_the_declared_input_is_a_clear_error():
    net = tiny_unet()
    apply_scalelong(net, "cs", skips=[SkipInput(net.dec0, arg=0, channels=slice(100, None))])
    with pytest.raises(ScaleLongError, match="select nothing"):
        run_tiny(net)
    net = TinyUNet()
    apply_scalelong(net, "cs", skips=[SkipInput(net.dec1, arg="skip")])
    with pytest.raises(ScaleLongError, match="called without its input skip"):
        net.dec1(torch.randn(1, 8, 4, 4))


def test_declared_model_moves_with_to():
    net = tiny_unet()
    apply_scalelong(net, "ls-nonshare", reduction=4, **declare_tiny(net))
    net.to(torch.float64)
    assert all(p.dtype == torch.float64 for p in net.scalelong.parameters())
    assert net(torch.randn(1, 1, 8, 8, dtype=torch.float64)).dtype == torch.float64


# ----------------------------------------------------------------------------- sizes per backbone


@pytest.mark.parametrize(("data_type", "tokens"), [(True, 23), (False, 22)])
def test_unidiffuser_token_count_counts_every_token_of_its_sequence(data_type, tokens):
    pytest.importorskip("diffusers")
    from adapter_fixtures import run_unidiffuser, unidiffuser

    model = unidiffuser(data_type)
    apply_scalelong(model, "ls", reduction=4)
    assert model.scalelong.gates[0].num_tokens == tokens
    run_unidiffuser(model)  # the gate raises on any other count
    # the inner transformer is already served through its holder
    assert is_applied(model.transformer)
    with pytest.raises(ScaleLongError, match="already applied"):
        apply_scalelong(model.transformer, "cs")
    with pytest.raises(ScaleLongError, match="holds this one"):
        remove_scalelong(model.transformer)
    remove_scalelong(model)
    assert not is_applied(model.transformer)


@pytest.mark.parametrize(
    ("case", "method", "count"),
    [
        # TokenGate(L, r=4): L*h + h + h*L + L, h = L // 4; L = 16 patches, 3 skips
        ("UTransformer2DModel", "ls", 148),
        ("UTransformer2DModel", "ls-nonshare", 3 * 148),
        # ChannelGate(c, r=4) per skip of widths 4, 4, 4, 8, 8, 16, 16: 13, 42, 148 each
        ("ddpm-Unet", "ls-nonshare", 3 * 13 + 2 * 42 + 2 * 148),
        # SharedChannelGate: core 4*16+16+16+1 = 97, adapters 4 + 8 + 16
        ("ddpm-Unet", "ls", 97 + 28),
    ],
)
def test_ls_parameter_counts(case, method, count):
    from adapter_fixtures import CASES, NEEDS

    pytest.importorskip(NEEDS[case])
    model = CASES[case].build()
    base = sum(p.numel() for p in model.parameters())
    apply_scalelong(model, method, reduction=4)
    assert sum(p.numel() for p in model.scalelong.parameters()) == count
    assert sum(p.numel() for p in model.parameters()) == base + count


def test_a_ddpm_unet_layout_that_does_not_add_up_is_refused():
    ddpm = pytest.importorskip("denoising_diffusion_pytorch")
    unet = ddpm.Unet(dim=8, dim_mults=(1, 2), channels=1, attn_dim_head=4, attn_heads=1)
    # a final block that merges 4 channels where the encoder's first skip has 8
    unet.final_res_block = ddpm.denoising_diffusion_pytorch.ResnetBlock(8 + 4, 8, time_emb_dim=32)
    with pytest.raises(ScaleLongError, match="decoder merges"):
        apply_scalelong(unet, "cs")


# ----------------------------------------------------------------------------- pretrained weights


def _pretrained_models(tmp_path):
    diffusers = pytest.importorskip("diffusers")
    from adapter_fixtures import run_utransformer, utransformer

    fresh = utransformer()
    fresh.save_pretrained(tmp_path / "uvit")
    unet = diffusers.UNet2DModel(
        sample_size=8,
        in_channels=1,
        out_channels=1,
        block_out_channels=(8, 16),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"),
        norm_num_groups=4,
    )
    unet.save_pretrained(tmp_path / "unet")
    return {  # (load, run)
        "uvit": (lambda: type(fresh).from_pretrained(tmp_path / "uvit"), run_utransformer),
        "unet": (
            lambda: diffusers.UNet2DModel.from_pretrained(tmp_path / "unet"),
            lambda m: m(torch.randn(1, 1, 8, 8), 3).sample,
        ),
        "fresh": (utransformer, run_utransformer),
    }


@pytest.mark.parametrize("kind", ["uvit", "unet"])
@pytest.mark.parametrize(("method", "kappa"), [("cs", 0.5), ("sqrt2", None), ("ls", None)])
def test_pretrained_diffusers_models_warn_once(tmp_path, kind, method, kappa):
    load, run = _pretrained_models(tmp_path)[kind]
    model = load()
    caught = pretrained_warnings(lambda: apply_scalelong(model, method, kappa, reduction=4))
    assert len(caught) == 1
    text = str(caught[0].message)
    assert "from-scratch" in text and "pretrained=False" in text and str(tmp_path) in text
    assert caught[0].filename == __file__  # points at the user's call
    assert pretrained_warnings(lambda: run(model)) == []  # once: not again on every forward


def test_no_warning_when_the_function_is_unchanged_fresh_or_silenced(tmp_path):
    load = {kind: load for kind, (load, _) in _pretrained_models(tmp_path).items()}
    assert pretrained_warnings(lambda: apply_scalelong(load["uvit"](), "none")) == []
    assert pretrained_warnings(lambda: apply_scalelong(load["uvit"](), "cs", 1.0)) == []
    assert pretrained_warnings(lambda: apply_scalelong(load["fresh"](), "cs")) == []
    assert pretrained_warnings(lambda: apply_scalelong(load["unet"](), "cs", pretrained=False)) == []
    assert pretrained_warnings(lambda: apply_scalelong(load["uvit"](), "ls", pretrained=False)) == []


def test_other_models_warn_when_told_they_are_pretrained():
    ddpm = pytest.importorskip("denoising_diffusion_pytorch")

    def unet():
        return ddpm.Unet(dim=8, dim_mults=(1, 2), channels=1, attn_dim_head=4, attn_heads=1)

    assert pretrained_warnings(lambda: apply_scalelong(unet(), "cs")) == []
    caught = pretrained_warnings(lambda: apply_scalelong(unet(), "cs", pretrained=True))
    assert len(caught) == 1 and "loaded from" not in str(caught[0].message)
    net = tiny_unet()
    caught = pretrained_warnings(lambda: apply_scalelong(net, "cs", pretrained=True, **declare_tiny(net)))
    assert len(caught) == 1
