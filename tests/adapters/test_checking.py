"""A declaration written by hand, checked against the forward pass it describes.

The networks are tracing_fixtures' EDM2-like UNet (4 skips of widths 16, 16, 16, 32, each the
tail of a decoder block's concatenated input), the keyword toy of adapter_fixtures and a diffusers
UNet. Each mistake is one ScaleLongError line, given at apply_scalelong with ``example=`` and at
the first call without it.
"""

import copy

import pytest
import torch
from torch import nn

import adapter_fixtures as fx
import tracing_fixtures as tfx
from scalelong import SkipInput, apply_scalelong, is_applied
from scalelong.errors import ScaleLongError

RIGHT = (
    tfx.edm2_declaration
)  # outermost first: dec.8x8_block1, dec.8x8_block0, dec.4x4_block1, dec.4x4_block0


def refused(declaration, *words, net=tfx.edm2_like, inputs=tfx.edm2_inputs):
    """The error ``declaration(net)`` gets, the same with example= (model left as it was) and at
    the first call (before the forward returns)."""
    messages = []
    for at_once in (True, False):
        model = net()
        example = {"example": inputs()} if at_once else {}
        with pytest.raises(ScaleLongError) as info:
            apply_scalelong(model, "cs", skips=declaration(model), **example)
            model(*inputs())
        if at_once:
            assert not is_applied(model) and not hasattr(model, "scalelong")
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert "\n" not in messages[0]
    for word in words:
        assert word in messages[0], (word, messages[0])
    return messages[0]


def test_a_declaration_innermost_first_is_refused_naming_the_right_order():
    message = refused(
        lambda n: RIGHT(n)[::-1],
        "declared innermost first",
        "('dec.4x4_block0', 'dec.4x4_block1', 'dec.8x8_block0', 'dec.8x8_block1')",
        "made 4th, 3rd, 2nd, 1st of 4",
        "in the order 'dec.8x8_block1', 'dec.8x8_block0', 'dec.4x4_block1', 'dec.4x4_block0'",
    )
    assert "skip 1 is the outermost" in message


def test_a_shuffled_declaration_is_out_of_order():
    refused(lambda n: [RIGHT(n)[k] for k in (1, 0, 2, 3)], "declared out of order", "made 2nd, 1st, 3rd, 4th")


def test_a_missing_slice_on_a_concatenated_input_is_refused_naming_the_slice():
    refused(
        lambda n: [s._replace(channels=None) if k == 1 else s for k, s in enumerate(RIGHT(n))],
        "declared skip 2: input 0 of 'dec.8x8_block0' is a torch.cat of 48 channels along dim 1",
        "channels 32:48 are the skip made by 'enc.8x8_block0'",
        "all 48 would be scaled, the main path too",
        "declare channels=slice(-16, None)",
    )


def test_a_slice_wider_than_the_skip_is_refused_naming_the_slice():
    refused(
        lambda n: [s._replace(channels=slice(-24, None)) if k == 0 else s for k, s in enumerate(RIGHT(n))],
        "declared skip 1: input 0 of 'dec.8x8_block1'",
        "channels=slice(-24, None) select 8:32, wider than the skip",
        "declare channels=slice(-16, None)",
    )


def test_a_slice_narrower_than_the_skip_is_refused_naming_the_slice():
    refused(
        lambda n: [s._replace(channels=slice(-16, None)) if k == 3 else s for k, s in enumerate(RIGHT(n))],
        "declared skip 4: input 0 of 'dec.4x4_block0' is a torch.cat of 64 channels",
        "channels=slice(-16, None) select 48:64, narrower than the skip",
        "declare channels=slice(-32, None)",
    )


def test_a_slice_of_the_main_path_is_refused_naming_the_slice():
    refused(
        lambda n: [s._replace(channels=slice(0, 16)) if k == 0 else s for k, s in enumerate(RIGHT(n))],
        "channels=slice(0, 16) select 0:16, not the skip's channels",
        "declare channels=slice(-16, None)",
    )


def test_a_declaration_of_one_skip_per_level_is_refused_naming_the_others():
    refused(
        lambda n: [RIGHT(n)[0], RIGHT(n)[2]],
        "lists 2 skips, but the forward pass of EDM2LikeUNet shows 4",
        "'enc.8x8_block0' (into input 0 of 'dec.8x8_block0', channels=slice(-16, None))",
        "'enc.4x4_block0' (into input 0 of 'dec.4x4_block0', channels=slice(-32, None))",
        "check=False",
    )
    x, t = tfx.edm2_inputs()
    chosen = tfx.edm2_like()
    apply_scalelong(chosen, "cs", skips=[RIGHT(chosen)[0], RIGHT(chosen)[2]], check=False)
    assert chosen(x, t).shape == x.shape  # trusted as declared


def test_one_skip_declared_twice_is_refused():
    # dec.8x8_block1's 1x1 shortcut receives the same concatenated input as the block
    refused(
        lambda n: [*RIGHT(n), SkipInput("dec.8x8_block1.conv_skip", 0, slice(-16, None))],
        "declared skips 1 and 5 both carry the skip made by 'enc.8x8_conv'",
    )


