"""The largest stable lr on each set of equal seeds: where methods ran unequal seeds, one edge per
comparison that the runs do support.

The basin table reads each method's edge on the seeds that *every* method ran at an lr
(:attr:`~scalelong.studies.sweep.basin.Basin.largest_stable_lr`), so a study that runs more seeds
for some methods (five seeds of four methods at the lrs around their edge, twenty of two for a
paired test) shows them only as k/n beside an edge read from fewer seeds. A **comparison** here is a
set of seeds S, the methods M that ran every seed of S at every lr of a set L, and L itself, with
M and L as large as the runs allow (no other method ran S at all of L; no other lr was run on S by
all of M). Within it every method's edge rests on the same seeds and lrs, so the edges compare:

    edge(m) = the largest lr of L at which no seed of S failed, nor at any smaller lr of L

(:func:`largest_stable_lr`), ``below min(L)`` where the smallest
failed. A comparison that a larger one contains (more seeds, methods and lrs, none fewer) adds
nothing and is left out.

The **LR sensitivity** of Wortsman et al. needs every seed at every lr of its grid, and the basin
table's grid is every lr any method trained, so one method run at a further lr, or on one seed
only, leaves the others one seed or none. Within a comparison of two lrs or more the grid is L and
every seed of S ran it: per seed s of S, LRS_s = mean over L of v_s(lr) - min over L of v_s(lr)
(:func:`~scalelong.studies.sweep.basin.lr_sensitivity` of the capped errors), reported as the mean
over S with its 95% t-interval and its difference to ``none``'s, paired by seed.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scalelong.studies.statistics import contrast, fmt_ci, fmt_contrast

if TYPE_CHECKING:  # basin.py reads its edges from here
    from scalelong.studies.sweep.basin import Basin


def largest_stable_lr(counts: Mapping[float, tuple[int, int]]) -> float | None:
    """The largest lr at which no seed failed, nor at any smaller lr that decides (``counts[lr]``:
    failed k of n runs, on the seeds every compared method ran there): a stable lr above a failed
    one is luck, not margin. None when the smallest lr failed."""
    stable = None
    for lr in sorted(counts):
        if counts[lr][0]:
            break
        stable = lr
    return stable


@dataclass(frozen=True)
class Comparison:
    """Methods that ran the same seeds at the same lrs of one depth."""

    depth: int | None
    seeds: frozenset
    methods: tuple[str, ...]  # in the report's method order
    lrs: tuple[float, ...]  # ascending

    def contains(self, other: Comparison) -> bool:
        """Whether this comparison holds every seed, method and lr of ``other``."""
        return (
            self.depth == other.depth
            and self.seeds >= other.seeds
            and set(self.methods) >= set(other.methods)
            and set(self.lrs) >= set(other.lrs)
        )


def _seeds_at(basin: Basin, lr: float) -> frozenset:
    return frozenset(r.seed for r in basin.at(lr) if r.seed is not None)


def comparisons(found: Sequence[Basin]) -> list[Comparison]:
    """Every comparison of one depth's basins (``found``, in method order) with at least two
    methods, none contained in another; by number of seeds, then of methods, descending."""
    if not found:
        return []
    depth = found[0].depth
    seed_sets = {_seeds_at(b, lr) for b in found for lr in b.lrs} - {frozenset()}
    candidates: set[Comparison] = set()
    for seeds in seed_sets:
        ran = {b.method: frozenset(lr for lr in b.lrs if _seeds_at(b, lr) >= seeds) for b in found}
        ran = {m: lrs for m, lrs in ran.items() if lrs}
        for size in range(2, len(ran) + 1):
            for subset in itertools.combinations(ran, size):
                lrs = frozenset.intersection(*(ran[m] for m in subset))
                if not lrs:
                    continue
                methods = tuple(b.method for b in found if ran.get(b.method, frozenset()) >= lrs)
                candidates.add(Comparison(depth, seeds, methods, tuple(sorted(lrs))))
    kept = [c for c in candidates if not any(o != c and o.contains(c) for o in candidates)]
    return sorted(kept, key=lambda c: (-len(c.seeds), -len(c.methods), -len(c.lrs), sorted(c.seeds)))


def edge_counts(basin: Basin, comparison: Comparison) -> dict[float, tuple[int, int]]:
    """Per lr of the comparison: (failed, runs) of ``basin`` on the comparison's seeds."""
    out = {}
    for lr in comparison.lrs:
        runs = [r for r in basin.at(lr) if r.seed in comparison.seeds]
        out[lr] = (sum(r.diverged for r in runs), len(runs))
    return out


