"""What only diffusers' UNets have: their own files (``save_pretrained`` / ``from_pretrained``),
FreeU, and the trainer's wrapper (``model.type=diffusers_unet2d``). The contract every backbone
meets (scaling, removal, copies, save / load / describe) is in test_adapters_backbones.py."""

import logging
import sys

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from adapter_fixtures import (  # noqa: E402
    TOY_DIFFUSERS_OVERRIDES,
    run_unet2d,
    run_unet2d_condition,
    unet2d,
    unet2d_condition,
)
from scalelong import apply_scalelong, describe, is_applied, load_scalelong, save_scalelong  # noqa: E402
from scalelong.errors import ScaleLongError  # noqa: E402

MODELS = {
    "UNet2DModel": (unet2d, run_unet2d),
    "UNet2DConditionModel": (unet2d_condition, run_unet2d_condition),
}


def perturb(model, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.scalelong.parameters():
            p.add_(torch.randn(p.shape, generator=gen))


class Unused(logging.Handler):
    """Collects diffusers' 'Some weights of the model checkpoint ... were not used' warnings."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "were not used" in record.getMessage():
            self.messages.append(record.getMessage())

    def __enter__(self):
        logging.getLogger("diffusers").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("diffusers").removeHandler(self)


@pytest.mark.parametrize("kind", list(MODELS))
def test_save_scalelong_writes_clean_diffusers_files_and_from_pretrained_plus_load_restores(kind, tmp_path):
    build, run = MODELS[kind]
    model = build().eval()
    apply_scalelong(model, "ls-nonshare", 0.8, reduction=4)
    perturb(model)
    expected = run(model)
    save_scalelong(model, tmp_path)  # a diffusers model: its own files are written too
    assert (tmp_path / "config.json").is_file() and (tmp_path / "scalelong.json").is_file()
    with Unused() as unused:
        loaded = type(model).from_pretrained(tmp_path).eval()
    assert unused.messages == [] and not hasattr(loaded, "scalelong")  # diffusers sees a plain UNet
    load_scalelong(loaded, tmp_path)
    s = loaded.scalelong
    assert (s.method, s.kappa, s.reduction) == ("ls-nonshare", 0.8, 4)
    assert torch.equal(run(loaded), expected)


def test_save_pretrained_keeps_no_scalelong_it_writes_the_gates_that_from_pretrained_drops(tmp_path):
    """What docs/own-loop.md says of save_pretrained: the model's files as diffusers sees them."""
    model = unet2d().eval()
    apply_scalelong(model, "ls", reduction=4)
    model.save_pretrained(tmp_path)
    with Unused() as unused:
        loaded = type(model).from_pretrained(tmp_path)
    assert len(unused.messages) == 1 and "scalelong.gates.0" in unused.messages[0]
    assert not is_applied(loaded) and not hasattr(loaded, "scalelong")  # the method is gone


@pytest.mark.parametrize("method", ["cs", "ls"])
def test_freeu_filters_the_skip_after_scalelong_scaled_it(method):
    """FreeU (enable_freeu) acts inside the up blocks on each skip they pop, so on what the
    ScaleLong pre-hook already scaled: skip' = fourier_filter(coefficient * skip, 1, s)."""
    from diffusers.utils.torch_utils import fourier_filter

    s1, s2, b1, b2 = 0.6, 0.3, 1.2, 1.4
    model = unet2d_condition().eval()
    apply_scalelong(model, method, 0.7, reduction=4)
    plain = run_unet2d_condition(model)
    model.enable_freeu(s1=s1, s2=s2, b1=b1, b2=b2)
    produced, merged, scaled = [], [], {}
    model.conv_in.register_forward_hook(lambda _m, _a, out: produced.append(out))
    for block in model.down_blocks:
        block.register_forward_hook(lambda _m, _a, out: produced.extend(out[1]))
    for k, block in enumerate(model.up_blocks):
        for resnet in block.resnets:  # each resnet merges cat([h, skip']) after FreeU
            resnet.register_forward_pre_hook(lambda _m, args, k=k: merged.append((k, args[0])))
    model.scalelong.probe = lambda i, skip, coef, out: scaled.__setitem__(i, out)
    with torch.no_grad():
        both = run_unet2d_condition(model)
    n = model.scalelong.num_skips
    assert len(produced) == len(merged) == n == 4
    assert not torch.allclose(both, plain)  # FreeU is on
    for j, (k, cat) in enumerate(merged):
        index = n - j  # consumed innermost first
        skip = produced[index - 1]
        if method == "cs":
            torch.testing.assert_close(scaled[index], 0.7 ** (index - 1) * skip, rtol=0, atol=0)
        expected = fourier_filter(scaled[index], threshold=1, scale=(s1, s2)[k])  # up blocks 0, 1
        torch.testing.assert_close(cat[:, -skip.shape[1] :], expected, rtol=1e-5, atol=1e-6)
    if method == "cs":  # the output: that of the plain UNet with FreeU whose tuples are scaled by hand
        reference = unet2d_condition().eval()
        reference.enable_freeu(s1=s1, s2=s2, b1=b1, b2=b2)
        first = n + 1
        for block in reference.up_blocks:
            first -= len(block.resnets)

            def by_hand(_m, args, kwargs, first=first):
                skips = kwargs["res_hidden_states_tuple"]  # UNet2DConditionModel passes it by keyword
                scaled = tuple(0.7 ** (first + j - 1) * s for j, s in enumerate(skips))
                return args, {**kwargs, "res_hidden_states_tuple": scaled}

            block.register_forward_pre_hook(by_hand, with_kwargs=True)
        with torch.no_grad():
            torch.testing.assert_close(both, run_unet2d_condition(reference), rtol=0, atol=0)


def test_the_trainers_wrapper_is_served_through_the_unet_it_holds(tmp_path):
    from scalelong.skips import skip_table
    from scalelong.training.build import DiffusersUNet2D

    unet = unet2d().eval()
    apply_scalelong(unet, "ls", reduction=4)
    wrapped = DiffusersUNet2D(unet)
    rows = describe(wrapped)
    assert [r.module for r in rows] == ["unet.up_blocks.1"] * 2 + ["unet.up_blocks.0"] * 2
    assert [r.input for r in rows] == [f"res_hidden_states_tuple[{j}]" for j in (0, 1, 0, 1)]
    assert "unet.up_blocks.1(res_hidden_states_tuple[0])" in skip_table(wrapped)
    perturb(unet)
    x, t = torch.randn(2, 1, 16, 16), torch.tensor([3.0, 700.0])
    expected = wrapped(x, t)
    save_scalelong(wrapped, tmp_path)  # no save_pretrained on the wrapper: ScaleLong's files only
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scalelong.json", "scalelong.safetensors"]
    fresh = DiffusersUNet2D(unet2d().eval())
    load_scalelong(fresh, tmp_path)
    assert is_applied(fresh.unet) and torch.equal(fresh(x, t), expected)


def test_a_file_of_the_earlier_diffusers_only_format_still_loads(tmp_path):
    import json

    model = unet2d().eval()
    apply_scalelong(model, "ls", reduction=4)
    perturb(model)
    save_scalelong(model, tmp_path, save_model=False)
    meta = json.loads((tmp_path / "scalelong.json").read_text())
    old = {k: meta[k] for k in ("method", "kappa", "reduction", "num_skips", "weights")}  # what it wrote
    (tmp_path / "scalelong.json").write_text(json.dumps(old))
    fresh = unet2d().eval()
    load_scalelong(fresh, tmp_path)
    assert torch.equal(run_unet2d(fresh), run_unet2d(model))


def test_train_diffusers_unet2d_from_config(tmp_path):
    from scalelong.training.build import build_model
    from scalelong.training.config import load_config
    from scalelong.training.train import train

    overrides = [
        f"out_dir={tmp_path}",
        "name=diffusers",
        *TOY_DIFFUSERS_OVERRIDES,
        "train.steps=3",
        "train.batch_size=8",
        "train.log_every=1",
        "optim.warmup_steps=1",
        "sample.num_images=0",
        "eval.every=0",  # the demo's evaluation at the last step: 256 samples of 50 solver steps
        "diagnostics.noise_levels=8",  # the probe at the end runs on the wrapper, on 8 images not 256
    ]
    cfg = load_config("configs/demo_uvit.yaml", overrides)
    rows = describe(build_model(cfg.model))
    assert [r.shape for r in rows] == [(16, 32, 32), (16, 32, 32), (16, 16, 16), (32, 16, 16)]
    result = train(cfg, progress=False)
    assert torch.isfinite(torch.tensor(result.final_loss))


def test_a_diffusers_model_type_without_the_extra_names_it(monkeypatch):
    from scalelong.training.build import build_model
    from scalelong.training.config import load_config

    cfg = load_config("configs/demo_uvit.yaml", TOY_DIFFUSERS_OVERRIDES)
    monkeypatch.setitem(sys.modules, "diffusers", None)  # as if the extra were not installed
    with pytest.raises(ScaleLongError, match=r"pip install scalelong\[diffusers\]"):
        build_model(cfg.model)
