import copy
import sys

import pytest
import torch
from torch import nn

diffusers = pytest.importorskip("diffusers")

from adapter_fixtures import TOY_DIFFUSERS_OVERRIDES  # noqa: E402
from adapter_fixtures import unet2d as toy_unet2d  # noqa: E402
from adapter_fixtures import unet2d_condition as toy_unet2d_condition  # noqa: E402
from scalelong.adapters import apply_scalelong, load_scalelong, remove_scalelong, save_scalelong  # noqa: E402
from scalelong.adapters.diffusers import skip_layout  # noqa: E402
from scalelong.errors import ScaleLongError  # noqa: E402


def unet2d() -> nn.Module:
    return toy_unet2d().eval()


def unet2d_condition() -> nn.Module:
    return toy_unet2d_condition().eval()


MODELS = {"UNet2DModel": unet2d, "UNet2DConditionModel": unet2d_condition}


def run(model: nn.Module, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x, t = torch.randn(2, 1, 16, 16, generator=gen), torch.tensor([10.0, 500.0])
    kwargs = {}
    if isinstance(model, diffusers.UNet2DConditionModel):
        kwargs["encoder_hidden_states"] = torch.randn(2, 5, 8, generator=gen)
    return model(x, t, **kwargs).sample


def perturb(model: nn.Module, seed: int = 1) -> None:
    """Move the LS parameters away from their init so round trips are meaningful."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.scalelong.parameters():
            p.add_(torch.randn(p.shape, generator=gen))


@pytest.fixture(params=list(MODELS))
def make(request):
    return MODELS[request.param]


def test_layout_counts_every_skip(make):
    model = make()
    assert skip_layout(model) == [(16, 16, 16), (16, 16, 16), (16, 8, 8), (32, 8, 8)]


def test_none_changes_nothing(make):
    model = make()
    before = run(model)
    apply_scalelong(model, method="none")
    assert (run(model) - before).abs().max().item() == 0.0


def test_cs_scales_each_merged_skip_by_kappa_power(make):
    kappa = 0.6
    model = make()
    produced, merged = {}, []
    outputs = [model.conv_in]
    model.conv_in.register_forward_hook(lambda m, a, out: produced.__setitem__(1, out))

    def record_down(_m, _a, out):  # a down block returns (hidden, res_samples)
        for s in out[1]:
            produced[len(produced) + 1] = s

    for block in model.down_blocks:
        block.register_forward_hook(record_down)
    apply_scalelong(model, method="cs", kappa=kappa)
    # what each up resnet really receives: cat([h, skip]); the skip is the tail of the channels
    for block in model.up_blocks:
        for resnet in block.resnets:
            resnet.register_forward_pre_hook(lambda _m, args: merged.append(args[0]))
    run(model)
    n = len(produced)
    assert n == 4 and len(merged) == n and len(outputs) == 1
    for j, cat in enumerate(merged):
        index = n - j  # consumed innermost first
        skip = produced[index]
        torch.testing.assert_close(cat[:, -skip.shape[1] :], kappa ** (index - 1) * skip, rtol=0, atol=0)


@pytest.mark.parametrize("method", ["ls", "ls-nonshare"])
def test_gradients_reach_ls_parameters(make, method):
    model = make().train()
    apply_scalelong(model, method=method)
    names = {n for n, _ in model.named_parameters() if n.startswith("scalelong.")}
    assert names and all(
        n.startswith("scalelong.") for n, _ in model.scalelong.named_parameters(prefix="scalelong")
    )
    run(model).square().mean().backward()
    for gate in model.scalelong.gates:
        assert sum(p.grad.abs().sum() for p in gate.parameters()) > 0


def test_deepcopy_uses_its_own_parameters(make):
    model = make()
    apply_scalelong(model, method="ls-nonshare")
    before = run(model)
    ema = copy.deepcopy(model)
    assert ema.up_blocks[0].__dict__["_scalelong_scaling"] is ema.scalelong
    torch.testing.assert_close(run(ema), before, rtol=0, atol=0)
    perturb(ema)
    assert not torch.allclose(run(ema), before)
    assert torch.equal(run(model), before)


def test_remove_restores_output_and_state_dict(make):
    model = make()
    before, keys = run(model), set(model.state_dict())
    apply_scalelong(model, method="ls")
    assert not torch.equal(run(model), before)
    remove_scalelong(model)
    assert torch.equal(run(model), before) and set(model.state_dict()) == keys
    apply_scalelong(model, method="cs")  # can be applied again after removal


def test_save_load_round_trip_via_from_pretrained(make, tmp_path):
    model = make()
    apply_scalelong(model, method="ls-nonshare", kappa=0.8, reduction=4)
    perturb(model)
    expected = run(model)
    save_scalelong(model, tmp_path)
    assert (tmp_path / "scalelong.json").is_file() and (tmp_path / "config.json").is_file()
    loaded = type(model).from_pretrained(tmp_path).eval()
    assert not hasattr(loaded, "scalelong")
    load_scalelong(loaded, tmp_path)
    s = loaded.scalelong
    assert (s.method, s.kappa, s.reduction) == ("ls-nonshare", 0.8, 4)
    assert torch.equal(run(loaded), expected)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_scalelong_weights_are_refused(tmp_path, damage):
    model = unet2d()
    apply_scalelong(model, method="ls", reduction=4)
    save_scalelong(model, tmp_path, save_model=False)
    weights = tmp_path / "scalelong.safetensors"
    data = bytearray(weights.read_bytes())
    if damage == "flip":
        data[-3] ^= 0x10  # one bit of one LS parameter: still a valid file, another number
    else:
        data = data[: len(data) // 2]
    weights.write_bytes(bytes(data))
    fresh = unet2d()
    with pytest.raises(ScaleLongError, match="scalelong.safetensors is damaged") as info:
        load_scalelong(fresh, tmp_path)
    assert "\n" not in str(info.value)
    assert not hasattr(fresh, "scalelong")  # nothing half-applied


def test_moves_with_the_model():
    model = unet2d()
    apply_scalelong(model, method="ls")
    model.to(torch.float64)
    assert all(p.dtype == torch.float64 for p in model.scalelong.parameters())
    x = torch.randn(1, 1, 16, 16, dtype=torch.float64)
    assert model(x, torch.tensor([3.0])).sample.dtype == torch.float64


def test_clear_errors(monkeypatch, tmp_path):
    model = unet2d()
    apply_scalelong(model, method="cs")
    with pytest.raises(ScaleLongError, match="already applied"):
        apply_scalelong(model, method="cs")
    with pytest.raises(ScaleLongError, match="UNet2DModel and UNet2DConditionModel"):
        apply_scalelong(nn.Linear(2, 2))
    with pytest.raises(ScaleLongError, match="not applied"):
        remove_scalelong(unet2d())
    with pytest.raises(ScaleLongError, match="no ScaleLong files"):
        load_scalelong(unet2d(), tmp_path)
    monkeypatch.setitem(sys.modules, "diffusers", None)  # as if the extra were not installed
    with pytest.raises(ScaleLongError, match=r"pip install scalelong\[diffusers\]"):
        apply_scalelong(model)


def test_train_diffusers_unet2d_from_config(tmp_path):
    from scalelong.config import load_config
    from scalelong.skips import skip_rows
    from scalelong.train import train

    overrides = [
        f"out_dir={tmp_path}",
        "name=diffusers",
        *TOY_DIFFUSERS_OVERRIDES,
        "train.steps=3",
        "train.batch_size=8",
        "train.log_every=1",
        "optim.warmup_steps=1",
        "sample.num_images=0",
    ]
    cfg = load_config("configs/demo.yaml", overrides)
    from scalelong.build import build_model

    rows = skip_rows(build_model(cfg.model))
    assert [r[1] for r in rows] == [(16, 32, 32), (16, 32, 32), (16, 16, 16), (32, 16, 16)]
    result = train(cfg, progress=False)
    assert torch.isfinite(torch.tensor(result.final_loss))
