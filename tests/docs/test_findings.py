"""The numbers the README's "What we found" and the Studies page quote from the lr basin and the long
run, recomputed from the studies' own data (docs/results/*/map.json, judged by today's failure
rule): a quote that drifts from its data, or data that change under a quote, fail here.

Each check formats the sentence fragment the page must contain from the data; whitespace and line
breaks of the page do not matter."""

from __future__ import annotations

import json
import re
import statistics
import sys
from functools import cache

import pytest

from conftest import REPO
from scalelong.skips import method_order
from scalelong.studies.divergence import cause
from scalelong.studies.statistics import contrast, fmt_contrast
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


def lr_text(lr: float) -> str:
    return f"{lr:.0e}".replace("e-0", "e-")


def assert_quoted(name: str, fragment: str) -> None:
    assert flat(fragment) in page(name), f"{name} does not say, as its data do: {fragment!r}"


# ----------------------------------------------------------------------------- the bf16 lr basin


def test_the_edges_on_seed_0():
    found = edges()
    four = [m for m in METHODS if found[m] == 0.04]
    eight = [m for m in METHODS if found[m] == 0.08]
    assert sorted(four + eight) == sorted(METHODS)  # every edge is one of the two the prose names
    names = ", ".join(f"`{m}`" for m in four[:-1]) + f" and `{four[-1]}`"
    assert_quoted("README.md", f"the largest stable lr is 4e-2 for {names} and 8e-2 for `ls` and `skip-norm`")
    assert_quoted("docs/studies.md", f"4e-2 for {names}, 8e-2 for `ls` and `skip-norm`")
    # the shared seeds behind every edge: seed 0 alone
    for b in study("lr-basin")[1]["basin"]:
        assert all(d["seeds"] == [0] for d in b["deciding"]), b["method"]


def test_the_five_seed_counts_and_mcnemar_at_2e_2_and_8e_2():
    n2, c2 = failed("lr-basin", 0.02, "none"), failed("lr-basin", 0.02, "cs")
    assert n2 == c2 == "2/5"
    cells = study("lr-basin")[0]
    t = outcomes(cells[12, 0.02, "cs"], cells[12, 0.02, "none"])
    assert (t.both, t.only_baseline, t.only_method, t.p) == (1, 1, 1, 1.0)
    assert_quoted(
        "README.md", f"at 2e-2 `none` and `cs` each failed {n2} (on different seeds: McNemar p = 1)"
    )
    counts = ", ".join(f"`{m}` {failed('lr-basin', 0.08, m)}" for m in METHODS[:5])
    assert_quoted("README.md", f"at 8e-2 {counts}")
    assert_quoted("docs/studies.md", f"{counts} failed")
    ls, sn = (
        outcomes(cells[12, 0.08, "ls"], cells[12, 0.08, "none"]),
        outcomes(cells[12, 0.08, "skip-norm"], cells[12, 0.08, "none"]),
    )
    assert_quoted(
        "docs/studies.md",
        f"`ls` trained on {ls.only_baseline} seeds where `none` failed (p = {ls.p:.2g}) and `skip-norm` on "
        f"{sn.only_baseline} (p = {sn.p:.2g})",
    )
    assert_quoted(
        "docs/studies.md",
        f"`cs` alone on seed 2 ({x0('lr-basin', 0.02, 'cs', seed=2):.3f}, just above the mean image)",
    )


def test_the_table_of_held_out_errors():
    cells = study("lr-basin")[0]
    for method in METHODS:
        row = []
        for lr in (0.003, 0.01, 0.02, 0.04, 0.08, 0.16):
            c = cells[12, lr, method]
            xs = c.values("x0_error")
            text = f"{sum(xs) / len(xs):.3f}"
            if c.count > 1:
                text += f" ({min(xs):.2f}-{max(xs):.2f})"
            if c.diverged or c.count > 1:
                text += f" [{c.diverged}/{c.count}]"
            row.append(text)
        assert_quoted("docs/studies.md", f"| {method} | " + " | ".join(row) + " |")
    mean_image = cells[12, 0.003, "none"].values("x0_mean_image")[0]
    assert_quoted("docs/studies.md", f"predicting the mean image scores {mean_image:.3f}")


def test_the_lr_sensitivity_of_one_seed():
    lrs = {b["method"]: b["lr_sensitivity_ema"] for b in study("lr-basin")[1]["basin"] if b["depth"] == 12}
    assert all(v["seed"] == [0] for v in lrs.values())
    quoted = ", ".join(f"`{m}` {lrs[m]['estimate']:.2g}" for m in METHODS)
    assert_quoted("docs/studies.md", f"(seed 0, the only one with every lr): {quoted}")


