"""The sweep report's lr basin (Wortsman et al. 2023): the largest stable lr, the LR sensitivity with
its interval over seeds, the cap of a diverged or worse-than-untrained run and where the cap comes
from, the figure, and map.json, on records written by hand."""

import dataclasses
import json
import math
import statistics

import pytest

from scalelong.diagnostics import metric_names as names
from scalelong.diffusion import NOISE_LEVELS
from scalelong.studies.divergence import Divergence
from scalelong.studies.plots import BasinPoint, basin_figure
from scalelong.studies.summary import (
    Cell,
    CellSummary,
    SeedSummary,
    heldout_x0_error,
    initial_x0_error,
)
from scalelong.studies.sweep import cell_config, report_sweep
from scalelong.studies.sweep.basin import (
    basin_section,
    basin_table,
    basins,
    capped_error,
    largest_stable_lr,
    left_out_note,
    lr_sensitivity,
)
from scalelong.training.config import load_config, save_config

T1 = 12.706204736174705  # t(0.975, 1): two seeds
T2 = 4.302652729911275  # t(0.975, 2): three seeds
BROKE = (Divergence("nonfinite", 50, "stopped on non-finite steps in a row"),)


def seed(k, error, start=math.nan, raw=math.nan, mean_image=0.8, diverged=False) -> SeedSummary:
    return SeedSummary(
        k,
        x0_error=error,
        x0_error_raw=raw,
        x0_error_start=start,
        x0_mean_image=mean_image,
        breaks=BROKE if diverged else (),
    )


def study() -> list[CellSummary]:
    """Depth 12 over lrs 1e-3, 2e-3, 4e-3: `none` with 3 seeds, untrained error 1.0 measured at step
    0; at 4e-3 seed 0 diverged and seed 2 ended worse than untrained (1.2). `cs` with seed 0 at
    every lr, seed 1 at two, seed 2 at one (mixed seed counts), step 0 measured in some runs only.
    Depth 24: one seed of `none`, no step 0 (the mean image's error caps it), diverged at 2e-3."""

    def cell(depth, lr, method, *runs):
        return CellSummary(Cell(depth, lr, method), list(runs))

    return [
        cell(12, 1e-3, "none", seed(0, 0.30, 1.0), seed(1, 0.32, 1.0), seed(2, 0.34, 1.0)),
        cell(12, 2e-3, "none", seed(0, 0.20, 1.0), seed(1, 0.22, 1.0), seed(2, 0.24, 1.0)),
        cell(12, 4e-3, "none", seed(0, math.inf, 1.0, diverged=True), seed(1, 0.50, 1.0), seed(2, 1.2, 1.0)),
        cell(12, 1e-3, "cs", seed(0, 0.28), seed(1, 0.29), seed(2, 0.27)),  # no step 0 measured here
        cell(12, 2e-3, "cs", seed(0, 0.18, 0.9), seed(1, 0.19, 0.95)),
        cell(12, 4e-3, "cs", seed(0, 0.25, 0.9)),
        cell(24, 1e-3, "none", seed(0, 0.5)),
        cell(24, 2e-3, "none", seed(0, math.nan, diverged=True)),
    ]


def test_the_pieces_of_wortsmans_lr_sensitivity():
    assert capped_error(0.3, 1.0, failed=False) == 0.3
    assert capped_error(1.2, 1.0, failed=False) == 1.0  # worse than untrained counts as untrained
    assert capped_error(0.3, 1.0, failed=True) == 0.3  # failed but finite: its own error, as Wortsman
    assert capped_error(math.nan, 1.0, failed=True) == 1.0  # failed and stopped before a probe: the cap
    assert capped_error(math.inf, 1.0, failed=False) == 1.0  # its output was not finite
    assert math.isnan(capped_error(math.nan, 1.0, failed=False))  # not logged: no value
    assert math.isnan(capped_error(0.3, math.nan, failed=False))  # no cap: no value
    assert lr_sensitivity([0.30, 0.20, 1.0]) == pytest.approx(0.5 - 0.2)
    assert lr_sensitivity([0.4]) == 0.0 and math.isnan(lr_sensitivity([0.3, math.nan]))
    # the largest lr with no divergence there nor below: a stable lr above a diverged one is luck
    assert largest_stable_lr({1e-3: (0, 3), 2e-3: (0, 3), 4e-3: (1, 3), 8e-3: (0, 1)}) == 2e-3
    assert largest_stable_lr({1e-3: (1, 3), 2e-3: (0, 3)}) is None


