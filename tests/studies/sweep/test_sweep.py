"""The stability map (`scalelong sweep`): cells, validation, divergence as a result, reuse, seeds added."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TESTS, learning_uvit_overrides
from scalelong.cli import main
from scalelong.errors import ScaleLongError
from scalelong.studies.divergence import Divergence
from scalelong.studies.statistics import rate_interval
from scalelong.studies.summary import Cell, CellSummary, SeedSummary, least_value
from scalelong.studies.sweep import cell_table, parse_numbers, stability_table


def sweep_command(tmp_path):
    return ["sweep", "configs/demo_uvit.yaml", *learning_uvit_overrides(tmp_path), "--no-progress"]


def test_parse_numbers_and_cell_names():
    assert parse_numbers("2e-3, 5e-3,1e-2", "--lrs") == [0.002, 0.005, 0.01]
    assert parse_numbers("12,16", "--depths", int) == [12, 16]
    for bad in ("abc", "0", "1e-3,1e-3", "", "nan"):
        with pytest.raises(ScaleLongError, match="--lrs"):
            parse_numbers(bad, "--lrs")
    assert Cell(12, 0.01, "cs").name(0) == "d12-lr0.01-cs-seed0"
    assert Cell(None, 2e-3, "ls-nonshare").name(3) == "lr0.002-ls-nonshare-seed3"


def test_every_cell_is_validated_before_any_run(tmp_path, capsys):
    base = sweep_command(tmp_path)
    assert main([*base, "--depths", "4,3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "d3-lr" in err and "model.uvit.depth must be an even number" in err
    assert main([*base, "--lrs", "1e-2,x"]) == 2
    assert main(["sweep", "configs/cifar10_unet_ddpm.yaml", "data.path=/nowhere", "--depths", "4"]) == 2
    assert "--depths sets model.uvit.depth; model.type=unet" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing was trained, nothing written


def test_lrs_that_would_share_a_run_folder_are_refused_before_any_run(tmp_path, capsys):
    assert main([*sweep_command(tmp_path), "--lrs", "1e-3,1.0000001e-3", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "0.001 and 0.0010000001 would share the run folder d4-lr0.001-none-seed0" in err
    assert not any(tmp_path.iterdir())  # nothing was trained, nothing written


def test_tables_name_the_largest_stable_lr_and_the_best_stable_cell():
    broke = [Divergence("loss", 40, "")]

    def cell(method, lr, finals, breaks):
        seeds = [SeedSummary(k, final_loss=x, feature_osc=1.0, spikes=0.0, breaks=tuple(b))
                 for k, (x, b) in enumerate(zip(finals, breaks, strict=True))]  # fmt: skip
        return CellSummary(Cell(12, lr, method), seeds, "loss")

    cells = [
        cell("none", 2e-3, [0.30, 0.32], [[], []]),
        cell("none", 1e-2, [0.20, 0.24], [[], broke]),  # lowest, but one seed diverged: not stable
        cell("none", 5e-3, [0.25, 0.27], [[], []]),
        cell("cs", 2e-3, [0.30], [[]]),
        cell("cs", 1e-2, [0.22], [[]]),
        cell("ls", 2e-3, [1.0], [broke]),
        cell("sqrt2", 2e-3, [0.3], [[]]),
        cell("sqrt2", 5e-3, [0.9], [broke]),
        cell("sqrt2", 1e-2, [0.3], [[]]),  # stable by chance above a diverged lr: no margin
    ]
    table = stability_table(cells, "loss").splitlines()
    # Only 2e-3 decides: every method ran seed 0 there, while ls ran no other lr and cs not 5e-3. So
    # none's edge is 2e-3 (its 5e-3 decides nothing), and cs's too, though cs trained at 1e-2.
    # none: mean 0.31, t(0.975, 1) x stdev 0.01414 / sqrt(2) = 12.706 x 0.01 = 0.127
    assert table[2] == "| none | 0.002 (on seed 0) | 0.31 ± 0.13 | 0.002 | 2 |"
    assert table[3] == "| sqrt2 | 0.002 (on seed 0) | 0.3 | 0.002 | 1 |"  # its 5e-3 and 1e-2 decide nothing
    assert table[4] == "| cs | 0.002 (on seed 0) | 0.3 | 0.002 | 1 |"
    assert table[5] == "| ls | none: the smallest lr that decides failed | n/a | | |"
    # without ls, 1e-2 decides on seed 0 for none, sqrt2 and cs: none trained there on seed 0 (its seed
    # 1 failed, which no other method ran), sqrt2 failed below it at 5e-3 - a stable lr above a failed
    # one is luck, not margin - and 5e-3 (not run by cs) still decides nothing
    table = stability_table([c for c in cells if c.cell.method != "ls"], "loss").splitlines()
    assert [row.split(" | ")[1] for row in table[2:]] == [
        "0.01 (the largest tried; on seed 0)",
        "0.01 (the largest tried; on seed 0)",
        "0.01 (the largest tried)",
    ]
    rows = cell_table(cells, "loss").splitlines()
    assert [r.split("|")[1:3] for r in rows[2:5]] == [
        [" none ", " 0.002 "],
        [" none ", " 0.005 "],
        [" none ", " 0.01 "],
    ]
    assert rows[4] == "| none | 0.01 | 2 | 0.22 ± 0.25 | n/a | 1 ± 0 | 0 ± 0 | 1/2 (loss) | 50% (1%-99%) |"
    assert rate_interval(0, 5)[1] == pytest.approx(0.522, abs=1e-3)  # 0/5 still allows 52%
    assert rate_interval(5, 5)[0] == pytest.approx(0.478, abs=1e-3)


def test_the_cell_table_gives_the_least_fp16_headroom_and_the_seeds_that_overflowed():
    def cell(method, headrooms):
        seeds = [SeedSummary(k, final_loss=0.2, feature_osc=1.0, spikes=0.0, fp16_headroom=h)
                 for k, h in enumerate(headrooms)]  # fmt: skip
        return CellSummary(Cell(12, 1e-2, method), seeds, "loss")

    rows = cell_table([cell("none", [0.59, 3.0]), cell("cs", [7.9, 12.0])], "loss").splitlines()
    assert "| loss spikes | least fp16 headroom | failed |" in rows[0]
    assert rows[2].split(" | ")[7:9] == ["0.59 (1/2 below 1)", "0/2"]
    assert rows[3].split(" | ")[7:9] == ["7.9", "0/2"]
    # runs that logged no headroom (diagnostics off, older runs): no column
    assert "headroom" not in cell_table([cell("none", [math.nan])], "loss")
    records = [{"step": 25, "fp16/headroom": 4.0}, {"step": 50, "fp16/headroom": 0.5}, {"step": 75}]
    assert least_value(records, "fp16/headroom") == 0.5 and math.isnan(least_value(records, "loss"))


def test_a_cell_whose_features_blew_up_says_so_instead_of_averaging_the_others():
    def cell(growths):
        seeds = [SeedSummary(k, final_loss=0.2, feature_growth=g) for k, g in enumerate(growths)]
        return CellSummary(Cell(12, 1e-2, "none"), seeds, "loss")

    def growth(growths):
        return cell_table([cell(growths)], "loss").splitlines()[2].split(" | ")[4]

    assert growth([math.inf, 50.0, 60.0]) == "55 ± 64; 1/3 non-finite"
    assert growth([math.inf, math.inf]) == "2/2 non-finite"
    assert growth([2.0, 4.0]) == "3 ± 13"
    assert growth([math.nan, math.nan]) == "n/a"  # not logged: nothing blew up


def mtimes(folder):
    return {p.parent.name: p.stat().st_mtime_ns for p in sorted(folder.glob("runs/*/summary.json"))}


@pytest.mark.slow
def test_sweep_records_divergence_reuses_runs_and_adds_seeds(tmp_path, capsys):
    command = sweep_command(tmp_path)
    grid = ["--methods", "none,cs", "--lrs", "2e-2,1e3", "--depths", "4"]
    assert main([*command, *grid]) == 0
    out = capsys.readouterr().out
    sweep = tmp_path / "t-sweep"
    for name in ("report.md", "report.html", "stability_d4.png", "map.json"):
        assert (sweep / name).is_file(), name
    cells = {(c["method"], c["lr"]): c for c in json.loads((sweep / "map.json").read_text())["cells"]}
    assert cells["none", 1000.0]["failed"][0][0]["criterion"] == "nonfinite"
    # 40 steps of a depth-4 U-ViT denoise no better than the mean image: failed by the x0 criterion,
    # finite throughout (the one rule; what a longer run must beat)
    (verdict,) = cells["none", 0.02]["failed"][0]
    assert verdict["criterion"] == "x0" and "is not below the mean image's" in verdict["detail"]
    assert cells["none", 0.02]["final_loss"][0] > 0
    assert "data:image/png;base64," in (sweep / "report.html").read_text()
    # lr 1e3 diverges at once: the run stops after 3 non-finite steps, and that is a result
    stopped = json.loads((sweep / "runs/d4-lr1000-none-seed0/summary.json").read_text())
    assert stopped["status"] == "stopped" and stopped["stopped"]["step"] == 4
    assert stopped["stopped"]["kind"] == "nonfinite" and "in forward at" in stopped["stopped"]["cause"]
    report = (sweep / "report.md").read_text()
    assert "| none | 0.02 | 1 | " in report and "| 1/1 (x0) |" in report
    assert "| none | 1000 | 1 | " in report and "| 1/1 (nonfinite) |" in report
    assert "- `d4-lr1000-cs-seed0`: nonfinite at step 4" in report
    stability, basin = out.split("lr basin, depth 4:")  # the stability table, then the lr basin's
    rows = [line for line in stability.splitlines() if line.startswith("| none ") or line.startswith("| cs ")]
    assert len(rows) == 2 and all("| none: the smallest lr that decides failed |" in r for r in rows)
    assert "| none | below 0.02 | 1/1 | 1/1 |" in basin and (sweep / "basin.png").is_file()
    assert f"report: {sweep / 'report.md'}" in out

    # the same command again: every run is reused, none retrained
    before = mtimes(sweep)
    assert len(before) == 4
    assert main([*command, *grid]) == 0
    assert "parameters" not in capsys.readouterr().out
    assert mtimes(sweep) == before

    # more seeds at the decisive lr: only the new runs train, and the report shows the union
    assert main([*command, "--methods", "none,cs", "--lrs", "2e-2", "--depths", "4", "--seeds", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("parameters") == 2
    after = mtimes(sweep)
    assert {k: after[k] for k in before} == before and len(after) == 6
    report = (sweep / "report.md").read_text()
    assert "| none | 0.02 | 2 | " in report and "| none | 1000 | 1 | " in report
    assert "1 to 2 seed(s) each" in report


def alive(pid: int) -> bool:
    """A process that still runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def start_waiting_sweep(tmp_path, methods: str = "none,cs") -> tuple[subprocess.Popen, list[Path], list[int]]:
    """A sweep of ``methods`` on --jobs 2 whose runs wait after their step-3 checkpoint; returns the
    process, the directories of the first two runs and the pids of its workers once both wait."""
    overrides = [*learning_uvit_overrides(tmp_path), "train.checkpoint_every=3", "train.log_every=3"]
    command = [sys.executable, str(TESTS / "run_until_killed.py"), "3", "sweep"]
    command += ["configs/demo_uvit.yaml", *overrides, "--methods", methods, "--lrs", "1e-3", "--depths", "4"]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.Popen([*command, "--jobs", "2", "--no-progress"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    runs = [tmp_path / "t-sweep" / "runs" / f"d4-lr0.001-{m}-seed0" for m in ("none", "cs")]
    end = time.monotonic() + 240
    while not all((r / "checkpoints" / "step-000003").exists() for r in runs):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, "the runs did not reach step 3"
        time.sleep(0.2)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    workers = [int(pid) for pid in children if alive(int(pid))]
    assert len(workers) >= 2  # the pool's workers (and the spawn resource tracker)
    return proc, runs, workers


def assert_ended_cleanly(runs: list[Path], workers: list[int]) -> None:
    end = time.monotonic() + 30
    while any(alive(pid) for pid in workers) and time.monotonic() < end:
        time.sleep(0.2)
    assert not [pid for pid in workers if alive(pid)], "a worker outlived the sweep"
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "interrupted" and summary["steps"] == 3, summary
        assert (run / "checkpoints" / "step-000003").is_dir() and not (run / ".lock").exists()


PROC_TREE = pytest.mark.skipif(
    not Path("/proc/self/task").is_dir(), reason="reads the process tree from /proc"
)


@pytest.mark.slow
@PROC_TREE
def test_sigterm_to_a_pooled_sweep_ends_every_worker_cleanly_and_starts_no_queued_run(tmp_path):
    """A job scheduler's SIGTERM reaches the sweep's parent alone: the runs in its --jobs workers
    must end as interrupted runs (checkpoint kept, lock released) and no worker may outlive it.
    Three runs on two workers: the executor has already handed the third to a worker; it must not
    start, or the parent would wait on it (here: for good)."""
    proc, runs, workers = start_waiting_sweep(tmp_path, methods="none,cs,ls")
    proc.send_signal(signal.SIGTERM)  # to the parent only
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 2 and err.strip().count("\n") == 0 and "interrupted" in err, err
    assert_ended_cleanly(runs, workers)
    queued = tmp_path / "t-sweep" / "runs" / "d4-lr0.001-ls-seed0"
    assert not (queued / "metrics.jsonl").exists()


@pytest.mark.slow
@PROC_TREE
def test_workers_of_a_killed_sweep_end_their_runs_cleanly(tmp_path):
    """SIGKILL leaves the parent no chance to act: the workers notice and end their runs themselves."""
    proc, runs, workers = start_waiting_sweep(tmp_path)
    proc.kill()
    proc.communicate(timeout=60)
    assert_ended_cleanly(runs, workers)
