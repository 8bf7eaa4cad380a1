import math
import sys

import pytest

from scalelong.errors import ScaleLongError
from scalelong.plots import load_metrics, series, steps_to_target, write_plots
from scalelong.tracking import MetricsLog


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
