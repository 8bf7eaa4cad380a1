"""The basin's answer from its data: failure paired by seed with McNemar's exact test, a map.json
of an older format read back under today's rule, and what made each run said per cell."""

import json
import math

import pytest

from scalelong.cli import main
from scalelong.errors import ScaleLongError
from scalelong.studies.divergence import Divergence, cause
from scalelong.studies.provenance import cell_provenance, provenance_section
from scalelong.studies.statistics import paired_outcomes
from scalelong.studies.summary import Cell, CellSummary, SeedSummary, StudyRun
from scalelong.studies.sweep import report_sweep
from scalelong.studies.sweep.mapfile import agreement_section, read_map, write_map_json
from scalelong.studies.sweep.paired import paired_json, paired_table
from scalelong.studies.sweep.tables import seeds_table
from scalelong.training.config import load_config

FAILED = (Divergence("x0", 1200, "final held-out x0 error 0.3 is not below the mean image's 0.2"),)


def test_mcnemar_is_exact_on_the_discordant_seeds():
    # 6 rescues and no failure the other way: 2 x 0.5^6 = 0.03125
    t = paired_outcomes({s: s < 2 for s in range(20)}, {s: s < 8 for s in range(20)})
    assert (t.both, t.only_baseline, t.only_method, t.neither, t.n) == (2, 6, 0, 12, 20)
    assert t.p == pytest.approx(2 * 0.5**6)
    # 8 of 9 one way: 2 x (1 + 9) / 512
    t = paired_outcomes({s: s == 9 for s in range(20)}, {s: s < 8 for s in range(20)})
    assert (t.only_baseline, t.only_method) == (8, 1) and t.p == pytest.approx(20 / 512)
    # no discordant seed: nothing to test; seeds only one side ran are left out
    assert paired_outcomes({0: True, 1: False}, {0: True, 1: False, 2: True}).p == 1.0
    assert paired_outcomes({0: True, 5: True}, {0: False, 1: True}).n == 1


def cell(method, lr, failed, headroom=None, x0=None):
    runs = [
        SeedSummary(
            s,
            fp16_headroom=(headroom or {}).get(s, math.nan),
            x0_error=(x0 or {}).get(s, math.nan),
            breaks=FAILED if s in failed else (),
        )
        for s in range(5)
    ]
    return CellSummary(Cell(12, lr, method), runs)


def test_the_paired_table_reads_only_trained_pairs_for_headroom_and_error():
    none = cell("none", 2e-2, {1, 4}, headroom={s: 0.5 for s in range(5)}, x0={s: 0.14 for s in range(5)})
    cs = cell(
        "cs", 2e-2, {1}, headroom={0: 4.0, 1: 1e-6, 2: 8.0, 3: 2.0, 4: 4.0}, x0={s: 0.13 for s in range(5)}
    )
    rows = paired_table([none, cs]).splitlines()
    assert rows[0].startswith("| depth | lr | method | shared seeds | both failed | only none failed |")
    cols = rows[2].split(" | ")
    assert cols[1:9] == ["0.02", "cs", "5", "1", "1", "0", "3", "1"]  # 1 rescue is no evidence: p = 1
    # headroom among seeds 0, 2, 3 (both trained): ratios 8, 16, 4 -> geometric mean 8; seed 1's 1e-6 and
    # seed 4 (none failed) stay out
    (row,) = paired_json([none, cs])
    assert row["fp16_headroom_ratio"]["n"] == 3 and row["fp16_headroom_ratio"]["estimate"] == pytest.approx(
        8.0
    )
    assert row["x0_error_minus_none"]["estimate"] == pytest.approx(-0.01)
    assert (row["only_none_failed"], row["only_method_failed"], row["mcnemar_p"]) == (1, 0, 1.0)


OLD_ROW = {  # one cell of an lr-basin map.json as written before today's rule
    "depth": 12,
    "lr": 0.08,
    "method": "none",
    "seeds": 3,
    "seed": [0, 1, 4],
    "final_loss": [0.8, 0.2, 0.9],
    "heldout_x0_error": [0.25, 0.15, 0.231],
    "heldout_x0_error_start": [0.79, 0.8, 0.81],
    "x0_mean_image": [0.204, 0.204, 0.204],
    "fp16_headroom_least": [1e-9, 0.5, 1e-9],
    "diverged": [
        [{"criterion": "loss", "step": 1200, "detail": "loss ends at 0.8"}],
        [{"criterion": "feature_norm", "step": 300, "detail": "383 x its first"}],
        [],
    ],
}


