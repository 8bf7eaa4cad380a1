"""find_skips: the long skips of a network read off one forward pass.

Every check compares what find_skips returns with the real model, read by probes of the test's
own (forward hooks on what the encoder makes, pre-hooks on what the decoder merges, the model's
own SkipScaling calls) or with the layout an adapter declares, never with find_skips's own logic.
"""

import copy
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from test_adapters_backbones import match
from torch import nn

import adapter_fixtures as fx
import tracing_fixtures as tfx
from scalelong import describe, find_skips, load_scalelong, save_scalelong
from scalelong.adapters import SkipInput, apply_scalelong, declared, is_applied, remove_scalelong
from scalelong.adapters.declaration import locate
from scalelong.diagnostics import Diagnostics
from scalelong.errors import ScaleLongError
from scalelong.skips import skip_table


def first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    return out[0] if isinstance(out, tuple) else out.sample


def _append_output(record):
    return lambda _m, _a, out: record.append(first_tensor(out))


def _diffusers_producers(unet, record):
    """conv_in, then per down block each resnet's (or its attention's) output and the downsampler's."""
    unet.conv_in.register_forward_hook(_append_output(record))
    for block in unet.down_blocks:
        attentions = getattr(block, "attentions", None)
        for k, resnet in enumerate(block.resnets):
            (attentions[k] if attentions else resnet).register_forward_hook(_append_output(record))
        for d in block.downsamplers or []:
            d.register_forward_hook(_append_output(record))


def _diffusers_consumers(unet, record):
    # an up block's resnet normalises cat([hidden_states, skip], 1) first
    for block in unet.up_blocks:
        for resnet in block.resnets:
            resnet.norm1.register_forward_pre_hook(lambda _m, args: record.append((args[0], 1)))


def _ddpm_inputs():
    return torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0)), torch.tensor([3.0, 700.0])


def _unet2d_inputs():
    return torch.randn(2, 1, 16, 16, generator=torch.Generator().manual_seed(0)), torch.tensor([3, 700])


def _condition_inputs():
    gen = torch.Generator().manual_seed(0)
    return (
        torch.randn(2, 1, 16, 16, generator=gen),
        torch.tensor([3, 700]),
        torch.randn(2, 3, 8, generator=gen),
    )


def _unidiffuser_inputs():
    gen = torch.Generator().manual_seed(0)
    latent, image, text = (torch.randn(*s, generator=gen) for s in ((2, 4, 8, 8), (2, 1, 8), (2, 3, 8)))
    return latent, image, text, torch.tensor([10, 500]), torch.tensor([0, 900])


