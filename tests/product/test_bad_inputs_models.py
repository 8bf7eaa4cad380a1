"""Bad models and damaged raw weights: each is one ``error:`` line on stderr, exit code 2, no
traceback, and nothing written (no run folder, no report, the run directory unchanged byte for byte)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_bad_inputs import files_under, refused

import scalelong.training.build
from conftest import REPO, tiny_uvit_overrides
from conftest import run_cli_on_cpu as cli
from scalelong.cli import main
from scalelong.errors import ScaleLongError
from scalelong.skips import MERGE_LAYER_METHODS, METHODS
from scalelong.training.build import build_model, check_model, check_models
from scalelong.training.checkpoint import save_checkpoint
from scalelong.training.config import config_to_dict, load_config, save_config

DEMO = REPO / "configs" / "demo_uvit.yaml"

UNET = ["model.type=unet", "model.unet.in_channels=1", "model.unet.attn_resolutions=[]"]
DIFFUSERS = ["model.type=diffusers_unet2d", "model.diffusers_unet2d.in_channels=1"]


def diffusers_blocks(channels: list[int], down: list[str], up: list[str]) -> list[str]:
    d = "model.diffusers_unet2d"
    return [
        *DIFFUSERS,
        f"{d}.block_out_channels=[{','.join(map(str, channels))}]",
        f"{d}.down_block_types=[{','.join(down)}]",
        f"{d}.up_block_types=[{','.join(up)}]",
    ]


# (model overrides, words of the one error line): shapes that pass config validation but that the
# backbone rejects, in its constructor or in its forward pass.
REJECTED = {
    "uvit-ls-tokens": (
        ["model.skip.method=ls", "model.uvit.patch_size=16"],  # 4 patches + 1 time token < 16
        [
            "model.uvit: the U-ViT rejects this config: LS needs at least reduction=16 tokens",
            "change model.uvit.img_size, patch_size",
            "or model.skip.ls_reduction",
        ],
    ),
    "unet-norm-groups": (
        [*UNET, "model.unet.base_channels=16", "model.unet.channel_mult=[1,2]"],  # a 16 + 32 decoder input
        [
            "model.unet: the UNet rejects this config: num_channels (48) must be divisible by num_groups",
            "change model.unet.base_channels, channel_mult, norm_groups",
        ],
    ),
    "diffusers-cross-attention": (
        diffusers_blocks(
            [32, 64], ["DownBlock2D", "CrossAttnDownBlock2D"], ["CrossAttnUpBlock2D", "UpBlock2D"]
        ),
        [
            "model.diffusers_unet2d: the diffusers UNet2DModel rejects this config: cross_attention_dim "
            "must be specified for CrossAttnDownBlock2D; change model.diffusers_unet2d.block_out_channels",
        ],
    ),
    "diffusers-odd-side": (  # 30 -> 15 -> 8 on the way down, 8 -> 16 on the way up: no skip fits
        [
            *diffusers_blocks([32] * 3, ["DownBlock2D"] * 3, ["UpBlock2D"] * 3),
            "model.diffusers_unet2d.sample_size=30",
        ],
        [
            "model.diffusers_unet2d: the diffusers UNet2DModel fails on a 1x30x30 input: Sizes of tensors",
            "or sample_size",
        ],
    ),
}

# Shapes config validation refuses first: their messages stay as they were.
VALIDATED = {
    "uvit-heads": (
        ["model.uvit.embed_dim=30", "model.uvit.num_heads=4"],
        ["embed_dim=30 must be divisible by num_heads=4"],
    ),
    "uvit-patch": (["model.uvit.patch_size=5"], ["img_size=32 must be divisible by patch_size=5"]),
    "diffusers-groups": (
        [
            *diffusers_blocks([32, 48], ["DownBlock2D"] * 2, ["UpBlock2D"] * 2),
            "model.diffusers_unet2d.norm_num_groups=32",
        ],
        ["block_out_channels must all be divisible by norm_num_groups=32"],
    ),
    "diffusers-counts": (
        diffusers_blocks([32, 64], ["DownBlock2D"] * 2, ["UpBlock2D"] * 3),
        ["block_out_channels, down_block_types and up_block_types need the same non-zero length"],
    ),
}

COMMANDS = {"train --dry-run": ["train", "--dry-run"], "train": ["train", "--no-progress"], "info": ["info"]}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", [*REJECTED, *VALIDATED])
def test_a_model_its_backbone_rejects_is_one_line(tmp_path, capsys, monkeypatch, case, command):
    monkeypatch.chdir(tmp_path)
    overrides, words = {**REJECTED, **VALIDATED}[case]
    first, *flags = COMMANDS[command]
    argv = [first, DEMO, *tiny_uvit_overrides("bad", tmp_path / "runs"), *overrides, *flags]
    refused(capsys, argv, *words)
    assert files_under(tmp_path) == []


@pytest.mark.parametrize("study", ["compare", "sweep"])
def test_a_study_checks_every_runs_model_before_any_run(tmp_path, capsys, monkeypatch, study):
    monkeypatch.chdir(tmp_path)
    overrides = [
        *tiny_uvit_overrides("s", tmp_path / "runs"),
        "model.uvit.patch_size=16",
    ]  # none builds, ls not
    argv = [study, DEMO, *overrides, "--methods", "none,ls", "--no-progress"]
    if study == "sweep":
        argv += ["--lrs", "1e-3"]
    run = "ls-seed0" if study == "compare" else "d2-lr0.001-ls-seed0"
    refused(capsys, argv, f"run {run}: model.uvit: the U-ViT rejects this config: LS needs at least")
    assert files_under(tmp_path) == []


@pytest.mark.parametrize("config", sorted(DEMO.parent.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_recipe_passes_the_model_check_with_every_method(config):
    rng = torch.get_rng_state()
    for method in METHODS:  # the check must never refuse a model that trains
        overrides = ["data.path=/nowhere", f"model.skip.method={method}"]
        if method in MERGE_LAYER_METHODS and "type: unet" in config.read_text():
            # no merge layer to normalise after or rescale: refused by the config, before any model
            with pytest.raises(ScaleLongError, match=f"^model.skip.method={method} needs one merge layer"):
                load_config(config, overrides)
            continue
        cfg = load_config(config, overrides)
        model = check_model(cfg.model)
        small = sum(p.numel() for p in model.parameters()) <= scalelong.training.build.CHECK_ON_CPU_PARAMETERS
        assert next(model.parameters()).device.type == ("cpu" if small else "meta")
    assert torch.equal(torch.get_rng_state(), rng)  # nothing drawn: a run's initialisation is unchanged


@pytest.mark.parametrize("case", ["uvit-ls-tokens", "diffusers-odd-side"])
def test_a_model_above_the_cpu_check_size_is_checked_on_the_meta_device(monkeypatch, case):
    cfg = load_config(DEMO, ["data.path=/nowhere"])
    monkeypatch.setattr(scalelong.training.build, "CHECK_ON_CPU_PARAMETERS", 0)
    assert next(check_model(cfg.model).parameters()).is_meta
    overrides, words = REJECTED[case]
    with pytest.raises(ScaleLongError) as meta_error:
        check_model(load_config(DEMO, ["data.path=/nowhere", *overrides]).model)
    monkeypatch.undo()
    with pytest.raises(ScaleLongError) as cpu_error:
        check_model(load_config(DEMO, ["data.path=/nowhere", *overrides]).model)
    for error in (meta_error, cpu_error):
        assert all(w in str(error.value) for w in words), str(error.value)


def test_the_model_check_of_the_demo_imports_no_symbolic_shapes():
    # torch's meta kernels pull in sympy on the first convolution: 1.5 s in every CLI process
    code = (
        "import sys; from scalelong.training.build import check_model; "
        "from scalelong.training.config import load_config; "
        f"check_model(load_config({str(DEMO)!r}).model); print('sympy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_study_checks_each_model_config_once(monkeypatch):
    checked = []
    monkeypatch.setattr(scalelong.training.build, "check_model", lambda cfg: checked.append(cfg.skip.method))
    cfgs = [
        load_config(None, [f"model.skip.method={m}", f"train.seed={s}"])
        for s in (0, 1)
        for m in ("none", "cs")
    ]
    check_models(cfgs)
    assert checked == ["none", "cs"]  # the second seed of each method shares the first one's model


def test_train_checks_the_model_before_it_builds_it_for_the_run(tmp_path, capsys, monkeypatch):
    devices = []
    construct = scalelong.training.build._construct

    def spy(cfg):
        devices.append(str(torch.get_default_device()))
        return construct(cfg)

    monkeypatch.setattr(scalelong.training.build, "_construct", spy)
    overrides = [*tiny_uvit_overrides("once", tmp_path / "runs", steps=2), "sample.num_images=0"]
    assert main(["train", str(DEMO), *overrides, "--no-progress"]) == 0, capsys.readouterr().err
    assert devices == ["meta", "cpu", "cpu"]  # counted on meta, checked on the CPU, then the run's


# ----------------------------------------------------------------------------- damaged raw weights

TINY = [
    "model.uvit.patch_size=8",
    "model.uvit.in_channels=1",
    "model.uvit.embed_dim=16",
    "model.uvit.depth=2",
    "model.uvit.num_heads=2",
    "sample.sampler=dpm_solver",
    "sample.steps=2",
    "eval.steps=2",
    "eval.batch_size=8",
]


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    """A run with two weights-only checkpoints whose raw weights differ from their EMA weights; the
    newest has 64 bytes of its model.safetensors flipped inside the last tensor."""
    cfg = load_config(None, [*TINY, "name=r", f"out_dir={tmp_path}"])
    cfg.run_dir.mkdir(parents=True)
    save_config(cfg, cfg.run_dir / "config.yaml")
    for step in (10, 20):
        torch.manual_seed(step)
        model, ema = build_model(cfg.model), build_model(cfg.model)
        save_checkpoint(cfg.run_dir / "checkpoints", step, model, ema, config_to_dict(cfg))
    flip_64_bytes(cfg.run_dir / "checkpoints" / "step-000020" / "model.safetensors")
    return cfg.run_dir


def flip_64_bytes(file: Path) -> None:
    data = bytearray(file.read_bytes())
    for i in range(len(data) - 64, len(data)):  # the last tensor's data: still a valid safetensors file
        data[i] ^= 0xFF
    file.write_bytes(bytes(data))


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in root.rglob("*")}


EVAL = ["eval", "--n", 4, "--metric", "fd-mnist", "--weights", "model"]


def test_eval_and_sample_verify_the_raw_weights_like_the_ema(run_dir, tmp_path, capsys):
    # the newest checkpoint: the raw weights fall back to the one before, in one warning line
    code, out, err = cli(capsys, EVAL[0], run_dir, *EVAL[1:])
    assert code == 0, err
    (warning,) = [line for line in out.splitlines() if line.startswith("warning:")]
    assert "step-000020 is damaged (model.safetensors fails its checksum); using step-000010" in warning
    (result,) = [json.loads(p.read_text()) for p in (run_dir / "eval").iterdir()]
    assert result["checkpoint"] == "step-000010" and result["weights"] == "model"
    assert (run_dir / "eval" / "fd-mnist-step-000010-model-n4-dpm_solver2.json").is_file()
    code, out, err = cli(capsys, "sample", run_dir, "--n", 2, "--out", tmp_path / "s", "--weights", "model")
    assert code == 0 and "using step-000010" in out and "from " in out and "step-000010 in" in out
    # the EMA weights of the same checkpoint are intact and load without a word
    code, out, _ = cli(capsys, "sample", run_dir, "--n", 2, "--out", tmp_path / "e", "--step", 20)
    assert code == 0 and "warning" not in out and "step-000020 in" in out


@pytest.mark.parametrize("command", ["eval", "sample"])
def test_damaged_raw_weights_asked_for_are_refused_and_nothing_is_written(run_dir, tmp_path, capsys, command):
    before = snapshot(tmp_path)
    args = EVAL[1:] if command == "eval" else ["--n", 2, "--out", tmp_path / "out", "--weights", "model"]
    refused_line = "step-000020 is damaged (model.safetensors fails its checksum); choose another --step"
    code, out, err = cli(capsys, command, run_dir, *args, "--step", 20)
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1 and refused_line in err
    assert snapshot(tmp_path) == before
    flip_64_bytes(run_dir / "checkpoints" / "step-000010" / "model.safetensors")
    before = snapshot(tmp_path)
    code, out, err = cli(capsys, command, run_dir, *args)
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1 and "warning" not in out
    assert "every checkpoint in" in err and "step-000010: model.safetensors fails its checksum" in err
    assert snapshot(tmp_path) == before
