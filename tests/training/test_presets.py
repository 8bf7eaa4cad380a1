"""Presets: the recipes shipped in the package, chosen by name wherever a config goes."""

from pathlib import Path

import pytest

from conftest import REPO, run_cli
from scalelong.cli import build_parser
from scalelong.errors import ScaleLongError
from scalelong.training.config import config_to_dict, load_config
from scalelong.training.presets import PRESET_DIR, preset_names, presets, resolve_config

SHIPPED = [
    "celeba64_uvit_s4",
    "cifar10_unet_ddpm",
    "cifar10_uvit_s2",
    "demo",
    "demo_uvit",
    "imagenet64_uvit_m4",
    "mscoco_uvit_s2_t2i",
    "stability",
]
# Every command whose first argument is a config, with the arguments it needs besides.
CONFIG_COMMANDS = {"train": [], "info": [], "compare": [], "sweep": [], "fid-stats": ["--out", "stats.npz"]}


def test_the_clone_configs_folder_is_the_packaged_presets():
    assert preset_names() == SHIPPED
    assert (REPO / "configs").is_symlink()
    assert (REPO / "configs").resolve() == PRESET_DIR.resolve()
    assert PRESET_DIR.resolve().is_relative_to(REPO / "src" / "scalelong")


@pytest.mark.parametrize("name", SHIPPED)
def test_a_preset_by_name_is_the_same_config_as_its_file(name):
    by_name = load_config(name, ["train.steps=7"])
    assert config_to_dict(by_name) == config_to_dict(load_config(f"configs/{name}.yaml", ["train.steps=7"]))
    assert by_name.name == name and by_name.train.steps == 7


def test_every_preset_has_a_one_line_description():
    table = presets()
    assert list(table) == SHIPPED
    for name, description in table.items():
        # A sentence of its own: the first line of the file's leading comment.
        assert description.endswith(".") and len(description) <= 100, (name, description)
    assert table["demo"].startswith("The demo: a small convolutional UNet")
    assert table["demo_uvit"].startswith("The demo's U-ViT")


def test_configs_command_lists_every_preset(capsys):
    code, out, err = run_cli(capsys, "configs")
    assert code == 0, err
    rows = {line.split()[0]: line.split(None, 1)[1] for line in out.splitlines()[: len(SHIPPED)]}
    assert rows == presets()
    assert str(PRESET_DIR) in out


def test_a_file_wins_over_a_preset_of_the_same_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo").write_text("name: mine\ntrain:\n  steps: 3\n")
    cfg = load_config("demo")
    assert (cfg.name, cfg.train.steps) == ("mine", 3)
    (tmp_path / "demo").unlink()
    assert load_config("demo").name == "demo"


def test_paths_are_never_preset_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_config(str(PRESET_DIR / "demo.yaml")) == PRESET_DIR / "demo.yaml"
    # A Path, a suffix or a folder says "file": a missing one is not looked up among the presets.
    cases = [(Path("demo"), False), ("./demo", False), ("demo.yaml", True), ("a/demo.yaml", True)]
    for missing, hint in cases:  # hint: the file's name is a preset's
        with pytest.raises(ScaleLongError, match=f"^config file not found: {missing}") as e:
            resolve_config(missing)
        assert str(e.value).endswith("; for the preset shipped with scalelong, pass its name: demo") == hint
    with pytest.raises(ScaleLongError) as e:
        resolve_config("other/recipe.yaml")
    assert str(e.value) == "config file not found: other/recipe.yaml"


def test_the_command_line_takes_a_preset_name(tmp_path, monkeypatch, capsys):
    """From a folder without configs/, the name gives what the clone's file gives."""
    code, from_file, err = run_cli(capsys, "train", "configs/demo_uvit.yaml", "--dry-run")
    assert code == 0, err
    monkeypatch.chdir(tmp_path)
    code, from_name, err = run_cli(capsys, "train", "demo_uvit", "--dry-run")
    assert code == 0, err
    assert from_name == from_file and "model: uvit" in from_name
    code, from_name, err = run_cli(capsys, "info", "cifar10_uvit_s2", "model.skip.method=cs")
    assert code == 0, err
    assert "44,255,328 parameters" in from_name


def test_the_stability_preset_is_the_demo_uvit_at_a_constant_lr(capsys):
    stability, demo = config_to_dict(load_config("stability")), config_to_dict(load_config("demo_uvit"))
    for section in ("model", "data", "diffusion"):
        assert stability[section] == demo[section], section
    assert stability["train"]["ema_decay"] == demo["train"]["ema_decay"]
    o = stability["optim"]
    assert (o["lr_schedule"], o["betas"], o["weight_decay"]) == ("constant", [0.99, 0.999], 0.03)
    assert o["lr"] == demo["optim"]["lr"] and 0 < o["warmup_steps"] < stability["train"]["steps"]
    assert stability["train"]["steps"] - o["warmup_steps"] >= 1000  # 1,000 steps at the constant lr
    assert stability["eval"]["every"] == 0
    d = stability["diagnostics"]
    assert (d["every"], d["noise_levels"], d["noise_levels_every"]) == (25, 256, 0)  # at the end
    assert d["noise_levels_raw"] and d["noise_levels_at_start"]  # what the lr basin reads
    assert stability["train"]["mixed_precision"] == "bf16" and o["implementation"] == "fused"
    code, out, err = run_cli(capsys, "train", "stability", "--dry-run")
    assert code == 0, err
    assert "lr_schedule: constant" in out and "skips: cs, kappa=0.5" in out and "data: " in out


def test_every_config_command_is_covered():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    takes_config = {name for name, p in sub.choices.items() if any(a.dest == "config" for a in p._actions)}
    assert takes_config == set(CONFIG_COMMANDS)
    for command in takes_config:
        (config,) = [a for a in sub.choices[command]._actions if a.dest == "config"]
        assert "YAML config file or preset name" in config.help


@pytest.mark.parametrize("command", sorted(CONFIG_COMMANDS))
def test_every_config_command_resolves_names(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    extra = CONFIG_COMMANDS[command]
    # The preset is found and read: the error is about its content, found after loading it.
    code, out, err = run_cli(capsys, command, "demo_uvit", "model.uvit.depth=3", *extra)
    assert code == 2 and err.strip() == "error: model.uvit.depth must be an even number >= 2, got 3"
    # An unknown name: one line that lists the presets; nothing is written.
    code, out, err = run_cli(capsys, command, "demoo", *extra)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: 'demoo' is neither a config file nor a preset; presets: ")
    assert all(name in err for name in SHIPPED)
    assert "Traceback" not in out + err
    assert list(tmp_path.iterdir()) == []


def test_presets_import_nothing_but_the_error_type():
    from import_fixtures import import_graph

    assert import_graph()["scalelong.training.presets"] <= {"scalelong.errors"}
