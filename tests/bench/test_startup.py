"""benchmarks/startup: every command is timed against `import torch`, checked for its exit code, quoted.

No timing assertions: the medians are whatever the machine gives; what is checked is that each ratio
is the quotient of two medians of the same run, that the baseline is exactly 1, and that a command
answering with another exit code than expected stops the benchmark before anything is timed."""

import json
import sys

import benchmarks.__main__ as bench
import benchmarks.harness as harness
import pytest
from benchmarks import startup

from scalelong.cli import build_parser


def test_each_command_is_what_the_cli_parses(tmp_path):
    cmds = startup.commands(tmp_path)
    assert list(cmds) == ["torch", "info", "refused", "dry-run"]
    assert [code for _, code in cmds.values()] == [0, 0, 2, 0]
    assert cmds["torch"][0] == [sys.executable, "-c", "import torch"]
    parse = build_parser().parse_args
    dry = parse(cmds["dry-run"][0][3:])  # after `python -m scalelong.cli`
    assert dry.command == "train" and dry.dry_run and f"out_dir={tmp_path}" in dry.overrides
    assert parse(cmds["refused"][0][3:]).overrides == ["optim.lr=abc"]
    assert parse(cmds["info"][0][3:]).command == "info"


@pytest.mark.slow
def test_every_command_is_timed_against_torch_and_quoted(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "RESULTS", tmp_path)
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    startup.main(["--quick", "--repeats", "1"])
    result = json.loads((tmp_path / "startup_quick.json").read_text())
    median, ratio = result["median_s"], result["ratio"]
    assert list(median) == ["torch", "info", "refused", "dry-run"] and result["repeats"] == 1
    assert ratio["torch"] == 1.0
    for name, seconds in median.items():
        assert seconds > 0 and ratio[name] == pytest.approx(seconds / median["torch"])
        assert result["met"][name] == (ratio[name] <= startup.TARGET)
    assert "--dry-run" in result["commands"]["dry-run"] and "optim.lr=abc" in result["commands"]["refused"]
    page = "\n".join(bench.startup_section(quick=True))
    assert "python -m benchmarks.startup" in page and "1 interleaved repeats, quick" in page
    row = next(line for line in page.splitlines() if line.startswith("| dry-run |"))
    assert f"| {ratio['dry-run']:.2f} |" in row and ("met" if result["met"]["dry-run"] else "not met") in row


def test_a_command_with_another_exit_code_stops_the_benchmark(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "RESULTS", tmp_path)
    refused, _ = startup.commands(tmp_path)["refused"]
    # marked as expected to succeed: the benchmark would time an error message, not the command
    monkeypatch.setattr(startup, "commands", lambda folder: {"refused": (refused, 0)})
    with pytest.raises(RuntimeError, match=r"'refused' .* exited with 2, expected 0") as stop:
        startup.main(["--quick", "--repeats", "1"])
    assert "error: config key 'optim.lr'" in str(stop.value)  # what it said, to see why
    assert not list(tmp_path.iterdir())  # nothing timed, nothing written