def edge_text(basin: Basin, comparison: Comparison) -> str:
    """One method's edge in a comparison as the table writes it: ``0.01 (2/5 failed at 0.02)``,
    ``0.04, the largest tried (0/5 failed at each)``, ``below 0.006 (1/5 failed there)``."""
    counts = edge_counts(basin, comparison)
    n = len(comparison.seeds)
    top = largest_stable_lr(counts)
    if top is None:
        lr = comparison.lrs[0]
        return f"below {lr:g} ({counts[lr][0]}/{n} failed there)"
    above = [lr for lr in comparison.lrs if lr > top]
    if not above:
        return f"{top:g}, the largest tried (0/{n} failed at {'each' if len(counts) > 1 else 'it'})"
    return f"{top:g} ({counts[above[0]][0]}/{n} failed at {above[0]:g})"


def comparison_sensitivity(basin: Basin, comparison: Comparison, weights: str = "ema") -> dict[int, float]:
    """Per seed of the comparison with a capped value at each of its lrs: its LR sensitivity over
    the comparison's lrs (Wortsman et al.; the grid is the comparison's, not the depth's)."""
    from scalelong.studies.sweep.basin import lr_sensitivity  # basin.py imports this module

    values = basin.seed_values(weights)
    return {
        s: lr_sensitivity([values[s][lr] for lr in comparison.lrs])
        for s in sorted(comparison.seeds)
        if all(lr in values.get(s, {}) for lr in comparison.lrs)
    }


def _seed_list(seeds: frozenset) -> str:
    """``0``, ``0-4``, ``0, 2, 5``: consecutive runs joined by a dash."""
    ordered = sorted(seeds)
    runs: list[list[int]] = []
    for s in ordered:
        if runs and s == runs[-1][-1] + 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)


def edges_table(found: Sequence[Basin]) -> str:
    """One depth's comparisons (:func:`comparisons`) as a table: per comparison its seeds, lrs and
    each method's edge (:func:`edge_text`); blank where a method is not in it. Empty without one."""
    found_comparisons = comparisons(found)
    if not found_comparisons:
        return ""
    methods = [b.method for b in found]
    head = ["seeds", "lrs", *methods]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    by_method = {b.method: b for b in found}
    for c in found_comparisons:
        row = [f"{_seed_list(c.seeds)} ({len(c.seeds)})", ", ".join(f"{lr:g}" for lr in c.lrs)]
        row += [edge_text(by_method[m], c) if m in c.methods else "" for m in methods]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def sensitivity_table(found: Sequence[Basin], weights: str = "ema") -> str:
    """Per comparison of two lrs or more: each method's LR sensitivity over the comparison's lrs
    (mean ± 95% t-interval over its seeds, :func:`comparison_sensitivity`) and, after the first
    method's (``none`` where it ran), its paired difference to it. Empty without such a comparison."""
    rows = [c for c in comparisons(found) if len(c.lrs) > 1]
    if not rows:
        return ""
    by_method = {b.method: b for b in found}
    methods = [b.method for b in found]
    head = ["seeds", "lrs", *methods]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for c in rows:
        per = {m: comparison_sensitivity(by_method[m], c, weights) for m in c.methods}
        base = c.methods[0]
        row = [f"{_seed_list(c.seeds)} ({len(c.seeds)})", ", ".join(f"{lr:g}" for lr in c.lrs)]
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
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


SENSITIVITY_NOTE = (
    "**The LR sensitivity on each set of equal seeds.** The same rows, where they span two lrs or "
    "more: per method the LR sensitivity over the row's lrs alone (Wortsman et al.'s formula above "
    "with G the row's lrs; every seed of the row ran them all), mean ± the half-width of a 95% "
    "t-interval over the seeds (their number), then its difference to the first method's (`vs "
    "none`), paired by seed (95% interval). Lower is a flatter basin; values compare within a row "
    "only, as the grid differs between rows."
)


EDGES_NOTE = (
    "**The edge on each set of equal seeds.** Where methods ran unequal seeds, each row is one "
    "comparison the runs support: seeds S (their number in brackets), the lrs at which every method "
    "of the row ran all of S, and per method the largest of those lrs at which no seed of S failed, "
    "nor at any smaller lr of the row, with the failures at the next lr up (`below` where the "
    "smallest failed); blank: the method did not run those seeds at those lrs. Edges compare only "
    "within a row."
)


def edges_json(found: Sequence[Basin]) -> list[dict]:
    """The comparisons of one depth's basins for map.json: seeds, lrs, and per method its edge
    (None: below the smallest lr) and failed k/n per lr."""
    by_method = {b.method: b for b in found}
    out = []
    for c in comparisons(found):
        rows = {}
        for m in c.methods:
            counts = edge_counts(by_method[m], c)
            rows[m] = {
                "largest_stable_lr": largest_stable_lr(counts),
                "failed": [{"lr": lr, "failed": k, "runs": n} for lr, (k, n) in counts.items()],
            }
            if len(c.lrs) > 1:
                per = comparison_sensitivity(by_method[m], c)
                rows[m]["lr_sensitivity"] = {"seed": list(per), "per_seed": list(per.values())}
        out.append({"depth": c.depth, "seeds": sorted(c.seeds), "lrs": list(c.lrs), "methods": rows})
    return out
