"""The run directory: its paths, the metrics log, checkpoints and the one model loader."""

import math

import pytest
import torch

from scalelong.build import build_model
from scalelong.checkpoint import save_checkpoint
from scalelong.config import config_to_dict, load_config, save_config
from scalelong.errors import ScaleLongError
from scalelong.runs import MetricsLog, RunDir, load_model

TINY = [
    "model.uvit.patch_size=8",
    "model.uvit.embed_dim=16",
    "model.uvit.depth=2",
    "model.uvit.num_heads=2",
    "model.skip.method=ls",
]


def test_the_layout_of_a_run_directory(tmp_path):
    run = RunDir(tmp_path / "demo")
    names = {
        run.config_file: "config.yaml",
        run.metrics_file: "metrics.jsonl",
        run.tb_dir: "tb",
        run.checkpoint(500): "checkpoints/step-000500",
        run.sample_grid(500): "samples/step-000500.png",
        run.eval_dir: "eval",
        run.eval_final_file: "eval_final.json",
        run.report_dir: "report",
        run.summary_file: "summary.json",
    }
    for path, name in names.items():
        assert path == tmp_path / "demo" / name
    assert run.checkpoints_dir == run.checkpoint(500).parent
    assert RunDir(run).path == run.path and str(run) == str(tmp_path / "demo") and run.name == "demo"


def test_metrics_log_round_trip_keeps_nonfinite_values(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"step": 1, "loss": math.nan, "fd_metric": "fd-mnist", "grad_norm": math.inf})
    log.write({"step": 2, "loss": 0.5, "grad_norm": -math.inf})
    log.write({"step": 3, "loss": 0.25})
    assert '"loss": "nan"' in log.path.read_text()  # JSON has no NaN: written as a string
    first, second, _ = log.read()
    assert math.isnan(first["loss"]) and first["grad_norm"] == math.inf and first["fd_metric"] == "fd-mnist"
    assert second["grad_norm"] == -math.inf
    log.truncate_after(2)
    assert [r["step"] for r in log.read()] == [1, 2] and math.isnan(log.read()[0]["loss"])
    assert MetricsLog(tmp_path / "none.jsonl").read() == []


def test_not_a_run_and_missing_checkpoints_are_one_line_errors(tmp_path):
    run = RunDir(tmp_path / "empty")
    with pytest.raises(ScaleLongError, match="not a run directory"):
        run.config()
    cfg = load_config(None, TINY)
    run.path.mkdir()
    save_config(cfg, run.config_file)
    with pytest.raises(ScaleLongError, match="no checkpoint yet"):
        run.load_model()
    model = build_model(cfg.model)
    save_checkpoint(run.checkpoints_dir, 4, model, model, config_to_dict(cfg))
    with pytest.raises(ScaleLongError, match="no checkpoint for step 3 .* available: step-000004"):
        run.find_checkpoint(3)
    assert run.find_checkpoint() == run.checkpoint(4) == run.find_checkpoint(4)
    assert not run.finished
    run.write_summary({"steps": 4})
    assert run.finished


def test_one_loader_for_a_run_and_for_a_bare_checkpoint(tmp_path):
    cfg = load_config(None, TINY)
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    save_config(cfg, run.config_file)
    model = build_model(cfg.model)
    with torch.no_grad():
        for p in model.skip_scaling.parameters():
            p.add_(1.0)  # not the initialisation, so loading must really copy
    ema = build_model(cfg.model)
    ckpt = save_checkpoint(run.checkpoints_dir, 2, model, ema, config_to_dict(cfg))
    rng = torch.get_rng_state()
    loaded_cfg, from_run, path = run.load_model(weights="model")
    from_meta = load_model(ckpt, weights="model")  # the config stored in meta.json
    assert torch.equal(torch.get_rng_state(), rng)  # building the model leaves the RNG alone
    assert path == ckpt and loaded_cfg.model == cfg.model and not from_run.training
    for k, v in model.state_dict().items():
        assert torch.equal(from_run.state_dict()[k], v) and torch.equal(from_meta.state_dict()[k], v), k
    assert torch.equal(load_model(ckpt).pos_embed, ema.pos_embed)  # EMA weights by default
    with pytest.raises(ScaleLongError, match="choose ema or model"):
        load_model(ckpt, weights="best")
    with pytest.raises(ScaleLongError, match="no meta.json"):
        load_model(tmp_path)