def test_an_old_map_is_judged_again_and_says_what_it_lacks(tmp_path, capsys):
    (tmp_path / "map.json").write_text(json.dumps({"metric": "loss", "cells": [OLD_ROW]}))
    cells, lacking, recorded = read_map(tmp_path / "map.json")
    assert lacking == [
        "per-run provenance and time series (no runs.json)",
        "feature growth",
        "verdicts by today's rule",
    ]
    # today: seed 0 fails (0.25 not below 0.204); seed 1 trains though its features grew; seed 4, which
    # the loss passed, fails at 0.231
    assert [bool(r.breaks) for r in cells[0].runs] == [True, False, True]
    assert cells[0].runs[2].breaks[0].criterion == "x0"
    assert [d["criterion"] for d in recorded[12, 0.08, "none", 1]] == ["feature_norm"]
    parts = agreement_section(cells, recorded)
    table = parts[2].splitlines()
    assert table[2] == "| (a)+(b): non-finite, loss | 1 | 1 | 0 | 1 |"
    assert table[3] == "| (a)+(b)+(c): and feature growth | 1 | 0 | 1 | 1 |"
    assert (
        "none lr 0.08 seed 4 (depth 12): recorded trained, today failed (x0 0.231, mean image 0.204)"
        in parts[3]
    )
    # --report-only on the folder: one line saying what the file lacks, and a report from it
    report = report_sweep(load_config("stability", []), tmp_path).read_text()
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "a map.json of an older format without per-run provenance" in out
    assert (
        "Made from `map.json` alone" in report and "## Today's rule against the verdicts recorded" in report
    )
    # written again, the map keeps the verdicts recorded when the runs were made
    again = json.loads((tmp_path / "map.json").read_text())["cells"][0]
    assert again["recorded_criteria"] == OLD_ROW["diverged"]
    assert [bool(f) for f in again["failed"]] == [True, False, True]


FIRST_ROW = {  # one cell of a map.json of the first format: a seed count, no held-out error
    "depth": 16,
    "lr": 0.015,
    "method": "ls",
    "seeds": 3,
    "final_loss": [0.9, 0.2, 0.25],
    "diverged": [
        [{"criterion": "loss", "step": 200, "detail": "loss ends at 0.723"}],
        [{"criterion": "feature_norm", "step": 175, "detail": "776 x its first"}],
        [],
    ],
}


