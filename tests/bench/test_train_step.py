"""benchmarks/train_step: every arm of the demo's step is timed against eager fp32 and reaches the summary.

No timing assertions: what is checked is that each ratio is the quotient of two medians of the same
run, that every arm ran, and that the benchmarks page quotes the table (timed on a narrow U-ViT in
the demo's recipe: loss, optimizer and EMA as the demo has them)."""

import json
from pathlib import Path

import benchmarks.__main__ as bench
import benchmarks.harness as harness
import pytest
import torch
import yaml
from benchmarks import train_step

from scalelong.training.config import load_config
from scalelong.training.presets import resolve_config


def narrow_demo(folder: Path) -> Path:
    """The demo U-ViT preset as a YAML file, its U-ViT 2 plain blocks of width 16: what is checked does not
    depend on the model, and on a busy machine each parallel region of the 2 threads waits for the
    one that got no core (the demo's 12 blocks took over a second a step at batch 2, most of it in
    the bf16 depthwise convolutions of model.uvit.mlp_conv)."""
    cfg = yaml.safe_load(resolve_config("demo_uvit").read_text())
    cfg["model"]["uvit"] |= {"embed_dim": 16, "depth": 2, "num_heads": 2, "mlp_conv": False}
    path = folder / "narrow-demo.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_every_arm_is_timed_and_quoted(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "RESULTS", tmp_path)
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    preset = str(narrow_demo(tmp_path))
    # 2 threads, so that the arm of 1 thread is there
    args = ["--no-compile", "--batch", "2", "--eval-batch", "2", "--repeats", "1", "--threads", "2"]
    train_step.main([*args, "--preset", preset])
    result = json.loads((tmp_path / "train_step.json").read_text())
    train = result["results"]["train"]
    assert list(train["median_s"]) == [
        "eager fp32",
        "eager bf16",
        "eager fp16 (CUDA's policy)",
        "eager bf16 (CUDA's policy)",
        "eager fp32, AdamW foreach",
        "eager fp32, AdamW fused",
        "eager bf16, AdamW fused",
        "eager fp32, EMA one lerp per parameter",
        "eager fp32, 1 thread",
    ]
    for arm, seconds in train["median_s"].items():
        assert seconds > 0 and train["ratio"][arm] == pytest.approx(seconds / train["median_s"]["eager fp32"])
    sample = result["results"]["sample"]
    assert sample["ratio"] == pytest.approx(sample["median_s"]["bf16"] / sample["median_s"]["fp32"])
    page = "\n".join(bench.train_step_section(quick=False))
    assert "python -m benchmarks.train_step" in page and "batch 2, 2 thread(s)" in page
    assert f"the {preset} preset" in page  # the narrow one was timed
    assert (
        f"| eager bf16 | {train['median_s']['eager bf16'] * 1e3:.1f} | {train['ratio']['eager bf16']:.3f} |"
        in page
    )


def test_the_step_trains_the_model_and_its_ema():
    step = train_step.step_fn("demo", 2, adamw="fused")
    before = [p.detach().clone() for p in step.model.parameters()]
    ema_before = [p.clone() for p in step.ema.parameters()]
    step()
    moved = [not torch.equal(p.detach(), q) for p, q in zip(step.model.parameters(), before, strict=True)]
    assert sum(moved) > len(moved) // 2  # AdamW moved (nearly) every parameter
    ema = [p for p in step.ema.parameters()]
    # the EMA moved by (1 - decay) of the way to the new weights
    decay = load_config("demo").train.ema_decay
    for e, b, p in zip(ema, ema_before, step.model.parameters(), strict=True):
        torch.testing.assert_close(e, b + (1 - decay) * (p.detach() - b))