def _seeded(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def _outputs(out):
    return torch.cat([o.flatten(1) for o in out], 1) if isinstance(out, tuple) else first_tensor(out)


@dataclass
class Net:
    build: Callable[[], nn.Module]
    inputs: Callable[[], tuple]
    producers: Callable
    consumers: Callable
    num_skips: int
    needs: str | None = None


NETS = {
    "EDM2-like": Net(tfx.edm2_like, tfx.edm2_inputs, tfx.edm2_producers, tfx.edm2_consumers, 4),
    "ddpm-Unet": Net(fx.ddpm_unet, _ddpm_inputs, fx._ddpm_producers, fx._ddpm_consumers, 7,
                     "denoising_diffusion_pytorch"),
    "UNet2DModel": Net(fx.unet2d, _unet2d_inputs, _diffusers_producers, _diffusers_consumers, 4, "diffusers"),
    "UNet2DConditionModel": Net(fx.unet2d_condition, _condition_inputs, _diffusers_producers,
                                _diffusers_consumers, 4, "diffusers"),
    "UTransformer2DModel": Net(fx.utransformer, lambda: (_seeded(2, 4, 8, 8),), fx._uvit_producers,
                               fx._uvit_consumers, 3, "diffusers"),
    "UniDiffuserModel": Net(fx.unidiffuser, _unidiffuser_inputs,
                            lambda m, r: fx._uvit_producers(m.transformer, r),
                            lambda m, r: fx._uvit_consumers(m.transformer, r), 2, "diffusers"),
    "skip-keyword toy": Net(fx.tiny_unet, lambda: (_seeded(2, 1, 8, 8),), fx._tiny_producers,
                            fx._tiny_consumers, 2),
}  # fmt: skip


def net_params(names=NETS):
    params = []
    for name in names:
        needs = NETS[name].needs
        marks = ()
        if needs is not None:
            try:
                __import__(needs)
            except ImportError:
                marks = (pytest.mark.skip(reason=f"needs {needs}"),)
        params.append(pytest.param(name, marks=marks, id=name))
    return params


def merged_factors(net: Net, found_model: nn.Module, method: str, kappa: float) -> dict[int, float]:
    """Install find_skips's declaration with ``method``, run, and match every merged input to the
    produced skip it is a multiple of: {produced index (1 = made first): factor}."""
    apply_scalelong(found_model, method, kappa, skips=find_skips(found_model, *net.inputs()))
    produced, merged = [], []
    net.producers(found_model, produced)
    net.consumers(found_model, merged)
    with torch.no_grad():
        found_model(*net.inputs())
    assert len(produced) == net.num_skips and len(merged) == net.num_skips
    factors = dict(match(tensor, dim, produced) for tensor, dim in merged)
    assert sorted(factors) == list(range(1, net.num_skips + 1))  # each produced skip merged once
    return factors


@pytest.mark.parametrize("name", net_params())
def test_the_found_skips_scale_skip_i_by_kappa_power_counted_from_the_first_made(name):
    """cs on the found declaration: the skip the encoder makes i-th is merged times kappa ** (i - 1)
    (relative to none, since EDM2's concat weighs its operands itself), and nothing else is scaled."""
    net, kappa = NETS[name], 0.6
    found = find_skips(net.build(), *net.inputs())
    assert len(found) == net.num_skips
    plain = merged_factors(net, net.build(), "none", 1.0)
    scaled = merged_factors(net, net.build(), "cs", kappa)
    for index in plain:
        assert scaled[index] / plain[index] == pytest.approx(kappa ** (index - 1), rel=1e-5)


def test_edm2_like_skips_every_encoder_entry_outermost_first():
    """What the released EDM2 UNet shows at this size (checked on it with hooks): 4 skips, the
    first conv's output included, each the tail slice of a decoder block's input."""
    net = tfx.edm2_like()
    found = find_skips(net, *tfx.edm2_inputs())
    assert found.skip_channels == [16, 16, 16, 32] and found.num_tokens is None
    assert list(found) == [
        SkipInput("dec.8x8_block1", 0, slice(-16, None)),
        SkipInput("dec.8x8_block0", 0, slice(-16, None)),
        SkipInput("dec.4x4_block1", 0, slice(-16, None)),
        SkipInput("dec.4x4_block0", 0, slice(-32, None)),
    ]
    assert list(found) == tfx.edm2_declaration(net)  # the recipe of docs/own-loop.md
    producers = [r.producer for r in found.records]
    assert producers == ["enc.8x8_conv", "enc.8x8_block0", "enc.4x4_down", "enc.4x4_block0"]
    assert found.shapes == [(16, 8, 8), (16, 8, 8), (16, 4, 4), (32, 4, 4)]
    assert list(found.blocks) == [*(f"enc.{k}" for k in net.enc), *(f"dec.{k}" for k in net.dec), "out_conv"]


@pytest.mark.parametrize("method", ["cs", "ls-nonshare"])
def test_apply_with_an_example_equals_the_hand_declaration(method):
    x, t = tfx.edm2_inputs()
    by_hand, by_example = tfx.edm2_like(), tfx.edm2_like()
    torch.manual_seed(1)
    apply_scalelong(
        by_hand, method, 0.7, skips=tfx.edm2_hand_declaration(by_hand), skip_channels=[16, 16, 16, 32]
    )
    torch.manual_seed(1)  # the LS gates start alike
    apply_scalelong(by_example, method, 0.7, example=(x, t))
    assert declared.installed(by_example).skips == declared.installed(by_hand).skips
    assert torch.equal(by_example(x, t), by_hand(x, t))  # by_hand's first call is checked, and passes
    assert not torch.equal(by_example(x, t), tfx.edm2_like()(x, t))  # and it does scale
    assert set(by_example.state_dict()) == set(by_hand.state_dict())
    remove_scalelong(by_example)
    assert torch.equal(by_example(x, t), tfx.edm2_like()(x, t))


def test_the_keyword_toy_matches_its_hand_declaration():
    net = fx.tiny_unet()
    found = find_skips(net, torch.randn(2, 1, 8, 8))
    hand = fx.declare_tiny(net)
    assert list(found) == [SkipInput("dec0", 0, slice(-4, None)), SkipInput("dec1", "skip")]
    assert [s.module for s in hand["skips"]] == [net.dec0, net.dec1] and found.skip_channels == [4, 8]
    x = torch.randn(2, 1, 8, 8)
    a, b = fx.tiny_unet(), fx.tiny_unet()
    apply_scalelong(a, "cs", 0.5, **fx.declare_tiny(a))
    apply_scalelong(b, "cs", 0.5, example=x)  # a single tensor is the one input
    assert declared.installed(a).skips == declared.installed(b).skips == tuple(found)
    assert torch.equal(a(x), b(x))


def test_skips_found_on_one_model_watch_the_blocks_of_the_model_they_are_applied_to():
    """find_skips keeps the blocks as paths: applied to a copy (an EMA, a second instance), the
    diagnostics watch the copy's blocks, not those of the model that was traced."""
    x, t = tfx.edm2_inputs()
    traced = tfx.edm2_like()
    found = find_skips(traced, x, t)
    assert all(isinstance(path, str) for path in found.blocks.values())
    copied = copy.deepcopy(traced)
    apply_scalelong(copied, "cs", 0.7, skips=found)
    watched = copied.scalelong.watched_blocks
    assert list(watched) == list(found.blocks)
    assert all(block is copied.get_submodule(path) for path, block in watched.items())
    copied.train()
    diag = Diagnostics(copied, every=1)
    assert diag.arm(1)
    copied(x, t).square().mean().backward()
    record = diag.collect(1, 1.0)
    norms = [record[f"block/{path}/feature_norm"] for path in found.blocks]
    assert all(math.isfinite(v) and v > 0 for v in norms), norms
    # blocks that are not the target's: one line, and nothing applied
    stranger = tfx.edm2_like()
    with pytest.raises(ScaleLongError, match="has no submodule 'enc.gone'") as info:
        apply_scalelong(stranger, "cs", skips=dataclasses.replace(found, blocks={"gone": "enc.gone"}))
    assert "\n" not in str(info.value)
    assert not is_applied(stranger) and not hasattr(stranger, "scalelong")


ADAPTED = ["ddpm-Unet", "UNet2DModel", "UNet2DConditionModel", "UTransformer2DModel", "UniDiffuserModel"]


@pytest.mark.parametrize("name", net_params(ADAPTED))
def test_a_network_an_adapter_knows_is_found_as_its_adapter_declares_it(name):
    """The very declaration (module paths, inputs, tuple items, slices) and gate sizes the adapter
    installs, and with LS gates alike, the same outputs."""
    net = NETS[name]
    by_adapter, by_trace = net.build(), net.build()
    torch.manual_seed(3)
    apply_scalelong(by_adapter, "ls-nonshare", 0.6, reduction=4)
    found = find_skips(by_trace, *net.inputs())
    torch.manual_seed(3)
    apply_scalelong(by_trace, "ls-nonshare", 0.6, skips=found, reduction=4)
    adapter, trace = declared.installed(by_adapter), declared.installed(by_trace)
    assert tuple(found) == adapter.skips == trace.skips
    assert (trace.skip_channels, trace.num_tokens) == (adapter.skip_channels, adapter.num_tokens)
    with torch.no_grad():
        assert torch.equal(_outputs(by_trace(*net.inputs())), _outputs(by_adapter(*net.inputs())))


def test_the_diffusers_unet_skips_are_its_up_blocks_tuple_items():
    pytest.importorskip("diffusers")
    found = find_skips(fx.unet2d(), *_unet2d_inputs())
    tuple_of = "res_hidden_states_tuple"
    assert list(found) == [
        SkipInput(f"up_blocks.{k}", tuple_of, item=j) for k, j in ((1, 0), (1, 1), (0, 0), (0, 1))
    ]
    assert [r.input for r in found.records] == [f"{tuple_of}[{j}]" for j in (0, 1, 0, 1)]
    assert [r.producer for r in found.records][0] == "conv_in"


def test_the_found_declaration_saves_loads_and_is_described_as_applied(tmp_path):
    x, t = tfx.edm2_inputs()
    net = tfx.edm2_like()
    found = find_skips(net, x, t)
    apply_scalelong(net, "ls-nonshare", 0.7, example=(x, t))
    with torch.no_grad():
        for p in net.scalelong.parameters():  # gates away from their init: the load must bring them
            p.add_(0.1)
    rows, listed = describe(net), describe(found)
    assert [r[:5] for r in rows] == [r[:5] for r in listed]  # index, module, input, slice, shape
    assert [r.made_by for r in listed] == [r.producer for r in found.records]
    assert all(r.treatment == "not applied" and r.coefficient is None for r in listed)
    save_scalelong(net, tmp_path)
    fresh = load_scalelong(tfx.edm2_like(), tmp_path)
    assert declared.installed(fresh).skips == tuple(found)
    assert torch.equal(fresh(x, t), net(x, t))


def own_skip_inputs(model: nn.Module, found, x, t) -> None:
    """Each found module's declared input is the very skip the model's own SkipScaling is asked
    to scale with that index."""
    asked, seen = {}, {}
    model.skip_scaling.probe = lambda i, skip, coef, out: asked.setdefault(i, skip)

    def read(index, spec):
        def hook(module, args, kwargs):
            position, name = locate(module, spec, index)
            value = args[position] if position is not None and position < len(args) else kwargs[name]
            if spec.channels is not None:
                start, stop, _ = spec.channels.indices(value.shape[spec.dim])
                value = value.narrow(spec.dim, start, stop - start)
            seen[index] = value

        return hook

    for index, spec in enumerate(found, start=1):
        model.get_submodule(spec.module).register_forward_pre_hook(read(index, spec), with_kwargs=True)
    with torch.no_grad():
        model(x, t)
    assert sorted(seen) == sorted(asked) == list(range(1, len(found) + 1))
    for index in seen:
        assert torch.equal(seen[index], asked[index]), index


def test_the_package_backbones_in_their_own_skip_order():
    from scalelong.models import UNet, UViT

    unet = UNet(img_size=16, in_channels=1, base_channels=8, channel_mult=(1, 2), num_res_blocks=1,
                attn_resolutions=(8,), norm_groups=4).eval()  # fmt: skip
    uvit = UViT(img_size=8, patch_size=2, in_channels=1, embed_dim=16, depth=6, num_heads=2).eval()
    for model, x in ((unet, torch.randn(2, 1, 16, 16)), (uvit, torch.randn(2, 1, 8, 8))):
        t = torch.rand(2)
        found = find_skips(model, x, t)
        assert [(1, *r.shape) for r in found.records] == model.skip_shapes(1)
        own_skip_inputs(model, found, x, t)
    assert find_skips(uvit, x, t).paths == ["out_blocks.2", "out_blocks.1", "out_blocks.0"]
    with pytest.raises(ScaleLongError, match="already holds a SkipScaling"):
        apply_scalelong(uvit, "cs", example=(x, t))  # its own method is a config key


def test_the_table_names_module_input_slice_shape_and_maker():
    found = find_skips(fx.tiny_unet(), torch.randn(2, 1, 8, 8))
    lines = skip_table(found).splitlines()
    assert lines[0].split() == ["skip", "shape", "scaled", "at", "made", "by", "coefficient"]
    assert lines[2].split() == ["1", "4x8x8", "dec0(input)[-4:]", "enc0", "not", "applied"]
    assert lines[3].split() == ["2", "8x4x4", "dec1(skip)", "enc1", "not", "applied"]
    assert str(found) == skip_table(found) and "outermost" in lines[-1]


def test_the_trace_leaves_the_model_as_it_was():
    net = tfx.edm2_like().train()
    net.dec["4x4_in0"].eval()
    before = copy.deepcopy(net.state_dict())
    state = torch.random.get_rng_state()
    find_skips(net, *tfx.edm2_inputs())
    assert net.training and not net.dec["4x4_in0"].training and net.enc["8x8_conv"].training
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in before.items())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in net.modules())


