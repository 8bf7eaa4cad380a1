"""The lr basin of a sweep, as Wortsman et al. 2023 read one ("Small-scale proxies for large-scale
Transformer training instabilities", arXiv 2309.14322): per method and depth, the final held-out
x0 error against the learning rate, the largest stable lr (the basin's upper edge) and the **LR
sensitivity**, the mean over the lr grid of the gap between the error at each lr and the best
error on the grid, where the untrained model's error caps every lr's value.

Per run (one seed s at one lr eta of one method and depth), with l the final held-out x0 error
(:func:`~scalelong.studies.heldout.heldout_x0_error`; the EMA's unless told) and l0 the untrained
model's error of the same seed (:func:`cap_of`):

    v_s(eta) = min(l_s(eta), l0)      (l0 where l is not finite or was not logged by a failed run)
                                                                              (:func:`capped_error`)
    LRS_s    = mean over eta of v_s(eta) - min over eta of v_s(eta)           (:func:`lr_sensitivity`)

over the depth's lr grid (every lr any method trained at that depth, so that every method is
averaged over the same lrs, each lr weighing the same); a seed enters only where it has a value at
every lr of the grid. The LR sensitivity of a method is the mean of LRS_s over those seeds with a
95% t-interval; its difference to the baseline's is
:func:`~scalelong.studies.statistics.contrast`, paired by seed.

Whether a run failed is the study's one rule (:mod:`scalelong.studies.divergence`). The **largest
stable lr** is read only from the seeds that every method of the depth ran at an lr (the shared
seeds): an lr where the methods ran different seeds is decided on the seeds they share, and one
that some method did not run decides nothing, so that no edge comes from a seed count. Where methods
ran unequal seeds, :mod:`.edges` reads an edge on every set of seeds that some methods share, and
:func:`comparison_sensitivity` the LR sensitivity over its own lrs.

The **LR sensitivity** of Wortsman et al. needs every seed at every lr of its grid, and the basin
table's grid is every lr any method trained, so one method run at a further lr, or on one seed
only, leaves the others one seed or none. Within a comparison of two lrs or more the grid is L and
every seed of S ran it: per seed s of S, LRS_s = mean over L of v_s(lr) - min over L of v_s(lr)
(:func:`~scalelong.studies.sweep.basin.lr_sensitivity` of the capped errors), reported as the mean
over S with its 95% t-interval and its difference to ``none``'s, paired by seed.

Nothing here assumes a backbone: a cell's depth is None for a network without one.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scalelong.skips import method_order
from scalelong.studies.divergence import NO_NOISE_ERROR
from scalelong.studies.markdown import markdown_table
from scalelong.studies.plots import BasinPoint, plot_basin
from scalelong.studies.statistics import Contrast, contrast, fmt_ci, fmt_contrast, mean_ci
from scalelong.studies.summary import CellSummary, SeedSummary
from scalelong.studies.sweep.edges import (
    EDGES_NOTE,
    Comparison,
    comparisons,
    edges_table,
    largest_stable_lr,
    seed_list,
)

WEIGHTS = {"ema": "EMA weights", "raw": "trained weights"}  # whose error: x0_error, x0_error_raw


def held_out(r: SeedSummary) -> tuple[dict[str, float], float, float]:
    """What the basin reads of a run, the quantity the failure rule judges it by: its final held-out
    error per weights, the untrained model's (step 0) and the best input-free guess's. The x0 error
    and the mean image's; for a network that predicts the noise, its noise error and 1 (no noise):
    its x0 error divides the noise's by alpha^2, thousands of times at the highest levels."""
    if r.prediction == "eps":
        return {"ema": r.eps_error, "raw": r.eps_error_raw}, r.eps_error_start, NO_NOISE_ERROR
    return {"ema": r.x0_error, "raw": r.x0_error_raw}, r.x0_error_start, r.x0_mean_image


