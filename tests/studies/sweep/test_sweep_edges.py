"""The largest stable lr on each set of equal seeds: which comparisons runs of unequal seeds support,
each method's edge within one, the report's table and map.json, on records written by hand."""

import json
import math
import statistics

import pytest

from scalelong.studies.divergence import Divergence
from scalelong.studies.summary import Cell, CellSummary, SeedSummary
from scalelong.studies.sweep.basin import basin_section, basins, comparison_sensitivity, sensitivity_table
from scalelong.studies.sweep.edges import Comparison, comparisons, edge_text, edges_json, edges_table
from scalelong.studies.sweep.mapfile import write_map_json
from scalelong.studies.sweep.tables import stability_table

T4 = 2.7764451051977987  # t(0.975, 4): five seeds
BROKE = (Divergence("nonfinite", 50, "stopped on non-finite steps in a row"),)


def cells_of(plan: dict[tuple[str, float], dict[int, bool]]) -> list[CellSummary]:
    """Depth 12 cells from {(method, lr): {seed: failed}}: held-out error 0.2, untrained 1.0."""
    return [
        CellSummary(
            Cell(12, lr, method),
            [
                SeedSummary(
                    s,
                    x0_error=math.inf if f else 0.2,  # a failed run counts at the cap, 1.0
                    x0_error_start=1.0,
                    x0_mean_image=0.8,
                    breaks=BROKE if f else (),
                )
                for s, f in runs.items()
            ],
        )
        for (method, lr), runs in plan.items()
    ]


def fp16_like() -> list[CellSummary]:
    """Seed 0 of three methods at 1e-2 and 2e-2; seeds 0-4 of `none` and `cs` at 6e-3 and 1e-2 (no
    `ls`): `none` fails seed 1 at 6e-3, which seed 0 alone cannot see; seeds 0-7 of both at 6e-3."""
    ok = dict.fromkeys(range(5), False)
    return cells_of(
        {
            ("none", 6e-3): {**dict.fromkeys(range(8), False), 1: True, 6: True},
            ("none", 1e-2): {**ok, 2: True},
            ("none", 2e-2): {0: True},
            ("cs", 6e-3): {**dict.fromkeys(range(8), False), 6: True},
            ("cs", 1e-2): {**ok, 2: True, 3: True},
            ("cs", 2e-2): {0: True},
            ("ls", 1e-2): {0: False},
            ("ls", 2e-2): {0: False},
        }
    )


def test_each_set_of_seeds_gives_the_largest_comparison_it_supports():
    found = basins(fp16_like())
    got = comparisons(found)
    assert got == [
        Comparison(12, frozenset(range(8)), ("none", "cs"), (6e-3,)),
        Comparison(12, frozenset(range(5)), ("none", "cs"), (6e-3, 1e-2)),
        Comparison(12, frozenset({0}), ("none", "cs", "ls"), (1e-2, 2e-2)),
        Comparison(12, frozenset({0}), ("none", "cs"), (6e-3, 1e-2, 2e-2)),
    ]
    # the basin table's own rule reads none's edge at 1e-2 from seed 0; on seeds 0-4, where it failed
    # seed 1 at 6e-3, it has none
    none = found[0]
    assert none.largest_stable_lr == 1e-2
    assert edge_text(none, got[1]) == "below 0.006 (1/5 failed there)"
    assert edge_text(found[1], got[1]) == "0.006 (2/5 failed at 0.01)"
    assert edge_text(found[2], got[2]) == "0.02, the largest tried (0/1 failed at each)"
    assert edge_text(found[1], got[0]) == "below 0.006 (1/8 failed there)"


def test_the_lr_sensitivity_of_a_comparison_reads_its_own_lrs_on_every_seed_of_it():
    found = basins(fp16_like())
    five = comparisons(found)[1]  # seeds 0-4 at 6e-3 and 1e-2; the depth's grid adds 2e-2
    assert found[0].seed_sensitivity() == {0: pytest.approx(0.8 / 3)}  # seed 0 alone ran the grid
    # a failed run counts at the cap 1.0: LRS_s = mean(1.0, 0.2) - 0.2 = 0.4 where one lr failed
    none = comparison_sensitivity(found[0], five)
    assert none == {0: 0.0, 1: pytest.approx(0.4), 2: pytest.approx(0.4), 3: 0.0, 4: 0.0}
    cs = comparison_sensitivity(found[1], five)
    assert cs == {0: 0.0, 1: 0.0, 2: pytest.approx(0.4), 3: pytest.approx(0.4), 4: 0.0}
    half = T4 * statistics.stdev([0, 0.4, 0.4, 0, 0]) / math.sqrt(5)
    diff_half = T4 * statistics.stdev([0, -0.4, 0, 0.4, 0]) / math.sqrt(5)
    row = sensitivity_table(found).splitlines()[2]
    assert row == (
        f"| 0-4 (5) | 0.006, 0.01 | 0.16 ± {half:.2g} (5) | 0.16 ± {half:.2g} (5); vs none +0 "
        f"({-diff_half:+.2g} to {diff_half:+.2g}) |  |"
    )


def test_the_edges_table_and_map_json(tmp_path):
    cells = fp16_like()
    found = basins(cells)
    table = edges_table(found).splitlines()
    assert table[0] == "| seeds | lrs | none | cs | ls |"
    assert table[3] == (
        "| 0-4 (5) | 0.006, 0.01 | below 0.006 (1/5 failed there) | 0.006 (2/5 failed at 0.01) |  |"
    )
    assert table[2].startswith("| 0-7 (8) | 0.006 |")
    parts, _ = basin_section(cells, tmp_path)
    assert "\n".join(table) in parts  # unequal seeds: the report shows every comparison
    data = json.loads(write_map_json(cells, tmp_path / "map.json", "loss", found).read_text())
    assert data["edges"] == edges_json(found, comparison_sensitivity)
    five = data["edges"][1]
    assert five["seeds"] == [0, 1, 2, 3, 4] and five["lrs"] == [6e-3, 1e-2]
    assert five["methods"]["none"]["largest_stable_lr"] is None
    assert five["methods"]["cs"]["largest_stable_lr"] == 6e-3
    assert five["methods"]["cs"]["failed"][1] == {"lr": 1e-2, "failed": 2, "runs": 5}


def test_a_comparison_that_a_larger_one_contains_adds_no_table(tmp_path):
    # seed 0 of `none` and `cs` is the comparison on seeds 0-1 again; `ls` shares no lr with them
    plan = {(m, lr): {0: False, 1: lr > 1e-2} for m in ("none", "cs") for lr in (1e-2, 2e-2)}
    cells = cells_of({**plan, ("ls", 4e-2): {0: False}})
    found = basins(cells)
    assert comparisons(found) == [Comparison(12, frozenset({0, 1}), ("none", "cs"), (1e-2, 2e-2))]
    parts, _ = basin_section(cells, tmp_path)
    assert not any(p.startswith("| seeds | lrs |") for p in parts)


def test_an_edge_that_no_lr_decides_is_said_to_be_undecided():
    """Methods that share no lr: no lr decides, which is not a failure at the smallest lr."""
    cells = cells_of({("none", 0.01): {0: False, 1: False}, ("cs", 0.04): {0: False, 1: False}})
    table = stability_table(cells, "loss")
    for method in ("none", "cs"):
        assert f"| {method} | undecided (no lr where every method ran the same seeds) | n/a | | |" in table
    assert "the smallest lr that decides failed" not in table