def test_the_control_and_the_fp16_headroom():
    lrs = (0.003, 0.01, 0.02, 0.04)
    control = (
        ", ".join(f"{x0('lr-basin', lr, 'cs-init'):.3f}" for lr in lrs[:3])
        + f" and {x0('lr-basin', 0.04, 'cs-init'):.3f}"
    )
    cs = (
        ", ".join(f"{x0('lr-basin', lr, 'cs'):.3f}" for lr in lrs[:3])
        + f" and {x0('lr-basin', 0.04, 'cs'):.3f}"
    )
    assert_quoted("docs/studies.md", f"`cs-init` ends at {control} from 3e-3 to 4e-2, `cs` at {cs}")
    h = {m: headroom("lr-basin", 0.01, m) for m in METHODS}
    assert_quoted(
        "docs/studies.md",
        f"their fp16 headroom is {h['cs']:.2g} (`cs`) against {h['cs-init']:.1g} (`cs-init`)",
    )
    assert_quoted(
        "docs/studies.md",
        f"At 1e-2 `none` falls to {h['none']:.1g}, below 1, while `cs` keeps {h['cs']:.2g}, "
        f"`cs-init` {h['cs-init']:.1g}, `ls` and `skip-norm` {h['ls']:.2g} and `merge-norm` "
        f"{round(h['merge-norm'], -1):.0f}",
    )
    assert f"{h['skip-norm']:.2g}" == f"{h['ls']:.2g}"
    cells = study("lr-basin")[0]
    below = {m: sum(v < 1 for v in cells[12, 0.02, m].values("fp16_headroom")) for m in ("none", "cs")}
    assert_quoted(
        "docs/studies.md",
        f"At 2e-2 `none` is below 1 in {below['none']} of 5 seeds and `cs` in {below['cs']} of 5",
    )
    assert_quoted(
        "docs/studies.md", f"`merge-norm` keeps {headroom('lr-basin', 0.04, 'merge-norm'):.2g} up to 4e-2"
    )


def test_depth_24():
    both = f"({x0('lr-basin', 0.01, 'none', 24):.3f} and {x0('lr-basin', 0.01, 'cs', 24):.3f})"
    assert failed("lr-basin", 0.01, "none", 24) == failed("lr-basin", 0.01, "cs", 24) == "0/1"
    assert failed("lr-basin", 0.02, "none", 24) == failed("lr-basin", 0.02, "cs", 24) == "1/1"
    assert_quoted("docs/studies.md", f"both train at 1e-2 {both} and both fail at 2e-2")
    h = (headroom("lr-basin", 0.01, "none", 24), headroom("lr-basin", 0.01, "cs", 24))
    assert_quoted("docs/studies.md", f"`none` {h[0]:.2g}, `cs` {h[1]:.2g}")


# ----------------------------------------------------------------------------- the long run


def test_the_long_run():
    cells = study("stability-long-run")[0]
    none, cs = cells[12, 0.01, "none"], cells[12, 0.01, "cs"]
    h = [f"{v:.2g}" for v in none.values("fp16_headroom")]
    merge = cells[12, 0.01, "merge-norm"].values("fp16_headroom")[0]
    quote = (
        f"`none` peaks above fp16's 65,504, headroom {h[0]} and {h[1]}; `cs` "
        f"{cs.values('fp16_headroom')[0]:.2g}x, `merge-norm` {merge:.0f}x"
    )
    assert_quoted("README.md", quote)
    assert [bool(r.breaks) for r in none.runs] == [False, False] and [bool(r.breaks) for r in cs.runs] == [
        False,
        True,
    ]
    err = (
        f"(final held-out x0 error {cs.values('x0_error')[1]:.3f} against "
        + " and ".join(f"{v:.3f}" for v in none.values("x0_error"))
        + ")"
    )
    assert_quoted("README.md", err)
    recorded = json.loads((RESULTS / "stability-long-run" / "map.json").read_text())
    growth = next(d for d in recorded["cells"][1]["diverged"][1] if d["criterion"] == "feature_norm")
    assert growth["step"] == 300 and "100x their first logged value by step 300" in page("README.md")


def test_a_changed_number_fails(monkeypatch):
    """The check can fail: the README with one count changed no longer says what the data do."""
    changed = page("README.md").replace("`ls` 3/5", "`ls` 2/5")
    assert changed != page("README.md")
    monkeypatch.setattr(
        sys.modules[__name__],
        "page",
        lambda name: changed if name == "README.md" else flat((ROOT / name).read_text()),
    )
    with pytest.raises(AssertionError, match="does not say"):
        test_the_five_seed_counts_and_mcnemar_at_2e_2_and_8e_2()


