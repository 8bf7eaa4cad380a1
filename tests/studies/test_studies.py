"""The study library's shared parts: the one estimator of a method against its baseline, the
metric names, and the layering of the front ends over ``scalelong.studies``."""

from __future__ import annotations

import ast
import math
import statistics
import warnings
from pathlib import Path

import pytest
import scipy.stats

import scalelong
from import_fixtures import import_graph
from scalelong.diagnostics import metric_names as names
from scalelong.studies.statistics import contrast, fmt_contrast
from scalelong.studies.summary import MethodSummary, SeedSummary

T2 = 4.302652729749462  # two-sided 95% Student t quantile, 2 degrees of freedom
T1 = 12.706204736174707  # ... 1 degree of freedom

A, B = [0.20, 0.23, 0.25], [0.30, 0.32, 0.36]  # a method and its baseline, seeds 0, 1, 2


def test_paired_by_seed_value_the_mean_difference_with_its_t_interval():
    c = contrast(A, B, [0, 1, 2], [0, 1, 2])
    # differences -0.10, -0.09, -0.11: mean -0.1, sd 0.01
    assert (c.paired, c.ratio, c.n) == (True, False, 3)
    assert c.estimate == pytest.approx(-0.1)
    assert (c.low, c.high) == pytest.approx(
        (-0.1 - T2 * 0.01 / math.sqrt(3), -0.1 + T2 * 0.01 / math.sqrt(3))
    )
    assert fmt_contrast(c) == "-0.1 (-0.12 to -0.075)"
    # the pairs are made by seed value, not by position: the same runs listed in another order
    again = contrast([A[2], A[0], A[1]], B, [2, 0, 1], [0, 1, 2])
    assert (again.estimate, again.low, again.high) == pytest.approx((c.estimate, c.low, c.high))


def test_unpaired_only_when_no_seed_is_shared_with_welchs_interval():
    c = contrast(A, B, [0, 1, 2], [5, 6, 7])
    va, vb = statistics.variance(A) / 3, statistics.variance(B) / 3
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)  # Welch-Satterthwaite
    assert df == pytest.approx(3.8585, abs=1e-4)
    half = scipy.stats.t.ppf(0.975, df) * math.sqrt(va + vb)
    assert (c.paired, c.n) == (False, 3)
    assert c.estimate == pytest.approx(statistics.fmean(A) - statistics.fmean(B))
    assert (c.low, c.high) == pytest.approx((c.estimate - half, c.estimate + half))
    assert fmt_contrast(c) == "-0.1 (-0.16 to -0.036, unpaired)"
    assert contrast(A, B) == c  # seeds unknown: nothing pairs
    paired = contrast(A, B, [0, 1, 2], [0, 1, 2])
    assert c.high - c.low > 2 * (paired.high - paired.low)  # the shared variation of a seed, removed


def test_mismatched_seeds_pair_on_the_shared_ones_and_one_shared_seed_has_no_interval():
    # seeds 1 and 2 in both: those two pairs, whatever else either side ran
    c = contrast(A, B, [0, 1, 2], [1, 2, 3])
    d = [A[1] - B[0], A[2] - B[1]]  # seed 1: 0.23 - 0.30, seed 2: 0.25 - 0.32
    assert (c.paired, c.n) == (True, 2)
    assert c.estimate == pytest.approx(-0.07)
    assert c.high - c.estimate == pytest.approx(T1 * statistics.stdev(d) / math.sqrt(2))
    # one seed in common of three a side: its one difference, not Welch over the six runs
    lone = contrast(A, B, [0, 1, 2], [2, 3, 4])
    assert (lone.paired, lone.n, lone.estimate) == (True, 1, pytest.approx(A[2] - B[0]))
    assert fmt_contrast(lone) == "-0.05 (1 seed, no interval)"
    # one seed in common: its one difference, no interval (NaN bounds), and it excludes nothing
    one = contrast([0.25], B, [1], [0, 1, 2])
    assert (one.paired, one.n, one.estimate) == (True, 1, pytest.approx(-0.07))
    assert math.isnan(one.low) and math.isnan(one.high) and not one.excludes_null()
    assert fmt_contrast(one) == "-0.07 (1 seed, no interval)"
    assert fmt_contrast(contrast([0.25], B, [1], [0, 1, 2], ratio=True)) == "0.78 (1 seed, no interval)"
    # no seed shared and no spread on either side: Welch's interval is the point, without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flat = contrast([1.0, 1.0], [2.0, 2.0], [0, 1], [2, 3])
    assert fmt_contrast(flat) == "-1 (-1 to -1, unpaired)"
    # one seed that matches nothing: there is nothing to compare (Welch needs two a side)
    assert contrast([0.25], B, [9], [0, 1, 2]) is None
    assert fmt_contrast(None) == "n/a"


