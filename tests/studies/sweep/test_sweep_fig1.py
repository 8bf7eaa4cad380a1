"""The sweep report's Fig. 1: hidden-feature norm against step, one panel per depth and one line
per method (mean over seeds, min..max band), and the per-out-block view that locates a blow-up."""

import math

import pytest
from matplotlib.colors import to_rgb

from conftest import learning_uvit_overrides
from scalelong.cli import main
from scalelong.studies.plots import (
    decoder_blocks,
    fig1_by_depth_figure,
    out_block_norm_figure,
    plot_fig1_by_depth,
    seed_band,
)
from scalelong.studies.summary import Cell, StudyRun
from scalelong.studies.sweep import fig1_section, report_sweep
from scalelong.training.config import load_config

METHODS = ["none", "sqrt2", "cs", "ls"]
DEPTHS = [12, 16]
STEPS = [10, 20, 30, 40]


def norm(depth: int, method: int, seed: int, step: int) -> float:
    return 1.0 + 0.1 * depth + method + 0.05 * seed * step  # distinct per cell, spread over seeds


def cell_records(depth: int, m: int, seeds: int = 3, blowup: bool = False) -> list[list[dict]]:
    """Records of each seed: feature_norm and three out-blocks (out_blocks.0 grows fastest)."""
    runs = []
    for seed in range(seeds):
        records = []
        for step in STEPS:
            value = norm(depth, m, seed, step) * (10.0 ** (step / 10) if blowup else 1.0)
            blocks = {f"block/out_blocks.{j}/feature_norm": value * (3 - j) for j in range(3)}
            records.append({"step": step, "loss": 0.1, "feature_norm": value, **blocks})
        runs.append(records)
    return runs


def fig1_records(blowup_method: str | None = None) -> dict:
    return {
        (d, method): cell_records(d, m, blowup=method == blowup_method)
        for d in DEPTHS
        for m, method in enumerate(METHODS)
    }


def test_one_panel_per_depth_one_line_per_method_with_the_band_of_the_seeds():
    runs = fig1_records()
    fig = fig1_by_depth_figure(runs)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == len(DEPTHS)
    assert [ax.get_title() for ax in panels] == ["depth 12, 3 seeds", "depth 16, 3 seeds"]
    assert panels[0].get_shared_x_axes().joined(panels[0], panels[1])
    for ax, depth in zip(panels, DEPTHS, strict=True):
        assert len(ax.get_lines()) == len(METHODS)
        assert [t.get_text() for t in ax.get_legend().get_texts()] == METHODS
        assert ax.get_yscale() == "linear"  # 2.2 .. 8.6: no decades
        for m, (line, band) in enumerate(zip(ax.get_lines(), ax.collections, strict=True)):
            seeds = runs[depth, METHODS[m]]
            assert list(line.get_xdata()) == STEPS
            # the line is the mean over seeds; the band spans exactly the seeds' min..max
            want = [sum(norm(depth, m, k, s) for k in range(3)) / 3 for s in STEPS]
            assert list(line.get_ydata()) == pytest.approx(want)
            assert to_rgb(line.get_color()) == pytest.approx(band.get_facecolor()[0][:3])  # one colour
            vertices = band.get_paths()[0].vertices
            for step in STEPS:
                ys = [y for x, y in vertices if x == step]
                values = [r["feature_norm"] for records in seeds for r in records if r["step"] == step]
                assert min(ys) == pytest.approx(min(values)) and max(ys) == pytest.approx(max(values))
                assert min(values) < max(values)  # three seeds that differ: a band, not a line


def test_a_blow_up_puts_every_panel_on_a_log_axis_and_colours_stay_per_method():
    fig = fig1_by_depth_figure(fig1_records(blowup_method="none"))
    panels = fig.axes
    assert [ax.get_yscale() for ax in panels] == ["log", "log"]
    colours = [[line.get_color() for line in ax.get_lines()] for ax in panels]
    assert colours[0] == colours[1] and len(set(colours[0])) == len(METHODS)