# Where the cap l0 of a run comes from, in the order tried (:func:`cap_of`).
CAP_SOURCES = {
    "step0": "the run's own step-0 measurement",
    "seed": "the step-0 measurement of the same seed at another lr (the same untrained network: the lr "
    "does not enter step 0)",
    "seeds": "the mean step-0 measurement of the method's other seeds at that depth",
    "mean_image": "the mean image's x0 error on the same held-out images (`noise/x0_mse_mean_image`; 1, "
    "predicting no noise, for a network that predicts the noise), for want of a measured untrained model",
}


def capped_error(error: float, initial: float, failed: bool = False) -> float:
    """Wortsman et al.'s v = min(l, l0), whether or not the run counts as failed: l0 where the error
    is not finite (inf: the model's output was not), or where a failed run logged none (a run
    stopped on non-finite steps measures nothing after); NaN where a run that trained logged no
    error, or where l0 is unknown."""
    if not math.isfinite(initial):
        return math.nan
    if error == math.inf or (failed and math.isnan(error)):
        return initial
    return min(error, initial) if math.isfinite(error) else math.nan


def lr_sensitivity(values: Sequence[float]) -> float:
    """Wortsman et al.'s LR sensitivity of one seed from its capped values (:func:`capped_error`),
    one per lr of the grid: their mean less their minimum. NaN if a value is missing."""
    if not values or not all(math.isfinite(v) for v in values):
        return math.nan
    return statistics.fmean(values) - min(values)


@dataclass(frozen=True)
class BasinRun:
    """One run (seed) of a method at one lr, as the basin reads it."""

    lr: float
    seed: int | None
    error: Mapping[
        str, float
    ]  # final held-out x0 error per weights ("ema", "raw"); NaN not logged, inf not finite
    cap: float  # l0, the untrained model's error (NaN: none found)
    cap_source: str  # a key of CAP_SOURCES ("" where none was found)
    diverged: bool  # failed, by the study's one rule (scalelong.studies.divergence)

    def value(self, weights: str = "ema") -> float:
        """The capped error v the LR sensitivity reads (:func:`capped_error`)."""
        return capped_error(self.error.get(weights, math.nan), self.cap, self.diverged)

    def kind(self, weights: str = "ema") -> str:
        """``diverged``: failed by the rule; ``capped``: trained by the rule but worse than the
        untrained model, so it counts at l0; ``ok``; ``missing``: no value."""
        if self.diverged:
            return "diverged"
        e = self.error.get(weights, math.nan)
        if math.isnan(self.value(weights)):
            return "missing"
        return "capped" if e > self.cap else "ok"