def test_a_declaration_made_for_another_model_is_stale_not_already_applied():
    x, t = tfx.edm2_inputs()
    old = tfx.edm2_like()
    apply_scalelong(old, "cs", skips=tfx.edm2_hand_declaration(old))
    stale = tfx.edm2_hand_declaration(old)  # the modules of `old`, ScaleLong on them
    message = refused(
        lambda n: stale, "skip 1: SkipInput.module is a Block of another model, one ScaleLong is applied to"
    )
    assert "stale" in message and "already applied" not in message and "remove_scalelong" not in message
    unapplied = tfx.edm2_hand_declaration(tfx.edm2_like())
    refused(lambda n: unapplied, "not one of this EDM2LikeUNet (a declaration made for another model?)")
    fresh = tfx.edm2_like()
    apply_scalelong(fresh, "cs", skips=tfx.edm2_hand_declaration(fresh))  # its own modules: fine
    assert torch.equal(fresh(x, t), old(x, t))


def test_a_slice_of_a_whole_skip_and_a_module_that_never_runs_are_refused():
    refused(
        lambda n: [SkipInput("dec0", 0, slice(-4, None)), SkipInput("dec1", "skip", channels=slice(0, 4))],
        "declared skip 2: input 'skip' of 'dec1' is the whole skip made by 'enc1' (8 along dim 1)",
        "select 4 of them",
        "drop channels=",
        net=fx.tiny_unet,
        inputs=_tiny_input,
    )
    refused(
        lambda n: [SkipInput("dec0", 0, slice(-4, None)), SkipInput("idle", 0)],
        "declared skip 2: 'idle' does not run in the forward pass of TinyUNet",
        net=_with_idle_module,
        inputs=_tiny_input,
    )


def _tiny_input() -> tuple[torch.Tensor]:
    return (torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0)),)


def _with_idle_module() -> nn.Module:
    net = fx.tiny_unet()
    net.idle = nn.Identity()  # a submodule its forward never calls
    return net


def test_the_first_call_is_watched_not_run_twice():
    """A right declaration: the first call runs once (a user's hook sees one forward), computes
    what the later calls compute, trains, and leaves no hook of the check behind; a copy made
    before it checks its own first call."""
    x, t = tfx.edm2_inputs()
    net = tfx.edm2_like().train()
    apply_scalelong(net, "ls-nonshare", skips=RIGHT(net), skip_channels=[16, 16, 16, 32])
    ema = copy.deepcopy(net)
    hooks = len(net._forward_hooks), len(net._forward_pre_hooks)
    calls = []
    net.out_conv.register_forward_hook(lambda *_: calls.append(1))
    first = net(x, t)
    assert len(calls) == 1 and (len(net._forward_hooks), len(net._forward_pre_hooks)) == (
        hooks[0] - 1,
        hooks[1] - 1,
    )
    first.square().mean().backward()
    assert all(p.grad is not None for p in net.scalelong.parameters())
    with torch.no_grad():
        assert torch.equal(net(x, t), first.detach())
    backwards = copy.deepcopy(tfx.edm2_like())
    apply_scalelong(backwards, "cs", skips=RIGHT(backwards)[::-1])
    copied = copy.deepcopy(backwards)
    for model in (backwards, copied):  # each its own first call
        with pytest.raises(ScaleLongError, match="innermost first"):
            model(x, t)
    assert torch.equal(ema(x, t), first.detach())  # the EMA copy's own first call, checked and passed


def test_diffusers_tuple_items_declared_by_hand_are_checked():
    pytest.importorskip("diffusers")
    tuple_of = "res_hidden_states_tuple"
    right = [SkipInput(f"up_blocks.{k}", tuple_of, item=j) for k, j in ((1, 0), (1, 1), (0, 0), (0, 1))]
    gen = torch.Generator().manual_seed(0)
    x, t = torch.randn(2, 1, 16, 16, generator=gen), torch.tensor([3, 700])
    net = fx.unet2d()
    apply_scalelong(net, "cs", skips=right, example=(x, t))  # the adapter's own declaration passes
    # an item counted from the end, and the resnets that concatenate the skips (each up block's
    # resnet j pops item -1 - j), pass too
    resnets = [
        SkipInput("up_blocks.1", tuple_of, item=-2),
        SkipInput("up_blocks.1.resnets.0", 0, slice(-16, None)),
    ]
    resnets += [
        SkipInput("up_blocks.0.resnets.1", 0, slice(-16, None)),
        SkipInput("up_blocks.0", tuple_of, item=1),
    ]
    apply_scalelong(fx.unet2d(), "cs", skips=resnets, example=(x, t))
    with pytest.raises(ScaleLongError) as info:
        apply_scalelong(fx.unet2d(), "cs", skips=right[::-1], example=(x, t))
    assert "innermost first" in str(info.value)
    assert "in the order 'up_blocks.1'[0], 'up_blocks.1'[1], 'up_blocks.0'[0], 'up_blocks.0'[1]" in str(
        info.value
    )
