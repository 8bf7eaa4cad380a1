"""benchmarks/train_step: every arm of the demo's step is timed against eager fp32 and reaches the summary.

No timing assertions: what is checked is that each ratio is the quotient of two medians of the same
run, that every arm ran, and that the benchmarks page quotes the table."""

import json

import benchmarks.__main__ as bench
import benchmarks.harness as harness
import pytest
import torch
from benchmarks import train_step

from scalelong.config import load_config


def test_every_arm_is_timed_and_quoted(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "RESULTS", tmp_path)
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    train_step.main(["--no-compile", "--batch", "2", "--eval-batch", "2", "--repeats", "1", "--threads", "2"])
    result = json.loads((tmp_path / "train_step.json").read_text())
    train = result["results"]["train"]
    assert list(train["median_s"]) == [
        "eager fp32",
        "eager bf16",
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
