"""benchmarks/cpu_processes: what it reads from a run's log and how the benchmarks page quotes it.

The arms themselves are training commands of the demo (seconds each); what is tested here is the
reading of their logs and the summary, without timing assertions."""

import json

import benchmarks.__main__ as bench
import pytest
from benchmarks import cpu_processes

from scalelong.cli import build_parser


def test_the_rate_is_the_median_logged_after_the_first_quarter(tmp_path):
    log = tmp_path / "metrics.jsonl"
    records = [{"step": s, "img_per_s": r} for s, r in [(25, 10.0), (50, 200.0), (75, 180.0), (100, 400.0)]]
    records.insert(2, {"step": 50, "noise/x0_mse@0.5": 0.1})  # a diagnostics record without a rate
    log.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    assert cpu_processes.logged_rate(log, steps=100) == 200.0  # steps 50, 75, 100: the slow start left out
    with pytest.raises(ValueError, match="no img_per_s after step 250"):
        cpu_processes.logged_rate(log, steps=1000)


def test_each_arm_is_a_valid_train_command(tmp_path):
    cmd = cpu_processes.train_command(tmp_path, steps=12, processes=2)
    args = build_parser().parse_args(cmd[3:])  # after `python -m scalelong.cli`
    assert args.config == "demo_uvit" and "train.cpu_processes=2" in args.overrides and args.no_progress


def test_the_page_quotes_the_table(tmp_path, monkeypatch):
    table = "| arm | processes |\n|---|---|\n| 2 processes, 1 thread each | 2 |"
    result = {"steps": 400, "cores": 2, "repeats": 3, "img_per_s": {}, "wall_s": {}, "table": table}
    (tmp_path / "cpu_processes.json").write_text(json.dumps(result))
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    page = "\n".join(bench.cpu_processes_section(quick=False))
    assert "python -m benchmarks.cpu_processes" in page and "400 steps" in page and table in page
    # --quick finds only the full result: it is quoted, marked as such
    assert "3 alternating repeats, full;" in bench.cpu_processes_section(quick=True)[0]