def test_basin_numbers_on_constructed_cells():
    none, cs, deep = basins(study())
    assert (none.depth, none.method, cs.method, deep.depth) == (12, "none", "cs", 24)
    assert none.grid == cs.grid == (1e-3, 2e-3, 4e-3) and deep.grid == (1e-3, 2e-3)
    # the divergence counts and the basin's upper edge
    assert none.counts() == {1e-3: (0, 3), 2e-3: (0, 3), 4e-3: (1, 3)}
    assert none.largest_stable_lr == 2e-3 and cs.largest_stable_lr == 4e-3 and deep.largest_stable_lr == 1e-3
    # none, per seed, capped at its step-0 error 1.0: the diverged seed 0 and the worse-than-untrained
    # seed 2 both count 1.0 at 4e-3
    per_seed = {
        0: statistics.fmean([0.30, 0.20, 1.0]) - 0.20,
        1: statistics.fmean([0.32, 0.22, 0.50]) - 0.22,
        2: statistics.fmean([0.34, 0.24, 1.0]) - 0.24,
    }
    assert none.seed_sensitivity() == pytest.approx(per_seed)
    mean = sum(per_seed.values()) / 3
    half = T2 * statistics.stdev(per_seed.values()) / math.sqrt(3)
    assert none.sensitivity() == pytest.approx((mean, half))
    assert [r.kind() for r in none.at(4e-3)] == ["diverged", "ok", "capped"]
    # best error: the lowest mean capped error over the grid, 0.22 at 2e-3
    lr, values = none.best()
    assert lr == 2e-3 and values == pytest.approx([0.20, 0.22, 0.24])
    # cs: seeds 1 and 2 lack lrs, so only seed 0 enters, without an interval. The caps at 1e-3: seeds
    # 0 and 1 take their own step-0 error at another lr (the same untrained network), seed 2, never
    # measured, the mean of the other seeds'
    caps = [(r.seed, r.cap, r.cap_source) for r in cs.at(1e-3)]
    assert caps == [(0, 0.9, "seed"), (1, 0.95, "seed"), (2, pytest.approx(0.925), "seeds")]
    assert cs.seed_sensitivity() == pytest.approx({0: statistics.fmean([0.28, 0.18, 0.25]) - 0.18})
    assert cs.left_out() == {1: [4e-3], 2: [2e-3, 4e-3]}
    cs_mean, cs_half = cs.sensitivity()
    assert cs_mean == pytest.approx(statistics.fmean([0.28, 0.18, 0.25]) - 0.18) and math.isnan(cs_half)
    # against none, paired by seed: seed 0 alone, no interval
    c = cs.against(none)
    assert c.paired and c.n == 1 and c.estimate == pytest.approx(cs_mean - per_seed[0]) and math.isnan(c.low)
    # depth 24: no step-0 measurement anywhere, the mean image's error (0.8) caps it; one seed
    assert {r.cap_source for r in deep.runs} == {"mean_image"}
    assert deep.seed_sensitivity() == pytest.approx({0: statistics.fmean([0.5, 0.8]) - 0.5})


def test_a_failed_run_with_a_finite_error_counts_at_its_own_error_as_wortsman():
    # Wortsman et al.: v = min(l, l0) whatever the verdict; only a run without a finite error sits at
    # l0. The failure (here seed 1's x0 criterion) decides the edge, not the value.
    stuck = (Divergence("x0", 400, "final held-out x0 error 0.9 is not below the mean image's 0.8"),)

    def run(k, error, breaks):
        return SeedSummary(k, x0_error=error, x0_error_start=1.0, breaks=breaks)

    cells = [
        CellSummary(Cell(12, 1e-3, "none"), [run(0, 0.3, ()), run(1, 0.3, ())]),
        CellSummary(Cell(12, 2e-2, "none"), [run(0, 0.2, ()), run(1, 0.9, stuck)]),
    ]
    (basin,) = basins(cells)
    assert basin.counts() == {1e-3: (0, 2), 2e-2: (1, 2)} and basin.largest_stable_lr == 1e-3
    assert [r.kind() for r in basin.at(2e-2)] == ["ok", "diverged"]
    assert basin.seed_sensitivity() == pytest.approx({0: 0.25 - 0.2, 1: 0.6 - 0.3})