# ----------------------------------------------------------------------------- the paired test


def paired_sentence() -> str:
    """The README's and Studies' sentence on the paired test, from its map.json."""
    data = json.loads((RESULTS / "lr-basin-paired" / "map.json").read_text())
    (row,) = [r for r in data["paired"] if r["method"] == "cs"]
    n = row["shared_seeds"]
    cells = {c["method"]: c for c in data["cells"]}
    failed = {m: sum(bool(f) for f in cells[m]["failed"]) for m in ("none", "cs")}
    h, d = row["fp16_headroom_ratio"], row["x0_error_minus_none"]
    verdict = (
        "a rescue by the criterion stated before the runs"
        if row["mcnemar_p"] < 0.05 and failed["cs"] < failed["none"] and n >= 5
        else "no rescue by the criterion stated before the runs"
    )
    # an interval that spans 1 (a ratio) or 0 (a difference) is no evidence of a gap: the sentence says so
    headroom = "no evidence of a gap" if h["low"] <= 1 <= h["high"] else "a gap"
    x0 = "no evidence of a gap" if d["low"] <= 0 <= d["high"] else "a gap"
    return (
        f"`none` failed on {failed['none']}/{n} seeds and `cs` on {failed['cs']}/{n}: both on "
        f"{row['both_failed']}, only `none` on {row['only_none_failed']}, only `cs` on "
        f"{row['only_method_failed']} (McNemar p = {row['mcnemar_p']:.2g}), {verdict}. Among the "
        f"{row['both_trained']} seeds where both trained, `cs`'s least fp16 headroom is {h['estimate']:.2g}x "
        f"`none`'s ({h['low']:.2g} to {h['high']:.2g}: {headroom}) and its held-out x0 error differs by "
        f"{d['estimate']:+.4f} ({d['low']:+.3f} to {d['high']:+.3f}: {x0})"
    )


def test_the_paired_test_as_quoted():
    data = json.loads((RESULTS / "lr-basin-paired" / "map.json").read_text())
    runs = json.loads((RESULTS / "lr-basin-paired" / "runs.json").read_text())
    precisions = {r["provenance"]["precision"] for c in runs["cells"] for r in c["runs"]}
    assert precisions == {"fp32"} and all(c["seed"] == data["cells"][0]["seed"] for c in data["cells"])
    sentence = paired_sentence()
    assert_quoted("README.md", sentence)
    assert_quoted("docs/studies.md", sentence)
    n = data["paired"][0]["shared_seeds"]
    assert_quoted("README.md", f"at 2e-2 on {n} paired seeds")
    assert_quoted("docs/studies.md", f"({n} of the 20 seeds")
    cells = {c["method"]: c for c in data["cells"]}
    failed = {m: sum(bool(f) for f in cells[m]["failed"]) for m in ("none", "cs")}
    p = data["paired"][0]["mcnemar_p"]
    assert_quoted(
        "docs/results.md",
        f"`none` failed {failed['none']}/{n}, `cs` {failed['cs']}/{n} (McNemar p = {p:.2g})",
    )


# ----------------------------------------------------------------------------- the fp16 lr basin


def fp16_sentence() -> str:
    """The Studies sentence on the fp16 basin so far, from its map.json and the bf16 basin's: how many
    runs, how many of them the bf16 basin made too and how each precision did on those, and bf16's
    least fp16 headroom below 1 as a prediction of an fp16 overflow in forward (the report's rule,
    :func:`scalelong.studies.sweep.beside.overflowed`)."""
    fp16 = by_run(study("lr-basin-fp16")[0].values())
    bf16 = by_run(study("lr-basin")[0].values())
    shared = sorted(k for k in fp16 if k in bf16)
    predicted = {k for k in shared if bf16[k].fp16_headroom < 1}
    over = {k for k in shared if overflowed(fp16[k])}
    return (
        f"{len(fp16)} runs, {len(shared)} of them also in the bf16 basin (the same lr, method and "
        f"seed); on those fp16 failed {sum(bool(fp16[k].breaks) for k in shared)} and bf16 "
        f"{sum(bool(bf16[k].breaks) for k in shared)}; bf16's least fp16 headroom was below 1 in "
        f"{len(predicted)} of them and {len(over)} overflowed in forward in fp16 "
        f"({len(predicted & over)} of the predicted)"
    )


def test_the_fp16_basin_as_quoted():
    runs = json.loads((RESULTS / "lr-basin-fp16" / "runs.json").read_text())
    precisions = {r["provenance"]["precision"] for c in runs["cells"] for r in c["runs"]}
    assert precisions == {"fp16"}
    assert_quoted("docs/studies.md", fp16_sentence())
    assert_quoted("docs/studies.md", five_seed_sentence())