def test_a_map_of_the_first_format_is_judged_by_its_loss_and_lists_its_failed_runs(tmp_path, capsys):
    folder = tmp_path / "old-sweep"
    folder.mkdir()
    (folder / "map.json").write_text(json.dumps({"metric": "loss", "cells": [FIRST_ROW]}))
    cells, lacking, _ = read_map(folder / "map.json")
    assert lacking[-1] == "seed numbers (read as 0 to n-1)"
    # no held-out error: the loss judges, feature growth (seed 1) no longer fails a run
    assert cells[0].seeds == [0, 1, 2] and [bool(r.breaks) for r in cells[0].runs] == [True, False, False]
    grid = ["--methods", "ls", "--lrs", "1.5e-2", "--depths", "16", "--seeds", "3", "--name", "old"]
    assert main(["sweep", "stability", *grid, f"out_dir={tmp_path}", "--report-only"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "seed numbers (read as 0 to n-1); reported without them" in out[0]
    assert out[-1] == f"made from {folder / 'map.json'}: none of the 3 runs' folders is here"
    report = (folder / "report.md").read_text()
    failed = report.split("## Runs that failed")[1].strip().splitlines()
    assert failed == ["- `d16-lr0.015-ls-seed0`: loss at step 200: loss ends at 0.723"]


def test_a_sweep_does_not_replace_a_map_whose_runs_are_not_here(tmp_path, capsys):
    folder = tmp_path / "old-sweep"
    folder.mkdir()
    kept = json.dumps({"metric": "loss", "cells": [FIRST_ROW]})
    (folder / "map.json").write_text(kept)
    grid = ["--methods", "none", "--lrs", "1e-2", "--depths", "4", "--seeds", "1", "--name", "old"]
    assert main(["sweep", "stability", *grid, f"out_dir={tmp_path}", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds 3 run(s) whose folders are not in" in err
    assert "(e.g. d16-lr0.015-ls-seed0)" in err
    assert (folder / "map.json").read_text() == kept and not (folder / "runs").exists()  # nothing trained


def test_an_incomplete_map_is_one_line_naming_the_file(tmp_path):
    row = {k: v for k, v in FIRST_ROW.items() if k != "seeds"}
    (tmp_path / "map.json").write_text(json.dumps({"metric": "loss", "cells": [row]}))
    with pytest.raises(ScaleLongError, match=r"map\.json: a cell of this map\.json is incomplete \(KeyError"):
        read_map(tmp_path / "map.json")


TODAY_ROW = {  # one cell of a map.json written under today's rule: no earlier verdicts to set beside
    "depth": None,  # a backbone without a U-ViT depth
    "lr": 0.02,
    "method": "cs",
    "seeds": 2,
    "seed": [0, 1],
    "final_loss": [0.3, 0.2],
    "heldout_x0_error": [0.26, 0.15],
    "x0_mean_image": [0.204, 0.204],
    "failed": [
        [
            {
                "criterion": "x0",
                "step": 1200,
                "detail": "final held-out x0 error 0.26 is not below the mean image's 0.204; the loss "
                "collapsed at step 700 (from its lowest 0.1 to 0.5; it ended at 0.6)",
            }
        ],
        [],
    ],
}


def test_a_map_written_today_keeps_its_causes_and_sets_no_rule_beside_itself(tmp_path):
    (tmp_path / "map.json").write_text(json.dumps({"metric": "loss", "cells": [TODAY_ROW]}))
    cells, _, recorded = read_map(tmp_path / "map.json")
    assert cells[0].cell.depth is None and recorded == {} and agreement_section(cells, recorded) == []
    (failure,) = cells[0].runs[0].breaks
    assert (failure.step, cause(failure)) == (1200, "x0 after a loss collapse")
    assert not cells[0].runs[1].breaks
    write_map_json(cells, tmp_path / "again.json", "loss")
    assert "recorded_criteria" not in json.loads((tmp_path / "again.json").read_text())["cells"][0]


def test_a_map_judges_a_network_that_predicts_the_noise_by_its_noise_error(tmp_path):
    row = {
        **TODAY_ROW,
        "heldout_x0_error": [12.0, 9.0],  # the x0 error of an eps network: its noise error / alpha^2
        "heldout_eps_error": [0.05, 1.1],
        "prediction": ["eps", "eps"],
        "failed": [[], []],
    }
    (tmp_path / "map.json").write_text(json.dumps({"metric": "loss", "cells": [row]}))
    cells, _, _ = read_map(tmp_path / "map.json")
    assert [[str(b) for b in r.breaks] for r in cells[0].runs] == [
        [],
        ["eps: final held-out eps error 1.1 is not below 1, the error of predicting no noise"],
    ]
    write_map_json(cells, tmp_path / "again.json", "loss")
    again = json.loads((tmp_path / "again.json").read_text())["cells"][0]
    assert again["prediction"] == ["eps", "eps"] and again["heldout_eps_error"] == [0.05, 1.1]


def test_a_held_out_error_without_a_mean_image_is_judged_by_the_loss(tmp_path):
    row = {**FIRST_ROW, "heldout_x0_error": [0.3, 0.15, 0.2]}  # logged before the mean image was
    (tmp_path / "map.json").write_text(json.dumps({"metric": "loss", "cells": [row]}))
    cells, _, _ = read_map(tmp_path / "map.json")
    assert [[b.criterion for b in r.breaks] for r in cells[0].runs] == [["loss"], [], []]


def test_a_map_read_back_keeps_its_metric_whatever_the_config_evaluates(tmp_path, capsys):
    (tmp_path / "map.json").write_text(json.dumps({"metric": "loss", "cells": [FIRST_ROW]}))
    base = load_config("demo_uvit", [])
    assert base.eval.every > 0  # a config that would score FD
    report = report_sweep(base, tmp_path).read_text()
    again = json.loads((tmp_path / "map.json").read_text())
    assert again["metric"] == "loss" and again["cells"][0]["final_loss"] == FIRST_ROW["final_loss"]
    assert "The colour is the final loss" in report and "FD" not in report.split("\n\n")[1]


@pytest.mark.parametrize("cells", [{"a": 1}, [1, 2], [{**FIRST_ROW, "seeds": "five"}]])
def test_a_map_of_the_wrong_shape_is_one_line(tmp_path, cells):
    (tmp_path / "map.json").write_text(json.dumps({"metric": "loss", "cells": cells}))
    with pytest.raises(
        ScaleLongError, match=r"map\.json: (not a sweep's map\.json|a cell of this map\.json)"
    ):
        read_map(tmp_path / "map.json")


def run(seed, commit, precision, argv=("scalelong", "sweep", "stability")):
    made = {
        "commit": commit,
        "torch": "2.14.1",
        "precision": precision,
        "device_name": "AMD EPYC",
        "argv": list(argv),
    }
    return StudyRun(f"run{seed}", [], {"provenance": made}, [], seed=seed)


def test_a_study_of_mixed_precisions_says_so_per_cell():
    same = {Cell(12, 2e-2, "none"): [run(0, "a" * 40, "fp32"), run(1, "a" * 40, "fp32")]}
    (heading, line, cmd_head, cmds) = provenance_section(same)
    assert line.startswith(
        "Every run: commit aaaaaaaaaa, torch 2.14.1, precision fp32, device_name AMD EPYC."
    )
    assert cmds == "    scalelong sweep stability  # 2"
    # a flag that changes only what the terminal shows is not part of the command that made a run
    quiet = {
        Cell(12, 2e-2, "none"): [run(0, "a" * 40, "fp32", ("cli.py", "sweep", "stability", "--no-progress"))]
    }
    assert provenance_section(quiet)[3] == "    scalelong sweep stability  # 1"
    mixed = {
        Cell(12, 2e-2, "none"): [run(0, "a" * 40, "bf16"), run(5, "b" * 40 + "+dirty", "fp32")],
        Cell(12, 2e-2, "cs"): [StudyRun("old", [], {}, [], seed=0)],
    }
    assert cell_provenance(mixed[Cell(12, 2e-2, "none")])["precision"] == ["bf16", "fp32"]
    parts = provenance_section(mixed)
    rows = parts[2].splitlines()
    assert (
        rows[2] == "| 12 | 0.02 | none | 2 | aaaaaaaaaa, bbbbbbbbbb+dirty | 2.14.1 | bf16, fp32 | AMD EPYC |"
    )
    assert rows[3] == "| 12 | 0.02 | cs | 1 | unrecorded | unrecorded | unrecorded | unrecorded |"


def test_failures_are_counted_by_cause():
    from scalelong.studies.sweep import cause_section

    overflow = Divergence(
        "nonfinite",
        40,
        "stopped on non-finite steps in a row; the last: fp16 overflow in forward at "
        "out_blocks.0.skip_linear (step 40: |value| inf)",
    )
    runs = [
        SeedSummary(0, breaks=(overflow,)),
        SeedSummary(1, breaks=FAILED),
        SeedSummary(2, breaks=(overflow,)),
    ]
    runs.append(SeedSummary(3))
    heading, _, table = cause_section([CellSummary(Cell(12, 2e-2, "none"), runs)])
    assert heading == "## Failures by cause"
    assert table.splitlines()[2:] == [
        "| 12 | 0.02 | none | nonfinite: fp16 overflow in forward at out_blocks.0.skip_linear | 2/4 |",
        "| 12 | 0.02 | none | x0 | 1/4 |",
    ]
    assert cause_section([CellSummary(Cell(12, 2e-2, "cs"), [SeedSummary(0)])]) == []


def test_the_runs_are_listed_by_the_seeds_they_ran():
    """A sweep of unequal seeds (seed 0 a cell, five around an edge, 20 for a paired test) says which
    runs it holds: per set of seeds, the methods that ran exactly those and at which lrs."""

    def ran(method, lr, seeds):
        return CellSummary(Cell(12, lr, method), [SeedSummary(s) for s in seeds])

    cells = [ran(m, lr, [0]) for m in ("cs-init", "none") for lr in (0.01, 0.04)]
    cells += [ran(m, 0.02, range(20)) for m in ("merge-norm", "none")]
    cells += [ran("cs", lr, range(5)) for lr in (0.01, 0.02)]
    assert seeds_table(cells).splitlines() == [
        "| depth | seeds | methods | lrs | runs |",
        "|---|---|---|---|---|",
        "| 12 | 0-19 | none, merge-norm | 0.02 | 40 |",
        "| 12 | 0-4 | cs | 0.01, 0.02 | 10 |",
        "| 12 | 0 | none, cs-init | 0.01, 0.04 | 4 |",
    ]
    assert seeds_table([ran("none", 0.01, range(5)), ran("cs", 0.02, range(5))]) == ""