def test_the_edge_is_read_on_the_seeds_every_method_ran():
    """5 seeds of none at 2e-3 (2 failed) against 1 seed of cs (trained): the edge is decided on seed 0
    alone, where both trained; 4e-3, which cs did not run, decides nothing."""
    none = [CellSummary(Cell(12, 1e-3, "none"), [seed(k, 0.3, 1.0) for k in range(5)])]
    none += [CellSummary(Cell(12, 2e-3, "none"), [seed(k, 0.3, 1.0, diverged=k in (1, 4)) for k in range(5)])]
    none += [CellSummary(Cell(12, 4e-3, "none"), [seed(0, 0.3, 1.0, diverged=True)])]
    cs = [CellSummary(Cell(12, lr, "cs"), [seed(0, 0.3, 1.0)]) for lr in (1e-3, 2e-3)]
    b_none, b_cs = basins(none + cs)
    assert b_none.counts()[2e-3] == (2, 5) and b_none.deciding_counts() == {1e-3: (0, 1), 2e-3: (0, 1)}
    assert b_none.largest_stable_lr == 2e-3 == b_cs.largest_stable_lr
    row = basin_table([b_none, b_cs]).splitlines()[2]
    assert row.startswith(
        "| none | 0.002 (on seed 0) | 0/5; 0/1 shared | 2/5; 0/1 shared | 1/1; not shared |"
    )


def test_the_report_section_tables_the_basin_and_says_which_cap(tmp_path):
    parts, found = basin_section(study(), tmp_path)
    assert parts[0] == "## The lr basin" and (tmp_path / "basin.png").read_bytes()[:4] == b"\x89PNG"
    cap = next(p for p in parts if p.startswith("The cap ℓ0"))
    assert (
        "of the 17 runs: 12 runs, the run's own step-0 measurement; 2 runs, the step-0 measurement of " in cap
    )
    assert "; 1 run, the mean step-0 measurement of the method's other seeds" in cap
    assert "2 runs, the mean image's x0 error" in cap and "diagnostics.noise_levels_at_start=true" in cap
    table = parts[parts.index("### Depth 12") + 1].splitlines()
    assert table[0] == (
        "| method | largest stable lr | failed at 0.001 | failed at 0.002 | failed at 0.004 | "
        "LR sensitivity (EMA weights) | LR sensitivity - none (95% CI) | best error | at lr |"
    )
    none, cs = basins(study())[:2]
    mean, half = none.sensitivity()
    best_half = T2 * 0.02 / math.sqrt(3)
    assert table[2] == (
        "| none | 0.002 (on the seeds all methods ran at each lr) | 0/3 | 0/3; 0/2 shared | "
        f"1/3; 1/1 shared (+1 above ℓ0) | {mean:.3g} ± {half:.2g} "
        "(3 seeds) | baseline | "
        f"0.22 ± {best_half:.2g} | 0.002 |"
    )
    diff = cs.sensitivity()[0] - none.seed_sensitivity()[0]
    assert table[3].startswith(
        f"| cs | 0.004 (the largest tried) | 0/3 | 0/2 | 0/1 | {cs.sensitivity()[0]:.3g} (1 seed) | "
        f"{diff:+.3g} (1 seed, no interval) | "
    )
    left_out = "cs seed 1 (no value at lr 0.004); cs seed 2 (no value at lr 0.002, 0.004)."
    assert f"Left out of the LR sensitivity: {left_out}" in parts
    deep = parts[parts.index("### Depth 24") + 1].splitlines()
    assert deep[2] == "| none | 0.001 | 0/1 | 1/1 | 0.15 (1 seed) | baseline | 0.5 | 0.001 |"


