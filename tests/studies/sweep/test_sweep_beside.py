"""A sweep beside another precision's map (`scalelong sweep ... --beside PATH`): the lr basin and the
failures by cause of each precision on the runs both made, the other precision's fp16 headroom as a
prediction of what fp16 did, the refusals of a bad --beside, and a report-only rebuild that finds the
map beside again. Everything on runs and maps written by hand: nothing trains."""

import json
import shutil

import pytest

from scalelong.cli import main
from scalelong.diagnostics import metric_names as names
from scalelong.diffusion import NOISE_LEVELS
from scalelong.studies.summary import Cell
from scalelong.studies.sweep import cell_config, report_sweep
from scalelong.training.config import load_config, save_config

FP16 = ["train.mixed_precision=fp16"]
FORWARD = "fp16 overflow in forward at out_blocks.0.skip_linear"
GRADIENT = "gradient overflow: the loss scale lowered to 2048"
STOPPED = "stopped on non-finite steps in a row; the last: "


def probe(step: int, error: float) -> dict:
    """A held-out probe: the same x0 error at every noise level, the mean image's 0.8."""
    record = {"step": step, names.X0_MEAN_IMAGE: 0.8}
    record.update({names.noise("x0", level): error for level in NOISE_LEVELS})
    return record


# ----------------------------------------------------------------------------- the bf16 map beside


def bf16_row(lr: float, method: str, runs: dict) -> dict:
    """A map.json row of an older format (no precision, no skipped steps): per seed (headroom, x0
    error, recorded criteria)."""
    seeds = sorted(runs)
    return {
        "depth": 12,
        "lr": lr,
        "method": method,
        "seeds": len(seeds),
        "seed": seeds,
        "final_loss": [0.05 for _ in seeds],
        "fp16_headroom_least": [runs[s][0] for s in seeds],
        "heldout_x0_error": [runs[s][1] for s in seeds],
        "x0_mean_image": [0.8 for _ in seeds],
        "failed": [runs[s][2] for s in seeds],
    }


def nonfinite(step: int) -> list[dict]:
    return [{"criterion": "nonfinite", "step": step, "detail": "stopped on non-finite steps in a row"}]


def write_bf16_map(folder, depth: int = 12) -> None:
    """The bf16 sweep: seed 0 at 1e-2, 2e-2, 4e-2 and 8e-2, seed 1 too at 2e-2 (fp16 ran no seed 1,
    nor 8e-2). `none` falls below 1 in headroom from 1e-2 on, fails at 2e-2 (x0 0.9, not below the
    mean image's 0.8) and 4e-2 (non-finite); `cs` keeps 7.5, 2 and then 0.8 at 4e-2, trained."""
    rows = [
        bf16_row(1e-2, "none", {0: (0.5, 0.3, [])}),
        bf16_row(2e-2, "none", {0: (0.2, 0.9, []), 1: (3.0, 0.3, [])}),
        bf16_row(4e-2, "none", {0: (0.1, None, nonfinite(300))}),
        bf16_row(8e-2, "none", {0: (0.05, None, nonfinite(100))}),
        bf16_row(1e-2, "cs", {0: (7.5, 0.3, [])}),
        bf16_row(2e-2, "cs", {0: (2.0, 0.3, []), 1: (4.0, 0.3, [])}),
        bf16_row(4e-2, "cs", {0: (0.8, 0.4, [])}),
        bf16_row(8e-2, "cs", {0: (0.3, None, nonfinite(150))}),
    ]
    for row in rows:
        row["depth"] = depth
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "map.json").write_text(json.dumps({"metric": "loss", "rule": "the bf16 rule", "cells": rows}))


# ----------------------------------------------------------------------------- the fp16 runs


