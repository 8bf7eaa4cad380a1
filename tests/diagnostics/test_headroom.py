"""fp16 headroom: the largest absolute value of every skip input and block output, and how far the
largest of them is from half precision's largest finite value (65,504); `scalelong analyze` says so
in one line when a run came within 10x of it."""

import math

import pytest
import torch
from torch import nn

from scalelong.cli import main
from scalelong.diagnostics import FP16_MAX, Diagnostics, RunLog, fp16_headroom, headroom_warning
from scalelong.diffusion import VPSDE, training_loss
from scalelong.models import UViT
from scalelong.skips import SkipScaling


class Scale(nn.Module):
    def __init__(self, factor: float):
        super().__init__()
        self.weight = nn.Parameter(torch.tensor(factor))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x


class OneSkip(nn.Module):
    """enc (x2) -> dec (x-5), the encoder's output merged back under cs: numbers a hand can follow."""

    def __init__(self):
        super().__init__()
        self.enc, self.dec = Scale(2.0), Scale(-5.0)
        self.skip_scaling = SkipScaling("cs", 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.enc(x)
        return torch.cat([self.dec(h), self.skip_scaling(h, 1)], dim=1)


def test_absmax_of_skips_and_blocks_by_hand_over_two_micro_batches():
    model = OneSkip()
    diag = Diagnostics(model, every=1, blocks={"enc": model.enc, "dec": model.dec}).attach()
    assert diag.arm(1)
    for x in (torch.tensor([[1.0, -3.0], [0.5, 2.0]]), torch.tensor([[-4.0, 0.0]])):  # two micro-batches
        model(x).sum().backward()
    rec = diag.collect(1, 1.0)
    # enc: 2 * x, largest |.| over both forwards 2 * 4 = 8; dec: -5 * 2 * x, 40; the skip is enc's output
    assert rec["block/enc/absmax"] == 8.0 and rec["block/dec/absmax"] == 40.0
    assert rec["skip/1/absmax_in"] == 8.0
    assert rec["fp16/headroom"] == FP16_MAX / 40.0
    assert rec["nonfinite_values"] == 0


def test_fp16_headroom_rules():
    assert fp16_headroom([1.0, 6550.4, 3.0]) == pytest.approx(10.0)
    assert fp16_headroom([0.0]) == math.inf
    assert fp16_headroom([1.0, math.inf]) == 0.0  # in fp16 an overflow is inf
    assert fp16_headroom([1.0, math.nan]) == 0.0  # ... which the next norm layer turns into NaN
    assert math.isnan(fp16_headroom([]))  # nothing measured: nothing can be said


def own_loop(folder, scale_from: int, scale: float, steps: int = 4) -> list[dict]:
    """A plain loop on a tiny U-ViT logging the diagnostics every step; from step ``scale_from`` on
    the input is multiplied by ``scale`` (the patch embedding is linear, so every feature grows)."""
    torch.manual_seed(0)
    model = UViT(8, 2, 1, 16, 2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    written = []
    with Diagnostics(model, every=1) as diag, RunLog(folder) as log:
        for step in range(1, steps + 1):
            x0 = torch.randn(4, 1, 8, 8) * (scale if step >= scale_from else 1.0)
            diag.arm(step)
            loss = training_loss(model, VPSDE(), x0).mean()
            loss.backward()
            written.append(log.write(step, diag.collect(step, loss.item()), loss=loss.item()))
            opt.step()
            opt.zero_grad()
    return written


def test_analyze_prints_one_line_when_features_come_within_10x_of_fp16_s_largest(tmp_path, capsys):
    records = own_loop(tmp_path / "large", scale_from=3, scale=1e4)
    assert records[0]["fp16/headroom"] > 100 and 1 < records[2]["fp16/headroom"] < 10
    largest = max((k for k in records[2] if k.endswith(("/absmax", "/absmax_in"))), key=records[2].get)
    assert main(["analyze", str(tmp_path / "large")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "headroom" in line]
    assert len(lines) == 1
    lowest = min(r["fp16/headroom"] for r in records)
    assert lines[0].startswith(
        "fp16 headroom: at step 3 the run came within 10x of fp16's largest value (65504): "
    )
    assert f"{largest} = {records[2][largest]:.4g} (headroom {records[2]['fp16/headroom']:.3g})" in lines[0]
    assert lines[0].endswith(
        f"lowest headroom {lowest:.3g} at step {min(records, key=lambda r: r['fp16/headroom'])['step']}"
    )


def test_a_normal_run_gets_no_line(tmp_path, capsys):
    records = own_loop(tmp_path / "normal", scale_from=99, scale=1.0)
    assert all(r["fp16/headroom"] > 10 for r in records)
    assert headroom_warning(records) is None
    assert main(["analyze", str(tmp_path / "normal")]) == 0
    assert "headroom" not in capsys.readouterr().out


def test_the_line_names_the_largest_tensor_of_the_first_close_step_and_an_overflow():
    records = [
        {"step": 10, "fp16/headroom": 50.0, "block/a/absmax": 1310.0},
        {"step": 20, "fp16/headroom": "nan", "block/a/absmax": "nan"},  # as the log stores NaN
        {"step": 30, "fp16/headroom": 0.5, "block/a/absmax": 9.0, "skip/2/absmax_in": 131008.0},
        {"step": 40, "fp16/headroom": 8.0, "block/a/absmax": 8188.0},
    ]
    assert headroom_warning(records) == (
        "fp16 headroom: at step 30 the run went past fp16's largest value (65504): "
        "skip/2/absmax_in = 1.31e+05 (headroom 0.5); lowest headroom 0.5 at step 30"
    )
    assert headroom_warning(records[:2]) is None


def test_a_real_fp16_overflow_has_headroom_0_and_the_line(tmp_path, capsys):
    """A half-precision U-ViT: step 1 is normal, step 2's input x3e4 overflows fp16 to inf, and the
    LayerNorm after it turns the inf into NaN, so every block's absmax is NaN. That is no headroom."""
    torch.manual_seed(0)
    model = UViT(8, 2, 1, 16, 2, 2).half()
    records = []
    with Diagnostics(model, every=1) as diag, RunLog(tmp_path / "fp16") as log:
        for step, scale in ((1, 1.0), (2, 3e4)):
            x = (torch.randn(4, 1, 8, 8) * scale).half()
            diag.arm(step)
            loss = (model(x, torch.rand(4).half()).float() - x.float()).pow(2).mean()
            loss.backward()
            records.append(log.write(step, diag.collect(step, loss.item()), loss=loss.item()))
            model.zero_grad()
    normal, overflow = records
    assert normal["fp16/headroom"] > 10
    absmax = {k: v for k, v in overflow.items() if k.startswith("block/") and k.endswith("/absmax")}
    assert len(absmax) == 3 and all(math.isnan(v) for v in absmax.values())  # the overflow reaches every norm
    assert overflow["fp16/headroom"] == 0.0  # was: NaN, and no warning
    assert overflow["fp16/headroom_ops"] == 0.0  # the per-op headroom agrees
    line = headroom_warning(records)
    assert line is not None and line.startswith(
        "fp16 headroom: at step 2 the run went past fp16's largest value (65504): "
    )
    assert line.endswith("(headroom 0); lowest headroom 0 at step 2")
    assert main(["analyze", str(tmp_path / "fp16")]) == 0  # read back from metrics.jsonl
    assert [x for x in capsys.readouterr().out.splitlines() if "headroom" in x] == [line]


def test_at_headroom_0_the_line_names_an_inf_first_then_a_nan():
    record = {"step": 5, "fp16/headroom": 0.0, "skip/1/absmax_in": 300.0, "block/a/absmax": "nan",
              "block/b/absmax": "inf", "block/c/absmax": "nan"}  # fmt: skip
    assert headroom_warning([record]) == (
        "fp16 headroom: at step 5 the run went past fp16's largest value (65504): "
        "block/b/absmax = inf (headroom 0); lowest headroom 0 at step 5"
    )
    no_inf = {**record, "block/b/absmax": 7.0}
    assert "block/a/absmax = nan (headroom 0)" in headroom_warning([no_inf])
    # At a finite headroom a NaN is a block that did not run: the largest measured value is named.
    missing = {"step": 6, "fp16/headroom": 0.5, "block/a/absmax": "nan", "skip/1/absmax_in": 131008.0}
    assert "skip/1/absmax_in = 1.31e+05 (headroom 0.5)" in headroom_warning([missing])
