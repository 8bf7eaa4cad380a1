"""save_scalelong / load_scalelong / describe on the package's own backbones (built with a method),
and the mistakes every model meets alike. The third-party backbones: test_adapters_backbones.py."""

import json
from unittest import mock

import pytest
import torch

from adapter_fixtures import declare_tiny, tiny_unet
from scalelong import UNet, UViT, apply_scalelong, describe, load_scalelong, save_scalelong
from scalelong.errors import ScaleLongError
from scalelong.skips import MERGE_LAYER_METHODS, METHODS, skip_table


def uvit(method: str, kappa: float = 0.5) -> UViT:
    torch.manual_seed(0)
    return UViT(
        img_size=8,
        patch_size=2,
        in_channels=1,
        embed_dim=32,
        depth=4,
        num_heads=2,
        skip_method=method,
        kappa=kappa,
    ).eval()


def unet(method: str, kappa: float = 0.9) -> UNet:
    torch.manual_seed(0)
    return UNet(
        img_size=8,
        in_channels=1,
        base_channels=8,
        channel_mult=(1, 2),
        num_res_blocks=1,
        attn_resolutions=(),
        norm_groups=4,
        skip_method=method,
        kappa=kappa,
    ).eval()


BACKBONES = {"UViT": (uvit, [(17, 32)] * 2), "UNet": (unet, [(8, 8, 8), (8, 8, 8), (8, 4, 4), (16, 4, 4)])}


def run(model) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return model(torch.randn(2, 1, 8, 8, generator=gen), torch.tensor([3.0, 700.0]))


@pytest.mark.parametrize("backbone", list(BACKBONES))
@pytest.mark.parametrize("method", ["ls-nonshare", "ls", "cs"])
def test_a_backbone_round_trips_into_one_built_with_another_method(backbone, method, tmp_path):
    build, shapes = BACKBONES[backbone]
    model = build(method, 0.7)
    with torch.no_grad():
        for p in model.skip_scaling.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    expected, rows = run(model), describe(model)
    assert [r.shape for r in rows] == shapes and {r.input for r in rows} == {"built in"}
    assert all(r.module == "skip_scaling" for r in rows)
    save_scalelong(model, tmp_path)
    meta = json.loads((tmp_path / "scalelong.json").read_text())
    assert meta["builtin"] == "skip_scaling" and meta["declaration"] is None
    fresh = build("none")  # the same weights, built with another method: load puts the saved one on
    load_scalelong(fresh, tmp_path)
    assert (fresh.skip_scaling.method, fresh.skip_scaling.kappa) == (method, 0.7)
    assert torch.equal(run(fresh), expected) and describe(fresh) == rows


def test_describe_and_the_skip_table_name_every_kind_of_input():
    net = tiny_unet()
    apply_scalelong(net, "ls-nonshare", reduction=4, **declare_tiny(net))
    rows = describe(net)
    assert [(r.module, r.input, r.channels) for r in rows] == [
        ("dec0", "input", slice(-4, None)),
        ("dec1", "skip", None),
    ]
    assert [r.gate for r in rows] == ["ChannelGate 1", "ChannelGate 2"]
    table = skip_table(net).splitlines()
    assert table[2].split() == ["1", "4x?x?", "dec0(input)[-4:]", "ls-nonshare:", "ChannelGate", "1"]
    assert table[3].split()[:3] == ["2", "8x?x?", "dec1(skip)"]