def write_fp16_run(base, runs_dir, lr, method, headroom, error=None, skipped=(5, 0), last="", stopped=""):
    """One fp16 run of seed 0: its least fp16 headroom, its final x0 error (None: stopped on
    non-finite steps, ``stopped`` the cause), the steps its loss scaler skipped (overflowed
    gradients, non-finite losses) and the cause of its last skipped step."""
    cfg = cell_config(base, Cell(12, lr, method), 0, runs_dir)
    path = runs_dir / cfg.name
    path.mkdir(parents=True)
    save_config(cfg, path / "config.yaml")
    records = [probe(0, 1.0), {"step": 100, "loss": 0.1, names.FP16_HEADROOM: headroom}]
    records += [probe(1200, error)] if error is not None else []
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {
        "status": "complete",
        "steps": 1200,
        "overflow_steps": skipped[0],
        "nonfinite_steps": skipped[1],
    }
    if stopped:
        summary |= {"status": "stopped", "stopped": {"step": 300, "kind": "nonfinite", "cause": stopped}}
    if last:
        summary["last_skipped"] = last
    summary["provenance"] = {"precision": "fp16", "commit": "a" * 40}
    (path / "summary.json").write_text(json.dumps(summary))


def write_fp16_sweep(tmp_path):
    """The fp16 sweep of seed 0 at 6e-3 (which bf16 did not run), 1e-2, 2e-2, 4e-2. Every run skips
    5 steps while its loss scale falls from 65,536. `none` at 1e-2 trains with 2 non-finite losses
    (its forward overflowed); at 2e-2 and 4e-2 it stops on overflows; `cs` trains at 1e-2, at 2e-2
    with one forward overflow (which bf16's headroom 2 did not predict) and fails at 4e-2 by its
    x0 error (bf16's 0.8 predicted an overflow that did not come)."""
    base = load_config("stability", [f"out_dir={tmp_path}", *FP16])
    runs = tmp_path / "basin-fp16-sweep" / "runs"
    write_fp16_run(base, runs, 6e-3, "none", 12.0, 0.25, last=GRADIENT + " (step 5)")
    write_fp16_run(base, runs, 6e-3, "cs", 30.0, 0.25, last=GRADIENT + " (step 5)")
    write_fp16_run(base, runs, 1e-2, "none", 0.0, 0.3, (5, 2), f"{FORWARD} (step 700: |value| inf)")
    write_fp16_run(
        base, runs, 2e-2, "none", 0.0, stopped=f"{FORWARD} (step 300: |value| inf)", skipped=(5, 3)
    )
    write_fp16_run(base, runs, 4e-2, "none", 0.0, stopped=f"{FORWARD} (step 90: |value| inf)", skipped=(5, 3))
    write_fp16_run(base, runs, 1e-2, "cs", 6.0, 0.3, last=GRADIENT + " (step 5)")
    write_fp16_run(base, runs, 2e-2, "cs", 0.0, 0.3, (6, 1), f"{FORWARD} (step 900: |value| inf)")
    write_fp16_run(base, runs, 4e-2, "cs", 1.5, 0.85, last=GRADIENT + " (step 5)")
    return base, runs.parent


def section(report: str) -> str:
    return report.split("## The precisions side by side\n\n")[1].split("\n## ")[0]


def table_after(text: str, marker: str) -> list[str]:
    """The lines of the first table after ``marker``."""
    rest = text.split(marker, 1)[1]
    start = rest.index("\n|") + 1
    return rest[start:].split("\n\n")[0].splitlines()


