import pytest
import torch
from torch import nn

from scalelong.cli import main
from scalelong.errors import ScaleLongError
from scalelong.models import UNet
from scalelong.models.unet import Upsample
from scalelong.skips import ChannelGate, SharedChannelGate, SkipScaling
from scalelong.training.config import load_config

DDPM_SKIP_CHANNELS = [128] * 4 + [256] * 8


def tiny(method: str = "none", kappa: float = 0.7, **kw) -> UNet:
    args = dict(
        img_size=16,
        in_channels=1,
        base_channels=16,
        channel_mult=(1, 2),
        num_res_blocks=2,
        attn_resolutions=(8,),
        dropout=0.0,
        norm_groups=8,
    )
    return UNet(**{**args, **kw}, skip_method=method, kappa=kappa).eval()


def inputs(n: int = 3, side: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 1, side, side), torch.rand(n) * 999


class Bypass(nn.Module):
    def forward(self, skip: torch.Tensor, index: int) -> torch.Tensor:
        return skip


def test_ddpm_cifar10_parameter_count_and_skip_layout():
    with torch.device("meta"):  # shapes only
        model = UNet()  # the DDPM CIFAR-10 defaults
    assert sum(p.numel() for p in model.parameters()) == 35_746_307  # DDPM paper: 35.7M
    assert model.num_skips == 12  # levels * (blocks + 1) = 4 * 3: conv-in, 8 res, 3 downsamples
    shapes = model.skip_shapes(2)
    assert shapes[0] == (2, 128, 32, 32) and shapes[3] == (2, 128, 16, 16)
    assert shapes[4] == (2, 256, 16, 16) and shapes[-1] == (2, 256, 4, 4)


def test_none_is_bit_identical_to_bypassed_scaling():
    model = tiny("none")
    x, t = inputs()
    out = model(x, t)
    model.skip_scaling = Bypass()
    assert torch.equal(out, model(x, t))


def test_cs_every_merged_skip_is_kappa_power_times_encoder_output():
    kappa = 0.6
    model = tiny("cs", kappa)
    encoder_out, merged = {}, []
    encoder = [model.conv_in, *model.down]
    for i, m in enumerate(encoder, start=1):
        m.register_forward_hook(lambda _m, _a, out, i=i: encoder_out.__setitem__(i, out))
    decoder = [b for b in model.up if not isinstance(b, Upsample)]
    for b in decoder:
        b.register_forward_pre_hook(lambda _m, args: merged.append(args[0]))
    x, t = inputs()
    model(x, t)
    n = model.num_skips
    assert len(encoder_out) == len(merged) == n == 6
    for j, cat in enumerate(merged):
        index = n - j  # the decoder meets the innermost skip first
        skip = encoder_out[index]
        scaled = cat[:, cat.shape[1] - skip.shape[1] :]  # the merge is cat([h, skip])
        torch.testing.assert_close(scaled, kappa ** (index - 1) * skip, rtol=0, atol=0)


def test_learned_gates_and_gradients():
    for method, kind in (("ls", SharedChannelGate), ("ls-nonshare", ChannelGate)):
        model = tiny(method).train()
        gates = model.skip_scaling.gates
        assert len(gates) == (1 if method == "ls" else model.num_skips)
        assert all(isinstance(g, kind) for g in gates)
        x, t = inputs()
        model(x, t).square().mean().backward()
        for gate in gates:  # (a ReLU unit of a width-1 bottleneck may be dead: test per gate)
            assert all(p.grad is not None for p in gate.parameters())
            assert sum(p.grad.abs().sum() for p in gate.parameters()) > 0
        coef = model.skip_scaling.gate_for(2)(torch.randn(2, 16, 16, 16))
        assert coef.shape == (2, 16, 1, 1) and 0.2 < coef.min() and coef.max() < 0.8  # near 0.5


