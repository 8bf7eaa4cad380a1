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

(:func:`largest_stable_lr`), ``below min(L)`` where the smallest failed. A comparison that a
larger one contains (more seeds, methods and lrs, none fewer) adds nothing and is left out. The LR
sensitivity over a comparison's lrs is the basin's
(:func:`~scalelong.studies.sweep.basin.comparison_sensitivity`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from scalelong.studies.markdown import markdown_table


class MethodRuns(Protocol):
    """What the edges read of one method's runs at one depth: a
    :class:`~scalelong.studies.sweep.basin.Basin` (basin.py imports this module)."""

    depth: int | None
    method: str

    @property
    def lrs(self) -> list[float]: ...

    def at(self, lr: float) -> list: ...


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

    def cells(self) -> list[str]:
        """The row's first two cells in every table of comparisons: its seeds (their number), its lrs."""
        return [f"{seed_list(self.seeds)} ({len(self.seeds)})", ", ".join(f"{lr:g}" for lr in self.lrs)]

    def contains(self, other: Comparison) -> bool:
        """Whether this comparison holds every seed, method and lr of ``other``."""
        return (
            self.depth == other.depth
            and self.seeds >= other.seeds
            and set(self.methods) >= set(other.methods)
            and set(self.lrs) >= set(other.lrs)
        )


def _seeds_at(basin: MethodRuns, lr: float) -> frozenset:
    return frozenset(r.seed for r in basin.at(lr) if r.seed is not None)


def comparisons(found: Sequence[MethodRuns]) -> list[Comparison]:
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


def edge_counts(basin: MethodRuns, comparison: Comparison) -> dict[float, tuple[int, int]]:
    """Per lr of the comparison: (failed, runs) of ``basin`` on the comparison's seeds."""
    out = {}
    for lr in comparison.lrs:
        runs = [r for r in basin.at(lr) if r.seed in comparison.seeds]
        out[lr] = (sum(r.diverged for r in runs), len(runs))
    return out


def edge_text(basin: MethodRuns, comparison: Comparison) -> str:
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


def seed_list(seeds: frozenset) -> str:
    """``0``, ``0-4``, ``0, 2, 5``: consecutive runs joined by a dash."""
    ordered = sorted(seeds)
    runs: list[list[int]] = []
    for s in ordered:
        if runs and s == runs[-1][-1] + 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)


def edges_table(found: Sequence[MethodRuns]) -> str:
    """One depth's comparisons (:func:`comparisons`) as a table: per comparison its seeds, lrs and
    each method's edge (:func:`edge_text`); blank where a method is not in it. Empty without one."""
    found_comparisons = comparisons(found)
    if not found_comparisons:
        return ""
    methods = [b.method for b in found]
    head = ["seeds", "lrs", *methods]
    by_method = {b.method: b for b in found}
    rows = [
        c.cells() + [edge_text(by_method[m], c) if m in c.methods else "" for m in methods]
        for c in found_comparisons
    ]
    return markdown_table(head, rows)


EDGES_NOTE = (
    "**The edge on each set of equal seeds.** Where methods ran unequal seeds, each row is one "
    "comparison the runs support: seeds S (their number in brackets), the lrs at which every method "
    "of the row ran all of S, and per method the largest of those lrs at which no seed of S failed, "
    "nor at any smaller lr of the row, with the failures at the next lr up (`below` where the "
    "smallest failed); blank: the method did not run those seeds at those lrs. Edges compare only "
    "within a row."
)


def edges_json(
    found: Sequence[MethodRuns],
    sensitivity: Callable[[MethodRuns, Comparison], Mapping[int, float]] | None = None,
) -> list[dict]:
    """The comparisons of one depth's methods for map.json: seeds, lrs, and per method its edge
    (None: below the smallest lr), failed k/n per lr and, with ``sensitivity`` (the basin's
    :func:`~scalelong.studies.sweep.basin.comparison_sensitivity`), its LR sensitivity per seed over
    the comparison's lrs."""
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
            if sensitivity is not None and len(c.lrs) > 1:
                per = sensitivity(by_method[m], c)
                rows[m]["lr_sensitivity"] = {"seed": list(per), "per_seed": list(per.values())}
        out.append({"depth": c.depth, "seeds": sorted(c.seeds), "lrs": list(c.lrs), "methods": rows})
    return out
