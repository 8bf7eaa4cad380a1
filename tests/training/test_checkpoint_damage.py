"""Checkpoints whose meta.json or weights do not fit: a damaged one falls back to the one before,
weights of another model are one error line."""

import json

import pytest

from conftest import TINY_UVIT as TINY
from scalelong.errors import ScaleLongError
from scalelong.training.build import build_model
from scalelong.training.checkpoint import (
    DamagedCheckpoint,
    checkpoint_problem,
    load_newest,
    load_training_state,
    save_checkpoint,
)
from scalelong.training.config import config_to_dict, load_config, save_config
from scalelong.training.runs import RunDir, load_model


def _run_with_two_checkpoints(tmp_path, overrides=TINY):
    cfg = load_config(None, overrides)
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    save_config(cfg, run.config_file)
    model = build_model(cfg.model)
    for step in (1, 2):
        save_checkpoint(run.checkpoints_dir, step, model, model, config_to_dict(cfg), {}, {"step": step})
    return run


@pytest.mark.parametrize(
    "edit, problem",
    [
        (lambda info: info.update(bytes=str(info["bytes"])), "meta.json lists no size for ema.safetensors"),
        (lambda info: info.pop("bytes"), "meta.json lists no size for ema.safetensors"),
        (lambda info: info.update(bytes=True), "meta.json lists no size for ema.safetensors"),
        (lambda info: info.update(sha256=123), "meta.json lists no checksum for ema.safetensors"),
    ],
)
def test_a_meta_json_with_a_bad_size_or_checksum_falls_back_to_the_older_checkpoint(tmp_path, edit, problem):
    run = _run_with_two_checkpoints(tmp_path)
    good, bad = run.checkpoints()
    meta = json.loads((bad / "meta.json").read_text())
    edit(meta["files"]["ema.safetensors"])
    (bad / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DamagedCheckpoint, match=problem):
        load_model(bad)
    assert checkpoint_problem(bad) == problem
    warnings = []
    _, _, path = run.load_model(warn=warnings.append)  # what sample and eval load
    assert (
        path == good and len(warnings) == 1 and problem in warnings[0] and "using step-000001" in warnings[0]
    )
    path, state = load_newest(run.checkpoints(), load_training_state, warnings.append)  # what a resume loads
    assert path == good and state["step"] == 1


def test_weights_of_another_shape_are_one_line_error(tmp_path):
    run = _run_with_two_checkpoints(tmp_path)
    wider = load_config(None, [*TINY[:1], "model.uvit.embed_dim=32", *TINY[2:]])
    save_config(wider, run.config_file)  # config.yaml edited after training
    with pytest.raises(ScaleLongError) as e:
        run.load_model()
    message = str(e.value)
    assert not isinstance(e.value, DamagedCheckpoint)  # every checkpoint has that shape: no fallback
    assert "\n" not in message and message.startswith(f"checkpoint {run.checkpoints()[-1]}/ema.safetensors")
    assert "does not fit this model (" in message and "was it written with another config?" in message
    assert ", the model's (" in message  # the first tensor of another shape, both shapes named