def test_the_section_sets_the_two_precisions_side_by_side(tmp_path):
    base, sweep = write_fp16_sweep(tmp_path)
    write_bf16_map(tmp_path / "basin-sweep")
    report = report_sweep(base, sweep, beside=tmp_path / "basin-sweep").read_text()
    text = section(report)
    print(text)  # the section as it renders, for the record
    assert "the 6 runs (depth, lr, method, seed) that both made" in text
    # the basin of each precision on the shared runs: seed 0 at 1e-2, 2e-2 and 4e-2
    fp16 = table_after(text, "**fp16**")
    assert (
        fp16[0]
        == "| depth | method | largest stable lr (fp16) | failed at 0.01 | failed at 0.02 | failed at 0.04 |"
    )
    assert fp16[2:] == ["| 12 | none | 0.01 | 0/1 | 1/1 | 1/1 |", "| 12 | cs | 0.02 | 0/1 | 0/1 | 1/1 |"]
    other = table_after(text, "**the other precision**")
    assert other[0].startswith("| depth | method | largest stable lr (the other precision) |")
    assert other[2:] == [
        "| 12 | none | 0.01 | 0/1 | 1/1 | 1/1 |",
        "| 12 | cs | 0.04 (the largest tried) | 0/1 | 0/1 | 0/1 |",
    ]
    # the basin figure with a row per precision, LR sensitivity and the failures paired by seed in each
    basin = text.split("### The lr basin and each method against `none`, in each precision")[1]
    assert "![the lr basin in each precision](basin_precisions.png)" in basin
    assert (sweep / "basin_precisions.png").stat().st_size > 10_000
    fp16_basin = basin.split("**fp16**")[1].split("**the other precision**")[0]
    assert "| cs | 0.02 | 0/1 | 0/1 | 1/1 | 0.183 (1 seed) | -0.283 (1 seed, no interval) |" in fp16_basin
    paired = [r.split(" | ")[1:9] for r in fp16_basin.splitlines() if r.startswith("| 12 |")]
    assert paired == [
        ["0.01", "cs", "1", "0", "0", "0", "1", "1"],
        ["0.02", "cs", "1", "0", "1", "0", "0", "1"],  # only none failed
        ["0.04", "cs", "1", "1", "0", "0", "0", "1"],
    ]
    other = basin.split("**the other precision**")[1].split("### Failures by cause")[0]
    assert [r.split(" | ")[1:9] for r in other.splitlines() if r.startswith("| 12 |")][1:] == [
        ["0.02", "cs", "1", "0", "1", "0", "0", "1"],
        ["0.04", "cs", "1", "0", "1", "0", "0", "1"],
    ]
    # the failures by cause of each precision, the same table as the report's own
    causes = text.split("### Failures by cause in each precision")[1]
    assert table_after(causes, "**fp16**")[2:] == [
        f"| 12 | 0.02 | none | nonfinite: {FORWARD} | 1/1 |",
        f"| 12 | 0.04 | none | nonfinite: {FORWARD} | 1/1 |",
        "| 12 | 0.04 | cs | x0 | 1/1 |",
    ]
    assert table_after(causes, "**the other precision**")[2:] == [
        "| 12 | 0.02 | none | x0 | 1/1 |",
        "| 12 | 0.04 | none | nonfinite | 1/1 |",
    ]
    # the prediction against what fp16 did: the rule in words, then the 2x2
    prediction = text.split("### fp16 headroom as a prediction of fp16 overflow")[1]
    assert "below 1 predicts that fp16 overflows" in prediction
    assert "6 of the 6 fp16 runs skipped steps" in prediction  # the loss scale's first steps, not counted
    square = table_after(prediction, "The count:")
    assert square[0] == "| the other precision: least fp16 headroom | fp16: overflowed | fp16: no overflow |"
    assert square[2:] == ["| below 1: predicts an overflow | 3 | 1 |", "| 1 or more | 1 | 1 |"]
    rows = table_after(prediction, "Per run:")
    assert rows[0] == (
        "| depth | lr | method | seed | the other precision: least fp16 headroom | fp16: outcome | fp16: "
        "steps skipped (loss scale + non-finite loss) | fp16: least fp16 headroom | fp16: overflowed |"
    )
    assert rows[2] == f"| 12 | 0.01 | none | 0 | 0.5 | trained; last skipped: {FORWARD} | 5 + 2 | 0 | yes |"
    assert rows[4] == f"| 12 | 0.02 | none | 0 | 0.2 | failed: nonfinite: {FORWARD} | 5 + 3 | 0 | yes |"
    assert rows[7] == "| 12 | 0.04 | cs | 0 | 0.8 | failed: x0 | 5 + 0 | 1.5 | no |"
    assert len(rows) == 2 + 6
    # map.json records where the map beside is and its rule, and each run's precision and skipped steps
    data = json.loads((sweep / "map.json").read_text())
    assert data["beside"]["path"] == "../basin-sweep/map.json"
    assert data["beside"]["rule"] == "the bf16 rule"
    assert "predicts that fp16 overflows" in data["beside"]["overflow_rule"]
    cell = next(c for c in data["cells"] if (c["method"], c["lr"]) == ("none", 1e-2))
    assert cell["precision"] == ["fp16"] and cell["overflow_steps"] == [5] and cell["nonfinite_steps"] == [2]
    assert cell["last_skipped"] == [f"{FORWARD} (step 700: |value| inf)"]


