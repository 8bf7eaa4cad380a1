"""benchmarks/demo_backbones: the demo's UNet step against the demo U-ViT's, timed side by side and quoted.

No timing assertions: what is checked is that the two steps are the presets' networks, that the ratio
is the quotient of the two medians, that the goal's verdict follows it, and that the summary quotes it."""

import json

import benchmarks.__main__ as bench
import benchmarks.harness as harness
import pytest
from benchmarks import demo_backbones


def test_the_two_arms_are_the_demo_presets_networks():
    steps = {
        name: demo_backbones.step_fn(preset, 2, adamw="fused")
        for name, preset in demo_backbones.BACKBONES.items()
    }
    kinds = {name: type(step.model).__name__ for name, step in steps.items()}
    assert kinds == {"UNet (demo)": "UNet", "U-ViT (demo_uvit)": "UViT"}


def test_the_ratio_is_timed_and_quoted(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "RESULTS", tmp_path)
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    monkeypatch.setattr(demo_backbones, "precisions", lambda: {"fp32": None})
    demo_backbones.main(["--quick", "--repeats", "1", "--batch", "2", "--eval-batch", "3"])
    result = json.loads((tmp_path / "demo_backbones_quick.json").read_text())
    assert list(result["results"]) == ["training step, fp32", "sampler forward, fp32"]
    fp32 = result["results"]["training step, fp32"]
    unet, uvit = fp32["median_s"]["UNet (demo)"], fp32["median_s"]["U-ViT (demo_uvit)"]
    assert unet > 0 and uvit > 0 and fp32["ratio"] == pytest.approx(unet / uvit)
    assert fp32["met"] == (fp32["ratio"] <= demo_backbones.TARGET) and result["batch"] == 2
    page = "\n".join(bench.demo_backbones_section(quick=True))
    assert "python -m benchmarks.demo_backbones" in page and "bf16 not timed" in page
    assert f"| training step, fp32 | {fp32['median_s']['UNet (demo)'] * 1e3:.1f} |" in page
    assert f"| {fp32['ratio']:.3f} | ≤ 1.2 |" in page and result["eval_batch"] == 3
    forward = result["results"]["sampler forward, fp32"]
    assert (
        forward["met"] is None
        and f"| sampler forward, fp32 | {forward['median_s']['UNet (demo)'] * 1e3:.1f}" in page
    )
