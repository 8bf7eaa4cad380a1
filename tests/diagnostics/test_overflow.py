"""Where fp16 overflows: the ops fp16 autocast runs in half precision, the first one past 65,504 in a
forward (and in backward), and the per-op headroom the diagnostics log on their steps."""

import math
import warnings

import pytest
import torch
from torch import nn

from scalelong import UViT
from scalelong.diagnostics import Diagnostics
from scalelong.diagnostics.overflow import (
    FP16_MAX,
    OpWatch,
    Overflow,
    fp16_ops,
    locate_grad_overflow,
    locate_overflow,
)
from scalelong.diffusion import VPSDE, training_loss
from scalelong.models.uvit import Attention


def chain(*gains: float) -> nn.Sequential:
    """Linear(4, 4) layers, layer i multiplying its input by gains[i] (ReLU between): numbers a hand
    can follow."""
    layers: list[nn.Module] = []
    for gain in gains:
        lin = nn.Linear(4, 4, bias=False)
        nn.init.eye_(lin.weight)
        with torch.no_grad():
            lin.weight.mul_(gain)
        layers += [lin, nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def no_hooks(model: nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


X = torch.full((2, 4), 100.0)


# ----------------------------------------------------------------------------- locate_overflow


def test_the_third_linear_past_fp16_s_largest_is_named():
    model = chain(1.0, 2.0, 1000.0, 0.001)  # out: 100, 200, 200,000, 200
    found = locate_overflow(model, lambda: model(X))
    assert found == Overflow("4", 200_000.0, "forward")  # Sequential index 4: the third Linear
    assert str(found) == "fp16 overflow in forward at 4 (|value| 2e+05)"
    assert no_hooks(model)


def test_of_two_overflowing_linears_the_first_is_named():
    model = chain(1.0, 2.0, 1000.0, 10.0)  # the third and the fourth go past 65,504
    assert locate_overflow(model, lambda: model(X)).module == "4"


def test_nothing_past_the_limit_is_none_and_a_nan_is_inf():
    model = chain(1.0, 2.0, 1000.0, 0.001)
    assert locate_overflow(model, lambda: model(X / 100)) is None  # out: 1, 2, 2,000, 2
    nan = torch.tensor([[1.0, math.nan, 1.0, 1.0]])
    assert locate_overflow(model, lambda: model(nan)) == Overflow("0", math.inf, "forward")
    assert no_hooks(model)


def test_hooks_are_removed_when_the_forward_raises():
    model = chain(1.0, 2.0)

    def fails():
        model(X)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        locate_overflow(model, fails)
    assert no_hooks(model)


def test_a_gradient_overflow_is_named_where_backward_meets_it_first():
    # d(loss)/d(out4) = 1000, W4 = 100: the gradient at the third Linear's output is 1e5, and so at
    # the earlier ones (W = 1); backward meets the third first
    model = chain(1.0, 1.0, 1.0, 100.0)
    x = torch.ones(1, 4)
    found = locate_grad_overflow(model, lambda: (1000.0 * model(x).sum()).backward(), step=7)
    assert found == Overflow("4", 100_000.0, "backward", 7)
    assert str(found) == "step 7: fp16 overflow in backward at 4 (|value| 1e+05)"
    model.zero_grad()
    assert locate_grad_overflow(model, lambda: model(x).sum().backward()) is None
    assert no_hooks(model)


def tiny_uvit() -> UViT:
    return UViT(
        img_size=8, patch_size=2, in_channels=1, embed_dim=32, depth=4, num_heads=2, skip_method="none"
    )


def test_the_uvit_s_fp16_ops_are_its_linears_convolutions_and_attention():
    model = tiny_uvit()
    ops = fp16_ops(model)
    assert {"patch_embed.proj", "out_blocks.1.skip_linear", "decoder_pred", "final_layer"} <= set(ops)
    assert {f"mid_block.{n}" for n in ("attn", "attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")} <= set(ops)
    assert not any("norm" in name for name in ops)  # LayerNorm runs in fp32 under autocast
    assert all(isinstance(m, (nn.Linear, nn.Conv2d, Attention)) for m in ops.values())
    assert list(ops) == [n for n, _ in model.named_modules() if n in ops]  # registration order

    class Compiled(nn.Module):  # what torch.compile's wrapper looks like: the model as _orig_mod
        def __init__(self, inner: nn.Module):
            super().__init__()
            self._orig_mod = inner

    assert list(fp16_ops(Compiled(model))) == list(ops)


def op_values(model: nn.Module, run) -> tuple[dict[str, float], dict[str, float]]:
    """(largest |output|, largest |gradient at the output|) per Linear, Conv2d and attention module,
    measured here with plain forward hooks and full backward hooks, merged over calls by max."""
    outputs: dict[str, float] = {}
    grads: dict[str, float] = {}
    handles = []
    for name, m in model.named_modules():
        if isinstance(m, (nn.Linear, nn.Conv2d, Attention)):

            def fwd(module, args, out, name=name):
                outputs[name] = max(outputs.get(name, 0.0), out.detach().abs().max().item())

            def bwd(module, grad_in, grad_out, name=name):
                grads[name] = max(grads.get(name, 0.0), grad_out[0].abs().max().item())

            handles += [m.register_forward_hook(fwd), m.register_full_backward_hook(bwd)]
    try:
        with warnings.catch_warnings():  # the patch embedding's input needs no gradient: said once
            warnings.filterwarnings("ignore", "Full backward hook is firing")
            run()
    finally:
        for h in handles:
            h.remove()
    return outputs, grads


def skip_linear_past_fp16(model: UViT, x: torch.Tensor, t: torch.Tensor, name: str) -> nn.Linear:
    """Scale ``name``'s weights so that its output is 4 x 65,504 on (x, t); return it."""
    with torch.no_grad():
        outputs, _ = op_values(model, lambda: model(x, t))
    assert max(v for k, v in outputs.items() if k != name) < 10.0  # every other op far below
    layer = model.get_submodule(name)
    with torch.no_grad():
        layer.weight.mul_(4 * FP16_MAX / outputs[name])
    return layer


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_a_uvit_s_skip_merge_past_fp16_is_located(autocast):
    torch.manual_seed(0)
    model = tiny_uvit()
    x, t = torch.randn(4, 1, 8, 8), torch.rand(4)
    skip_linear_past_fp16(model, x, t, "out_blocks.1.skip_linear")
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), torch.no_grad():
        found = locate_overflow(model, lambda: model(x, t))
    assert found.module == "out_blocks.1.skip_linear" and found.kind == "forward"
    assert found.value == pytest.approx(4 * FP16_MAX, rel=0.02)  # bf16 rounds to 8 bits
    assert no_hooks(model)


# ----------------------------------------------------------------------------- OpWatch


def test_opwatch_merges_micro_batches_by_max_and_records_nan_as_inf():
    model = chain(1.0, 3.0)
    watch = OpWatch(fp16_ops(model))
    watch.arm()
    model(torch.tensor([[1.0, -2.0, 0.0, 0.0]])).sum().backward()
    model(torch.tensor([[0.0, 0.0, -5.0, 0.0]])).sum().backward()  # second micro-batch: larger
    watch.disarm()
    outputs, grads = watch.values()
    # layer 2's output is 3 * relu(x): 3, then 0; the gradient at it is 1, at layer 0's output 3, then 0
    assert outputs == {"0": 5.0, "2": 3.0} and grads == {"2": 1.0, "0": 3.0}
    assert no_hooks(model)
    watch.arm()  # a new step forgets the last one
    model(torch.tensor([[math.nan, 0.0, 0.0, 0.0]]))
    assert watch.values() == ({"0": math.inf, "2": math.inf}, {})


# ----------------------------------------------------------------------------- Diagnostics


def uvit_step(model: UViT, diag: Diagnostics, step: int, x0: torch.Tensor) -> dict:
    gen = torch.Generator().manual_seed(step)
    diag.arm(step)
    training_loss(model, VPSDE(), x0, gen).mean().backward()
    record = diag.collect(step, 1.0)
    model.zero_grad()
    return record


def test_diagnostics_log_the_ops_headroom_and_the_op_with_the_least():
    torch.manual_seed(0)
    model = tiny_uvit()
    x0 = torch.randn(8, 1, 8, 8)
    diag = Diagnostics(model, every=2)
    assert uvit_step(model, diag, 1, x0) == {}  # not armed: nothing recorded, no hook left
    assert diag.op_watch.outputs == {} and diag.largest_op_values() == {} and no_hooks(model)

    gen = torch.Generator().manual_seed(2)
    outputs, grads = op_values(model, lambda: training_loss(model, VPSDE(), x0, gen).mean().backward())
    model.zero_grad()
    record = uvit_step(model, diag, 2, x0)  # the same draws: the same values
    assert record["fp16/headroom_ops"] == pytest.approx(FP16_MAX / max(outputs.values()), rel=1e-6)
    assert record["fp16/headroom_grad"] == pytest.approx(FP16_MAX / max(grads.values()), rel=1e-6)
    assert record["fp16/least_op"] == max(outputs, key=outputs.__getitem__)
    assert diag.largest_op_values() == pytest.approx(outputs, rel=1e-6)
    assert no_hooks(model)

    before = diag.largest_op_values()
    assert uvit_step(model, diag, 3, 100 * x0) == {}  # larger values, on a step not armed
    assert diag.largest_op_values() == before

    resumed = Diagnostics(model, every=2)
    resumed.load_state_dict(diag.state_dict())
    assert resumed.largest_op_values() == before
    uvit_step(model, resumed, 4, 100 * x0)  # the history goes on from there: the larger values
    assert all(resumed.largest_op_values()[k] >= v for k, v in before.items())
    assert resumed.largest_op_values()["patch_embed.proj"] > before["patch_embed.proj"]
    older = {k: v for k, v in diag.state_dict().items() if k != "op_history"}  # written before it
    Diagnostics(model, every=2).load_state_dict(older)


def test_diagnostics_locate_the_overflow_with_the_module_s_history():
    torch.manual_seed(0)
    model = tiny_uvit()
    x0, x, t = torch.randn(8, 1, 8, 8), torch.randn(4, 1, 8, 8), torch.rand(4)
    diag = Diagnostics(model, every=1)
    uvit_step(model, diag, 1, x0)
    name = "out_blocks.1.skip_linear"
    before = diag.largest_op_values()[name]
    skip_linear_past_fp16(model, x, t, name)
    record = uvit_step(model, diag, 2, x0)
    assert record["fp16/least_op"] == name and record["fp16/headroom_ops"] < 1

    diag.arm(3)  # on an armed step: the located forward is not recorded in the step's statistics
    gen = torch.Generator().manual_seed(3)
    training_loss(model, VPSDE(), x0, gen).mean().backward()
    with torch.no_grad():
        found = diag.locate_overflow(lambda: model(1e30 * x, t), step=3)
    record = diag.collect(3, 1.0)
    assert found.module == "patch_embed.proj" and found.value > 1e29 and found.step == 3
    # the step's own values (skip_linear at 4 x 65,504), not those of the 1e30 input
    assert record["fp16/least_op"] == name and record["fp16/headroom_ops"] > 0.1
    assert record["fp16/headroom"] > 1e-3

    with torch.no_grad():
        found = diag.locate_overflow(lambda: model(x, t))
    assert found.module == name and found.largest_before == diag.largest_op_values()[name] > before
    assert str(found).startswith(f"fp16 overflow in forward at {name} (|value| 2.6")
    assert "its largest |value| on the logged steps before" in str(found)
    assert no_hooks(model)