def test_the_figure_draws_what_a_cell_has():
    runs = fig1_records()
    del runs[16, "ls"]  # a cell not run at this depth
    runs[12, "cs"] = runs[12, "cs"][:1]  # one seed there
    fig = fig1_by_depth_figure(runs)
    assert [len(ax.get_lines()) for ax in fig.axes] == [4, 3]
    assert [t.get_text() for t in fig.axes[1].get_legend().get_texts()] == ["none", "sqrt2", "cs"]
    assert fig.axes[0].get_title() == "depth 12, 1 to 3 seeds"


def test_seed_band_leaves_non_finite_values_out():
    runs = [
        [{"step": 1, "feature_norm": 1.0}, {"step": 2, "feature_norm": 2.0}],
        [{"step": 1, "feature_norm": 3.0}, {"step": 2, "feature_norm": math.inf}],
        [{"step": 1, "feature_norm": math.nan}, {"step": 3, "feature_norm": math.nan}],
    ]
    steps, mean, lo, hi = seed_band(runs, "feature_norm")
    assert steps == [1, 2, 3]
    assert (mean[:2], lo[:2], hi[:2]) == ([2.0, 2.0], [1.0, 2.0], [3.0, 2.0])
    assert all(math.isnan(v[2]) for v in (mean, lo, hi))  # no finite value: a gap


def test_out_block_view_one_panel_per_method_one_line_per_out_block():
    by_method = {method: cell_records(12, m, blowup=method == "none") for m, method in enumerate(METHODS)}
    assert decoder_blocks(by_method["cs"][0]) == ["out_blocks.0", "out_blocks.1", "out_blocks.2"]
    fig = out_block_norm_figure(by_method, title="depth 12")
    panels = fig.axes
    assert [ax.get_title() for ax in panels] == [f"{m}, 3 seeds" for m in METHODS]
    assert [len(ax.get_lines()) for ax in panels] == [3] * len(METHODS)
    labels = [t.get_text() for t in panels[0].get_legend().get_texts()]
    assert labels == ["out_blocks.0 (skip 3)", "out_blocks.1 (skip 2)", "out_blocks.2 (skip 1)"]
    assert panels[0].get_shared_y_axes().joined(panels[0], panels[3])
    assert panels[3].get_yscale() == "log"  # none's blow-up spans decades; the axes are shared
    # each line: the mean over seeds of that block
    ys = list(panels[2].get_lines()[0].get_ydata())
    assert ys == pytest.approx([3 * sum(norm(12, 2, k, s) for k in range(3)) / 3 for s in STEPS])