@dataclass
class Basin:
    """One method at one depth: its runs over the depth's lr grid."""

    depth: int | None
    method: str
    grid: tuple[float, ...]  # every lr any method trained at this depth, ascending
    runs: list[BasinRun] = field(default_factory=list)
    shared: Mapping[float, frozenset] = field(default_factory=dict)  # per lr: the seeds every method ran

    def at(self, lr: float) -> list[BasinRun]:
        return [r for r in self.runs if r.lr == lr]

    @property
    def lrs(self) -> list[float]:
        """The lrs this method trained, ascending."""
        return sorted({r.lr for r in self.runs})

    def counts(self) -> dict[float, tuple[int, int]]:
        """Per lr it trained: (failed, runs), over every seed it ran there."""
        return {lr: (sum(r.diverged for r in self.at(lr)), len(self.at(lr))) for lr in self.lrs}

    def deciding_counts(self) -> dict[float, tuple[int, int]]:
        """Per lr that decides an edge: (failed, runs) over the seeds every method of the depth ran
        there (:attr:`shared`); an lr without such seeds is left out."""
        out = {}
        for lr in self.lrs:
            seeds = self.shared.get(lr, frozenset())
            runs = [r for r in self.at(lr) if r.seed in seeds]
            if runs:
                out[lr] = (sum(r.diverged for r in runs), len(runs))
        return out

    @property
    def largest_stable_lr(self) -> float | None:
        """:func:`largest_stable_lr` over the shared seeds (:meth:`deciding_counts`)."""
        return largest_stable_lr(self.deciding_counts())

    def stable_edge(self) -> str:
        """The largest stable lr as every table writes it: ``2e-3``; ``8e-3 (the largest tried)``
        where it is the largest lr the method trained (the edge may lie further out); ``none``
        where the smallest lr that decides failed; ``undecided`` where no lr decides. Where the
        method ran seeds that did not decide
        (other methods did not run them), the seeds that did are named, ``1e-2 (on seed 0)``, or
        where they differ between lrs it says so, so the edge is not read as the method's over all
        its runs."""
        top = self.largest_stable_lr
        notes = ["the largest tried"] if top is not None and top == self.lrs[-1] else []
        deciding = self.deciding_counts()
        if not deciding:  # nothing to read an edge from: no lr where every method ran the same seeds
            return "undecided (no lr where every method ran the same seeds)"
        if not all(lr in deciding and deciding[lr][1] == len(self.at(lr)) for lr in self.lrs):
            sets = {self.shared[lr] for lr in deciding}
            if len(sets) == 1:
                (seeds,) = sets
                notes.append(f"on seed{'s' if len(seeds) > 1 else ''} {seed_list(seeds)}")
            else:
                notes.append("on the seeds all methods ran at each lr")
        text = f"below {self.lrs[0]:g}" if top is None else f"{top:g}"  # "none" would read as the method
        return text + (f" ({'; '.join(notes)})" if notes else "")

    def seed_values(self, weights: str = "ema") -> dict[int | None, dict[float, float]]:
        """Per seed, its capped value at each lr it has one (:meth:`BasinRun.value`)."""
        out: dict[int | None, dict[float, float]] = {}
        for r in sorted(self.runs, key=lambda r: (r.seed is None, r.seed or 0)):
            if math.isfinite(v := r.value(weights)):
                out.setdefault(r.seed, {})[r.lr] = v
        return out

    def seed_sensitivity(self, weights: str = "ema") -> dict[int, float]:
        """LRS_s of every seed with a value at every lr of the grid."""
        return {
            s: lr_sensitivity([v[lr] for lr in self.grid])
            for s, v in self.seed_values(weights).items()
            if s is not None and all(lr in v for lr in self.grid)
        }

    def left_out(self, weights: str = "ema") -> dict[int | None, list[float]]:
        """The seeds left out of the LR sensitivity, each with the lrs of the grid it lacks a value at."""
        seeds = {r.seed for r in self.runs}
        values = self.seed_values(weights)
        kept = self.seed_sensitivity(weights)
        return {
            s: [lr for lr in self.grid if lr not in values.get(s, {})]
            for s in sorted(seeds, key=lambda s: (s is None, s or 0))
            if s not in kept
        }

    def sensitivity(self, weights: str = "ema") -> tuple[float, float]:
        """The LR sensitivity: the mean of LRS_s over the seeds that have it, and the half-width
        of its 95% t-interval (NaN with one seed; both NaN with none)."""
        return mean_ci(list(self.seed_sensitivity(weights).values()))

    def best(self, weights: str = "ema") -> tuple[float, list[float]] | None:
        """The lr of the lowest mean capped value over the seeds that ran it (ties: the smaller
        lr), with those values; None without a value."""
        at = {lr: [v for r in self.at(lr) if math.isfinite(v := r.value(weights))] for lr in self.lrs}
        found = [(statistics.fmean(v), lr) for lr, v in at.items() if v]
        if not found:
            return None
        lr = min(found)[1]
        return lr, at[lr]

    def against(self, baseline: Basin, weights: str = "ema") -> Contrast | None:
        """This method's LR sensitivity less the baseline's, paired by seed
        (:func:`~scalelong.studies.statistics.contrast`; Welch's only without a shared seed)."""
        a, b = self.seed_sensitivity(weights), baseline.seed_sensitivity(weights)
        return contrast(list(a.values()), list(b.values()), list(a), list(b))

    def logged(self, weights: str) -> bool:
        """Whether any run logged a final error of ``weights``."""
        return any(not math.isnan(r.error.get(weights, math.nan)) for r in self.runs)