def test_a_basin_of_runs_that_predict_the_noise_reads_their_noise_error(tmp_path):
    """The same errors logged as an eps network's noise errors, beside x0 errors a thousand times
    larger: the basin reads the noise errors (against 1, not the mean image) and says so."""
    said = "These runs predict the noise (`diffusion.prediction=eps`)"
    assert not any(p.startswith(said) for p in basin_section(study(), tmp_path)[0])
    reference, cells = study(), study()
    for c in reference:  # the x0 study with the input-free guess an eps network's cap falls back on
        c.runs = [dataclasses.replace(r, x0_mean_image=1.0) for r in c.runs]
    for c in cells:
        c.runs = [
            dataclasses.replace(
                r,
                prediction="eps",
                eps_error=r.x0_error,
                eps_error_raw=r.x0_error_raw,
                eps_error_start=r.x0_error_start,
                x0_error=1000 * r.x0_error,
                x0_error_start=1000 * r.x0_error_start,
            )
            for r in c.runs
        ]

    def read(found):  # every number the basin gives, flat
        return [v for b in found for v in (*b.sensitivity(), *(r.value() for r in b.runs))]

    assert read(basins(cells)) == pytest.approx(read(basins(reference)), nan_ok=True)
    assert any(r.cap_source == "mean_image" and r.cap == 1.0 for b in basins(cells) for r in b.runs)
    assert any(p.startswith(said) for p in basin_section(cells, tmp_path)[0])


def test_a_single_lr_or_no_held_out_error_gives_one_sentence(tmp_path):
    one = [CellSummary(Cell(12, 1e-3, m), [seed(0, 0.3, 1.0)]) for m in ("none", "cs")]
    parts, _ = basin_section(one, tmp_path)
    assert parts == [
        "## The lr basin",
        "The sweep trained a single lr (0.001): the lr basin needs two or more (--lrs).",
    ]
    unlogged = [CellSummary(Cell(12, lr, "none"), [SeedSummary(0)]) for lr in (1e-3, 2e-3)]
    parts, _ = basin_section(unlogged, tmp_path)
    assert len(parts) == 2 and "No run logged the held-out x0 error" in parts[1]
    assert not (tmp_path / "basin.png").exists()


def test_a_network_without_a_depth_gets_the_same_basin(tmp_path):
    """A sweep over another backbone (or a user's own network) has cells of depth None."""
    cells = [
        CellSummary(Cell(None, 1e-3, "none"), [seed(0, 0.3, 1.0), seed(1, 0.4, 1.0)]),
        CellSummary(Cell(None, 2e-3, "none"), [seed(0, 0.2, 1.0), seed(1, math.nan, 1.0, diverged=True)]),
        CellSummary(Cell(None, 1e-3, "skip-norm"), [seed(0, 0.3, 1.0), seed(1, 0.3, 1.0)]),
        CellSummary(Cell(None, 2e-3, "skip-norm"), [seed(0, 0.25, 1.0), seed(1, 0.21, 1.0)]),
    ]
    parts, found = basin_section(cells, tmp_path)
    assert not any(p.startswith("### Depth") for p in parts)
    rows = next(p for p in parts if p.startswith("| method |")).splitlines()[2:]
    # per seed: none (0.3, 0.2) -> 0.05, (0.4, capped 1.0) -> 0.3; skip-norm (0.3, 0.25) -> 0.025,
    # (0.3, 0.21) -> 0.045; paired differences -0.025 and -0.255
    own = T1 * statistics.stdev([0.025, 0.045]) / math.sqrt(2)
    d = statistics.fmean([-0.025, -0.255])
    half = T1 * statistics.stdev([-0.025, -0.255]) / math.sqrt(2)
    best = T1 * statistics.stdev([0.25, 0.21]) / math.sqrt(2)
    assert rows[0].startswith("| none | 0.001 | 0/2 | 1/2 | 0.175 ± ")
    assert rows[1] == (
        f"| skip-norm | 0.002 (the largest tried) | 0/2 | 0/2 | 0.035 ± {own:.2g} (2 seeds) | "
        f"{d:+.3g} ({d - half:+.2g} to {d + half:+.2g}) | 0.23 ± {best:.2g} | 0.002 |"
    )
    fig = basin_figure({"EMA": {(None, "none"): []}})  # an empty panel draws nothing, and does not fail
    assert len(fig.axes) == 1 and not fig.axes[0].lines
    assert [b.depth for b in found] == [None, None]