def test_plot_fig1_by_depth_writes_a_png(tmp_path):
    path = plot_fig1_by_depth(fig1_records(), tmp_path / "fig1.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fig1_section_draws_the_smallest_lr_unless_told_and_tabulates_the_gap(tmp_path):
    def run(final: float, seed: int = 0) -> StudyRun:
        records = [{"step": 1, "feature_norm": 1.0}, {"step": 2, "feature_norm": final}]
        return StudyRun("r", records, {}, [], seed=seed)

    runs = {
        Cell(12, 1e-3, "cs"): [run(2.0, 0), run(4.0, 1)],
        Cell(12, 1e-3, "none"): [run(6.0, 0), run(6.0, 1)],
        Cell(24, 1e-3, "none"): [run(30.0)],
        Cell(24, 1e-3, "cs"): [run(3.0)],
        Cell(12, 1e-2, "none"): [run(600.0)],
        Cell(12, 1e-2, "cs"): [run(6.0)],
    }
    parts = fig1_section(runs, tmp_path)
    assert "at lr 0.001 (the smallest of the map)" in parts[1]
    table = next(p for p in parts if p.startswith("| method |")).splitlines()
    # rows in method order (none first); cs's mean 3 ± t(0.975, 1) x 1.414 / sqrt(2) = 12.7, and its
    # ratio to none paired by seed, as the gap table has it: the geometric mean of 2/6 and 4/6
    assert table == [
        "| method | depth 12 | depth 24 |",
        "|---|---|---|",
        "| none | 6 ± 0 | 30 |",
        "| cs | 3 ± 13 (0.47x none) | 3 (0.1x none) |",
    ]
    assert (tmp_path / "fig1.png").is_file() and not (tmp_path / "out_blocks_d12.png").exists()  # no blocks
    parts = fig1_section(runs, tmp_path, fig1_lr=1e-2)
    assert "at lr 0.01 (chosen for this figure)" in parts[1]
    assert "| cs | 6 (0.01x none) |" in next(p for p in parts if p.startswith("| method |"))
    assert not any("out-blocks" in p for p in parts)  # no block was logged: no per-block view


def tiny(tmp_path) -> list[str]:
    """A tiny U-ViT trained 6 steps, diagnostics every 2."""
    return [*learning_uvit_overrides(tmp_path), "train.steps=6", "train.log_every=2", "diagnostics.every=2"]


def sweep(tmp_path, *args: str) -> int:
    return main(
        ["sweep", "configs/demo_uvit.yaml", *tiny(tmp_path), "--no-progress", "--methods", "none,cs", *args]
    )


@pytest.mark.slow
def test_a_sweep_report_embeds_fig1_by_depth_and_the_out_block_views(tmp_path, capsys):
    assert sweep(tmp_path, "--lrs", "1e-2,2e-2", "--depths", "2", "--fig1-lr", "5e-3") == 2
    assert "--fig1-lr 0.005 is not one of --lrs 0.01,0.02" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before any run

    # 2 depths x 1 lr x 2 methods, 6 steps each: the smallest lr is the one drawn
    assert sweep(tmp_path, "--lrs", "1e-2", "--depths", "2,4") == 0
    folder = tmp_path / "t-sweep"
    for name in (
        "fig1.png",
        "out_blocks_d2.png",
        "out_blocks_d4.png",
        "magnitude_d2.png",
        "magnitude_d4.png",
    ):
        assert (folder / name).read_bytes()[:4] == b"\x89PNG", name
    report = (folder / "report.md").read_text()
    assert "## Fig. 1: hidden-feature norm by depth" in report
    assert "at lr 0.01 (the smallest of the map)" in report and "**min..max**" in report
    assert "![Fig. 1 at lr 0.01](fig1.png)" in report
    assert "![out-block feature norms, depth 4, lr 0.01](out_blocks_d4.png)" in report
    table = report.split("seeds both ran, as in the gap table):\n\n")[1].split("\n\n")[0].splitlines()
    assert table[0] == "| method | depth 2 | depth 4 |"
    assert table[2].startswith("| none | ") and table[3].startswith("| cs | ") and "none) |" in table[3]
    html = (folder / "report.html").read_text()
    # 2 heatmaps, Fig. 1, 2 out-block views, and the peak |value| along the network per depth
    assert html.count("data:image/png;base64,") == 2 + 1 + 2 + 2
    assert "| 4 | cs | 1 |" in report.split("peak |value| along the network")[-1]  # its table, per depth
    assert "<figcaption>Fig. 1 at lr 0.01</figcaption>" in html

    # the report alone, without training: of what finished, at another lr if asked
    (folder / "fig1.png").unlink()
    base = load_config("configs/demo_uvit.yaml", tiny(tmp_path))
    assert report_sweep(base, folder) == folder / "report.md"
    assert (folder / "fig1.png").is_file()
    report_sweep(base, folder, fig1_lr=3e-2)
    assert "No finished run at lr 0.03 to draw." in (folder / "report.md").read_text()


def test_the_gap_table_gives_the_ratio_the_counts_and_the_difference_with_their_intervals():
    from scalelong.studies.divergence import Divergence
    from scalelong.studies.summary import CellSummary, SeedSummary
    from scalelong.studies.sweep import gap_table

    broke = [Divergence("nonfinite", 100, "x")]

    def cell(c, seeds, losses, norms, x0=None, breaks=None) -> CellSummary:
        x0 = x0 or [math.nan] * len(seeds)
        breaks = breaks or [[]] * len(seeds)
        runs = [
            SeedSummary(k, final_loss=f, feature_norm=n, x0_error=e, breaks=tuple(b))
            for k, f, n, e, b in zip(seeds, losses, norms, x0, breaks, strict=True)
        ]
        return CellSummary(c, runs, "loss")

    def row(*cells) -> list[str]:
        (line,) = gap_table(list(cells), "loss").splitlines()[2:]
        return [c.strip() for c in line.strip("|").split("|")]

    at12, at24 = Cell(12, 0.01, "none"), Cell(24, 0.01, "cs")
    none = cell(at12, [0, 1, 2], [0.30, 0.32, 0.34], [400.0, 800.0, 1600.0], breaks=[broke, [], []])
    # seeds 5 to 7 share none with none's: unpaired (Welch)
    cs = cell(Cell(12, 0.01, "cs"), [5, 6, 7], [0.20, 0.22, 0.24], [100.0, 200.0, 400.0])
    alone = cell(at24, [0, 1], [0.2, 0.2], [1.0, 2.0])  # no none at depth 24: no row
    table = gap_table([none, cs, alone], "loss").splitlines()
    assert len(table) == 3  # header, rule, one row
    cells = row(none, cs, alone)
    assert cells[:3] == ["12", "0.01", "cs"]
    # geometric means 800 and 200: ratio 0.25; both log-samples have sd ln 2, so the Welch interval is
    # exp(+-t(0.975, 4) * ln2 * sqrt(2/3))
    half = 2.7764451051977987 * math.log(2) * math.sqrt(2 / 3)
    assert cells[3] == f"0.25 ({0.25 * math.exp(-half):.2g} to {0.25 * math.exp(half):.2g}, unpaired)"
    assert cells[4] == "0/3 vs 1/3 (p 1)"
    d = 2.7764451051977987 * 0.02 * math.sqrt(2 / 3)
    assert cells[5] == f"-0.1 ({-0.1 - d:+.2g} to {-0.1 + d:+.2g}, unpaired)"
    assert gap_table([cs, alone], "loss") == ""  # nothing to compare against
    # with the held-out x0 error of each seed: one more column, the same Welch difference
    none_x0 = cell(at12, [0, 1, 2], none.final, [400.0, 800.0, 1600.0], [0.10, 0.11, 0.12], none.breaks)
    cs_x0 = cell(cs.cell, [5, 6, 7], cs.final, [100.0, 200.0, 400.0], [0.08, 0.09, 0.10])
    assert row(none_x0, cs_x0)[6] == f"-0.02 ({-0.02 - d / 2:+.2g} to {-0.02 + d / 2:+.2g}, unpaired)"
    # paired by seed: every seed of cs sits exactly 4x below none's norm and 0.1 below its loss,
    # so the paired intervals collapse onto the point while the unpaired ones above do not
    paired = cell(cs.cell, [0, 1, 2], cs.final, [100.0, 200.0, 400.0], [0.08, 0.09, 0.10])
    cells = row(none_x0, paired)
    assert cells[3] == "0.25 (0.25 to 0.25)" and cells[5] == "-0.1 (-0.1 to -0.1)"
    assert cells[6] == "-0.02 (-0.02 to -0.02)"
    # the pairs are made by seed value: listed in another order, the same
    shuffled = cell(cs.cell, [2, 0, 1], [0.24, 0.20, 0.22], [400.0, 100.0, 200.0], [0.10, 0.08, 0.09])
    assert row(none_x0, shuffled) == cells
    # one shared seed of three: its one pair, no interval (not Welch over the six runs)
    overlap = cell(cs.cell, [2, 3, 4], [0.24, 0.5, 0.5], [400.0, 1.0, 1.0])
    cells = row(none, overlap)
    assert cells[3] == "0.25 (1 seed, no interval)" and cells[5] == "-0.1 (1 seed, no interval)"
    # one seed of cs against three of none: its own pair, no interval
    one = cell(cs.cell, [1], [0.25], [200.0])
    cells = row(none, one)
    assert cells[3] == "0.25 (1 seed, no interval)" and cells[5] == "-0.07 (1 seed, no interval)"


def test_the_held_out_x0_error_is_the_mean_over_the_levels_of_the_last_probe():
    from scalelong.studies.summary import heldout_x0_error

    records = [
        {"step": 5, "noise/x0_mse@0.10": 9.0, "noise/x0_mse@0.50": 9.0},
        {"step": 10, "noise/x0_mse@0.10": 0.1, "noise/x0_mse@0.50": 0.3, "noise/eps_mse@0.10": 5.0},
        {"step": 11, "loss": 0.2},
    ]
    assert heldout_x0_error(records) == pytest.approx(0.2)
    assert math.isnan(heldout_x0_error([{"step": 1, "loss": 0.2}]))
