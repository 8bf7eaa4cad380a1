"""The sweep report's gap by length: the held-out x0 error at every probe, per method, and its
difference to ``none`` paired by seed at the same step."""

import math

import pytest

from scalelong.studies.summary import Cell, StudyRun
from scalelong.studies.sweep.length import length_section, length_table, probes

LEVELS = (0.1, 0.5, 1.0)


def probe(step: int, error: float) -> dict:
    """A record of a held-out probe whose noise levels average to ``error``."""
    spread = {0.1: -0.02, 0.5: 0.0, 1.0: 0.02}
    return {"step": step, **{f"noise/x0_mse@{lv:.2f}": error + spread[lv] for lv in LEVELS}}


def run(method: str, seed: int, errors: dict[int, float]) -> StudyRun:
    records = [{"step": s, "loss": 0.2} for s in (50, 150)] + [probe(s, e) for s, e in errors.items()]
    return StudyRun(
        f"d12-lr0.01-{method}-seed{seed}", sorted(records, key=lambda r: r["step"]), {}, [], seed=seed
    )


def cells() -> dict[Cell, list[StudyRun]]:
    """none and cs, two seeds: cs leads by 0.01 at step 1000 and by 0.03 (seed 0) / 0.05 (seed 1) at 2000."""
    none = [
        run("none", 0, {0: 0.8, 1000: 0.20, 2000: 0.18}),
        run("none", 1, {0: 0.8, 1000: 0.22, 2000: 0.20}),
    ]
    cs = [run("cs", 0, {0: 0.8, 1000: 0.19, 2000: 0.15}), run("cs", 1, {0: 0.8, 1000: 0.21, 2000: 0.15})]
    return {Cell(12, 0.01, "none"): none, Cell(12, 0.01, "cs"): cs}


def test_probes_average_the_levels_after_step_0():
    assert probes(cells()[Cell(12, 0.01, "cs")][0]) == pytest.approx({1000: 0.19, 2000: 0.15})


def test_the_table_pairs_each_step_with_none_by_seed():
    table = length_table(cells()).splitlines()
    assert table[0] == "| method | step 1,000 | step 2,000 |"
    none, cs = table[2], table[3]
    assert none.startswith("| none | 0.21 ± ")
    # the paired differences: -0.01 at both seeds at step 1000 (no spread), -0.03 and -0.05 at 2000
    at_1000, at_2000 = cs.split(" | ")[1:3]
    assert at_1000.startswith("0.2 ± ") and "- none -0.01 (-0.01 to -0.01)" in at_1000
    half = 12.706 * math.sqrt(0.0002) / math.sqrt(2)  # t(0.975, 1) sd / sqrt(2) of (-0.03, -0.05)
    assert f"- none -0.04 ({-0.04 - half:+.2g} to {-0.04 + half:+.2g})" in at_2000


def test_the_section_draws_one_panel_and_is_left_out_without_two_probes(tmp_path):
    parts = length_section(cells(), tmp_path, 0.01)
    assert parts[0] == "## The gap by length: held-out x0 error over training"
    assert (tmp_path / "heldout.png").is_file() and "Depth 12:" in parts
    once = {c: [run(c.method, 0, {0: 0.8, 1000: 0.2})] for c in cells()}  # one probe after step 0
    assert length_section(once, tmp_path, 0.01) == []
    assert length_section(cells(), tmp_path, 0.02) == []  # no cell at that lr


def test_the_figure_leaves_out_the_untrained_model(tmp_path, monkeypatch):
    import scalelong.studies.sweep.length as length

    drawn = {}

    def capture(curves, path, **kwargs):
        drawn.update(curves)
        path.write_bytes(b"")
        return path

    monkeypatch.setattr(length, "plot_fig1_by_depth", capture)
    length_section(cells(), tmp_path, 0.01)
    assert drawn.keys() == {(12, "none"), (12, "cs")}
    for seeds in drawn.values():  # step 0's 0.8 would squash the trained runs' 0.15..0.22
        assert [[r["step"] for r in records] for records in seeds] == [[1000, 2000]] * 2
    assert drawn[12, "cs"][1][1][length.KEY] == pytest.approx(0.15)
