import math

import pytest

from conftest import tiny_uvit_overrides
from scalelong.cli import main
from scalelong.compare import mean_ci, parse_methods, steps_to_target, summarise, summary_table
from scalelong.errors import ScaleLongError


def fd_curve(steps_to_values):
    return [{"step": s, "fd": v, "loss": 1.0} for s, v in steps_to_values]


def fd_records(values, start=1000, every=1000):
    return [{"step": start + k * every, "fd": v} for k, v in enumerate(values)]


def test_steps_to_target_known_answer():
    runs = {
        "none": fd_records([100.0, 50.0, 30.0, 20.0]),  # final 20, first reached at 4000
        "cs": fd_records([80.0, 30.0, 20.0, 15.0]),  # reaches 20 at 3000
        "ls": fd_records([60.0, "nan", 19.0, 12.0]),  # the NaN at 2000 does not count; 19 at 3000
        "sqrt2": fd_records([90.0, 60.0, 40.0, 25.0]),  # never
        "fast": fd_records([18.0, 10.0]),  # at 1000
    }
    res = steps_to_target(runs, "none")
    assert res.target == 20.0
    assert res.steps == {"none": 4000, "cs": 3000, "ls": 3000, "sqrt2": None, "fast": 1000}
    assert res.speedup == {
        "none": 1.0,
        "cs": pytest.approx(4 / 3),
        "ls": pytest.approx(4 / 3),
        "sqrt2": None,
        "fast": 4.0,
    }


def test_steps_to_target_non_monotone_baseline_and_errors():
    runs = {"none": fd_records([100.0, 15.0, 30.0, 20.0]), "cs": fd_records([20.0, 10.0])}
    res = steps_to_target(runs, "none")
    assert res.steps["none"] == 2000  # it first got as good as its final value at step 2000
    assert res.speedup["cs"] == 2.0
    with pytest.raises(ScaleLongError, match="baseline"):
        steps_to_target(runs, "ls")
    with pytest.raises(ScaleLongError, match="finite"):
        steps_to_target({"none": fd_records(["nan"])}, "none")


def test_summary_pairs_speedups_by_seed_with_known_answer():
    runs = {
        # baseline reaches its final FD (10) at step 400 in both seeds
        "none": [
            fd_curve([(100, 40), (200, 20), (300, 12), (400, 10)]),
            fd_curve([(100, 50), (200, 30), (300, 15), (400, 10)]),
        ],
        # cs gets there at 200 in seed 0 and 300 in seed 1: speed-ups 2.0 and 1.333
        "cs": [
            fd_curve([(100, 30), (200, 9), (300, 8), (400, 7)]),
            fd_curve([(100, 35), (200, 14), (300, 10), (400, 9)]),
        ],
        # sqrt2 never reaches 10
        "sqrt2": [fd_curve([(100, 60), (200, 40), (300, 30), (400, 20)])] * 2,
    }
    by_method = {s.method: s for s in summarise(runs, "none")}
    assert by_method["none"].steps_to_target == [400, 400]
    assert by_method["cs"].steps_to_target == [200, 300]
    assert by_method["cs"].speedup == pytest.approx([2.0, 4 / 3])
    assert by_method["sqrt2"].steps_to_target == [None, None]
    table = summary_table(list(by_method.values()), "none")
    assert "| cs | 8 ± " in table and "250 (2/2 seeds)" in table and "not reached (0/2)" in table
    # paired final-FD change: cs 7/10 - 1 and 9/10 - 1 -> -20% on average
    assert by_method["cs"].fd_change == pytest.approx([-0.3, -0.1])
    assert "| -20% ± " in table


def test_mean_ci_matches_the_t_interval():
    mean, half = mean_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    assert mean == 3.0
    t95 = 2.7764451051977987  # two-sided 95% Student t quantile, 4 degrees of freedom
    assert half == pytest.approx(t95 * math.sqrt(2.5) / math.sqrt(5), rel=1e-12)
    assert math.isnan(mean_ci([7.0])[1])
    # beyond 30 degrees of freedom too (the quantile tends to 1.96, never reaching it)
    _, half = mean_ci([0.0, 1.0] * 25)
    assert half == pytest.approx(2.0095752371292392 * 0.5050762722761054 / math.sqrt(50), rel=1e-12)


def test_parse_methods_rejects_unknown_and_repeated():
    assert parse_methods("none, cs,ls") == ["none", "cs", "ls"]
    with pytest.raises(ScaleLongError, match="choose from"):
        parse_methods("none,foo")
    with pytest.raises(ScaleLongError, match="twice"):
        parse_methods("cs,cs")


@pytest.mark.slow
def test_compare_command_writes_every_plot_and_the_table(tmp_path, capsys):
    overrides = tiny_uvit_overrides("cmp", tmp_path, steps=6, method="none") + [
        "model.uvit.depth=4",
        "diagnostics.every=2",
        "eval.every=3",
        "eval.num_samples=16",
        "eval.steps=2",
        "eval.batch_size=16",
        "eval.final_num_samples=0",
        "train.checkpoint_every=3",
    ]
    command = ["compare", "configs/demo.yaml", "--methods", "none,cs,ls", "--no-progress", *overrides]
    assert main(command) == 0
    stdout = capsys.readouterr().out
    report = tmp_path / "cmp-compare"
    for name in (
        "report.md",
        "report.html",
        "loss.png",
        "feature_norm.png",
        "grad_oscillation.png",
        "fd.png",
        "coefficients_ls.png",
    ):
        assert (report / name).is_file(), name
    rows = [line for line in stdout.splitlines() if line.startswith("| ")]
    assert [r.split("|")[1].strip() for r in rows[1:]] == ["none", "cs", "ls"]
    assert "data:image/png;base64," in (report / "report.html").read_text()
    # a second call reuses the finished runs instead of training again
    assert main(command) == 0
    assert "parameters" not in capsys.readouterr().out