def points(depth_shift: float = 0.0) -> dict:
    """Two methods at two lrs: none has 2 seeds, one diverged at the larger lr; cs one seed."""
    return {
        (12, "none"): [
            BasinPoint(1e-3, 0.3 + depth_shift, "ok", 1.0),
            BasinPoint(1e-3, 0.5 + depth_shift, "ok", 1.0),
            BasinPoint(2e-3, 0.2 + depth_shift, "ok", 1.0),
            BasinPoint(2e-3, 1.0, "diverged", 1.0),
        ],
        (12, "cs"): [BasinPoint(1e-3, 0.25, "ok", 0.9), BasinPoint(2e-3, 0.9, "capped", 0.9)],
        (24, "none"): [BasinPoint(1e-3, 0.4, "ok", 1.0), BasinPoint(2e-3, 1.0, "diverged", 1.0)],
        (24, "cs"): [BasinPoint(1e-3, 0.35, "ok", 0.9), BasinPoint(2e-3, 0.3, "ok", 0.9)],
    }


def test_the_figure_has_one_panel_per_depth_and_one_line_per_method():
    fig = basin_figure({"EMA weights": points()})
    panels = fig.axes
    assert [ax.get_title() for ax in panels] == [
        "depth 12, EMA weights, 1 to 2 seeds",
        "depth 24, EMA weights, 1 seed",
    ]
    for ax in panels:
        lines = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
        assert [line.get_label() for line in lines] == ["none", "cs"]
        assert ax.get_xscale() == "log" and list(ax.get_xticks()) == pytest.approx([1e-3, 2e-3])
        caps = [line for line in ax.get_lines() if line.get_label().startswith("_untrained")]
        assert [tuple(line.get_ydata()) for line in caps] == [(1.0, 1.0), (0.9, 0.9)]  # one cap a method
    none = panels[0].get_lines()[0]
    assert list(none.get_xdata()) == [1e-3, 2e-3] and list(none.get_ydata()) == pytest.approx([0.4, 0.6])
    # the seeds as points: none's 3 healthy runs, its diverged one (an x at the cap), then cs's runs
    offsets = [c.get_offsets().tolist() for c in panels[0].collections]
    assert offsets == [[[1e-3, 0.3], [1e-3, 0.5], [2e-3, 0.2]], [[2e-3, 1.0]], [[1e-3, 0.25]], [[2e-3, 0.9]]]
    legend = [t.get_text() for t in panels[0].get_legend().get_texts()]
    assert legend == [
        "none",
        "cs",
        "untrained model (the cap)",
        "failed: at min(error, cap)",
        "worse than untrained: at the cap",
    ]
    # with the trained weights: a second row of panels, one per depth again
    fig = basin_figure({"EMA weights": points(), "trained weights": points(0.05)})
    assert len(fig.axes) == 4 and fig.axes[2].get_title().startswith("depth 12, trained weights")
    assert list(fig.axes[2].get_lines()[0].get_ydata()) == pytest.approx([0.45, 0.625])


# ----------------------------------------------------------------------------- end to end, by hand


def noise_record(step: int, error: float, raw: float | None = None, mean_image: float = 0.8) -> dict:
    """A probe: the same error at every level, so its mean over the levels is ``error``."""
    record = {"step": step, names.X0_MEAN_IMAGE: mean_image}
    for level in NOISE_LEVELS:
        record[names.noise("x0", level)] = error
        record[names.noise("eps", level)] = 1.0
        if raw is not None:
            record[names.noise("x0", level, weights="raw")] = raw
    return record


def report_tables(base, sweep) -> str:
    """The tables the command prints (the stability tables, then the basin's)."""
    from scalelong.studies.sweep import collect, write_sweep_report

    return write_sweep_report(base, collect(base, sweep / "runs"), sweep)[1]