def fp16_magnitude_sentence(lr: float = 0.006, name: str = "lr-basin-fp16") -> str:
    """Where the values fp16 overflows on sit, at one lr of a study, from its runs.json's peaks (the
    methods that ran five or more seeds there): the skips' inputs against the decoder stream."""
    runs = json.loads((RESULTS / name / "runs.json").read_text())
    cells = {c["method"]: c["runs"] for c in runs["cells"] if c["lr"] == lr and len(c["runs"]) >= 5}
    methods = sorted(cells, key=method_order)

    def median(method: str, pick) -> float:
        return statistics.median(pick(r["peak_absmax"]) for r in cells[method])

    def skips(p):
        return max(v for k, v in p.items() if k.startswith("in_blocks."))

    def last(p):
        return p[max((k for k in p if k.startswith("out_blocks.")), key=lambda k: int(k.split(".")[1]))]

    def num(x: float) -> str:  # two significant digits, thousands separated: 19,000
        return f"{float(f'{x:.2g}'):,.0f}" if x >= 10 else f"{x:.2g}"

    grown = [m for m in methods if median(m, lambda p: last(p) / p["mid_block"]) > 1]
    shrunk = [m for m in methods if m not in grown]
    text = (
        f"at {lr:g} the skips' inputs peaked at a median of "
        + _and([f"{num(median(m, skips))} (`{m}`, {len(cells[m])} seeds)" for m in methods])
        + ", while from the middle block to the last out-block the decoder stream grew by a median "
        + _and([f"{num(median(m, lambda p: last(p) / p['mid_block']))}x (`{m}`)" for m in grown])
        + ", to "
        + _and([num(median(m, last)) for m in grown])
        + " against fp16's 65,504"
    )
    ratios = []
    for m in methods[1:]:
        mine, base = ({r["seed"]: last(r["peak_absmax"]) for r in cells[k]} for k in (m, methods[0]))
        c = contrast(list(mine.values()), list(base.values()), list(mine), list(base), ratio=True)
        ratios.append(f"{fmt_contrast(c, unit='x')} with `{m}`")
    text += (
        f"; paired by seed, the last out-block's peak over `{methods[0]}`'s was " + _and(ratios)
        if ratios
        else ""
    )
    if shrunk:
        text += (
            "; after a LayerNorm at each merge it shrank ("
            + _and(
                [
                    f"`{m}` {num(median(m, lambda p: last(p) / p['mid_block']))}x, to {num(median(m, last))}"
                    for m in shrunk
                ]
            )
            + ")"
        )
    return text


def test_scaled_skips_overflowed_as_often_as_none_where_the_values_are_quoted():
    """Studies: at 6e-3 the runs of `cs` and `ls` "overflowed as often as `none`'s", on the seeds each
    shares with `none`."""
    cells = study("lr-basin-fp16")[0]
    runs = {m: {r.seed: r for r in cells[12, 0.006, m].runs} for m in ("none", "cs", "ls")}
    for m in ("cs", "ls"):
        shared = runs[m].keys() & runs["none"].keys()
        assert len(shared) >= 5
        assert sum(overflowed(runs[m][s]) for s in shared) == sum(overflowed(runs["none"][s]) for s in shared)
    assert_quoted("docs/studies.md", "and those runs overflowed as often as `none`'s")


def test_where_the_fp16_values_sit_as_quoted():
    assert_quoted("docs/studies.md", fp16_magnitude_sentence())
    assert_quoted("docs/studies.md", fp16_magnitude_sentence(0.02, "lr-basin-paired"))


CAUSE_WORDS = {
    "x0": "its held-out error (no better than the mean image)",
    "loss": "its loss",
    "nonfinite": "non-finite steps",
}


def _and(items: list[str]) -> str:
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
    return (
        f"at {lr:g} on seeds {seeds[0]}-{seeds[-1]}, {precision} failed {', '.join(counts)}"
        + (
            f"; every failure of {_and([f'`{m}`' for m in overflowing])} was an fp16 overflow in forward at "
            f"{where}"
            if overflowing
            else ""
        )
        + (
            f", {', '.join(f'`{m}`' for m in others)}'s by {', '.join(CAUSE_WORDS[c] for c in causes)}"
            if others
            else ""
        )
        + (f"; {other} failed {' and '.join(bf16_counts)} of the same runs" if bf16_counts else "")
    )


