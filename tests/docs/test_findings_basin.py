"""The numbers the README's "What we found" and the Studies page quote from the first bf16 lr basin,
its paired test and the long run, recomputed from the studies' own data (docs/results/*/map.json,
judged by today's failure rule): a quote that drifts from its data, or data that change under a
quote, fail here."""

from __future__ import annotations

import json

import findings
import pytest
from findings import METHODS, RESULTS, ROOT, assert_quoted, edges, failed, flat, headroom, page, study, x0

from scalelong.studies.sweep.paired import outcomes

# ----------------------------------------------------------------------------- the bf16 lr basin


def test_the_edges_on_seed_0():
    found = edges()
    four = [m for m in METHODS if found[m] == 0.04]
    eight = [m for m in METHODS if found[m] == 0.08]
    assert sorted(four + eight) == sorted(METHODS)  # every edge is one of the two the prose names
    names = ", ".join(f"`{m}`" for m in four[:-1]) + f" and `{four[-1]}`"
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
    counts = ", ".join(f"`{m}` {failed('lr-basin', 0.08, m)}" for m in METHODS[:5])
    assert_quoted("README.md", f"at 8e-2 (five seeds) {counts}")
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


# ----------------------------------------------------------------------------- every method on equal seeds

EQUAL = "lr-basin-bf16"


def test_the_equal_seed_runs_share_one_commit_and_numerics():
    runs = json.loads((RESULTS / EQUAL / "runs.json").read_text())
    made = {
        tuple(r["provenance"][k] for k in ("commit", "torch", "precision", "autocast", "device_name"))
        for c in runs["cells"]
        for r in c["runs"]
    }
    assert len(made) == 1 and next(iter(made))[2:4] == ("bf16", "torch")  # torch's CPU bf16 autocast
    cells = study(EQUAL)[0]
    assert {k[1] for k in cells} == {0.02, 0.04} and {k[2] for k in cells} == set(METHODS)
    n = sum(c.count for c in cells.values())
    assert_quoted("docs/studies.md", f"({n} of the 60 runs, every run in torch's CPU bf16 autocast")
    assert_quoted("docs/results/lr-basin-bf16/report.md", f"**{n} of 60 finished**")


def test_the_equal_seed_edges_and_verdict_as_quoted():
    edges = findings.edges_sentence(EQUAL)
    verdict = findings.equal_seed_verdict(EQUAL)
    for name in ("README.md", "docs/studies.md"):
        assert_quoted(name, edges)
        assert_quoted(name, verdict)
    assert_quoted("docs/results.md", edges)
    assert_quoted("docs/studies.md", findings.five_seed_sentence(EQUAL, "bf16"))
    assert_quoted("docs/studies.md", findings.repeat_clause("lr-basin", EQUAL))
    at = [study(EQUAL)[0][12, 0.02, m].diverged for m in METHODS]
    assert min(at) >= 1  # "every method failed at 2e-2 already"
    assert_quoted("docs/studies.md", "on five equal seeds every method failed at 2e-2 already")
    assert_quoted("docs/studies.md", f"each method failed on {min(at)} or {max(at)} of the 5 seeds there")


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
        findings,
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