def write_run(base, runs_dir, cell: Cell, k: int, records: list[dict], stopped_at: int | None = None):
    cfg = cell_config(base, cell, k, runs_dir)
    path = runs_dir / cfg.name
    path.mkdir(parents=True)
    save_config(cfg, path / "config.yaml")
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {"status": "complete", "steps": 100}
    if stopped_at is not None:
        summary = {"status": "stopped", "stopped": {"step": stopped_at, "kind": "nonfinite"}}
    (path / "summary.json").write_text(json.dumps(summary))


def test_a_sweep_report_of_hand_written_runs_draws_the_basin_and_map_json_rebuilds_it(tmp_path):
    base = load_config("stability", [f"out_dir={tmp_path}", "train.steps=100", "optim.warmup_steps=10"])
    sweep = tmp_path / "stability-sweep"
    runs = sweep / "runs"
    for k in (0, 1):  # seed 1's errors 10% above seed 0's, its untrained error 5% above
        for method, errors in (("none", (0.3, 0.2, None)), ("cs", (0.28, 0.18, 0.25))):
            for lr, error in zip((1e-3, 2e-3, 4e-3), errors, strict=True):
                start = noise_record(0, 1.0 + 0.05 * k, 1.0 + 0.05 * k)
                if error is None:  # diverged: stopped by the non-finite policy, no final probe
                    write_run(base, runs, Cell(12, lr, method), k, [start], stopped_at=40)
                else:
                    end = noise_record(100, error * (1 + 0.1 * k), error + 0.02)
                    write_run(base, runs, Cell(12, lr, method), k, [start, end])
    report = report_sweep(base, sweep).read_text()
    assert "## The lr basin" in report and "![the lr basin](basin.png)" in report
    assert (sweep / "basin.png").read_bytes()[:4] == b"\x89PNG"
    assert "<figcaption>the lr basin</figcaption>" in (sweep / "report.html").read_text()  # embedded
    assert "of the 12 runs: 12 runs, the run's own step-0 measurement." in report
    table = report.split("### Depth 12\n\n")[1].split("\n\n")[0].splitlines()
    assert table[0].endswith("| best error | at lr | LR sensitivity (trained weights) |")
    # none: seed 0 (0.3, 0.2, cap 1.0), seed 1 (0.33, 0.22, cap 1.05); cs below the cap everywhere
    lrs_none = [statistics.fmean([0.3, 0.2, 1.0]) - 0.2, statistics.fmean([0.33, 0.22, 1.05]) - 0.22]
    lrs_cs = [statistics.fmean([0.28, 0.18, 0.25]) - 0.18, statistics.fmean([0.308, 0.198, 0.275]) - 0.198]
    d = [a - b for a, b in zip(lrs_cs, lrs_none, strict=True)]

    def ci(values) -> tuple[float, float]:
        return statistics.fmean(values), T1 * statistics.stdev(values) / math.sqrt(2)

    (m, h), (m_cs, h_cs), (m_d, h_d), (m_best, h_best) = ci(lrs_none), ci(lrs_cs), ci(d), ci([0.2, 0.22])
    assert table[2].startswith(
        f"| none | 0.002 | 0/2 | 0/2 | 2/2 | {m:.3g} ± {h:.2g} (2 seeds) | baseline | "
        f"{m_best:.3g} ± {h_best:.2g} | 0.002 |"
    )
    assert table[3].startswith(
        f"| cs | 0.004 (the largest tried) | 0/2 | 0/2 | 0/2 | {m_cs:.3g} ± {h_cs:.2g} (2 seeds) | "
        f"{m_d:+.3g} ({m_d - h_d:+.2g} to {m_d + h_d:+.2g}) | "
    )
    assert "lr basin, depth 12:" in report_tables(base, sweep)
    data = json.loads((sweep / "map.json").read_text())
    cell = next(c for c in data["cells"] if (c["method"], c["lr"]) == ("none", 4e-3))
    assert (cell["depth"], cell["seed"], cell["heldout_x0_error"]) == (12, [0, 1], [None, None])
    assert cell["basin_cap"] == [1.0, 1.05] and cell["basin_cap_source"] == ["step0", "step0"]
    assert cell["basin_value"] == [1.0, 1.05] and cell["heldout_x0_error_start"] == [1.0, 1.05]
    # the LR sensitivity rebuilt from the cells of map.json alone
    values = {}
    for c in data["cells"]:
        for s, v in zip(c["seed"], c["basin_value"], strict=True):
            values.setdefault((c["method"], s), []).append(v)
    rebuilt = {key: statistics.fmean(v) - min(v) for key, v in values.items()}
    (none,) = [b for b in data["basin"] if b["method"] == "none"]
    (cs,) = [b for b in data["basin"] if b["method"] == "cs"]
    assert none["lr_sensitivity_ema"]["per_seed"] == pytest.approx([rebuilt["none", 0], rebuilt["none", 1]])
    assert none["lr_sensitivity_ema"]["per_seed"] == pytest.approx(lrs_none)
    assert cs["lr_sensitivity_ema"]["estimate"] == pytest.approx(
        statistics.fmean([rebuilt["cs", 0], rebuilt["cs", 1]])
    )
    assert none["largest_stable_lr"] == 2e-3 and none["lrs"] == [1e-3, 2e-3, 4e-3]
    assert (
        cs["lr_sensitivity_ema"]["minus_none"]["paired"] and cs["lr_sensitivity_ema"]["minus_none"]["n"] == 2
    )
    assert none["failed"][2] == {"lr": 4e-3, "failed": 2, "runs": 2}


