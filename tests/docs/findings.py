"""What the findings checks share: each study's map.json read under today's failure rule, the pages
as flat text, and the sentences a basin's answer is written in (edges on equal seeds, five-seed
clauses per lr), built from the data so that the docs can be checked against them.

The checks themselves (``test_findings_*.py``) format the sentence fragment a page must contain
from the data; whitespace and line breaks of the page do not matter."""

from __future__ import annotations

import json
import re
from functools import cache

from conftest import REPO
from scalelong.skips import method_order
from scalelong.studies.divergence import cause
from scalelong.studies.summary import CellSummary
from scalelong.studies.sweep.beside import by_run, overflowed
from scalelong.studies.sweep.mapfile import read_map
from scalelong.studies.sweep.paired import outcomes

ROOT = REPO
RESULTS = ROOT / "docs" / "results"
METHODS = ("none", "cs", "ls", "skip-norm", "merge-norm", "cs-init")


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@cache
def page(name: str) -> str:
    return flat((ROOT / name).read_text())


@cache
def study(name: str):
    """(cells by (depth, lr, method), the map's raw JSON)."""
    cells, _, _ = read_map(RESULTS / name / "map.json")
    return {(c.cell.depth, c.cell.lr, c.cell.method): c for c in cells}, json.loads(
        (RESULTS / name / "map.json").read_text()
    )


def failed(name: str, lr: float, method: str, depth: int = 12) -> str:
    c = study(name)[0][depth, lr, method]
    return f"{c.diverged}/{c.count}"


def x0(name: str, lr: float, method: str, depth: int = 12, seed: int = 0) -> float:
    c = study(name)[0][depth, lr, method]
    return c.values("x0_error")[c.seeds.index(seed)]


def headroom(name: str, lr: float, method: str, depth: int = 12, seed: int = 0) -> float:
    c = study(name)[0][depth, lr, method]
    return c.values("fp16_headroom")[c.seeds.index(seed)]


def edges(depth: int = 12) -> dict[str, float]:
    return {b["method"]: b["largest_stable_lr"] for b in study("lr-basin")[1]["basin"] if b["depth"] == depth}


def assert_quoted(name: str, fragment: str) -> None:
    assert flat(fragment) in page(name), f"{name} does not say, as its data do: {fragment!r}"


CAUSE_WORDS = {
    "x0": "its held-out error (no better than the mean image)",
    "loss": "its loss",
    "nonfinite": "non-finite steps",
}


def listed(items: list[str]) -> str:
    """'a', 'b', 'c' -> 'a, b and c'."""
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def overflow_sites(run) -> list[str]:
    """The modules a run's failure or last skipped step says overflowed in forward (``[]``: none named)."""
    said = (cause(run.breaks[0]) if run.breaks else "") + " " + run.last_skipped
    return sorted(set(re.findall(r"forward at (\S+)", said)))


def paired_verdict(row: dict) -> tuple[int, int, bool]:
    """A map.json ``paired`` row read by the criterion stated before the runs: `none`'s failures, the
    method's, and whether that is a rescue (fewer failures than `none`, McNemar p < 0.05)."""
    none_failed = row["both_failed"] + row["only_none_failed"]
    method_failed = row["both_failed"] + row["only_method_failed"]
    return none_failed, method_failed, row["mcnemar_p"] < 0.05 and method_failed < none_failed


def five_seed_sentence(name: str = "lr-basin-fp16", precision: str = "fp16") -> str:
    """A basin's answer on five seeds (Studies): one clause per lr where `none` and another method ran
    five or more seeds (:func:`lr_clause`), beside the first bf16 basin."""
    cells = study(name)[0]
    lrs = sorted(  # where `none` and another method ran five seeds or more
        lr
        for lr in {k[1] for k in cells}
        if sum(c.count >= 5 for k, c in cells.items() if k[1] == lr) > 1
        and cells.get((12, lr, "none")) is not None
        and cells[12, lr, "none"].count >= 5
    )
    return "; ".join(lr_clause(cells, lr, precision) for lr in lrs)