def test_mistakes_are_one_line(tmp_path):
    with pytest.raises(ScaleLongError, match="no ScaleLong files"):
        load_scalelong(uvit("none"), tmp_path)
    with pytest.raises(ScaleLongError, match="not applied to this model"):
        save_scalelong(tiny_unet(), tmp_path)
    with pytest.raises(ScaleLongError, match="has no save_pretrained"):
        save_scalelong(uvit("cs"), tmp_path, save_model=True)
    with pytest.raises(ScaleLongError, match="has no skip scaling"):
        describe(tiny_unet())
    save_scalelong(uvit("ls"), tmp_path)
    with pytest.raises(ScaleLongError, match="sits at 'skip_scaling'"):
        load_scalelong(tiny_unet(), tmp_path)  # saved from a backbone, loaded into another network
    deeper = UViT(img_size=8, patch_size=2, in_channels=1, embed_dim=32, depth=6, num_heads=2)
    with pytest.raises(ScaleLongError, match="saved for 2 skips but this model has 3"):
        load_scalelong(deeper, tmp_path)
    meta = json.loads((tmp_path / "scalelong.json").read_text())
    (tmp_path / "scalelong.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "weights"}))
    with pytest.raises(ScaleLongError, match="records no checksum"):
        load_scalelong(uvit("none"), tmp_path)
    (tmp_path / "scalelong.json").write_text(json.dumps({**meta, "format": 99}))
    with pytest.raises(ScaleLongError, match="newer scalelong"):
        load_scalelong(uvit("none"), tmp_path)
    for text in ("[1, 2]", "{}", "not json"):
        (tmp_path / "scalelong.json").write_text(text)
        with pytest.raises(ScaleLongError, match="not a valid ScaleLong file") as info:
            load_scalelong(uvit("none"), tmp_path)
        assert "\n" not in str(info.value)


def _builds(backbone: str, method: str) -> bool:
    """Whether the backbone takes the method: merge-norm and cs-init need the U-ViT's merge layers."""
    return backbone == "UViT" or method not in MERGE_LAYER_METHODS


ROUND_TRIPS = [
    pytest.param(backbone, method, target, id=f"{backbone}-{method}-into-{target}")
    for backbone in BACKBONES
    for method in METHODS
    for target in ("none", "ls")
    if _builds(backbone, method)
]


@pytest.mark.parametrize(("backbone", "method", "target"), ROUND_TRIPS)
def test_every_method_round_trips_into_a_backbone_built_with_another(backbone, method, target, tmp_path):
    """Each method of scalelong.skips.METHODS, saved from a tiny backbone, loads into one built with
    `none` or `ls` (whose gates are parameters) and computes what the saved one did."""
    build, _ = BACKBONES[backbone]
    model = build(method, 0.7)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # gates and norms away from their init: the load must bring them
        for p in model.skip_scaling.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    expected, rows = run(model), describe(model)
    save_scalelong(model, tmp_path)
    fresh = build(target)
    # the backbone's own weights are the model's to load (cs-init moved cs into skip_linear's)
    own = {k: v for k, v in model.state_dict().items() if not k.startswith("skip_scaling.")}
    assert fresh.load_state_dict(own, strict=False).unexpected_keys == []
    assert load_scalelong(fresh, tmp_path) is fresh
    assert (fresh.skip_scaling.method, fresh.skip_scaling.kappa) == (method, 0.7)
    assert torch.allclose(run(fresh), expected, rtol=0, atol=1e-6) and describe(fresh) == rows
    loaded = fresh.skip_scaling.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in model.skip_scaling.state_dict().items())


def test_a_layout_saved_from_another_backbone_is_one_line_and_changes_nothing(tmp_path):
    save_scalelong(uvit("skip-norm"), tmp_path)  # 2 token skips, LayerNorms of width 32
    two_skips = UNet(img_size=8, in_channels=1, base_channels=8, channel_mult=(1,), num_res_blocks=1,
                     attn_resolutions=(), norm_groups=4, skip_method="cs").eval()  # fmt: skip
    before, scaling = run(two_skips), two_skips.skip_scaling
    with pytest.raises(ScaleLongError, match="token skips .* this UNet has feature-map skips") as info:
        load_scalelong(two_skips, tmp_path)
    assert "\n" not in str(info.value)
    assert two_skips.skip_scaling is scaling and torch.equal(run(two_skips), before)


def compiled(model):
    return torch.compile(model, backend="eager")  # the wrapper, without a compiler's run time


def data_parallel(model):
    """DataParallel on the CPU: the wrapper only (its `module.` prefix is DDP's), the model stays put."""
    with mock.patch.object(torch.cuda, "is_available", return_value=False):
        return torch.nn.DataParallel(model)


@pytest.mark.parametrize("wrap", [data_parallel, compiled], ids=["DataParallel", "compile"])
@pytest.mark.parametrize("kind", ["backbone", "declared"])
def test_a_wrapped_model_saves_and_loads_as_the_plain_one(wrap, kind, tmp_path):
    """DDP's `module.` and torch.compile's `_orig_mod.` are not recorded: what is saved from the
    wrapper loads into the plain model, and into a wrapped one (onto the model inside)."""
    build, plain = (lambda: uvit("ls"), lambda: uvit("none")) if kind == "backbone" else WRAPPED_DECLARED
    model = build()
    expected = run_model(model)
    save_scalelong(wrap(model), tmp_path)
    assert json.loads((tmp_path / "scalelong.json").read_text())["at"] == ""
    fresh = plain()
    assert load_scalelong(fresh, tmp_path) is fresh
    assert torch.equal(run_model(fresh), expected)
    inner = plain()
    wrapper = wrap(inner)
    assert load_scalelong(wrapper, tmp_path) is wrapper
    assert torch.equal(run_model(inner), expected)
    # a folder an earlier version saved from the wrapper, its prefix recorded, loads too
    meta = json.loads((tmp_path / "scalelong.json").read_text())
    prefix = "module" if wrap is data_parallel else "_orig_mod"
    (tmp_path / "scalelong.json").write_text(json.dumps({**meta, "at": prefix}))
    old = plain()
    load_scalelong(old, tmp_path)
    assert torch.equal(run_model(old), expected)


def declared_tiny():
    net = tiny_unet()
    apply_scalelong(net, "ls-nonshare", reduction=4, **declare_tiny(net))
    with torch.no_grad():
        for p in net.scalelong.parameters():
            p.add_(0.5)
    return net


WRAPPED_DECLARED = (declared_tiny, tiny_unet)


def run_model(model) -> torch.Tensor:
    if isinstance(model, UViT):
        return run(model)
    return model(torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0)))
