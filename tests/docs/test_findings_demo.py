"""The demo's numbers as the README, the demo recipe and the benchmarks page quote them, from the
records its runs wrote (docs/results/demo-*): seeds of `scalelong train demo`, `make demo`, the
samplers, the budgets in reference steps."""

from __future__ import annotations

import json

from findings import RESULTS, ROOT, assert_quoted


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
