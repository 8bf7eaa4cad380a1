"""``scalelong compare``: train several skip methods side by side and write one report.

Every method of a seed starts from the same trunk weights (the skip module is built after the
backbone's initialisation), sees the same batches in the same order and the same noise, so
the methods differ only in how the skips are scaled. Claims rest on several seeds: the table
gives means with 95% t-intervals over seeds, and speed-ups are paired per seed against the
baseline of that seed.
"""

from __future__ import annotations

import base64
import copy
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import scipy.stats

from scalelong.config import Config
from scalelong.errors import ScaleLongError
from scalelong.plots import Records, as_float, load_metrics, series, write_plots
from scalelong.runs import RunDir
from scalelong.skips import METHODS
from scalelong.train import train


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (NaN half-width for fewer than 2 values)."""
    xs = [v for v in values if math.isfinite(v)]
    if not xs:
        return math.nan, math.nan
    if len(xs) == 1:
        return xs[0], math.nan
    t = scipy.stats.t.ppf(0.975, df=len(xs) - 1)  # two-sided 95%
    return statistics.fmean(xs), float(t) * statistics.stdev(xs) / math.sqrt(len(xs))


def fmt_ci(values: Sequence[float], digits: int = 3, unit: str = "") -> str:
    mean, half = mean_ci(values)
    if math.isnan(mean):
        return "n/a"
    return f"{mean:.{digits}g}{unit}" + ("" if math.isnan(half) else f" ± {half:.2g}")


def average_records(runs: Sequence[Records]) -> list[dict]:
    """One record per step holding the mean over runs of every key logged at that step."""
    by_step: dict[int, dict[str, list[float]]] = {}
    for records in runs:
        for r in records:
            slot = by_step.setdefault(int(r["step"]), {})
            for k, v in r.items():
                if k != "step":
                    slot.setdefault(k, []).append(as_float(v))
    return [
        {"step": s, **{k: statistics.fmean(v) for k, v in kv.items()}} for s, kv in sorted(by_step.items())
    ]


def _last(records: Records, key: str) -> float:
    _, values = series(records, key)
    finite = [v for v in values if math.isfinite(v)]
    return finite[-1] if finite else math.nan


@dataclass
class TargetResult:
    """Steps each method needs to reach the baseline's final value of a lower-is-better metric."""

    target: float  # the baseline's last finite value
    steps: dict[str, int | None]  # first logged step at or below target; None if never reached
    speedup: dict[str, float | None]  # baseline's steps / method's steps


def steps_to_target(records_by_method: Mapping[str, Records], baseline: str, key: str = "fd") -> TargetResult:
    """Steps to reach the baseline's final ``key`` (e.g. Frechet distance) and the speed-up.

    The baseline's own count is the first step at which it reached its final value (which can
    be earlier than its last step when the metric is not monotone), so the baseline's speed-up is 1.
    """
    if baseline not in records_by_method:
        raise ScaleLongError(f"baseline {baseline!r} not among the methods {sorted(records_by_method)}")
    _, base_values = series(records_by_method[baseline], key)
    finite = [v for v in base_values if math.isfinite(v)]
    if not finite:
        raise ScaleLongError(f"the baseline {baseline!r} has no finite {key!r} values")
    target = finite[-1]
    steps: dict[str, int | None] = {}
    for method, records in records_by_method.items():
        # NaN compares False, so a diverged evaluation never counts as reaching the target.
        steps[method] = next((s for s, v in zip(*series(records, key), strict=True) if v <= target), None)
    base_steps = steps[baseline]
    speedup = {m: (base_steps / s if s and base_steps else None) for m, s in steps.items()}
    return TargetResult(target, steps, speedup)


@dataclass
class MethodSummary:
    method: str
    final_fd: list[float]  # per seed
    fd_change: list[float]  # final FD / the baseline's of the same seed - 1, per seed (paired)
    final_loss: list[float]
    feature_osc_std: list[float]  # mean sliding-window std of the hidden-feature norm
    spikes: list[float]
    steps_to_target: list[int | None]
    speedup: list[float | None]


def summarise(
    runs: Mapping[str, Sequence[Records]], baseline: str, fd_key: str = "fd"
) -> list[MethodSummary]:
    """Per-method summaries from ``runs[method][seed] -> records``; speed-ups paired by seed."""
    seeds = min(len(r) for r in runs.values())
    targets = [steps_to_target({m: runs[m][s] for m in runs}, baseline, fd_key) for s in range(seeds)]
    base_fd = [_last(r, fd_key) for r in runs[baseline]]
    out = []
    for method, per_seed in runs.items():
        osc = [
            statistics.fmean(v)
            if (v := [x for x in series(r, "osc/feature_norm_std")[1] if math.isfinite(x)])
            else math.nan
            for r in per_seed
        ]
        out.append(
            MethodSummary(
                method=method,
                final_fd=[_last(r, fd_key) for r in per_seed],
                fd_change=[_last(r, fd_key) / b - 1 for r, b in zip(per_seed, base_fd, strict=False)],
                final_loss=[_last(r, "loss") for r in per_seed],
                feature_osc_std=osc,
                spikes=[_last(r, "spikes") for r in per_seed],
                steps_to_target=[t.steps[method] for t in targets],
                speedup=[t.speedup[method] for t in targets],
            )
        )
    return out