def cap_of(cells: Sequence[CellSummary]) -> dict[tuple[int, int], tuple[float, str]]:
    """The cap l0 of every run, keyed by (index of its cell in ``cells``, index of its seed),
    with its source (a key of :data:`CAP_SOURCES`), from the first of: the run's own step-0
    measurement (``diagnostics.noise_levels_at_start``); the mean of the same seed's step-0
    measurements at the other lrs of its method and depth; the mean over the method's other
    seeds at that depth of theirs; the mean image's x0 error, the run's own or else the mean of
    every run's (one number of the held-out images). NaN and "" where none is found."""

    def finite_mean(values: Sequence[float]) -> float:
        xs = [v for v in values if math.isfinite(v)]
        return statistics.fmean(xs) if xs else math.nan

    by_seed: dict[tuple, list[float]] = {}  # (depth, method, seed) -> its step-0 measurements
    for c in cells:
        for r in c.runs:
            by_seed.setdefault((c.cell.depth, c.cell.method, r.seed), []).append(held_out(r)[1])
    seed_mean = {k: finite_mean(v) for k, v in by_seed.items()}
    mean_image = finite_mean([held_out(r)[2] for c in cells for r in c.runs])
    caps = {}
    for i, c in enumerate(cells):
        for j, r in enumerate(c.runs):
            key = (c.cell.depth, c.cell.method, r.seed)
            others = [v for (d, m, s), v in seed_mean.items() if (d, m) == key[:2] and s != r.seed]
            _, start, guess = held_out(r)
            tried = [
                (start, "step0"),
                (seed_mean[key], "seed"),
                (finite_mean(others), "seeds"),
                (guess if math.isfinite(guess) else mean_image, "mean_image"),
            ]
            caps[i, j] = next(((v, src) for v, src in tried if math.isfinite(v)), (math.nan, ""))
    return caps


def basins(cells: Sequence[CellSummary]) -> list[Basin]:
    """One :class:`Basin` per (depth, method) of a sweep's cells, by depth, then in method order."""
    caps = cap_of(cells)
    grids: dict[int | None, set[float]] = {}
    for c in cells:
        grids.setdefault(c.cell.depth, set()).add(c.cell.lr)
    found: dict[tuple, Basin] = {}
    for i, c in enumerate(cells):
        d, m = c.cell.depth, c.cell.method
        basin = found.setdefault((d, m), Basin(d, m, tuple(sorted(grids[d]))))
        for j, r in enumerate(c.runs):
            cap, source = caps[i, j]
            error = held_out(r)[0]
            basin.runs.append(BasinRun(c.cell.lr, r.seed, error, cap, source, bool(r.breaks)))
    for depth, lrs in grids.items():  # the seeds every method of the depth ran, per lr
        mine = [b for (d, _), b in found.items() if d == depth]
        for lr in lrs:
            ran = [frozenset(r.seed for r in b.at(lr) if r.seed is not None) for b in mine]
            shared = frozenset.intersection(*ran) if ran else frozenset()
            for b in mine:
                b.shared = {**b.shared, lr: shared}
    return sorted(found.values(), key=lambda b: (-1 if b.depth is None else b.depth, method_order(b.method)))


# ----------------------------------------------------------------------------- on equal seeds


def comparison_sensitivity(basin: Basin, comparison: Comparison, weights: str = "ema") -> dict[int, float]:
    """Per seed of the comparison with a capped value at each of its lrs: its LR sensitivity over
    the comparison's lrs (Wortsman et al.; the grid is the comparison's, not the depth's)."""
    values = basin.seed_values(weights)
    return {
        s: lr_sensitivity([values[s][lr] for lr in comparison.lrs])
        for s in sorted(comparison.seeds)
        if all(lr in values.get(s, {}) for lr in comparison.lrs)
    }


