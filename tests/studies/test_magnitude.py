"""How large the values get along the network: the blocks in forward order on every backbone, the
peak |value| of each over a run, the middle-to-last growth, what counts as reaching fp16's range,
the sweep report's figure and table, and runs.json, on records written by hand."""

import json
import math
import statistics

import pytest

from scalelong.diagnostics.overflow import FP16_MAX
from scalelong.studies.magnitude import decoder_growth, forward_order, median_profile, peak_absmax, reached
from scalelong.studies.provenance import run_json
from scalelong.studies.summary import StudyRun
from scalelong.studies.sweep.figures import magnitude_parts


def test_blocks_in_forward_order_on_every_backbone():
    assert forward_order(["out_blocks.10", "mid_block", "in_blocks.1", "out_blocks.2", "in_blocks.0"]) == [
        "in_blocks.0",
        "in_blocks.1",
        "mid_block",
        "out_blocks.2",
        "out_blocks.10",  # by index, not as text
    ]
    assert forward_order(["up.0", "mid.1", "mid.0", "down.1", "down.0"]) == [
        "down.0",
        "down.1",
        "mid.0",
        "mid.1",
        "up.0",
    ]
    ddpm = ["final_res_block", "ups.1.0", "mid_block2", "downs.0.1", "ups.0.1", "mid_block1", "downs.0.0"]
    assert forward_order(ddpm) == ["downs.0.0", "downs.0.1", "mid_block1", "mid_block2", "ups.0.1", "ups.1.0"]
    diffusers_uvit = ["transformer_out_blocks.0.block", "transformer_mid_block", "transformer_in_blocks.0"]
    assert forward_order(diffusers_uvit) == diffusers_uvit[::-1]
    assert forward_order(["up_blocks.1", "down_blocks.0", "mid_block"]) == [
        "down_blocks.0",
        "mid_block",
        "up_blocks.1",
    ]


def uvit(stream: list[float], skips: float = 100.0, middle: float = 90.0) -> list[dict]:
    """Records of a depth-4 U-ViT whose decoder stream peaks at ``stream[j]`` out of out_blocks.j
    at step 50 (half that at step 25)."""
    records = []
    for step, f in ((25, 0.5), (50, 1.0)):
        r = {"step": step, "loss": 0.2}
        r |= {f"block/in_blocks.{i}/absmax": skips * f for i in range(2)}
        r |= {"block/mid_block/absmax": middle * f}
        r |= {f"block/out_blocks.{j}/absmax": v * f for j, v in enumerate(stream)}
        records.append(r)
    return records


def test_the_peak_of_each_block_and_the_growth_from_the_middle_to_the_last():
    records = uvit([900.0, 18000.0])
    assert peak_absmax(records) == {
        "in_blocks.0": 100.0,
        "in_blocks.1": 100.0,
        "mid_block": 90.0,
        "out_blocks.0": 900.0,
        "out_blocks.1": 18000.0,
    }
    assert decoder_growth(peak_absmax(records)) == (100.0, 90.0, 18000.0)
    assert not reached(records, FP16_MAX)
    # an fp16 forward that overflowed logs a non-finite value: the peak keeps the largest finite one
    overflowed = [*records, {"step": 75, "block/out_blocks.1/absmax": "inf"}]
    assert peak_absmax(overflowed)["out_blocks.1"] == 18000.0 and reached(overflowed, FP16_MAX)
    assert reached(uvit([900.0, 70000.0]), FP16_MAX)  # a bf16 run past fp16's range
    blocks, mid, lo, hi = median_profile([records, uvit([300.0, 6000.0]), uvit([600.0, 30000.0])])
    assert blocks[-1] == "out_blocks.1" and (mid[-1], lo[-1], hi[-1]) == (18000.0, 6000.0, 30000.0)
    assert decoder_growth({"out_blocks.0": 1.0}) is None


def test_the_report_draws_the_profile_and_tabulates_where_it_is_largest(tmp_path):
    def run(stream, seed, **summary):
        return StudyRun("r", uvit(stream), summary, [], seed=seed)

    chosen = {
        (12, "none"): [
            run([900.0, 18000.0], 0),
            run([600.0, 9000.0], 1, last_skipped="fp16 overflow in forward"),
        ],
        (12, "merge-norm"): [run([50.0, 60.0], 0), run([40.0, 45.0], 1)],
    }
    parts = magnitude_parts(chosen, 6e-3, tmp_path)
    assert (tmp_path / "magnitude_d12.png").is_file() and "(magnitude_d12.png)" in parts[2]
    # merge-norm's last block against none's, paired by seed: 60 / 18000 and 45 / 9000, on the log scale
    logs = [math.log(60 / 18000), math.log(45 / 9000)]
    half = 12.706204736174705 * statistics.stdev(logs) / math.sqrt(2)  # t(0.975, 1)
    mean = statistics.fmean(logs)
    ratio = f"{math.exp(mean):.2g}x ({math.exp(mean - half):.2g} to {math.exp(mean + half):.2g})"
    assert parts[-1].splitlines()[0].startswith("| depth | method | seeds | skips' inputs |")
    assert "| last decoder block / none (95% CI) |" in parts[-1].splitlines()[0]
    assert parts[-1].splitlines()[2:] == [
        "| 12 | none | 2 | 100 | 90 | 1.35e+04 |  | 150x | 1/2 |",  # medians: (18000 + 9000) / 2 over 90
        f"| 12 | merge-norm | 2 | 100 | 90 | 52.5 | {ratio} | 0.583x | 0/2 |",
    ]
    # another depth where `none` did not run: each depth's ratios divide by its own first method
    chosen[24, "cs"] = [run([700.0, 7000.0], 0)]
    header = magnitude_parts(chosen, 6e-3, tmp_path)[-1].splitlines()[0]
    assert "| last decoder block / the first method of its depth (95% CI) |" in header
    assert (
        magnitude_parts({(12, "none"): [StudyRun("r", [{"step": 1, "loss": 1.0}], {}, [])]}, 1e-2, tmp_path)
        == []
    )


def test_runs_json_carries_each_runs_peaks():
    entry = run_json(StudyRun("r", uvit([900.0, math.inf]), {}, [], seed=0), {})
    assert entry["peak_absmax"] == pytest.approx(
        {
            "in_blocks.0": 100.0,
            "in_blocks.1": 100.0,
            "mid_block": 90.0,
            "out_blocks.0": 900.0,
            "out_blocks.1": None,
        }
    )
    json.dumps(entry)  # no NaN or inf in the file