def fp16_paired_sentence(method: str, lr: float) -> str:
    """Studies' sentence on an fp16 paired test against `none` (20 seeds planned, the criterion stated
    before the runs), as far as its seeds have run: the paired 2x2 counts and McNemar's p."""
    (row,) = [r for r in study("lr-basin-fp16")[1]["paired"] if r["method"] == method and r["lr"] == lr]
    n, both, only_none, only_m = (
        row[k] for k in ("shared_seeds", "both_failed", "only_none_failed", "only_method_failed")
    )
    failed_none, failed_m, rescued = paired_verdict(row)
    if n < 20:
        status = "the test is read at 20 seeds"
    elif rescued:
        status = "a rescue by the criterion stated before the runs"
    else:
        status = "no rescue by the criterion stated before the runs"
    text = (
        f"`none` against `{method}` at {lr:g}, {n} of the 20 paired seeds finished: `none` failed "
        f"{failed_none}/{n} and `{method}` {failed_m}/{n}, both on {both}, only `none` on {only_none}, only "
        f"`{method}` on {only_m} (McNemar p = {row['mcnemar_p']:.2g}); {status}"
    )
    if n < 20:
        return text
    h, d = row["fp16_headroom_ratio"], row["x0_error_minus_none"]  # the secondary outcomes, stated too
    if h["low"] is None or d["low"] is None:  # one seed where both trained: a value, no interval
        return text + (
            f". On the {row['both_trained']} seed where both trained, `{method}`'s least fp16 headroom is "
            f"{h['estimate']:.2g}x `none`'s and its held-out x0 error differs by {d['estimate']:+.4f} (one "
            "seed: no interval)"
        )
    headroom = "no evidence of a gap" if h["low"] <= 1 <= h["high"] else "a gap"
    x0 = "no evidence of a gap" if d["low"] <= 0 <= d["high"] else "a gap"
    return text + (
        f". Among the {row['both_trained']} seeds where both trained, `{method}`'s least fp16 headroom "
        f"is {h['estimate']:.2g}x `none`'s ({h['low']:.2g} to {h['high']:.2g}: {headroom}) and its held-out "
        f"x0 error differs by {d['estimate']:+.4f} ({d['low']:+.3f} to {d['high']:+.3f}: {x0})"
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


def fp16_overflow_at() -> dict[str, dict[str, list]]:
    """Per method, per module named (``""`` where none is on record): the runs (keys) of the fp16 basin
    that overflowed in forward by the report's rule, from their failure's cause or last skipped step."""
    at: dict[str, dict[str, list]] = {}
    for k, r in by_run(study("lr-basin-fp16")[0].values()).items():
        if not overflowed(r):
            continue
        for site in overflow_sites(r) or [""]:
            at.setdefault(k[2], {}).setdefault(site, []).append(k)
    return at


def fp16_overflow_sites() -> str:
    """Where the fp16 basin's runs overflowed: the methods whose every overflow on record was at one
    module, with their runs and lrs, then each other method's modules with counts and lrs."""
    at = fp16_overflow_at()
    named = {m: {s: ks for s, ks in sites.items() if s} for m, sites in at.items()}
    main = max(
        {s for sites in named.values() for s in sites},
        key=lambda s: sum(len(v.get(s, [])) for v in named.values()),
    )
    one = sorted((m for m, sites in named.items() if set(sites) == {main}), key=method_order)
    runs = [k for m in one for k in named[m][main]]
    lrs = sorted({k[1] for k in runs})
    text = (
        f"every overflow of {_and([f'`{m}`' for m in one])} ({len(runs)} runs, {lrs[0]:g} to {lrs[-1]:g}) "
        f"was in forward at `{main}`"
    )
    unnamed = [k for m in one for k in at[m].get("", [])]
    if unnamed:
        which = ", ".join(sorted({f"`{k[2]}` at {k[1]:g}" for k in unnamed}))
        has = "has" if len(unnamed) == 1 else "have"
        text += f", and {len(unnamed)} more ({which}) {has} no module on record"
    for m in sorted(set(named) - set(one), key=method_order):
        sites = sorted(named[m].items(), key=lambda kv: (kv[0] != main, -len(kv[1]), kv[0]))
        parts = [
            f"`{site}` ({len(ks)}, at {_and([f'{lr:g}' for lr in sorted({k[1] for k in ks})])})"
            for site, ks in sites
        ]
        text += f"; `{m}`'s {sum(len(ks) for ks in named[m].values())} were at " + _and(parts)
    return text


def fp16_paired_rows(finished: bool = True) -> dict[float, list[dict]]:
    """The fp16 paired tests against `none` by lr (``paired`` rows of map.json that ran 20 seeds, or
    with ``finished=False`` those planned at 20 that have not)."""
    tests = {("cs", 0.006), ("merge-norm", 0.02), ("cs", 0.02)}  # stated before their runs in Studies
    out: dict[float, list[dict]] = {}
    for r in study("lr-basin-fp16")[1]["paired"]:
        if (r["method"], r["lr"]) in tests and (r["shared_seeds"] >= 20) == finished:
            out.setdefault(r["lr"], []).append(r)
    return dict(sorted(out.items(), reverse=True))


def fp16_paired_answer() -> str:
    """The README's fp16 answer from the 20-seed paired tests: per lr the failures of `none` and of
    each method with McNemar's p, then each method's verdict by the criterion stated before the runs
    (fewer failures than `none` and p < 0.05), then `cs`'s headroom where both trained."""
    clauses, verdicts, headroom = [], {}, []
    for lr, rows in fp16_paired_rows().items():
        counts = [f"`none` failed {paired_verdict(rows[0])[0]}/20"]
        for i, r in enumerate(rows):
            _, failed_m, rescued = paired_verdict(r)
            p = format(r["mcnemar_p"], ".2g")
            counts.append(f"`{r['method']}` {failed_m}/20 ({'McNemar ' * (i == 0)}p = {p})")
            verdicts.setdefault((r["method"], rescued), []).append(f"{lr:g}")
            h = r["fp16_headroom_ratio"]
            if h["low"] is not None and r["both_trained"] >= 5:
                headroom.append(
                    f"on the {r['both_trained']} seeds where both trained at {lr:g}, `{r['method']}` kept "
                    f"{h['estimate']:.2g}x ({h['low']:.2g} to {h['high']:.2g}) `none`'s least fp16 headroom"
                )
        clauses.append(f"at {lr:g} {_and(counts)}")
    said = [
        f"`{m}` "
        + ("did " if i and rescued else "")
        + ("did not " if not rescued else "")
        + ("keep fp16 training alive where `none` failed " if i == 0 else "")
        + f"(at {' and '.join(lrs) if rescued else ' or '.join(lrs)})"
        for i, ((m, rescued), lrs) in enumerate(sorted(verdicts.items(), key=lambda v: method_order(v[0][0])))
    ]
    return (
        "on 20 paired seeds "
        + "; ".join(clauses)
        + ". By the criterion stated before the runs (fewer failures than `none`, McNemar p < 0.05), "
        + _and(said)
        + ("; " + _and(headroom) if headroom else "")
    )


def test_the_fp16_paired_tests_as_quoted():
    assert_quoted("docs/studies.md", fp16_paired_sentence("cs", 0.006))
    assert_quoted("docs/studies.md", fp16_paired_sentence("merge-norm", 0.02))
    assert_quoted("docs/studies.md", fp16_paired_sentence("cs", 0.02))


FP16_SITES = (
    "`out_blocks.5.skip_linear` merges skip 1, the outermost, which `cs` leaves at kappa^0 = 1, and "
    "what overflows there is the decoder stream, about a hundred times larger than the skips' inputs; "
    "with a LayerNorm after each merge, from 0.04 up the merges' own outputs overflow, before their norm"
)
FP16_VERDICT = (
    "So scaling the long skips keeps about twice the headroom but did not keep fp16 training alive where "
    "plain skips overflowed; a LayerNorm after each merge, which bounds the decoder stream, did."
)


def test_the_fp16_basin_in_the_readme():
    """The README's fp16 answer: the edges on seeds 0-4, where the overflows sit, the finished paired
    tests, and a verdict in words that the tests' own verdicts and the headroom carry."""
    assert_quoted("README.md", edges_sentence())
    assert_quoted("README.md", "Where fp16 overflowed: " + fp16_overflow_sites() + ". " + FP16_SITES)
    at = (
        fp16_overflow_at()
    )  # as FP16_SITES and Studies say: merge-norm's overflows elsewhere are at 0.04 and up
    last = sorted((m for m in at if set(at[m]) - {""} == {"out_blocks.5.skip_linear"}), key=method_order)
    assert_quoted(
        "docs/studies.md",
        f"Every overflow of {_and([f'`{m}`' for m in last])} with a module on record was at "
        "`out_blocks.5.skip_linear`, the last merge",
    )
    assert all(
        k[1] >= 0.04
        for site, ks in at["merge-norm"].items()
        if site != "out_blocks.5.skip_linear"
        for k in ks
    )
    answer = fp16_paired_answer()
    assert_quoted("README.md", answer[0].upper() + answer[1:] + ". " + FP16_VERDICT)
    for lr, rows in fp16_paired_rows().items():
        for row in rows:
            failed_none, failed_m, rescued = paired_verdict(row)
            assert rescued == (row["method"] == "merge-norm"), (row["method"], lr)  # as FP16_VERDICT says
            if row["method"] == "cs" and row["both_trained"] >= 5:  # "about twice the headroom"
                assert 1.5 <= row["fp16_headroom_ratio"]["estimate"] <= 2.5
            p = format(row["mcnemar_p"], ".2g")
            assert_quoted(
                "docs/results.md",
                f"`none` failed {failed_none}/20, `{row['method']}` {failed_m}/20 (McNemar p = {p})",
            )


def mean_reference_step(measured) -> float:
    """The unit of a cost: the mean of the reference step measured before and after the command."""
    values = list(measured.values()) if isinstance(measured, dict) else list(measured)
    return sum(values) / len(values)


def demo_seed_rows() -> list[str]:
    """The demo recipe's table of `scalelong train demo` seeds, from the runs' record: FD-MNIST at
    each evaluation and re-scored on 1,000 samples, the confident share, the wall time and its cost
    in reference steps (the mean of the reference step measured before and after)."""
    record = json.loads((RESULTS / "demo-unet" / "train-demo-seeds.json").read_text())
    ref = mean_reference_step(record["reference_step_s"])
    rows = []
    for seed, r in record["runs"].items():
        evals = " / ".join(f"{e['fd']:.1f}" for e in r["evaluations"])
        rows.append(
            f"| {seed} | {evals} | **{r['fd_mnist_1000']:.1f}** | {r['confident']:.2f} | "
            f"{r['wall_s']:,.0f} s | {r['wall_s'] / ref:,.0f} |"
        )
    mean = sum(r["fd_mnist_1000"] for r in record["runs"].values()) / len(record["runs"])
    return [*rows, f"Mean {mean:.1f} over the three seeds"]


def test_the_demo_seeds_as_quoted():
    for fragment in demo_seed_rows():
        assert_quoted("docs/demo-recipe.md", fragment)


SAMPLER_NAMES = {
    "dpm_solver": "DPM-Solver 2M (`dpm_solver`)",
    "dpm_solver_pp": "DPM-Solver++ 2M (`dpm_solver_pp`)",
}


def sampler_table() -> str:
    """The demo recipe's table of FD-MNIST (1,000 samples) of the three seeds' final weights by
    sampler and solver steps, from its record, cheapest first."""
    record = json.loads((RESULTS / "demo-unet" / "sampler-steps.json").read_text())
    seeds = record["seeds"]
    names = list(next(iter(seeds.values())))
    rows = [
        f"| sampler | solver steps | {' | '.join(f'seed {s}' for s in seeds)} | mean |",
        "|---|---|" + "---|" * len(seeds) + "---|",
    ]
    for name in sorted(names, key=lambda n: (int(n.split()[1]), n)):
        sampler, steps = name.split()
        fds = [seeds[s][name]["fd"] for s in seeds]
        cells = " | ".join(f"{fd:.1f}" for fd in fds)
        rows.append(f"| {SAMPLER_NAMES[sampler]} | {steps} | {cells} | **{sum(fds) / len(fds):.1f}** |")
    return "\n".join(rows)


def test_the_sampler_table_as_measured():
    assert_quoted("docs/demo-recipe.md", sampler_table())


def make_demo_rows() -> list[str]:
    """The demo recipe's `make demo` table and cost, from the record of the measured run."""
    record = json.loads((RESULTS / "demo-make-demo-unet" / "make-demo.json").read_text())
    ref = mean_reference_step(record["reference_step_s"])
    rows = [f"**{record['wall_s']:,.0f} s**, {record['wall_s'] / ref:,.0f} reference steps"]
    for method, r in record["runs"].items():
        first, last = r["evaluations"]
        rows.append(f"| {method} | {first['fd']:.1f} | **{last['fd']:.1f}** | {last['confident']:.2f} |")
    return rows


def test_make_demo_as_quoted():
    for fragment in make_demo_rows():
        assert_quoted("docs/demo-recipe.md", fragment)


def test_the_readme_quotes_the_demo_as_measured():
    record = json.loads((RESULTS / "demo-make-demo-unet" / "make-demo.json").read_text())
    final = {m: r["evaluations"][-1]["fd"] for m, r in record["runs"].items()}
    assert_quoted("README.md", ", ".join(f"{fd:.0f} (`{m}`)" for m, fd in final.items()))
    ref = mean_reference_step(record["reference_step_s"])
    assert_quoted(
        "README.md",
        f"{record['wall_s']:,.0f} s after the setup ({record['wall_s'] / ref:,.0f} reference steps",
    )
    scores = [f"{fd:.1f}" for fd in preset_scores()]
    assert_quoted("README.md", f"{', '.join(scores[:-1])} and {scores[-1]} on seeds 0-{len(scores) - 1}")


def preset_scores() -> list[float]:
    """FD-MNIST (1,000 samples) of the three seeds' final weights with the demo preset's own sampler."""
    import yaml

    preset = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())["eval"]
    seeds = json.loads((RESULTS / "demo-unet" / "sampler-steps.json").read_text())["seeds"]
    return [rows[f"{preset['sampler']} {preset['steps']}"]["fd"] for rows in seeds.values()]