def sensitivity_table(found: Sequence[Basin], weights: str = "ema") -> str:
    """Per comparison of two lrs or more: each method's LR sensitivity over the comparison's lrs
    (mean ± 95% t-interval over its seeds, :func:`comparison_sensitivity`) and, after the first
    method's (``none`` where it ran), its paired difference to it. Empty without such a comparison."""
    spanning = [c for c in comparisons(found) if len(c.lrs) > 1]
    if not spanning:
        return ""
    by_method = {b.method: b for b in found}
    methods = [b.method for b in found]
    head = ["seeds", "lrs", *methods]
    rows = []
    for c in spanning:
        per = {m: comparison_sensitivity(by_method[m], c, weights) for m in c.methods}
        base = c.methods[0]
        row = c.cells()
        for m in methods:
            if m not in per:
                row.append("")
                continue
            text = f"{fmt_ci(list(per[m].values()))} ({len(per[m])})" if per[m] else "n/a"
            if m != base and per[m] and per[base]:
                diff = contrast(
                    list(per[m].values()), list(per[base].values()), list(per[m]), list(per[base])
                )
                text += f"; vs {base} {fmt_contrast(diff)}"
            row.append(text)
        rows.append(row)
    return markdown_table(head, rows)


SENSITIVITY_NOTE = (
    "**The LR sensitivity on each set of equal seeds.** The same rows, where they span two lrs or "
    "more: per method the LR sensitivity over the row's lrs alone (Wortsman et al.'s formula above "
    "with G the row's lrs; every seed of the row ran them all), mean ± the half-width of a 95% "
    "t-interval over the seeds (their number), then its difference to the first method's (`vs "
    "none`), paired by seed (95% interval). Lower is a flatter basin; values compare within a row "
    "only, as the grid differs between rows."
)


# ----------------------------------------------------------------------------- the report's section


def _count(basin: Basin, lr: float, weights: str) -> str:
    """``1/3`` failed at ``lr`` over every seed run; where the methods ran other seeds, the count on
    the shared seeds that decides the edge (``; 0/1 shared``) or that it decides nothing (``; not
    shared``); ``+1 above l0`` for runs that trained but count at the cap; blank: not run."""
    runs = basin.at(lr)
    if not runs:
        return ""
    above = sum(r.kind(weights) == "capped" for r in runs)
    text = f"{sum(r.diverged for r in runs)}/{len(runs)}"
    deciding = basin.deciding_counts().get(lr)
    if deciding is None:
        text += "; not shared"
    elif deciding[1] != len(runs):
        text += f"; {deciding[0]}/{deciding[1]} shared"
    return text + (f" (+{above} above ℓ0)" if above else "")


def _sensitivity(basin: Basin, weights: str) -> str:
    values = list(basin.seed_sensitivity(weights).values())
    if not values:
        return "n/a"
    return f"{fmt_ci(values)} ({len(values)} seed{'' if len(values) == 1 else 's'})"


def basin_table(found: Sequence[Basin], weights: str = "ema") -> str:
    """The table of one depth's basins: per method the largest stable lr, diverged k/n per lr of
    the grid, the LR sensitivity (mean ± 95% t-interval over its seeds) and its paired difference
    to the baseline's (the first method: ``none`` where it ran), the best mean capped error and its
    lr; with the trained weights' LR sensitivity where the runs logged it."""
    grid = found[0].grid
    raw = weights == "ema" and any(b.logged("raw") for b in found)
    base = found[0]
    head = ["method", "largest stable lr", *(f"failed at {lr:g}" for lr in grid)]
    head += [
        f"LR sensitivity ({WEIGHTS[weights]})",
        f"LR sensitivity - {base.method} (95% CI)",
        "best error",
        "at lr",
    ]
    head += ["LR sensitivity (trained weights)"] if raw else []
    rows = []
    for b in found:
        diff = "baseline" if b is base else fmt_contrast(b.against(base, weights))
        best = b.best(weights)
        row = [b.method, b.stable_edge(), *(_count(b, lr, weights) for lr in grid)]
        row += [_sensitivity(b, weights), diff]
        row += [fmt_ci(best[1]), f"{best[0]:g}"] if best else ["n/a", ""]
        row += [_sensitivity(b, "raw")] if raw else []
        rows.append(row)
    return markdown_table(head, rows)