def test_the_other_precision_is_read_from_the_map_or_the_config_of_its_runs(tmp_path):
    base, sweep = write_fp16_sweep(tmp_path)
    write_bf16_map(tmp_path / "basin-sweep")
    (tmp_path / "basin-sweep" / "runs.json").write_text(
        json.dumps({"base_config": {"train": {"mixed_precision": "bf16"}}, "cells": []})
    )
    text = section(report_sweep(base, sweep, beside=tmp_path / "basin-sweep" / "map.json").read_text())
    assert "| bf16, by its config: least fp16 headroom | fp16: overflowed | fp16: no overflow |" in text
    # a map that records each run's precision (today's) names it without a config
    data = json.loads((sweep / "map.json").read_text())
    for c in data["cells"]:
        c["precision"] = ["bf16" for _ in c["seed"]]
    shutil.rmtree(tmp_path / "basin-sweep")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "map.json").write_text(json.dumps(data))
    text = section(report_sweep(base, sweep, beside=tmp_path / "other").read_text())
    assert "| depth | method | largest stable lr (bf16) |" in text


def sweep_argv(tmp_path, *extra: str) -> list[str]:
    grid = ["--methods", "none,cs", "--lrs", "6e-3,1e-2,2e-2,4e-2", "--depths", "12", "--seeds", "1"]
    return ["sweep", "stability", *grid, "--name", "basin-fp16", f"out_dir={tmp_path}", *FP16, *extra]


def test_a_report_only_rebuild_finds_the_map_beside_again(tmp_path, capsys):
    base, sweep = write_fp16_sweep(tmp_path)
    write_bf16_map(tmp_path / "basin-sweep")
    beside = str(tmp_path / "basin-sweep" / "map.json")
    assert main([*sweep_argv(tmp_path, "--report-only", "--beside", beside), "--no-progress"]) == 0
    first = section((sweep / "report.md").read_text())
    assert "| below 1: predicts an overflow | 3 | 1 |" in first
    # without --beside: map.json says where the map beside is
    assert main([*sweep_argv(tmp_path, "--report-only"), "--no-progress"]) == 0
    assert section((sweep / "report.md").read_text()) == first
    # the run folders gone, from map.json alone: the same section, skipped steps and causes kept
    shutil.rmtree(sweep / "runs")
    (sweep / "runs.json").unlink()
    assert main([*sweep_argv(tmp_path, "--report-only"), "--no-progress"]) == 0
    assert section((sweep / "report.md").read_text()) == first
    capsys.readouterr()
    # the map beside moved away: said in one line, the report without the section
    shutil.rmtree(tmp_path / "basin-sweep")
    assert main([*sweep_argv(tmp_path, "--report-only"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "the map beside it recorded" in out and "is gone" in out
    assert "## The precisions side by side" not in (sweep / "report.md").read_text()


def listing(folder) -> dict:
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("report_only", [True, False], ids=["report-only", "training"])
def test_a_bad_beside_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys, report_only):
    base, sweep = write_fp16_sweep(tmp_path)
    write_bf16_map(tmp_path / "d24", depth=24)  # a map of another depth: no run in common
    (tmp_path / "empty").mkdir()
    (tmp_path / "compare.json").write_text(json.dumps({"methods": ["none"], "seeds": 1}))
    (tmp_path / "cells.json").write_text(json.dumps({"cells": [{"lr": 1e-2}]}))
    (tmp_path / "broken.json").write_text("{not json")
    before = listing(tmp_path)
    cases = {
        str(tmp_path / "nowhere"): "no such file or folder",
        str(tmp_path / "empty"): "holds no map.json",
        str(tmp_path / "compare.json"): "not a sweep's map.json",
        str(tmp_path / "cells.json"): "not a sweep's map.json",
        str(tmp_path / "broken.json"): "not a sweep's map.json",
        str(tmp_path / "d24"): "shares no run (depth, lr, method, seed) with this sweep",
    }
    extra = ["--report-only"] if report_only else ["--jobs", "1"]
    for given, why in cases.items():
        assert main([*sweep_argv(tmp_path, *extra, "--beside", given), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: --beside ") and why in err, err
    assert listing(tmp_path) == before
