"""model.type=python: the user's own network in train, info, compare and sweep.

The network lives in a file the test writes outside the package; its skips are found by
find_skips (or its adapter's layout, for a diffusers UNet a builder returns).
"""

import json

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from scalelong.cli import main
from scalelong.training.build import build_model
from scalelong.training.config import load_config

NETWORK = '''
import torch
from torch import nn


class Net(nn.Module):
    """Two skips, concatenated in this forward; a time embedding added in the middle."""

    def __init__(self, width, channels):
        super().__init__()
        self.enc0 = nn.Conv2d(channels, width, 3, padding=1)
        self.enc1 = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
        self.mid = nn.Conv2d(2 * width, 2 * width, 3, padding=1)
        self.temb = nn.Linear(1, 2 * width)
        self.dec1 = nn.Conv2d(4 * width, width, 3, padding=1)
        self.dec0 = nn.Conv2d(2 * width, channels, 3, padding=1)

    def forward(self, x, t):
        s1 = torch.relu(self.enc0(x))
        s2 = torch.relu(self.enc1(s1))
        h = torch.relu(self.mid(s2) + self.temb(t[:, None] / 1000)[:, :, None, None])
        h = torch.relu(self.dec1(torch.cat([h, s2], 1)))
        h = nn.functional.interpolate(h, scale_factor=2.0)
        return self.dec0(torch.cat([h, s1], 1))


def build(width=4, channels=1):
    return Net(width, channels)


def broken(width=4):
    raise ValueError("width must be even")


def not_a_module(width=4):
    return 42


def diffusers_unet(width=4):
    import diffusers

    blocks = {"down_block_types": ("DownBlock2D",) * 2, "up_block_types": ("UpBlock2D",) * 2}
    return diffusers.UNet2DModel(sample_size=16, in_channels=1, out_channels=1, layers_per_block=1,
                                 block_out_channels=(width, 2 * width), norm_num_groups=4, **blocks)
'''


def write_network(folder) -> str:
    (folder / "my_unet.py").write_text(NETWORK)
    return str(folder / "my_unet.py")


def write_images(folder, n: int = 24, side: int = 16) -> None:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (side, side), dtype=np.uint8), mode="L").save(
            folder / f"{i:03d}.png"
        )


def own_overrides(tmp_path, builder: str, *extra: str) -> list[str]:
    return [
        f"out_dir={tmp_path / 'runs'}",
        "name=mine",
        "model.type=python",
        f"model.python.builder={builder}",
        "model.python.kwargs.width=4",
        "model.python.in_channels=1",
        "model.python.img_size=16",
        "data.name=folder",
        f"data.path={tmp_path / 'images'}",
        "data.channels=1",
        "data.heldout=8",
        "diagnostics.noise_levels=8",
        "diagnostics.every=2",
        "train.steps=4",
        "train.batch_size=8",
        "train.log_every=2",
        "train.checkpoint_every=0",
        "train.tensorboard=false",
        "train.device=cpu",
        "optim.warmup_steps=1",
        "eval.every=0",
        "sample.num_images=0",
        *extra,
    ]


def test_the_builder_s_network_gets_the_found_skips(tmp_path):
    file = write_network(tmp_path)
    cfg = load_config(
        "configs/demo_uvit.yaml", own_overrides(tmp_path, f"{file}:build", "model.skip.method=cs")
    )
    model = build_model(cfg.model)
    assert model.skip_shapes(1) == [(1, 4, 16, 16), (1, 8, 8, 8)]
    assert model.net.scalelong.coefficients() == [1.0, 0.5]  # the demo's kappa 0.5, skip 1 outermost
    x, t = torch.randn(2, 1, 16, 16), torch.full((2,), 300.0)
    torch.manual_seed(0)
    plain = load_builder_net(file)
    scaled = model.net
    plain.load_state_dict({k: v for k, v in scaled.state_dict().items() if not k.startswith("scalelong")})
    assert not torch.equal(model(x, t), plain(x, t))  # cs scales skip 2 by 0.5
    dec0_input = []
    plain.dec1.register_forward_pre_hook(lambda _m, args: dec0_input.append(args[0].clone()))
    scaled.dec1.register_forward_pre_hook(lambda _m, args: dec0_input.append(args[0].clone()))
    plain(x, t), model(x, t)
    a, b = dec0_input
    assert torch.equal(b[:, :8], a[:, :8]) and torch.allclose(
        b[:, 8:], 0.5 * a[:, 8:]
    )  # the skip's half only


