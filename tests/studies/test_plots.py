import math
import sys

import pytest

from scalelong.errors import ScaleLongError
from scalelong.studies.plots import load_metrics, series, spans_decades, write_plots
from scalelong.training.runs import MetricsLog


def synthetic(method: str, scale: float, learned: bool) -> list[dict]:
    recs = []
    for k in range(1, 21):
        r = {
            "step": 10 * k,
            "loss": 1.0 / k + (5.0 if k == 7 and method == "none" else 0.0),
            "feature_norm": scale * (100 + 10 * math.sin(k)),
            "block_grad_norm": scale * (1 + 0.5 * math.cos(k)),
            "osc/block_grad_norm_std": scale * 0.3,
        }
        for i in (1, 2, 3):
            c = 0.5 + 0.01 * k / i if learned else 0.5 ** (i - 1)
            r |= {
                f"skip/{i}/coef_mean": c,
                f"skip/{i}/coef_min": c - 0.05 * learned,
                f"skip/{i}/coef_max": c + 0.05 * learned,
            }
        if k % 5 == 0:
            r["fd"] = 200.0 * scale / k
        recs.append(r)
    return recs


def test_plots_are_written_as_png(tmp_path):
    runs = {
        "none": synthetic("none", 1.0, False),
        "cs": synthetic("cs", 0.5, False),
        "ls": synthetic("ls", 0.6, True),
    }
    runs["none"][3]["feature_norm"] = "nan"  # as the metrics log writes it: a gap, not a crash
    paths = write_plots(runs, tmp_path)
    names = sorted(p.name for p in paths)
    assert names == ["coefficients_ls.png", "fd.png", "feature_norm.png", "grad_oscillation.png", "loss.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_the_peak_value_along_the_network_is_drawn_where_the_blocks_logged_it(tmp_path):
    runs = {"none": synthetic("none", 1.0, False), "cs": synthetic("cs", 0.5, False)}
    for r in runs["none"]:  # cs logged no block: it has no line, and does not stop the figure
        r |= {
            "block/in_blocks.0/absmax": 90.0,
            "block/mid_block/absmax": 80.0,
            "block/out_blocks.0/absmax": 2e4,
        }
    paths = write_plots(runs, tmp_path)
    assert "magnitude.png" in [p.name for p in paths] and (tmp_path / "magnitude.png").stat().st_size > 5000


def test_load_metrics_reads_nonfinite_back(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"step": 1, "loss": math.nan, "fd": 3.0})
    log.write({"step": 2, "loss": 0.5})
    recs = load_metrics(tmp_path)
    steps, loss = series(recs, "loss")
    assert steps == [1, 2] and math.isnan(loss[0]) and loss[1] == 0.5
    assert series(recs, "fd") == ([1], [3.0])


def test_missing_matplotlib_names_the_extra(tmp_path, monkeypatch):
    for mod in [m for m in sys.modules if m.startswith("matplotlib")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ScaleLongError, match=r"scalelong\[report\]"):
        write_plots({"none": synthetic("none", 1.0, False)}, tmp_path)


def test_analyze_drops_a_torn_last_line_and_its_plots_count_as_scalelong_files(tmp_path, capsys):
    from scalelong.cli import main
    from scalelong.training.runs import RunDir

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    log = run.metrics_log
    records = synthetic("ls", 0.6, True)
    records[-1] |= {"noise/x0_mse@0.50": 0.1, "noise/eps_mse@0.50": 0.2, "noise/x0_mse_mean_image": 0.3}
    for r in records:
        log.write(r)
    with log.path.open("a") as f:
        f.write('{"step": 210, "loss": 0.0')  # a kill mid-write
    assert main(["analyze", str(run)]) == 0
    out, err = capsys.readouterr()
    warnings = [line for line in out.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "last line is cut short" in warnings[0] and err == ""
    plots = sorted(run.report_dir.iterdir())
    assert len(plots) == 6 and set(plots) <= set(run.project_files())  # every kind: --overwrite removes them


def test_feature_norms_go_on_a_log_axis_only_when_they_blow_up():
    steady = [169.0, 294.0, 530.0, 505.0]
    blown_up = [*steady, 1.0e7, 5.7e7]  # the demo's `none` run at lr 5e-3 after step 8,150
    assert not spans_decades(steady) and spans_decades(blown_up)
    assert not spans_decades([float("nan"), 0.0, -1.0]) and not spans_decades([])
    assert spans_decades([1.0, float("inf"), 101.0]) and not spans_decades([1.0, float("inf"), 99.0])