def lr_clause(cells, lr: float, precision: str = "fp16") -> str:
    """At one lr: each method's failures k/n in ``precision`` with McNemar's p against `none` (paired
    by seed), where fp16's failures overflowed, and how the first bf16 basin did on the same runs (the
    methods it ran on five or more of them); on the seeds every method there ran (a paired test's
    further seeds of two methods are its own finding)."""
    at = {k[2]: c for k, c in cells.items() if k[1] == lr and c.count >= 5}
    shared = set.intersection(*({r.seed for r in c.runs} for c in at.values()))
    at = {m: CellSummary(c.cell, [r for r in c.runs if r.seed in shared], c.metric) for m, c in at.items()}
    methods = sorted(at, key=method_order)
    fp16 = by_run(at.values())
    seeds = sorted({k[3] for k in fp16})

    def failed(m: str) -> set[int]:
        return {k[3] for k, r in fp16.items() if k[2] == m and r.breaks}

    counts = []
    for m in methods:
        text = f"`{m}` {len(failed(m))}/{at[m].count}"
        if m != "none":
            p = format(outcomes(at[m], at["none"]).p, ".2g")
            same = failed(m) == failed("none") and failed(m)  # both failed, on the same seeds
            notes = [f"the same seed{'s' * (len(failed(m)) > 1)}"] if same else []
            if rescued := len(failed("none") - failed(m)):
                of = len(failed("none"))
                notes.append(
                    f"trained on {rescued} of the {of} seeds `none` failed"
                    if of > 1
                    else "trained on the seed `none` failed"
                )
            notes.append(f"McNemar p = {p} against `none`" if len(counts) == 1 else f"p = {p}")
            text += f" ({'; '.join(notes)})"
        counts.append(text)
    overflowing = [
        m
        for m in methods
        if precision == "fp16"
        and failed(m)
        and all(overflowed(fp16[k]) for k in fp16 if k[2] == m and fp16[k].breaks)
    ]
    modules = sorted(
        {site for k in fp16 if k[2] in overflowing and fp16[k].breaks for site in overflow_sites(fp16[k])}
    )
    others = [m for m in methods if failed(m) and m not in overflowing]
    bf16 = by_run(study("lr-basin")[0].values())  # the first bf16 basin
    other = "bf16" if precision == "fp16" else "the first bf16 basin"
    shared = {m: [k for k in fp16 if k[2] == m and k in bf16] for m in methods}
    bf16_counts = [
        f"`{m}` {sum(bool(bf16[k].breaks) for k in ks)}/{len(ks)}" for m, ks in shared.items() if len(ks) >= 5
    ]
    causes = sorted({b.criterion for m in others for k in fp16 if k[2] == m for b in fp16[k].breaks})
    where = " or ".join(f"`{module}`" for module in modules)
    by_cause = ""  # what failed the runs that did not overflow: beside the overflows, or all of them
    if others and overflowing:
        by_cause = f", {', '.join(f'`{m}`' for m in others)}'s by {', '.join(CAUSE_WORDS[c] for c in causes)}"
    elif others:
        by_cause = f"; every failure by {' or '.join(CAUSE_WORDS[c] for c in causes)}"
    return (
        f"at {lr:g} on seeds {seeds[0]}-{seeds[-1]}, {precision} failed {', '.join(counts)}"
        + (
            f"; every failure of {listed([f'`{m}`' for m in overflowing])} was an fp16 overflow in "
            f"forward at {where}"
            if overflowing
            else ""
        )
        + by_cause
        + (f"; {other} failed {' and '.join(bf16_counts)} of the same runs" if bf16_counts else "")
    )


def edges_sentence(name: str = "lr-basin-fp16", seeds: tuple = (0, 1, 2, 3, 4)) -> str:
    """A study's edges on equal seeds, as the README says them: the comparison of its map.json's
    ``edges`` on ``seeds`` with the most methods and lrs, each method's failures at each of its lrs,
    then its largest lr at which no seed failed (``below`` the smallest where that one failed)."""
    rows = [e for e in study(name)[1]["edges"] if e["seeds"] == list(seeds)]
    row = max(rows, key=lambda e: (len(e["methods"]), len(e["lrs"])))
    lrs, n = row["lrs"], len(seeds)
    counts, edges = [], []
    for m, edge in row["methods"].items():
        failed_at = {f["lr"]: f["failed"] for f in edge["failed"]}
        counts.append(f"`{m}` " + " / ".join(str(failed_at[lr]) for lr in lrs))
        top = edge["largest_stable_lr"]
        edges.append(f"`{m}` " + (f"below {lrs[0]:g}" if top is None else f"{top:g}"))
    at = " / ".join(f"{lr:g}" for lr in lrs)
    return (
        f"on seeds {seeds[0]}-{seeds[-1]}, the runs that failed of {n} at {at}: {', '.join(counts)}; the "
        f"largest lr where no seed failed, nor at a smaller one: {', '.join(edges)}"
    )


def repeated(first: str, again: str) -> tuple[int, int]:
    """Of the runs of study ``again`` that repeat one of ``first`` (the same depth, lr, method and
    seed): how many, and how many reproduce its final loss and held-out x0 error to the last digit."""
    old, new = by_run(study(first)[0].values()), by_run(study(again)[0].values())
    shared = [k for k in new if k in old]
    same = sum((old[k].final_loss, old[k].x0_error) == (new[k].final_loss, new[k].x0_error) for k in shared)
    return len(shared), same


def fewer_failures(name: str, by: int = 3) -> list[tuple[str, float, int, int]]:
    """(method, lr, `none`'s failures, the method's) where a method failed on ``by`` or more fewer
    seeds than `none` at the same lr, on the seeds both ran: the criterion, stated before the equal-seed
    runs, for a 20-seed paired test there."""
    cells = study(name)[0]
    found = []
    for (depth, lr, method), c in sorted(cells.items(), key=lambda kv: (kv[0][1], method_order(kv[0][2]))):
        base = cells.get((depth, lr, "none"))
        if method == "none" or base is None:
            continue
        t = outcomes(c, base)
        none_failed, method_failed = t.both + t.only_baseline, t.both + t.only_method
        if none_failed - method_failed >= by:
            found.append((method, lr, none_failed, method_failed))
    return found


def equal_seed_verdict(name: str) -> str:
    """What the criterion stated before the equal-seed runs makes of them (:func:`fewer_failures`)."""
    earned = fewer_failures(name)
    if not earned:
        return (
            "No method failed on 3 or more fewer seeds than `none` at either lr, so by the criterion stated "
            "before the runs no method earns the 20-seed paired test: on equal seeds, neither scaling nor "
            "normalising the long skips widened the bf16 basin beyond seed noise"
        )
    said = listed([f"`{m}` at {lr:g} ({mf}/5 against `none`'s {nf}/5)" for m, lr, nf, mf in earned])
    return (
        f"By the criterion stated before the runs, {said} failed on 3 or more fewer seeds than `none`: "
        "each gets the 20-seed paired test there"
    )


def repeat_clause(first: str, again: str) -> str:
    """How the runs of ``again`` that repeat runs of ``first`` compare (:func:`repeated`)."""
    shared, same = repeated(first, again)
    return (
        f"The {shared} runs that repeat one of the first basin's (the same lr, method and seed; another "
        f"commit, the same numerics) reproduce its final loss and held-out x0 error to the last digit in "
        f"{same} of {shared}"
    )
