"""Plots of ``metrics.jsonl`` records, one list of records per method (``scalelong analyze``,
``scalelong compare``).

Records are the dicts the trainer logs (``step`` plus flat metrics; see
:mod:`scalelong.diagnostics` for the diagnostic names). Non-finite values, which the metrics log
writes as the strings ``"nan"`` / ``"inf"``, are read back as floats and plotted as gaps.

Plotting needs matplotlib (the ``report`` extra); it is imported only when a plot is drawn and
rendered with the Agg canvas, so no global backend is changed.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from scalelong.diagnostics import metric_names as names
from scalelong.diagnostics.overflow import FP16_MAX
from scalelong.errors import ScaleLongError
from scalelong.runlog.records import Records, as_float, load_metrics, series  # re-exported: the readers
from scalelong.skips import ordinal
from scalelong.studies.magnitude import median_profile

# ---------------------------------------------------------------------- plots


def _figure(ncols: int = 1, nrows: int = 1, size: tuple[float, float] = (6.0, 4.0)):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ScaleLongError(
            "plots need matplotlib: pip install 'scalelong[report]' (or pip install matplotlib)"
        ) from e
    fig = Figure(figsize=(size[0] * ncols, size[1] * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
    except OSError as e:
        raise ScaleLongError(f"cannot write the plot {path} ({e.strerror}); choose another --out") from None
    return path


def spans_decades(values: Sequence[float], ratio: float = 100.0) -> bool:
    """True when the positive finite ``values`` span more than ``ratio`` (max / min): a blow-up
    that a linear axis would flatten everything else under."""
    positive = [v for v in values if math.isfinite(v) and v > 0]
    return bool(positive) and max(positive) > ratio * min(positive)


def _per_method(
    records_by_method: Mapping[str, Records], key: str, path: str | Path, ylabel: str, log: bool | None
) -> Path:
    """One line per method; ``log`` None: a log axis only when the values span decades."""
    fig, axes = _figure()
    ax = axes[0][0]
    for method, records in records_by_method.items():
        steps, values = series(records, key)
        if steps:
            ax.plot(steps, values, label=method)
    ax.set(xlabel="step", ylabel=ylabel)
    values = [v for r in records_by_method.values() for v in series(r, key)[1]]
    if spans_decades(values) if log is None else log and any(v > 0 and math.isfinite(v) for v in values):
        ax.set_yscale("log")
    ax.legend()
    return _save(fig, path)


def plot_loss(records_by_method: Mapping[str, Records], path: str | Path) -> Path:
    """Training loss vs step, one line per method."""
    return _per_method(records_by_method, names.LOSS, path, "loss", log=True)


def plot_feature_norm(records_by_method: Mapping[str, Records], path: str | Path) -> Path:
    """The paper's Fig. 1: norm of hidden features (mean over blocks) vs step, one line per method;
    on a log axis when a run's norms blow up by decades."""
    return _per_method(records_by_method, names.FEATURE_NORM, path, "norm of hidden features", log=None)


def plot_fd(records_by_method: Mapping[str, Records], path: str | Path, key: str = names.FD) -> Path:
    """Frechet distance vs step, one line per method."""
    return _per_method(records_by_method, key, path, "Frechet distance", log=True)


def plot_digit_score(
    records_by_method: Mapping[str, Records], path: str | Path, real: Mapping[str, float] | None = None
) -> Path:
    """The digit score of each evaluation vs step, per method: the share of confident digits (left)
    and the class balance (right), with the held-out real digits' values ``real`` dashed."""
    fig, axes = _figure(ncols=2, size=(5.0, 3.5))
    keys = ((names.DIGITS_CONFIDENT, "confident", "share of confident digits (p >= 0.9)"),
            (names.DIGITS_ENTROPY, "entropy", "class balance (entropy / log 10)"))  # fmt: skip
    for ax, (key, name, label) in zip(axes[0], keys, strict=True):
        for method, records in records_by_method.items():
            steps, values = series(records, key)
            if steps:
                ax.plot(steps, values, marker="o", ms=3, label=method)
        if real is not None:
            ax.axhline(real[name], color="grey", linestyle="--", label="real digits")
        ax.set(xlabel="step", ylabel=label, ylim=(0, 1.02))
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    return _save(fig, path)