def test_a_ratio_is_a_geometric_mean_of_the_per_seed_ratios_on_the_log_scale():
    # per seed 0.7 and 0.9 of the baseline: geometric mean sqrt(0.63), interval exp(mean ± t sd / sqrt 2)
    c = contrast([7.0, 9.0], [10.0, 10.0], [0, 1], [0, 1], ratio=True)
    logs = [math.log(0.7), math.log(0.9)]
    half = T1 * statistics.stdev(logs) / math.sqrt(2)
    assert c.estimate == pytest.approx(math.sqrt(0.63))
    assert (c.low, c.high) == pytest.approx(
        (math.exp(statistics.fmean(logs) - half), math.exp(statistics.fmean(logs) + half))
    )
    assert fmt_contrast(c, as_percent=True) == "-21% (-84% to +292%)"
    assert fmt_contrast(c) == "0.79 (0.16 to 3.9)" and not c.excludes_null()
    # every seed exactly 4x below: the interval collapses onto the point, which excludes 1
    exact = contrast([100.0, 200.0, 400.0], [400.0, 800.0, 1600.0], [0, 1, 2], [0, 1, 2], ratio=True)
    assert fmt_contrast(exact) == "0.25 (0.25 to 0.25)" and exact.excludes_null()
    # values that have no log (non-positive) or are not finite are left out, with their pair
    kept = contrast([7.0, 9.0, 0.0, math.nan], [10.0, 10.0, 5.0, 5.0], [0, 1, 2, 3], [0, 1, 2, 3], ratio=True)
    assert kept == c


def test_a_comparison_pairs_its_fd_change_and_speed_up_by_seed():
    def method(name, fds, steps, seeds=(0, 1)):
        runs = [SeedSummary(seed=s, final_fd=fd) for s, fd in zip(seeds, fds, strict=True)]
        return MethodSummary(name, runs, list(steps))

    none = method("none", [10.0, 10.0], [400, 400])
    cs = method("cs", [7.0, 9.0], [200, 300])
    assert fmt_contrast(cs.fd_change(none), as_percent=True) == "-21% (-84% to +292%)"
    speed = cs.speedup(none)  # 400/200 and 400/300: geometric mean sqrt(8/3)
    assert speed.estimate == pytest.approx(math.sqrt(8 / 3)) and speed.paired
    late = method("ls", [8.0, 8.0], [None, 200])  # seed 0 never got there: seed 1 alone
    assert late.speedup(none).estimate == pytest.approx(2.0) and late.speedup(none).n == 1
    assert method("sqrt2", [20.0, 20.0], [None, None]).speedup(none) is None


# ----------------------------------------------------------------------------- metric names


def test_every_metric_name_is_built_and_parsed_in_one_place():
    assert names.skip(3, "coef_mean") == "skip/3/coef_mean"
    assert names.parse_skip("skip/3/coef_mean") == (3, "coef_mean")
    assert names.block("out_blocks.0", "feature_norm") == "block/out_blocks.0/feature_norm"
    assert names.parse_block("block/down_blocks.1.resnets.0/grad_norm") == (
        "down_blocks.1.resnets.0",
        "grad_norm",
    )
    assert names.osc("feature_norm", "std") == "osc/feature_norm_std"
    assert names.noise("x0", 0.5) == "noise/x0_mse@0.50" and names.noise("eps", 0.05) == "noise/eps_mse@0.05"
    assert names.parse_noise("noise/x0_mse@0.50") == ("x0", 0.5)
    assert names.parse_noise(names.X0_MEAN_IMAGE) is None
    raw = names.noise("x0", 0.5, weights="raw")
    assert raw == "noise/raw/x0_mse@0.50" and names.parse_noise(raw, weights="raw") == ("x0", 0.5)
    assert names.parse_noise(raw) is None and names.parse_noise("noise/x0_mse@0.50", weights="raw") is None
    assert names.is_absmax("skip/2/absmax_in") and names.is_absmax("block/mid_block/absmax")
    assert not names.is_absmax("skip/2/norm_in") and not names.is_absmax("absmax")
    assert names.parse_skip("block/x/feature_norm") is None and names.parse_block("skip/1/norm_in") is None
    assert names.parse_skip("skip/one/norm_in") is None


def test_metric_names_import_nothing_of_the_package():
    assert import_graph()["scalelong.diagnostics.metric_names"] == set()


# ----------------------------------------------------------------------------- layering


def private_imports(source: str) -> list[str]:
    """``from scalelong.x import _y`` in ``source``: a private name taken from another module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scalelong"):
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return found


def test_no_module_imports_a_private_name_of_another():
    source = Path(scalelong.__file__).parent
    found = {str(p.relative_to(source)): private_imports(p.read_text()) for p in sorted(source.rglob("*.py"))}
    assert {k: v for k, v in found.items() if v} == {}
    assert private_imports("from scalelong.studies.compare import _last, mean_ci\n") == [
        "scalelong.studies.compare._last"
    ]


def test_the_study_library_imports_neither_front_end():
    graph = import_graph()
    studies = [m for m in graph if m.startswith("scalelong.studies")]
    assert len(studies) >= 7
    for module in studies:
        assert not graph[module] & {
            "scalelong.studies.compare",
            "scalelong.studies.sweep",
            "scalelong.cli",
        }, module