def load_builder_net(file):
    from scalelong.training.user_model import load_builder

    return load_builder(f"{file}:build")(width=4, channels=1)


def test_a_diffusers_unet_from_a_builder_goes_through_its_adapter(tmp_path, capsys):
    pytest.importorskip("diffusers")
    file = write_network(tmp_path)
    argv = [
        "info",
        "configs/demo_uvit.yaml",
        *own_overrides(tmp_path, f"{file}:diffusers_unet"),
        "model.skip.method=cs",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "model: python" in out and out.count("x16x16") == 2 and out.count("x8x8") == 2  # its 4 skips
    last = next(line for line in out.splitlines() if line.startswith("   4  "))
    assert last.split() == ["4", "8x8x8", "net.up_blocks.0(res_hidden_states_tuple[1])", "0.125"]  # 0.5 ** 3
    cfg = load_config("configs/demo_uvit.yaml", argv[2:])
    model = build_model(cfg.model)
    assert model(torch.randn(2, 1, 16, 16), torch.full((2,), 10.0)).shape == (2, 1, 16, 16)  # .sample


def test_sweep_trains_a_network_from_outside_the_package_on_a_folder_of_images(tmp_path, capsys):
    file = write_network(tmp_path)
    write_images(tmp_path / "images")
    base = ["sweep", "configs/demo_uvit.yaml", *own_overrides(tmp_path, f"{file}:build")]
    grid = ["--methods", "none,cs", "--lrs", "1e-3,1e3", "--no-progress"]
    assert main([*base, *grid, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "4 runs in" in out and "model: python" in out
    assert "24, 8 held out for the noise-level probe" in out  # the run trains on the other 16
    assert not (tmp_path / "runs").exists()
    assert main([*base, *grid]) == 0
    sweep = tmp_path / "runs" / "mine-sweep"
    report = (sweep / "report.md").read_text()
    assert (sweep / "stability.png").is_file() and "| none | 0.001 | 1 |" in report
    assert "| none | 1000 | 1 | " in report and "nonfinite" in report  # the divergence rule on it, unchanged
    run = sweep / "runs" / "lr0.001-cs-seed0"
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["model"]["python"] == {"builder": f"{file}:build", "kwargs": {"width": 4},
                                        "in_channels": 1, "img_size": 16}  # fmt: skip
    assert saved["data"]["heldout"] == 8 and saved["data"]["heldout_seed"] == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("noise/x0_mse@0.50" in r for r in records)  # measured on the held-out images
    assert any(k.startswith("block/") and k.endswith("feature_norm") for r in records for k in r)
    assert any(k.startswith("skip/2/") for r in records for k in r)


@pytest.mark.parametrize(
    "builder, words",
    [
        ("my_unet", ["must name the function that builds your network"]),
        ("no_such_package_xyz.net:build", ["cannot import 'no_such_package_xyz.net'", "ModuleNotFoundError"]),
        ("missing.py:build", ["no file missing.py"]),
        ("{file}:nope", ["has no function 'nope'"]),
        ("{file}:broken", ["raised ValueError: width must be even", "model.python.kwargs"]),
        ("{file}:not_a_module", ["returned a int, not a torch.nn.Module"]),
    ],
)
def test_a_bad_builder_is_one_error_line(tmp_path, capsys, builder, words):
    file = write_network(tmp_path)
    write_images(tmp_path / "images", n=16)
    argv = ["sweep", "configs/demo_uvit.yaml", *own_overrides(tmp_path, builder.format(file=file))]
    assert main([*argv, "--methods", "none,cs", "--lrs", "1e-3", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
    for word in words:
        assert word in err, (word, err)