def plot_grad_oscillation(records_by_method: Mapping[str, Records], path: str | Path) -> Path:
    """Gradient norm of the blocks vs step (left) and its sliding-window std (right), per method."""
    fig, axes = _figure(ncols=2)
    for method, records in records_by_method.items():
        keys = (names.BLOCK_GRAD_NORM, names.osc(names.BLOCK_GRAD_NORM, "std"))
        for ax, key in zip(axes[0], keys, strict=True):
            steps, values = series(records, key)
            if steps:
                ax.plot(steps, values, label=method)
    axes[0][0].set(xlabel="step", ylabel="gradient norm")
    axes[0][1].set(xlabel="step", ylabel="sliding-window std of gradient norm")
    axes[0][0].legend()
    return _save(fig, path)


def last_noise_levels(records: Records) -> tuple[int, dict[str, dict[float, float]], float] | None:
    """The latest per-noise-level measurement of a run: (step, {"eps"|"x0": {level: mse}}, the
    mean-image x0 error), or None when the run logged none."""
    for r in sorted(records, key=lambda r: int(r["step"]), reverse=True):
        found: dict[str, dict[float, float]] = {"eps": {}, "x0": {}}
        for k, v in r.items():
            if parsed := names.parse_noise(k):
                kind, level = parsed
                found[kind][level] = as_float(v)
        if found["x0"]:
            return int(r["step"]), found, as_float(r.get(names.X0_MEAN_IMAGE, math.nan))
    return None


def plot_noise_levels(records_by_method: Mapping[str, Records], path: str | Path) -> Path:
    """Denoising error per noise level at each run's latest measurement: x0 error (left, with the
    mean image's error dashed: above it a level is not learnt) and epsilon error (right)."""
    fig, axes = _figure(ncols=2)
    baseline = math.nan
    for method, records in records_by_method.items():
        found = last_noise_levels(records)
        if found is None:
            continue
        step, errors, baseline = found
        for ax, kind in zip(axes[0], ("x0", "eps"), strict=True):
            levels = sorted(errors[kind])
            ax.plot(levels, [errors[kind][x] for x in levels], marker="o", label=f"{method} (step {step})")
    if math.isfinite(baseline):
        axes[0][0].axhline(baseline, color="grey", linestyle="--", label="mean image")
    axes[0][0].set(xlabel="noise level (fraction of the schedule; 1 = pure noise)", ylabel="x0 MSE")
    axes[0][1].set(xlabel="noise level (fraction of the schedule; 1 = pure noise)", ylabel="epsilon MSE")
    for ax in axes[0]:
        ax.set_yscale("log")
    axes[0][0].legend()
    return _save(fig, path)


def skip_title(index: int, num_skips: int) -> str:
    """Where skip ``index`` (1 = outermost) of ``num_skips`` sits: the decoder merges the innermost
    skip first and the outermost last (LIFO), e.g. ``skip 1 (outermost), merged 6th of 6``."""
    where = " (outermost)" if index == 1 else " (innermost)" if index == num_skips else ""
    return f"skip {index}{where}\nmerged {ordinal(num_skips - index + 1)} of {num_skips}"


