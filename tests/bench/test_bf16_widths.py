"""benchmarks/bf16_widths: one row per width reaches the fast-path table, with its verdict.

No timing assertions: the step times here are whatever the machine gives; what is checked is
that the ratio is the quotient of the two medians and that the summary quotes every width."""

import json

import benchmarks.__main__ as bench
import benchmarks.harness as harness
import pytest
from benchmarks import bf16_widths


@pytest.mark.parametrize(("ratio", "word"), [(0.51, "bf16 faster"), (1.99, "fp32 faster"), (1.03, "tie")])
def test_verdict_reads_the_ratio(ratio, word):
    assert bf16_widths.verdict(ratio) == word


def test_every_width_lands_in_the_fast_path_table(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "RESULTS", tmp_path)
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    # narrow widths (one head each): what is checked does not depend on the width
    bf16_widths.main(["--widths", "16,32", "--batch", "2", "--repeats", "1", "--threads", "1"])
    result = json.loads((tmp_path / "bf16_widths.json").read_text())
    keys = ["16 plain", "16 mlp_conv", "32 plain", "32 mlp_conv"]
    assert result["batch"] == 2 and list(result["results"]) == keys
    for r in result["results"].values():
        assert r["ratio"] == pytest.approx(r["median_s"]["bf16"] / r["median_s"]["fp32"])
        assert r["verdict"] == bf16_widths.verdict(r["ratio"])
    table = "\n".join(bench.fast_path_section(quick=False))
    for key, label in zip(keys, ["16", "16, mlp_conv", "32", "32, mlp_conv"], strict=True):
        row = next(line for line in table.splitlines() if f"U-ViT width {label} bf16" in line)
        assert f"{result['results'][key]['ratio']:.3f}" in row and "batch 2, 1 thread(s)" in row
    assert "python -m benchmarks.bf16_widths" in table


def test_a_bad_width_list_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as stop:
        bf16_widths.main(["--widths", "64,x"])
    assert (
        stop.value.code == 2 and "--widths '64,x': give comma-separated integers" in capsys.readouterr().err
    )
