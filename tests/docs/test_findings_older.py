"""The numbers the README and the Studies page quote from the studies made before every run kept its
provenance: the demo-scale maps (judged again by today's rule from their map.json) and the depth
studies (whose feature ratios and held-out errors exist only in the gap tables of their report.md,
the runs not kept). A quote that drifts from its data, or a verdict that today's rule changes under
a quote, fails here."""

from __future__ import annotations

import re
from functools import cache

from findings import RESULTS, assert_quoted

from scalelong.studies.statistics import fisher_p, mean_ci
from scalelong.studies.sweep.mapfile import read_map


@cache
def older(name: str):
    """(cells by (depth, lr, method), per run (depth, lr, method, seed) the verdict recorded then)."""
    cells, _, recorded = read_map(RESULTS / name / "map.json")
    return {(c.cell.depth, c.cell.lr, c.cell.method): c for c in cells}, recorded


def failed(name: str, depth: int, lr: float, method: str) -> int:
    return older(name)[0][depth, lr, method].diverged


def growth(name: str) -> tuple[list[float], list[float]]:
    """The feature growth recorded for the runs that failed today, and for those that trained: the
    factor over the first logged value where the former criterion (c) fired."""
    cells, recorded = older(name)
    grew: tuple[list[float], list[float]] = ([], [])
    for key, c in cells.items():
        for r in c.runs:
            for d in recorded[(*key, r.seed)]:
                if d["criterion"] == "feature_norm":
                    factor = float(re.search(r"([0-9.e+]+) x its first", d["detail"]).group(1))
                    grew[0 if r.breaks else 1].append(factor)
    return grew


def recorded_count(name: str, methods, cells_of) -> list[int]:
    """Runs per method that the rule of the time failed (any recorded criterion) over ``cells_of``."""
    recorded = older(name)[1]
    return [
        sum(bool(v) for (d, lr, m, _), v in recorded.items() if m == method and (d, lr) in cells_of)
        for method in methods
    ]


def sci(x: float) -> str:
    """One significant digit as the docs write it: 3e7, 8e5."""
    return f"{x:.0e}".replace("e+0", "e")


def loss_ci(name: str, depth: int, lr: float, method: str) -> str:
    mean, half = mean_ci(older(name)[0][depth, lr, method].values("final_loss"))
    return f"{mean:.3f} ± {half:.3f}"


# ----------------------------------------------------------------------------- the map at demo scale

MAP_METHODS = ("none", "sqrt2", "cs", "ls")
MAP_CELLS = [(d, lr) for d in (12, 16) for lr in (0.01, 0.015, 0.02)]
DECISIVE = [(d, lr) for d in (12, 16) for lr in (0.01, 0.015)]


def test_the_map_at_demo_scale_as_quoted():
    cells = older("stability-map")[0]
    pooled = {m: sum(failed("stability-map", d, lr, m) for d, lr in DECISIVE) for m in MAP_METHODS}
    for m in MAP_METHODS:
        row = [f"{failed('stability-map', d, lr, m)}/{cells[d, lr, m].count}" for d, lr in MAP_CELLS]
        p = fisher_p(pooled[m], 20, pooled["none"], 20)
        total = f"{pooled[m]}/20" + ("" if m == "none" else f" (p = {p:.2g}{' vs none' * (m == 'sqrt2')})")
        assert_quoted("docs/studies.md", f"| `{m}` | " + " | ".join(row) + f" | {total} |")
        assert m == "none" or p > 0.3
    others = ", ".join(str(pooled[m]) for m in MAP_METHODS[1:3]) + f" and {pooled['ls']}"
    assert_quoted("README.md", f"failed in {pooled['none']} of 20 decisive runs against {others} for `sqrt2`")
    assert_quoted(
        "docs/studies.md",
        f"`none` failed in {pooled['none']} of 20 runs and the ScaleLong methods in {others}",
    )
    at = {lr: [cells[d, lr, m] for d in (12, 16) for m in MAP_METHODS] for lr in (0.015, 0.02)}
    said = {lr: (sum(c.diverged for c in cs), sum(c.count for c in cs)) for lr, cs in at.items()}
    assert_quoted(
        "docs/studies.md",
        f"{said[0.015][0]} of the {said[0.015][1]} runs at 1.5e-2 and "
        f"{said[0.02][0]} of the {said[0.02][1]} at 2e-2",
    )
    then = recorded_count("stability-map", MAP_METHODS, DECISIVE)
    assert_quoted("docs/studies.md", f"that counted {then[0]}, {then[1]}, {then[2]} and {then[3]} of 20")
    grew, trained = growth("stability-map")
    n_failed = sum(c.diverged for c in cells.values())
    assert_quoted(
        "docs/studies.md",
        f"{len(grew)} of the {n_failed} failed runs show the mechanism the paper describes, "
        f"hidden-feature norms past 100x their first logged value ({min(grew):.0f}x to {sci(max(grew))}x)",
    )
    assert_quoted("docs/studies.md", f"{len(trained)} runs that trained passed 100x too")