def plot_coefficients(records: Records, path: str | Path, title: str = "") -> Path:
    """One small panel per skip: its coefficient vs step (the mean over the batch, with the batch's
    min..max as a band) on a shared 0..1 axis; the panel's title names the skip (1 = outermost)
    and where the decoder merges it. Six bands of one axis hide each other; panels do not."""
    parsed = (names.parse_skip(k) for r in records for k in r)
    indices = sorted({p[0] for p in parsed if p and p[1] == "coef_mean"})
    count = max(len(indices), 1)
    nrows = math.ceil(count / 4)
    ncols = math.ceil(count / nrows)
    fig, axes = _figure(ncols, nrows, size=(3.0, 2.4))
    panels = [ax for row in axes for ax in row]
    num_skips = max(indices, default=0)
    for ax, i in zip(panels, indices, strict=False):
        steps, mean = series(records, names.skip(i, "coef_mean"))
        lo = dict(zip(*series(records, names.skip(i, "coef_min")), strict=True))
        hi = dict(zip(*series(records, names.skip(i, "coef_max")), strict=True))
        band = [s for s in steps if s in lo and s in hi]
        ax.fill_between(band, [lo[s] for s in band], [hi[s] for s in band], color="C0", alpha=0.25, lw=0)
        ax.plot(steps, mean, color="C0")
        ax.set_title(skip_title(i, num_skips), fontsize=9)
        ax.set_ylim(0, 1.02)  # sigmoid gates: a band that touches 1 stays inside the frame
        ax.grid(alpha=0.3)
    for ax in panels[len(indices) :]:
        ax.set_visible(False)
    for row in axes:  # one y scale for all: tick labels on the left column only
        row[0].set_ylabel("coefficient")
        for ax in row[1:]:
            ax.tick_params(labelleft=False)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    heading = "skip coefficients: mean over the batch (line) and its min..max (band)"
    fig.suptitle(f"{title}: {heading}" if title else heading, fontsize=10)
    return _save(fig, path)


def _varying_coefficients(records: Records) -> bool:
    values: dict[int, set[float]] = {}
    for r in records:
        for k, v in r.items():
            parsed = names.parse_skip(k)
            if parsed and parsed[1].startswith("coef_") and math.isfinite(x := as_float(v)):
                values.setdefault(parsed[0], set()).add(round(x, 6))  # per skip: mean, min and max
    return any(len(v) > 1 for v in values.values())


def plot_stability_map(
    values: Sequence[Sequence[float]],
    notes: Sequence[Sequence[str]],
    marked: Sequence[Sequence[bool]],
    rows: Sequence[str],
    cols: Sequence[str],
    path: str | Path,
    title: str = "",
    metric: str = "",
) -> Path:
    """A heatmap of ``values[row][col]`` (rows: methods, columns: learning rates; NaN: grey),
    each cell with its value and ``notes`` written in it; ``marked`` cells (a seed failed) hatched."""
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm
    from matplotlib.patches import Rectangle

    finite = [v for row in values for v in row if math.isfinite(v)]
    fig, axes = _figure(size=(1.2 + 1.5 * len(cols), 1.0 + 0.7 * len(rows)))
    ax = axes[0][0]
    norm = (
        LogNorm(min(finite), max(finite))
        if finite and min(finite) > 0 and max(finite) > min(finite)
        else None
    )
    grid = [[v if math.isfinite(v) else math.nan for v in row] for row in values]
    cmap = colormaps["viridis_r"].with_extremes(bad="lightgrey")  # lower is better: bright
    image = ax.imshow(grid, cmap=cmap, norm=norm, aspect="auto")
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            text = ("" if not math.isfinite(v) else f"{v:.3g}") + (f"\n{notes[i][j]}" if notes[i][j] else "")
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=8,
                bbox={"facecolor": "white", "alpha": 0.7, "edgecolor": "none", "pad": 1},
            )
            if marked[i][j]:
                ax.add_patch(
                    Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="xx", edgecolor="red", lw=1.5)
                )
    ax.set_xticks(range(len(cols)), cols)
    ax.set_yticks(range(len(rows)), rows)
    ax.set(xlabel="learning rate", ylabel="skip method", title=title)
    fig.colorbar(image, ax=ax, label=f"final {metric}, mean over seeds".strip())
    return _save(fig, path)


# ------------------------------------------------------------ across seeds and depths (sweep)


