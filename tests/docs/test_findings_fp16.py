"""The numbers the README and the Studies page quote from the fp16 lr basin (docs/results/lr-basin-fp16):
its edges on equal seeds, where fp16 overflowed, the values along the network and its 20-seed paired
tests, recomputed from its map.json and runs.json."""

from __future__ import annotations

import json
import statistics

from findings import (
    RESULTS,
    assert_quoted,
    edges_sentence,
    five_seed_sentence,
    listed,
    overflow_sites,
    paired_verdict,
    study,
)

from scalelong.skips import method_order
from scalelong.studies.statistics import contrast, fmt_contrast
from scalelong.studies.sweep.beside import by_run, overflowed

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
        + listed([f"{num(median(m, skips))} (`{m}`, {len(cells[m])} seeds)" for m in methods])
        + ", while from the middle block to the last out-block the decoder stream grew by a median "
        + listed([f"{num(median(m, lambda p: last(p) / p['mid_block']))}x (`{m}`)" for m in grown])
        + ", to "
        + listed([num(median(m, last)) for m in grown])
        + " against fp16's 65,504"
    )
    ratios = []
    for m in methods[1:]:
        mine, base = ({r["seed"]: last(r["peak_absmax"]) for r in cells[k]} for k in (m, methods[0]))
        c = contrast(list(mine.values()), list(base.values()), list(mine), list(base), ratio=True)
        ratios.append(f"{fmt_contrast(c, unit='x')} with `{m}`")
    text += (
        f"; paired by seed, the last out-block's peak over `{methods[0]}`'s was " + listed(ratios)
        if ratios
        else ""
    )
    if shrunk:
        text += (
            "; after a LayerNorm at each merge it shrank ("
            + listed(
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
        f"every overflow of {listed([f'`{m}`' for m in one])} ({len(runs)} runs, {lrs[0]:g} to {lrs[-1]:g}) "
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
            f"`{site}` ({len(ks)}, at {listed([f'{lr:g}' for lr in sorted({k[1] for k in ks})])})"
            for site, ks in sites
        ]
        text += f"; `{m}`'s {sum(len(ks) for ks in named[m].values())} were at " + listed(parts)
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
        clauses.append(f"at {lr:g} {listed(counts)}")
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
        + listed(said)
        + ("; " + listed(headroom) if headroom else "")
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
        f"Every overflow of {listed([f'`{m}`' for m in last])} with a module on record was at "
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