# ----------------------------------------------------------------------------- refusals


class Plain(nn.Module):
    """No skip at all: a stack of convolutions."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (
            nn.Conv2d(1, 4, 3, padding=1),
            nn.Conv2d(4, 4, 3, padding=1),
            nn.Conv2d(4, 1, 1),
        )

    def forward(self, x, t):
        return self.c(self.b(self.a(x)) * t[:, None, None, None])


class TwoDecoders(nn.Module):
    """The encoder's output reaches two decoder modules: whose skip is it?"""

    def __init__(self):
        super().__init__()
        self.enc, self.mid = nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)
        self.dec1, self.dec2 = nn.Conv2d(8, 4, 1), nn.Conv2d(8, 1, 1)

    def forward(self, x):
        s = self.enc(x)
        h = self.dec1(torch.cat([self.mid(s), s], 1))
        return self.dec2(torch.cat([h, s], 1))


class FirstInFirstOut(nn.Module):
    """Two skips merged in the order they were made (a queue, not a stack)."""

    def __init__(self):
        super().__init__()
        self.e1, self.e2 = nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)
        self.mid = nn.Conv2d(4, 4, 3, padding=1)
        self.d1, self.d2 = nn.Conv2d(8, 4, 1), nn.Conv2d(8, 1, 1)

    def forward(self, x):
        s1 = self.e1(x)
        s2 = self.e2(s1)
        h = self.d1(torch.cat([self.mid(s2), s1], 1))
        return self.d2(torch.cat([h, s2], 1))