def seed_band(runs: Sequence[Records], key: str) -> tuple[list[int], list[float], list[float], list[float]]:
    """``key`` across the runs (seeds) of one cell: ``(steps, mean, lo, hi)``, at every step any
    run logged, of the runs' finite values there; ``lo``..``hi`` is their min..max. Non-finite
    values are left out, so where a seed diverged its spread ends; a step no run has a finite
    value at is NaN in all three (a gap in the line)."""
    at: dict[int, list[float]] = {}
    for records in runs:
        for step, value in zip(*series(records, key), strict=True):
            at.setdefault(step, []).append(value)
    steps = sorted(at)
    finite = [[v for v in at[s] if math.isfinite(v)] for s in steps]
    mean = [sum(v) / len(v) if v else math.nan for v in finite]
    return steps, mean, [min(v, default=math.nan) for v in finite], [max(v, default=math.nan) for v in finite]


def _depth_order(depth: int | None) -> int:
    return -1 if depth is None else depth


def _seed_count(counts: Sequence[int]) -> str:
    lo, hi = min(counts, default=0), max(counts, default=0)
    return f"{lo} seed{'s' if hi > 1 else ''}" if lo == hi else f"{lo} to {hi} seeds"


def fig1_by_depth_figure(
    runs: Mapping[tuple[int | None, str], Sequence[Records]],
    key: str = names.FEATURE_NORM,
    log: bool | None = None,
    title: str = "",
    ylabel: str = "norm of hidden features",
):
    """The paper's Fig. 1 across depths, as a matplotlib Figure (not saved; :func:`plot_fig1_by_depth`
    saves it). ``runs[(depth, method)]`` holds the records of each seed of that cell.

    One panel per depth, shallow to deep, left to right, sharing the x-axis (step). In each
    panel one line per method, in the order of ``runs`` and one colour per method in every
    panel: the mean over its seeds of ``key`` (the hidden-feature norm, mean over blocks), with
    the seeds' min..max as a band (:func:`seed_band`). ``log`` None: every panel on a log y-axis
    when the values span decades (:func:`spans_decades`), so a blow-up does not flatten the rest.
    """
    depths = sorted({d for d, _ in runs}, key=_depth_order)
    methods = list(dict.fromkeys(m for _, m in runs))
    fig, axes = _figure(ncols=max(len(depths), 1), size=(4.6, 3.6))
    panels = list(axes[0])
    for ax in panels[1:]:  # before drawing, so the limits cover every panel
        ax.sharex(panels[0])
    values: list[float] = []
    for ax, depth in zip(panels, depths, strict=False):
        counts = []
        for i, method in enumerate(methods):
            steps, mean, lo, hi = seed_band(runs.get((depth, method), ()), key)
            if not steps:
                continue
            counts.append(len(runs[depth, method]))
            ax.fill_between(steps, lo, hi, color=f"C{i}", alpha=0.2, lw=0)
            ax.plot(steps, mean, color=f"C{i}", label=method)
            values += lo + hi
        where = "" if depth is None else f"depth {depth}, "
        ax.set_title(f"{where}{_seed_count(counts)}", fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    panels[0].set_ylabel(ylabel)
    if spans_decades(values) if log is None else log and any(v > 0 and math.isfinite(v) for v in values):
        for ax in panels:
            ax.set_yscale("log")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_fig1_by_depth(
    runs: Mapping[tuple[int | None, str], Sequence[Records]], path: str | Path, **kwargs
) -> Path:
    """:func:`fig1_by_depth_figure` saved as a PNG at ``path``."""
    return _save(fig1_by_depth_figure(runs, **kwargs), path)


@dataclass(frozen=True)
class BasinPoint:
    """One run in the lr-basin figure (:func:`basin_figure`)."""

    lr: float
    value: float  # its final error as the basin counts it (capped at ``cap``); NaN: not drawn
    kind: str  # ok | diverged | capped (worse than the untrained model) | missing
    cap: float  # the untrained model's error


_BASIN_MARKERS = {  # kind -> (marker, size, legend entry); ok points carry no legend entry
    "ok": ("o", 16, ""),
    "diverged": ("x", 42, "failed: at min(error, cap)"),
    "capped": ("v", 30, "worse than untrained: at the cap"),
}


def _basin_panel(ax, points: Mapping[str, Sequence[BasinPoint]], methods: Sequence[str]) -> list[float]:
    """One panel of :func:`basin_figure`: ``points[method]``, drawn in the method's colour of
    ``methods``; returns the values drawn (for the choice of a log axis)."""
    from matplotlib.lines import Line2D

    values, kinds, seeds = [], set(), []
    for i, method in enumerate(methods):
        pts = [p for p in points.get(method, ()) if math.isfinite(p.value)]
        if not pts:
            continue
        colour, at = f"C{i}", sorted({p.lr for p in pts})
        ax.plot(
            at,
            [statistics.fmean(p.value for p in pts if p.lr == lr) for lr in at],
            color=colour,
            label=method,
        )
        for kind, (marker, size, _) in _BASIN_MARKERS.items():
            if mine := [p for p in pts if p.kind == kind]:
                kinds.add(kind)
                paint = (
                    {"facecolors": "none", "edgecolors": colour} if kind == "capped" else {"color": colour}
                )
                ax.scatter(
                    [p.lr for p in mine], [p.value for p in mine], marker=marker, s=size, alpha=0.8, **paint
                )
        if caps := [p.cap for p in pts if math.isfinite(p.cap)]:
            ax.axhline(statistics.fmean(caps), color=colour, ls=":", lw=1, label=f"_untrained {method}")
        seeds.append(max(sum(p.lr == lr for p in pts) for lr in at))
        values += [p.value for p in pts] + caps
    if ax.lines:
        handles = [line for line in ax.lines if not line.get_label().startswith("_")]
        handles.append(Line2D([], [], color="grey", ls=":", lw=1, label="untrained model (the cap)"))
        for kind in ("diverged", "capped"):
            marker, _, text = _BASIN_MARKERS[kind]
            face = "none" if kind == "capped" else "grey"
            if kind in kinds:
                handles.append(
                    Line2D([], [], color="grey", ls="", marker=marker, markerfacecolor=face, label=text)
                )
        ax.legend(handles=handles, fontsize=7)
    ax.set_title(_seed_count(seeds), fontsize=10)
    return values


def basin_figure(
    rows: Mapping[str, Mapping[tuple[int | None, str], Sequence[BasinPoint]]],
    log: bool | None = None,
    ylabel: str = "final held-out x0 error",
):
    """The lr basin (Wortsman et al. 2023) as a matplotlib Figure (not saved; :func:`plot_basin`
    saves it). ``rows[label][(depth, method)]`` holds the runs (seeds, lrs) of that method at
    that depth, one row of panels per label (e.g. the EMA weights, the trained weights).

    One panel per depth, shallow to deep, left to right; the lr on a log x-axis shared by every
    panel, ticks at the lrs trained. In each panel one line per method, one colour per method in
    every panel: the mean over the seeds at each lr of their values; each seed a point, a
    failed run an x at min(error, cap) (an error it did not log: the cap), a run that trained but
    ended worse than the untrained model a triangle at the cap;
    a dotted line per method at its cap (the mean over its runs). ``log`` None: log y-axes when
    the values span decades."""
    from matplotlib.ticker import NullLocator

    depths = sorted({d for points in rows.values() for d, _ in points}, key=_depth_order)
    methods = list(dict.fromkeys(m for points in rows.values() for _, m in points))
    lrs = sorted({p.lr for points in rows.values() for pts in points.values() for p in pts})
    fig, axes = _figure(ncols=max(len(depths), 1), nrows=max(len(rows), 1), size=(4.6, 3.6))
    panels = [ax for row in axes for ax in row]
    for ax in panels[1:]:  # before drawing, so the limits cover every panel
        ax.sharex(panels[0])
    values: list[float] = []
    for row, (label, points) in zip(axes, rows.items(), strict=False):
        for ax in row[1:]:
            ax.sharey(row[0])
        for ax, depth in zip(row, depths, strict=False):
            values += _basin_panel(ax, {m: pts for (d, m), pts in points.items() if d == depth}, methods)
            where = "" if depth is None else f"depth {depth}, "
            ax.set_title(f"{where}{label}, {ax.get_title()}", fontsize=10)
            ax.set_xlabel("learning rate")
            ax.grid(alpha=0.3)
        row[0].set_ylabel(ylabel)
    panels[0].set_xscale("log")
    if lrs:
        panels[0].set_xticks(lrs, [f"{lr:g}" for lr in lrs])
        panels[0].xaxis.set_minor_locator(NullLocator())
    if spans_decades(values) if log is None else log and any(v > 0 and math.isfinite(v) for v in values):
        for ax in panels:
            ax.set_yscale("log")
    else:
        for ax in panels:
            ax.ticklabel_format(axis="y", useOffset=False)  # errors as they are, not as offsets from 1
    return fig


def plot_basin(
    rows: Mapping[str, Mapping[tuple[int | None, str], Sequence[BasinPoint]]], path: str | Path, **kwargs
) -> Path:
    """:func:`basin_figure` saved as a PNG at ``path``."""
    return _save(basin_figure(rows, **kwargs), path)


# Decoder blocks as the diagnostics name them: U-ViT out_blocks.j, diffusers up_blocks.j, UNet up.j.
_DECODER = re.compile(r"^(out_blocks|up_blocks|up)\.(\d+)$")


def decoder_blocks(records: Records) -> list[str]:
    """The decoder blocks with a logged feature norm (``out_blocks.0``, ...), in forward order."""
    parsed = (names.parse_block(k) for r in records for k in r)
    matches = (m for p in parsed if p and p[1] == "feature_norm" and (m := _DECODER.match(p[0])))
    found = {(m.group(1), int(m.group(2))): m.group(0) for m in matches}
    return [found[k] for k in sorted(found)]


def _block_label(name: str, count: int) -> str:
    """``out_blocks.0 (skip 6)``: a U-ViT out-block merges skip ``count - j`` (LIFO; 1 = outermost)."""
    kind, _, j = name.partition(".")
    return f"{name} (skip {count - int(j)})" if kind == "out_blocks" else name


def out_block_norm_figure(
    runs_by_method: Mapping[str, Sequence[Records]], log: bool | None = None, title: str = ""
):
    """Where a blow-up sits, as a matplotlib Figure: one panel per method (of one depth), sharing
    both axes; in each, the feature norm of every decoder block (a U-ViT's out-blocks) against
    step, the mean over the method's seeds (:func:`seed_band`). The colour runs from the first
    out-block (dark; it merges the innermost skip) to the last (bright; the outermost skip, next
    to the output). ``log`` None: log y-axes when the norms span decades."""
    methods = list(runs_by_method)
    fig, axes = _figure(ncols=max(len(methods), 1), size=(3.8, 3.2))
    from matplotlib import colormaps  # after _figure: it says which extra to install

    panels, cmap, values = list(axes[0]), colormaps["viridis"], []
    for ax in panels[1:]:  # before drawing, so the limits cover every panel
        ax.sharex(panels[0])
        ax.sharey(panels[0])
    for ax, method in zip(panels, methods, strict=False):
        seeds = runs_by_method[method]
        blocks = decoder_blocks([r for records in seeds for r in records])
        for j, name in enumerate(blocks):
            steps, mean, _, _ = seed_band(seeds, names.block(name, "feature_norm"))
            colour = cmap(0.9 * j / max(len(blocks) - 1, 1))
            ax.plot(steps, mean, color=colour, label=_block_label(name, len(blocks)))
            values += mean
        ax.set_title(f"{method}, {_seed_count([len(seeds)])}", fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    panels[0].set_ylabel("feature norm of the block")
    if spans_decades(values) if log is None else log and any(v > 0 and math.isfinite(v) for v in values):
        panels[0].set_yscale("log")  # shared: every panel follows
    if panels[0].lines:
        panels[0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_out_block_norms(runs_by_method: Mapping[str, Sequence[Records]], path: str | Path, **kwargs) -> Path:
    """:func:`out_block_norm_figure` saved as a PNG at ``path``."""
    return _save(out_block_norm_figure(runs_by_method, **kwargs), path)


def magnitude_figure(
    profiles: Mapping[str, tuple[Sequence[str], Sequence[float], Sequence[float], Sequence[float]]],
    limit: float | None = None,
    title: str = "",
):
    """How large the values get along the network, as a matplotlib Figure: per method (one line
    each) the peak |value| of every block's output over the run against the block, in forward order
    (``profiles[method]``: blocks, median over seeds, least, largest:
    :func:`scalelong.studies.magnitude.median_profile`), the seeds' spread as a band, on a log axis;
    ``limit`` (fp16's 65,504) as a dashed line. Non-finite peaks are left out of a line."""
    blocks = list(max(profiles.values(), key=lambda p: len(p[0]))[0]) if profiles else []
    fig, axes = _figure(size=(max(6.0, 0.55 * len(blocks) + 2), 4.2))
    ax = axes[0][0]
    for method, (names_, mid, lo, hi) in profiles.items():
        x = [blocks.index(b) for b in names_ if b in blocks]
        keep = [i for i, v in enumerate(mid) if math.isfinite(v) and v > 0]
        (line,) = ax.plot([x[i] for i in keep], [mid[i] for i in keep], marker="o", ms=3, label=method)
        band = [i for i in keep if math.isfinite(lo[i]) and math.isfinite(hi[i])]
        ax.fill_between(
            [x[i] for i in band],
            [lo[i] for i in band],
            [hi[i] for i in band],
            color=line.get_color(),
            alpha=0.15,
        )
    if limit is not None:
        ax.axhline(limit, color="black", ls="--", lw=1, label=f"fp16's largest value, {limit:,.0f}")
    ax.set_yscale("log")
    decoder = [b for b in blocks if _DECODER.match(b)]
    labels = [_block_label(b, len(decoder)) if b in decoder else b for b in blocks]
    ax.set_xticks(range(len(blocks)), labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("peak |value| of the block's output")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def plot_magnitude(profiles, path: str | Path, **kwargs) -> Path:
    """:func:`magnitude_figure` saved as a PNG at ``path``."""
    return _save(magnitude_figure(profiles, **kwargs), path)


def write_plots(
    records_by_method: Mapping[str, Records], out_dir: str | Path, fd_key: str = names.FD
) -> list[Path]:
    """Every plot whose data is present, as PNG files in ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    has = lambda key: any(key in r for recs in records_by_method.values() for r in recs)  # noqa: E731
    paths = []
    if has(names.LOSS):
        paths.append(plot_loss(records_by_method, out_dir / "loss.png"))
    if has(names.FEATURE_NORM):
        paths.append(plot_feature_norm(records_by_method, out_dir / "feature_norm.png"))
    if has(names.BLOCK_GRAD_NORM):
        paths.append(plot_grad_oscillation(records_by_method, out_dir / "grad_oscillation.png"))
    if has(fd_key):
        paths.append(plot_fd(records_by_method, out_dir / "fd.png", fd_key))
    profiles = {m: median_profile([recs]) for m, recs in records_by_method.items()}
    if profiles := {m: p for m, p in profiles.items() if p[0]}:  # blocks' absmax logged
        paths.append(plot_magnitude(profiles, out_dir / "magnitude.png", limit=FP16_MAX))
    if any(last_noise_levels(r) for r in records_by_method.values()):
        paths.append(plot_noise_levels(records_by_method, out_dir / "noise_levels.png"))
    for method, records in records_by_method.items():
        if _varying_coefficients(records):  # constant methods give flat lines: not worth a plot
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", method)
            paths.append(plot_coefficients(records, out_dir / f"coefficients_{safe}.png", title=method))
    return paths


__all__ = [
    "as_float",
    "load_metrics",
    "series",
    "plot_loss",
    "plot_feature_norm",
    "plot_fd",
    "plot_digit_score",
    "plot_grad_oscillation",
    "plot_coefficients",
    "skip_title",
    "plot_noise_levels",
    "last_noise_levels",
    "plot_stability_map",
    "seed_band",
    "fig1_by_depth_figure",
    "plot_fig1_by_depth",
    "BasinPoint",
    "basin_figure",
    "plot_basin",
    "decoder_blocks",
    "out_block_norm_figure",
    "plot_out_block_norms",
    "write_plots",
]
