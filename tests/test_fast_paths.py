"""Fast paths give the plain path's numbers: channels_last UNet, the compiled trainer.

No timing here; speed is measured in benchmarks/fast_paths.py.
"""

import functools
import json

import torch

from conftest import tiny_uvit_overrides
from scalelong.config import load_config
from scalelong.models import UNet
from scalelong.train import train


def test_channels_last_unet_matches_contiguous():
    model = UNet(16, 1, 16, (1, 2), 2, (8,), dropout=0.0, norm_groups=8, skip_method="cs", kappa=0.7).eval()
    x, t = torch.randn(2, 1, 16, 16), torch.rand(2) * 999
    with torch.no_grad():
        plain = model(x, t)
        fast = model.to(memory_format=torch.channels_last)(x.contiguous(memory_format=torch.channels_last), t)
    torch.testing.assert_close(fast, plain, rtol=1e-4, atol=1e-5)


def test_compiled_training_matches_eager_and_keeps_diagnostics(tmp_path, monkeypatch):
    # The eager backend traces through dynamo (guards, graph breaks, hooks) without the C++ compile.
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    runs = {}
    for name, compiled in (("eager", "false"), ("compiled", "true")):
        overrides = tiny_uvit_overrides(name, tmp_path, steps=6, method="ls")
        overrides += [f"train.compile={compiled}", "diagnostics.every=3", "sample.num_images=0"]
        result = train(load_config("configs/demo.yaml", overrides), progress=False)
        runs[name] = [
            json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()
        ]
    for a, b in zip(runs["eager"], runs["compiled"], strict=True):
        assert a["step"] == b["step"] and a.keys() == b.keys()
        if "loss" in a:
            assert abs(a["loss"] - b["loss"]) <= 1e-4 * abs(a["loss"])
    diag = [r for r in runs["compiled"] if "skip/1/coef_mean" in r]
    assert [r["step"] for r in diag] == [3, 6]  # diagnostic steps run eager: the probe still fires