def test_ls_parameter_cost_on_ddpm_layout():
    shared = SkipScaling("ls", 12, skip_channels=DDPM_SKIP_CHANNELS)
    nonshare = SkipScaling("ls-nonshare", 12, skip_channels=DDPM_SKIP_CHANNELS)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(shared) == (4 * 16 + 16 + 16 + 1) + (128 + 256) == 481
    assert count(nonshare) == 4 * (2 * 128 * 8 + 8 + 128) + 8 * (2 * 256 * 16 + 16 + 256) == 76_448


def test_shared_gate_rejects_unknown_width_and_layout_errors():
    scaling = SkipScaling("ls", 2, skip_channels=[8, 16])
    with pytest.raises(ScaleLongError, match="widths 8, 16"):
        scaling(torch.randn(1, 32, 4, 4), 1)
    with pytest.raises(ScaleLongError, match="2 skips"):
        SkipScaling("ls-nonshare", 2, skip_channels=[8])
    with pytest.raises(ScaleLongError, match="divisible"):
        tiny(img_size=15)


def test_class_conditioning():
    model = tiny(num_classes=3)
    x, t = inputs(2)
    a = model(x, t, torch.tensor([0, 0]))
    b = model(x, t, torch.tensor([1, 2]))
    assert a.shape == x.shape and not torch.allclose(a, b)
    with pytest.raises(ScaleLongError, match="labels"):
        model(x, t)


def test_an_unconditional_unet_refuses_labels_instead_of_ignoring_them():
    model = tiny()
    x, t = inputs(2)
    with pytest.raises(ScaleLongError, match=r"not class-conditional \(num_classes=0\).*num_classes > 0"):
        model(x, t, torch.tensor([0, 1]))
    with pytest.raises(ScaleLongError, match="must be an integer >= 1"):
        tiny("ls-nonshare", ls_reduction=0)


def test_info_prints_skip_table(capsys):
    assert main(["info", "configs/cifar10_unet_ddpm.yaml", "model.skip.method=ls-nonshare"]) == 0
    out = capsys.readouterr().out
    assert "35,822,755" in out  # 35,746,307 + 76,448 gate parameters
    rows = [line.split() for line in out.splitlines() if line[:4].strip().isdigit()]
    assert [int(r[0]) for r in rows] == list(range(1, 13))  # 4 levels * (2 blocks + 1)
    assert rows[0][1] == "128x32x32" and rows[-1][1] == "256x4x4"
    assert rows[4][2:] == ["built-in", "ls-nonshare:", "ChannelGate", "5"]


def test_config_validation():
    with pytest.raises(ScaleLongError, match="model.unet.img_size"):
        load_config("configs/cifar10_unet_ddpm.yaml", ["model.unet.img_size=20"])
    with pytest.raises(ScaleLongError, match="model.unet.channel_mult"):
        load_config("configs/cifar10_unet_ddpm.yaml", ["model.unet.channel_mult=[]"])
    with pytest.raises(ScaleLongError, match="unknown config key"):
        load_config("configs/cifar10_unet_ddpm.yaml", ["model.unet.width=3"])
    # one check of the sizes serves the config (naming the key) and the constructor
    with pytest.raises(ScaleLongError, match=r"^model.unet.attn_heads=3 must divide every level width"):
        load_config("configs/cifar10_unet_ddpm.yaml", ["model.unet.attn_heads=3"])
    with pytest.raises(ScaleLongError, match=r"^attn_heads=3 must divide every level width"):
        tiny(attn_heads=3)