def left_out_note(found: Sequence[Basin], weights: str = "ema") -> str:
    """The seeds left out of the LR sensitivity, per method, those that lack the same lrs in one
    clause: ``none seeds 5-19 (no value at lr 0.01, 0.04)``. Empty when none is left out."""
    notes = []
    for b in found:
        lacking: dict[tuple[float, ...], list] = {}
        for seed, lrs in b.left_out(weights).items():
            lacking.setdefault(tuple(lrs), []).append(seed)
        for lrs, seeds in lacking.items():
            named = frozenset(s for s in seeds if s is not None)
            which = f"seed{'s' * (len(named) > 1)} {seed_list(named)}" if named else "its run"
            notes.append(f"{b.method} {which} (no value at lr {', '.join(f'{lr:g}' for lr in lrs)})")
    return "Left out of the LR sensitivity: " + "; ".join(notes) + "." if notes else ""


def cap_note(found: Sequence[Basin]) -> str:
    """Which cap l0 the runs used, with how many runs took each source."""
    counts: dict[str, int] = {}
    for b in found:
        for r in b.runs:
            counts[r.cap_source] = counts.get(r.cap_source, 0) + 1
    total = sum(counts.values())
    sources = {**CAP_SOURCES, "": "none was found, so they have no value"}
    parts = [f"{n} run{'' if n == 1 else 's'}, {sources[k]}" for k in sources if (n := counts.get(k))]
    text = (
        f"The cap ℓ0 (the untrained model's held-out x0 error) of the {total} runs: " + "; ".join(parts) + "."
    )
    if counts.get("step0", 0) < total:
        text += " `diagnostics.noise_levels_at_start=true` measures every run's untrained model at step 0."
    return text


def figure_points(found: Sequence[Basin], weights: str) -> dict[tuple[int | None, str], list[BasinPoint]]:
    """The points of one row of the basin figure: per (depth, method), each run's capped value."""
    return {
        (b.depth, b.method): [BasinPoint(r.lr, r.value(weights), r.kind(weights), r.cap) for r in b.runs]
        for b in found
    }


def basin_section(
    cells: Sequence[CellSummary], sweep_dir: Path, found: Sequence[Basin] | None = None
) -> tuple[list[str], list[Basin]]:
    """The sweep report's lr basin (Wortsman et al. 2023): the figure ``basin.png`` (one panel per
    depth, one line per method; a second row for the trained weights where logged), and per depth
    the table of :func:`basin_table`; with the basins it read (``found``: the basins of ``cells``
    where already computed). One sentence where the sweep has a single lr or no held-out error."""
    heading = "## The lr basin"
    lrs = sorted({c.cell.lr for c in cells})
    if len(lrs) < 2:
        lr = f" ({lrs[0]:g})" if lrs else ""
        return [heading, f"The sweep trained a single lr{lr}: the lr basin needs two or more (--lrs)."], []
    found = basins(cells) if found is None else list(found)
    if not any(b.logged("ema") for b in found):
        return [
            heading,
            "No run logged the held-out x0 error the lr basin reads (`noise/x0_mse@L`): train with "
            "diagnostics.noise_levels > 0.",
        ], found
    rows = {WEIGHTS["ema"]: figure_points(found, "ema")}
    if any(b.logged("raw") for b in found):
        rows[WEIGHTS["raw"]] = figure_points(found, "raw")
    png = plot_basin(rows, sweep_dir / "basin.png")
    parts = [
        heading,
        "As Wortsman et al. 2023 (arXiv 2309.14322) read a method's stability: the final held-out x0 "
        "error (256 fixed held-out images, mean over the 11 noise levels, `noise/x0_mse@L`) against the "
        "lr on a log axis, one panel per depth, one line per method: the mean over the seeds that ran "
        "each lr of the capped error, the value the LR sensitivity reads; each seed is a point. A run "
        "that failed by the rule above is an x, one that trained but ended worse than the untrained "
        "model a triangle at the untrained model's error ℓ0; the dotted line of each method is its ℓ0 "
        "(mean over its runs)."
        + (
            " The bottom row is the trained weights (`noise/raw/x0_mse@L`), the top the EMA's."
            if len(rows) > 1
            else ""
        ),
        f"![the lr basin]({png.name})",
        *(
            [
                "These runs predict the noise (`diffusion.prediction=eps`): for them ℓ is the held-out "
                "noise error (`noise/eps_mse@L`, averaged the same way) and ℓ0 the untrained model's, the "
                "quantity the failure rule judges them by (eps); their x0 error would divide it by alpha^2, "
                "thousands of times at the highest noise levels."
            ]
            if any(r.prediction == "eps" for c in cells for r in c.runs)
            else []
        ),
        "**LR sensitivity**, as Wortsman et al. define it: per seed s, over the lr grid G of the depth "
        "(every lr a method trained there, each weighing the same), LRS_s = mean over G of "
        "v_s(lr) - min over G of v_s(lr), with v_s(lr) = min(ℓ_s(lr), ℓ0_s), ℓ the final held-out x0 "
        "error and ℓ0_s the untrained model's of that seed (ℓ0 where ℓ is not finite; a run that "
        "failed but ended finite counts at its own error, as in the paper). The table gives the mean "
        "of LRS_s over the seeds that ran every lr of the grid, ± the half-width of a 95% t-interval, "
        "with their number, and its difference to the first method's, paired by seed. A wider basin "
        "reads as a larger largest stable lr and a smaller LR sensitivity. **Largest stable lr**: no "
        "seed failed there nor at any smaller lr, counted only on the seeds that every method ran at "
        "that lr (k/n shared in the cell where they differ from all its runs; an lr that some method "
        "did not run decides nothing): no edge comes from a difference in seed counts. **Best "
        "error**: the lowest mean capped error over the grid (EMA weights) and its lr.",
        cap_note(found),
    ]
    for depth in sorted({b.depth for b in found}, key=lambda d: -1 if d is None else d):
        mine = [b for b in found if b.depth == depth]
        if len(mine[0].grid) < 2:
            parts.append(f"Depth {depth}: a single lr ({mine[0].grid[0]:g}), no basin.")
            continue
        if depth is not None:
            parts.append(f"### Depth {depth}")
        parts.append(basin_table(mine))
        if note := left_out_note(mine, "ema"):
            parts.append(note)
        if len(comparisons(mine)) > 1:  # unequal seeds: the edge of each comparison they support
            parts += [EDGES_NOTE, edges_table(mine)]
            if table := sensitivity_table(mine):
                parts += [SENSITIVITY_NOTE, table]
    return parts, found


