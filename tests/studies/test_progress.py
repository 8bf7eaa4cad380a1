"""A study's progress lines: one per run in training, read from each run's metrics.jsonl by the
parent, printed as plain lines where the output is not a terminal, off with --no-progress."""

import json
import os
import re
import subprocess
import sys

from conftest import learning_uvit_overrides, tiny_uvit_overrides
from scalelong.cli import main
from scalelong.studies import progress
from scalelong.studies.progress import MetricsTail, StudyProgress


def test_the_tail_reads_a_cut_last_line_once_it_is_whole_and_rereads_a_rewritten_log(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.read() == ([], False)  # not written yet
    first = json.dumps({"step": 5, "loss": 0.5}) + "\n"
    second = json.dumps({"step": 10, "loss": "nan", "fd": 40.0}) + "\n"
    path.write_text(first + "not json\n" + second[:12])  # a worker writing its line right now
    assert tail.read() == ([{"step": 5, "loss": 0.5}], False)
    assert tail.read() == ([], False)
    with path.open("a") as f:
        f.write(second[12:])
    assert tail.read() == ([{"step": 10, "loss": "nan", "fd": 40.0}], False)
    tmp = tmp_path / "rewritten"
    tmp.write_text(first)  # a resumed run truncates its log to its checkpoint, atomically
    os.replace(tmp, path)
    assert tail.read() == ([{"step": 5, "loss": 0.5}], True)

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(first + second + '{"step": 15, "lo')
    shown = StudyProgress([("r", run, 20)], live=False, every=1e9)
    try:
        assert shown.finished("r") == ""  # never seen training: nothing to add
        state = shown.runs["r"]
        assert (state.step, state.fd, state.fd_step) == (10, 40.0, 10)
        assert str(state.loss) == "nan"
    finally:
        shown.close()


def compare_command(tmp_path, *flags):
    overrides = tiny_uvit_overrides("p", tmp_path, steps=30)
    return ["compare", "configs/demo_uvit.yaml", "--methods", "none,cs", *overrides, *flags]


def test_a_compare_prints_plain_progress_lines_and_a_final_line_per_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(progress, "POLL_S", 0.05)
    monkeypatch.setattr(progress, "PLAIN_EVERY_S", 0.05)
    assert main(compare_command(tmp_path)) == 0
    out, err = capsys.readouterr()
    for name in ("none-seed0", "cs-seed0"):
        assert re.search(rf"^progress  {name}\s+([\d-]+)/30  ", err, re.M), err
        final = rf"^\[\d/2\] {name}: trained \(30/30 steps, loss [\d.e-]+, \S+ elapsed\)$"
        assert re.search(final, out, re.M), out
    assert "\x1b[" not in err  # no cursor movement where the output is not a terminal


def test_no_progress_prints_no_progress_lines(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(progress, "POLL_S", 0.05)
    monkeypatch.setattr(progress, "PLAIN_EVERY_S", 0.05)
    assert main(compare_command(tmp_path, "--no-progress")) == 0
    out, err = capsys.readouterr()
    assert "progress" not in err and "elapsed" not in out + err
    assert re.search(r"^\[1/2\] none-seed0: trained$", out, re.M), out


def test_a_sweep_on_two_workers_shows_both_runs_through_a_pipe(tmp_path):
    """The workers write only their logs; the parent reads them and prints every run's line."""
    command = ["sweep", "configs/demo_uvit.yaml", *learning_uvit_overrides(tmp_path), "train.steps=60",
               "--methods", "none,cs", "--lrs", "1e-3", "--depths", "4", "--jobs", "2"]  # fmt: skip
    script = (
        "import sys; from scalelong.studies import progress; progress.PLAIN_EVERY_S = 0.5; "
        f"from scalelong.cli import main; sys.exit(main({command!r}))"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    for m in ("none", "cs"):
        name = f"d4-lr0.001-{m}-seed0"
        steps = re.findall(rf"^progress  {name}\s+(\d+)/60  loss ", done.stderr, re.M)
        assert steps, done.stderr
        assert re.search(rf"^\[\d/2\] {name}: trained \(60/60 steps, loss ", done.stdout, re.M), done.stdout


def test_on_a_terminal_the_block_is_redrawn_in_place_and_cleared_at_the_end(tmp_path, capsys, monkeypatch):
    import io
    import time

    monkeypatch.setattr(progress, "POLL_S", 0.02)
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text("{}")  # the run is training
    (run / "metrics.jsonl").write_text(json.dumps({"step": 4, "loss": 0.25, "fd": 12.5}) + "\n")
    stream = io.StringIO()
    shown = StudyProgress([("r", run, 8), ("w", tmp_path / "waiting", 8)], stream=stream, live=True)
    time.sleep(0.2)
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 8, "loss": 0.125}) + "\n")
    time.sleep(0.2)
    shown.note("[1/2] r: trained")
    shown.close()
    drawn = stream.getvalue()
    assert re.search(r"\x1b\[2Kr  ▕.*▏ +8/8  loss 0.125  FD 12.5 @4  \d+s elapsed", drawn), drawn
    assert "2 runs: 1 training, 1 waiting, 0 finished" in drawn
    assert drawn.endswith("\x1b[2F\x1b[J")  # the block erased: the outcome lines stay
    assert capsys.readouterr().out == "[1/2] r: trained\n"