def preset_budget_sentence() -> str:
    """The train demo's cost beside the U-ViT demo's, measured back to back in both orders, from its
    record: the wall times, their costs in reference steps (each over the mean of the steps around
    it), the ratios, and the UNet's seconds of evaluation in the first pair."""
    record = json.loads((RESULTS / "demo-unet" / "train-demo-preset.json").read_text())

    def costs(pair: dict) -> dict[str, tuple[float, float]]:  # command -> (wall s, reference steps)
        ref = pair["reference_step_s"]
        return {
            r["command"].split()[2]: (r["wall_s"], r["wall_s"] / mean_reference_step(ref[i : i + 2]))
            for i, r in enumerate(pair["runs"])
        }

    first, other = costs(record), costs(record["reversed"])
    unet = record["runs"][0]
    evaluation = sum(e["fd_seconds"] for e in unet["evaluations"]) + unet["rescore"]["fd_seconds"]

    def pair_text(c: dict) -> str:
        (w1, c1), (w2, c2) = c["demo"], c["demo_uvit"]
        return f"{w1:.0f} and {w2:.0f} s: {c1:,.0f} and {c2:,.0f} reference steps, {c1 / c2:.2f}x"

    return (
        f"({evaluation:.0f} s of evaluation in all), the UNet demo and the U-ViT demo, run back to back, "
        f"took {pair_text(first)}; in the other order, the U-ViT demo first, {pair_text(other)}"
    )