def test_the_held_out_errors_the_basin_reads():
    records = [noise_record(0, 1.0, 1.0), {"step": 5, "loss": 0.3}, noise_record(10, 0.3, 0.25)]
    assert initial_x0_error(records) == 1.0
    assert heldout_x0_error(records) == pytest.approx(0.3) and heldout_x0_error(
        records, "raw"
    ) == pytest.approx(0.25)
    assert math.isnan(heldout_x0_error(records[:2]))  # step 0 is the untrained model, not a final error
    broken = noise_record(20, math.nan)
    assert heldout_x0_error([*records, broken]) == math.inf  # logged, not finite
    assert math.isnan(initial_x0_error(records[1:]))


class _LeftOut:
    """A basin that reports the seeds its LR sensitivity left out, and nothing else."""

    def __init__(self, method: str, left: dict):
        self.method, self._left = method, left

    def left_out(self, weights: str = "ema") -> dict:
        return self._left


def test_seeds_left_out_for_the_same_lrs_are_named_once():
    """A paired test's 15 further seeds of `none` at one lr lack the same lrs: one clause, not 15."""
    missing = {s: [0.01, 0.04] for s in range(5, 20)} | {0: [0.08]}
    note = left_out_note([_LeftOut("none", missing), _LeftOut("cs", {3: [0.02]}), _LeftOut("ls", {})])
    assert note == (
        "Left out of the LR sensitivity: none seeds 5-19 (no value at lr 0.01, 0.04); "
        "none seed 0 (no value at lr 0.08); cs seed 3 (no value at lr 0.02)."
    )
    assert left_out_note([_LeftOut("ls", {})]) == ""


def test_a_run_whose_config_cannot_be_read_is_left_out_of_the_report_with_one_warning(tmp_path, capsys):
    from scalelong.studies.sweep import collect

    base = load_config("stability", [f"out_dir={tmp_path}", "train.steps=100", "optim.warmup_steps=10"])
    runs = tmp_path / "stability-sweep" / "runs"
    for lr in (1e-3, 2e-3):
        write_run(base, runs, Cell(12, lr, "none"), 0, [noise_record(0, 1.0), noise_record(100, 0.3)])
    damaged = runs / Cell(12, 2e-3, "none").name(0)
    (damaged / "config.yaml").write_text("model: [unclosed\n")  # and no checkpoint holds a copy
    found = collect(base, runs)
    assert [(c.lr, [r.name for r in rs]) for c, rs in found.items()] == [(1e-3, ["d12-lr0.001-none-seed0"])]
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith(f"warning: run {damaged.name} left out: ")