def test_the_longer_runs_at_the_boundary_as_quoted():
    none, cs = (failed("stability-map-1500-steps", 12, 0.01, m) for m in ("none", "cs"))
    assert_quoted(
        "docs/studies.md",
        f"`none` failed in {none}/5 runs (exact 95% interval 0%-52%), final loss "
        f"{loss_ci('stability-map-1500-steps', 12, 0.01, 'none')}; `cs` in {cs}/5",
    )
    assert_quoted("docs/studies.md", f"(Fisher p = {fisher_p(cs, 5, none, 5):.2f} against `none`)")
    grew, trained = growth("stability-map-1500-steps")
    assert len(grew) == cs and not trained
    assert_quoted("docs/studies.md", f"feature norms {sci(min(grew))}-{sci(max(grew))} x")
    # the third `cs` seed the 200-step map failed learned when given 1,500 steps
    short = {r.seed for r in older("stability-map")[0][12, 0.01, "cs"].runs if r.breaks}
    long = {r.seed for r in older("stability-map-1500-steps")[0][12, 0.01, "cs"].runs if r.breaks}
    assert len(short) == 3 and long < short and len(long) == 2


def test_the_map_on_the_current_demo_as_quoted():
    name = "stability-map-mlp-conv"
    pooled = {m: sum(failed(name, 12, lr, m) for lr in (0.015, 0.02)) for m in ("none", "cs", "ls")}
    for m, edge in (("none", "2e-2 (the largest tried)"), ("cs", "1.5e-2"), ("ls", "1e-2")):
        row = [f"{failed(name, 12, lr, m)}/5" for lr in (0.01, 0.015, 0.02)]
        p = fisher_p(pooled[m], 10, pooled["none"], 10)
        total = f"{pooled[m]}/10" + ("" if m == "none" else f" (p = {p:.2g}{' vs none' * (m == 'cs')})")
        assert_quoted("docs/studies.md", f"| `{m}` | " + " | ".join(row) + f" | {total} | {edge} |")
    losses = ", ".join(f"`{m}` {loss_ci(name, 12, 0.01, m)}" for m in ("none", "cs", "ls"))
    assert_quoted("docs/studies.md", f"Final loss at lr 1e-2, mean ± 95% interval over seeds: {losses}")
    plain = failed("stability-map", 12, 0.015, "none")
    assert failed(name, 12, 0.015, "none") == 0
    assert_quoted("docs/studies.md", f"the plain U-ViT lost {plain} of 5 (p = {fisher_p(0, 5, plain, 5):.2f}")
    grew, trained = growth(name)
    assert_quoted(
        "docs/studies.md",
        f"The {len(grew)} failed runs again show the feature norm exploding ({min(grew):.0f}x to "
        f"{sci(max(grew))}x its first logged value); {len(trained)} runs that trained",
    )
    then = recorded_count(name, ("none", "cs", "ls"), [(12, 0.015), (12, 0.02)])
    assert_quoted("docs/studies.md", f"{then[0]}/10, {then[1]}/10 and {then[2]}/10")


# ----------------------------------------------------------------------------- the depth studies