def test_the_train_demo_budget_as_measured():
    assert_quoted("docs/benchmarks.md", preset_budget_sentence())
    unet = json.loads((RESULTS / "demo-unet" / "train-demo-preset.json").read_text())["runs"][0]
    fd = unet["rescore"]["fd"]
    assert_quoted("docs/demo-recipe.md", f"it ended at FD-MNIST **{fd:.1f}** on 1,000 samples")


def test_the_preset_says_what_its_sampler_scores():
    seeds = json.loads((RESULTS / "demo-unet" / "sampler-steps.json").read_text())["seeds"]

    def mean(name: str) -> float:
        return sum(rows[name]["fd"] for rows in seeds.values()) / len(seeds)

    assert sum(preset_scores()) / len(seeds) == mean("dpm_solver_pp 25")
    assert_quoted(
        "configs/demo.yaml",
        f"FD-MNIST (1,000) {mean('dpm_solver_pp 25'):.1f} on average, # against {mean('dpm_solver 50'):.1f} "
        f"with 50 DPM-Solver steps at twice the cost, {mean('dpm_solver_pp 15'):.1f} with 15",
    )


def test_the_reference_steps_spread_as_measured():
    record = json.loads((RESULTS / "demo-unet" / "reference-step-spread.json").read_text())

    def span(values) -> str:
        return f"{min(values):.0f} to {max(values):.0f} ms"

    one_process = [v for repeat in record["one_process_2_threads_ms"] for v in repeat[:6]]
    assert_quoted(
        "docs/benchmarks.md",
        f"six fresh measurements back to back read {span(record['fresh_processes_2_threads_ms'])}, and one "
        f"process measuring six times in a row {span(record['one_process_2_threads_ms'][0])}; with "
        f"`--threads 1` six fresh measurements read {span(record['fresh_processes_1_thread_ms'])}",
    )
    assert max(one_process) / min(one_process) > max(record["fresh_processes_1_thread_ms"]) / min(
        record["fresh_processes_1_thread_ms"]
    )


def budget_table() -> str:
    """docs/benchmarks.md's table of the demo's costs in reference steps, from their record."""
    record = json.loads((RESULTS / "demo-unet" / "budgets.json").read_text())
    rows = [
        "| command | wall time | reference step, before / after | cost in reference steps |",
        "|---|---|---|---|",
    ]
    for m in record["measurements"]:
        before, after = m["reference_step_s"]
        rows.append(
            f"| {m['what']} | {m['wall_s']:,.0f} s | {before * 1e3:.0f} / {after * 1e3:.0f} ms | "
            f"{m['wall_s'] / mean_reference_step(m['reference_step_s']):,.0f} |"
        )
    return "\n".join(rows)


def test_the_budgets_as_measured():
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    block = text.split("<!-- budgets:start -->\n", 1)[1].split("\n<!-- budgets:end -->", 1)[0]
    assert block == budget_table()