class SharedMerge(nn.Module):
    """One merge layer serves both skips: a SkipInput on it could not tell its two calls apart."""

    def __init__(self):
        super().__init__()
        self.e1, self.e2 = nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)
        self.mid, self.merge = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(8, 4, 1)

    def forward(self, x):
        s1 = self.e1(x)
        s2 = self.e2(s1)
        h = self.merge(torch.cat([self.mid(s2), s2], 1))
        return self.merge(torch.cat([h, s1], 1))


def one_line(call, *words):
    with pytest.raises(ScaleLongError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, (word, message)


def test_refusals_are_one_line_and_say_what_to_do():
    x, t = torch.randn(2, 1, 8, 8), torch.rand(2)
    one_line(lambda: find_skips(Plain(), x, t), "found no long skip in Plain", "SkipInput")
    one_line(lambda: find_skips(TwoDecoders(), x), "reaches 2 decoder modules", "'dec1', 'dec2'", "SkipInput")
    one_line(lambda: find_skips(FirstInFirstOut(), x), "not merged in reverse order", "'e2'", "SkipInput")
    one_line(lambda: find_skips(SharedMerge(), x), "'merge'", "runs 2 times", "SkipInput")
    one_line(lambda: find_skips(Plain(), x), "Plain failed on the example input", "(x, t)")
    one_line(lambda: find_skips(Plain()), "needs an example input")
    applied = fx.tiny_unet()
    apply_scalelong(applied, "cs", **fx.declare_tiny(applied))
    one_line(lambda: find_skips(applied, x), "ScaleLong is applied", "before apply_scalelong")
    one_line(lambda: apply_scalelong(Plain(), "cs", example=(x, t)), "found no long skip in Plain")
    one_line(lambda: apply_scalelong(Plain(), "cs", example=3), "example must be the model's inputs")
    one_line(lambda: describe(3), "describe takes a model")
    one_line(lambda: apply_scalelong(Plain(), "cs"), "example=(x, t)")  # the error says how


def test_a_skip_handed_over_in_a_tuple_is_declared_as_its_item():
    class TupleMerge(nn.Module):
        def forward(self, x, skips):
            return x + skips[0]  # merged by a sum, not a concatenation: still a long skip

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc, self.mid, self.dec = nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(4, 4, 1), TupleMerge()

        def forward(self, x):
            s = self.enc(x)
            return self.dec(self.mid(s), (s,))

    x = torch.randn(1, 1, 4, 4)
    assert list(find_skips(Net(), x)) == [SkipInput("dec", "skips", item=0)]
    plain = Net()
    scaled = copy.deepcopy(plain)
    apply_scalelong(scaled, "sqrt2", example=x)
    s = plain.enc(x)
    assert torch.allclose(scaled(x), plain.mid(s) + s * 2**-0.5)


def test_a_declared_input_of_the_found_skips_is_a_skip_input():
    found = find_skips(fx.tiny_unet(), torch.randn(2, 1, 8, 8))
    assert all(isinstance(s, SkipInput) for s in found) and found[:1] == [found[0]]