def test_todays_rule_keeps_every_verdict_of_the_depth_studies():
    """Their reports were written under the rule of the time; today's gives every run the same verdict,
    so the counts they and the README quote stand."""
    for name in ("depth-study", "depth-study-kappa-0.9", "depth-study-lr-probe"):
        cells, recorded = older(name)
        for key, c in cells.items():
            for r in c.runs:
                assert bool(r.breaks) == bool(recorded[(*key, r.seed)]), (name, key, r.seed)
        assert_quoted(f"docs/results/{name}/report.md", "gives every run here the same verdict")
    counts = {(d, m): failed("depth-study", d, 0.02, m) for d in (12, 32) for m in ("none", "cs")}
    assert (counts[32, "none"], counts[32, "cs"]) == (1, 1)  # depth 32 ran one seed: both broke
    assert_quoted(
        "README.md",
        f"at lr 2e-2 `none` broke in {counts[12, 'none']} of 5 runs at depth 12 and `cs` in "
        f"{counts[12, 'cs']} of 5 "
        f"(p = {fisher_p(counts[12, 'cs'], 5, counts[12, 'none'], 5):.2g}), and at depth 32 both broke",
    )
    at_5e3 = [c for (d, lr, m), c in older("depth-study")[0].items() if lr == 0.005]
    assert not any(c.diverged for c in at_5e3)
    assert_quoted("README.md", "No method diverged at any depth there")


NUMBER = r"([+-]?[0-9.]+(?:e[+-]?\d+)?)"


def numbers(text: str) -> tuple[float, ...]:
    """'0.79 (0.5 to 1.2)' -> (0.79, 0.5, 1.2); '0.8 (1 seed, no interval)' or '0.80' -> (0.8,)."""
    found = re.fullmatch(rf"\**{NUMBER}(?: \({NUMBER} to {NUMBER}\))?.*?\**", text.strip())
    assert found, f"no number in {text!r}"
    return tuple(float(x) for x in found.groups() if x is not None)


def gap_row(name: str, depth: int, method: str, lr: float = 0.005) -> dict[str, tuple[float, ...]]:
    """A row of the report's gap table, its contrasts by column."""
    for line in (RESULTS / name / "report.md").read_text().splitlines():
        cols = [c.strip() for c in line.strip("|").split("|")]
        if cols[:3] == [str(depth), f"{lr:g}", method]:
            return {"feature": numbers(cols[3]), "loss": numbers(cols[5]), "x0": numbers(cols[6])}
    raise AssertionError(f"{name}/report.md has no gap row for depth {depth}, {method}")


def close(quoted: tuple[float, ...], reported: tuple[float, ...]) -> bool:
    """A quote rounds the report's number to two significant digits or to 4 decimals."""
    return len(quoted) == len(reported) and all(
        abs(q - r) <= max(abs(r) * 0.02, 6e-5) for q, r in zip(quoted, reported, strict=True)
    )


def test_the_depth_table_as_its_report_gives_it():
    """Every contrast of the Studies' depth table is the report's gap table, rounded."""
    rows = 0
    for line in (RESULTS.parent / "studies.md").read_text().splitlines():
        cols = [c.strip() for c in line.strip("|").split("|")]
        if len(cols) != 6 or not re.fullmatch(r"\d+ \(\d+\)", cols[0]):
            continue
        depth = int(cols[0].split()[0])
        methods = re.findall(r"`([a-z0-9]+)`", cols[1])
        for i, method in enumerate(methods):
            reported = gap_row("depth-study", depth, method)
            for column, key in ((2, "feature"), (3, "x0"), (4, "loss")):
                part = cols[column].split(", ")[i] if len(methods) > 1 else cols[column]
                assert close(numbers(part), reported[key]), (depth, method, key, part, reported[key])
            rows += 1
    assert rows == 9  # cs, sqrt2 and ls at depths 12, 24 and 32


def test_the_depth_ratios_in_the_readme_as_the_report_gives_them():
    readme = re.sub(r"\s+", " ", (RESULTS.parent.parent / "README.md").read_text())
    quoted = re.search(
        rf"`cs` ends with hidden features ({NUMBER} \({NUMBER} to {NUMBER}\)) times `none`'s at depth 12 "
        rf"and ({NUMBER} \({NUMBER} to {NUMBER}\)) at depth 32",
        readme,
    )
    assert quoted, "the README no longer quotes the depth study's feature ratios"
    assert close(numbers(quoted.group(1)), gap_row("depth-study", 12, "cs")["feature"])
    assert close(numbers(quoted.group(5)), gap_row("depth-study", 32, "cs")["feature"])
    x0 = re.search(rf"x0 error {NUMBER}, {NUMBER} to {NUMBER}\)", readme)
    assert x0 and close(tuple(float(v) for v in x0.groups()), gap_row("depth-study", 32, "cs")["x0"])