def test_train_tiny_unet_from_config(tmp_path):
    """The DDPM recipe with a tiny UNet learns: the loss falls and every LS gate tensor trains."""
    import json

    from safetensors.torch import load_file

    from scalelong.training.build import build_model
    from scalelong.training.train import train

    overrides = [
        f"out_dir={tmp_path}",
        "name=unet",
        "model.skip.method=ls",
        "model.unet.in_channels=1",
        "model.unet.dropout=0",
        "data.name=mnist",
        "train.checkpoint_every=0",
        "model.unet.base_channels=16",
        "model.unet.channel_mult=[1,2]",
        "model.unet.num_res_blocks=1",
        "model.unet.attn_resolutions=[]",
        "model.unet.norm_groups=8",
        "train.steps=10",
        "train.batch_size=8",
        "train.log_every=1",
        "optim.lr=2e-3",
        "optim.warmup_steps=1",
        "sample.num_images=0",
        "diagnostics.noise_levels=8",  # the end-of-run probe on 8 held-out images, not 256
    ]
    cfg = load_config("configs/cifar10_unet_ddpm.yaml", overrides)
    result = train(cfg, progress=False)
    records = (result.run_dir / "metrics.jsonl").read_text().splitlines()
    losses = [json.loads(line)["loss"] for line in records]
    assert len(losses) == 10 and all(0 < v < 2 for v in losses)
    # epsilon-MSE starts near 1; ten steps at lr 2e-3 bring it well below half of that
    assert losses[0] > 0.9 and max(losses[-3:]) < 0.5 * losses[0], losses
    assert result.final_loss == losses[-1]
    torch.manual_seed(cfg.train.seed)
    init = build_model(cfg.model).state_dict()
    trained = load_file(result.checkpoint / "model.safetensors")
    gates = [k for k in trained if k.startswith("skip_scaling.")]
    assert gates and all(not torch.equal(trained[k], init[k]) for k in gates)


def test_unset_kappa_resolves_per_backbone():
    from scalelong.skips import find_skip_scaling
    from scalelong.training.build import build_model
    from scalelong.training.config import ModelConfig, SkipConfig, UNetConfig

    for model_type, kappa in (("uvit", 0.5), ("unet", 0.9), ("diffusers_unet2d", 0.9)):
        assert load_config(None, [f"model.type={model_type}"]).model.skip.kappa == kappa
        given = load_config(None, [f"model.type={model_type}", "model.skip.kappa=0.7"])
        assert given.model.skip.kappa == 0.7
    # a config made in Python, never validated, builds the same model
    small = UNetConfig(base_channels=16, channel_mult=[1, 2], attn_resolutions=[], norm_groups=8)
    model = build_model(ModelConfig(type="unet", skip=SkipConfig(method="cs"), unet=small), device="meta")
    assert find_skip_scaling(model).kappa == 0.9


def test_unet_config_without_kappa_resolves_to_0_9_shows_it_and_resumes(tmp_path, capsys):
    """The DDPM UNet's 12 skips: without a kappa the innermost gets 0.9 ** 11, not 0.5 ** 11 = 5e-4."""
    config = tmp_path / "unet.yaml"
    config.write_text("model:\n  type: unet\n  skip:\n    method: cs\n")
    assert main(["info", str(config)]) == 0
    stdout = capsys.readouterr().out
    assert "skips: cs, kappa=0.9" in stdout
    rows = [line.split() for line in stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [int(r[0]) for r in rows] == list(range(1, 13))
    assert [float(r[3]) for r in rows] == pytest.approx([0.9**i for i in range(12)], rel=1e-5)  # 6 digits

    # the run directory stores the resolved kappa, and the same YAML resumes from it
    tiny_run = [
        f"out_dir={tmp_path}",
        "name=unet",
        "model.unet.in_channels=1",
        "model.unet.base_channels=16",
        "model.unet.channel_mult=[1,2]",
        "model.unet.num_res_blocks=1",
        "model.unet.attn_resolutions=[]",
        "model.unet.norm_groups=8",
        "train.batch_size=4",
        "sample.num_images=0",
        "diagnostics.every=0",
        "diagnostics.noise_levels=8",  # the end-of-run probe on 8 held-out images, not 256
        "--no-progress",
    ]
    assert main(["train", str(config), "train.steps=2", *tiny_run]) == 0
    assert load_config(tmp_path / "unet" / "config.yaml").model.skip.kappa == 0.9
    assert "kappa: 0.9" in (tmp_path / "unet" / "config.yaml").read_text()
    capsys.readouterr()
    assert main(["train", str(config), "train.steps=3", *tiny_run]) == 0
    assert "resuming" in capsys.readouterr().out