def _number(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None  # JSON has no NaN


def basin_json(found: Sequence[Basin]) -> list[dict]:
    """Per (method, depth) the numbers of the basin table, for map.json: the grid, the counts, the
    largest stable lr, the per-seed and mean LR sensitivity (EMA and trained weights), the
    difference to the baseline and the best error."""
    rows = []
    for b in found:
        base = next(x for x in found if x.depth == b.depth)
        entry: dict = {
            "depth": b.depth,
            "method": b.method,
            "lrs": list(b.grid),
            "failed": [{"lr": lr, "failed": k, "runs": n} for lr, (k, n) in b.counts().items()],
            "deciding": [
                {"lr": lr, "failed": k, "runs": n, "seeds": sorted(b.shared[lr])}
                for lr, (k, n) in b.deciding_counts().items()
            ],
            "largest_stable_lr": b.largest_stable_lr,
        }
        for w in WEIGHTS:
            per_seed = b.seed_sensitivity(w)
            mean, half = b.sensitivity(w)
            best = b.best(w)
            entry[f"lr_sensitivity_{w}"] = {
                "estimate": _number(mean),
                "half_width_95": _number(half),
                "seed": list(per_seed),
                "per_seed": [_number(v) for v in per_seed.values()],
                "left_out": {str(s): lrs for s, lrs in b.left_out(w).items()},
                "best_error": None if best is None else _number(statistics.fmean(best[1])),
                "best_lr": None if best is None else best[0],
            }
            c = b.against(base, w) if b is not base else None
            entry[f"lr_sensitivity_{w}"][f"minus_{base.method}"] = (
                None
                if c is None
                else {
                    "estimate": _number(c.estimate),
                    "low": _number(c.low),
                    "high": _number(c.high),
                    "paired": c.paired,
                    "n": c.n,
                }
            )
        rows.append(entry)
    return rows