def summary_table(summaries: Sequence[MethodSummary], baseline: str) -> str:
    """Markdown table of the comparison (mean ± 95% interval over seeds)."""
    n = len(summaries[0].final_fd)
    lines = [
        f"| method | final FD | final FD vs {baseline} (paired) | final loss | feature-norm osc. std "
        f"| loss spikes | steps to {baseline}'s final FD | speed-up vs {baseline} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        reached = [x for x in s.steps_to_target if x is not None]
        steps = (
            f"{statistics.median(reached):.0f} ({len(reached)}/{n} seeds)"
            if reached
            else f"not reached (0/{n})"
        )
        speed = [x for x in s.speedup if x is not None]
        lines.append(
            f"| {s.method} | {fmt_ci(s.final_fd)} | {fmt_ci([100 * x for x in s.fd_change], unit='%')} "
            f"| {fmt_ci(s.final_loss)} | {fmt_ci(s.feature_osc_std)} "
            f"| {fmt_ci(s.spikes)} | {steps} | {fmt_ci(speed, unit='x') if speed else 'n/a'} |"
        )
    return "\n".join(lines)


def method_config(base: Config, method: str, seed: int, out_dir: Path) -> Config:
    cfg = copy.deepcopy(base)
    cfg.model.skip.method = method
    cfg.train.seed = seed
    cfg.out_dir = str(out_dir)
    cfg.name = f"{method}-seed{seed}"
    return cfg


def parse_methods(text: str) -> list[str]:
    methods = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise ScaleLongError(f"--methods {text!r}: choose from {', '.join(METHODS)}, comma separated")
    if len(set(methods)) != len(methods):
        raise ScaleLongError(f"--methods {text!r} names a method twice")
    return methods


def run_comparison(
    base: Config, methods: Sequence[str], seeds: int, report_dir: Path, progress: bool = True
) -> tuple[Path, str]:
    """Train every method for every seed (reusing finished runs) and write the report.

    Returns the path of report.md and the summary table (markdown)."""
    runs_dir = report_dir / "runs"
    runs: dict[str, list[list[dict]]] = {m: [] for m in methods}
    for k in range(seeds):
        for method in methods:
            cfg = method_config(base, method, base.train.seed + k, runs_dir)
            if not RunDir(cfg.run_dir).finished:  # finished runs are kept: reruns resume
                train(cfg, progress=progress)
            runs[method].append(load_metrics(cfg.run_dir))
    return write_report(runs, methods[0], report_dir, base)


def _embed(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    img = f'<img src="data:image/png;base64,{data}" alt="{path.stem}">'
    return f"<figure>{img}<figcaption>{path.stem}</figcaption></figure>"


def write_report(
    runs: Mapping[str, Sequence[Records]], baseline: str, report_dir: Path, base: Config
) -> Path:
    """report.md, PNG plots (means over seeds) and a self-contained report.html in ``report_dir``."""
    report_dir.mkdir(parents=True, exist_ok=True)
    summaries = summarise(runs, baseline)
    table = summary_table(summaries, baseline)
    plots = write_plots({m: average_records(r) for m, r in runs.items()}, report_dir)
    seeds = len(next(iter(runs.values())))
    depth = getattr(base.model, base.model.type, None)
    header = (
        f"# ScaleLong comparison: {', '.join(runs)}\n\n"
        f"{base.model.type} ({'depth ' + str(depth.depth) if hasattr(depth, 'depth') else ''}), "
        f"data {base.data.name}, {base.train.steps} steps, batch {base.train.batch_size}, "
        f"{seeds} seed(s) from {base.train.seed}. Values are means over seeds ± the half-width of a "
        "95% t-interval; speed-ups are paired per seed. FD is the Frechet distance "
        f"({base.eval.metric}) of EMA samples.\n"
    )
    if seeds < 5:
        header += (
            f"\n**{seeds} seed(s) only:** on small models seed-to-seed noise is larger than the effect; "
            "use --seeds 5 or more before drawing a conclusion.\n"
        )
    md = header + "\n" + table + "\n\n" + "\n".join(f"![{p.stem}]({p.name})" for p in plots) + "\n"
    (report_dir / "report.md").write_text(md)
    rows = "".join(
        "<tr>" + "".join(f"<td>{c.strip()}</td>" for c in line.strip("|").split("|")) + "</tr>"
        for line in table.splitlines()[2:]
    )
    head = "".join(f"<th>{c.strip()}</th>" for c in table.splitlines()[0].strip("|").split("|"))
    html = (
        "<!doctype html><meta charset='utf-8'><title>ScaleLong comparison</title>"
        "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}td,th{border:1px solid #ccc;"
        "padding:4px 8px}table{border-collapse:collapse}img{max-width:100%}</style>"
        f"<pre style='white-space:pre-wrap'>{header}</pre><table><tr>{head}</tr>{rows}</table>"
        + "".join(_embed(p) for p in plots)
    )
    (report_dir / "report.html").write_text(html)
    return report_dir / "report.md", table
