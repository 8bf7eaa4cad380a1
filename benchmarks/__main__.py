"""One entry point for the benchmarks: run them, assemble results/SUMMARY.md, embed it in docs/benchmarks.md.

    python -m benchmarks --quick                   # every default benchmark, quick mode (make bench)
    python -m benchmarks --only method_overhead throughput
    python -m benchmarks --summary                 # no runs: rebuild SUMMARY.md, docs/benchmarks.md
    python -m benchmarks --list

Each benchmark runs in its own process (``python -m benchmarks.<name>``) so threads, memory
and compile caches do not leak between them; each writes ``results/<name>[_quick].json|md``.
The summary reads those files (the requested mode first, the other mode as a fallback, marked)
and replaces the text between ``<!-- bench:start -->`` and ``<!-- bench:end -->`` in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness import RESULTS, markdown_table

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


@dataclass
class Bench:
    module: str
    what: str
    device_flag: bool = True  # takes --device
    extra: list[str] = field(default_factory=list)
    default: bool = True  # part of a plain `python -m benchmarks`


REGISTRY = {
    "method_overhead": Bench("method_overhead", "step time of each skip method vs none (U-ViT, UNet)"),
    "uvit_vs_reference": Bench("uvit_vs_reference", "our U-ViT vs a plain reference U-ViT"),
    "unet_vs_diffusers": Bench(
        "unet_vs_diffusers", "our UNet vs diffusers UNet2DModel", device_flag=False, extra=["--channels-last"]
    ),
    "adapter_overhead": Bench(
        "adapter_overhead", "apply_scalelong on diffusers UNet2DModel", device_flag=False
    ),
    "fast_paths": Bench("fast_paths", "channels_last, bf16 autocast, torch.compile"),
    "bf16_widths": Bench("bf16_widths", "bf16 autocast vs fp32 per U-ViT width", default=False),
    "train_step": Bench(
        "train_step",
        "the demo U-ViT's step: eager/compiled x fp32/bf16, AdamW kernels, EMA, threads",
        device_flag=False,
        default=False,
    ),
    "demo_backbones": Bench(
        "demo_backbones", "the demo's UNet step / the demo U-ViT's step", device_flag=False, default=False
    ),
    "cpu_processes": Bench(
        "cpu_processes",
        "scalelong train demo_uvit as processes of one thread vs one process",
        device_flag=False,
        default=False,
    ),
    "throughput": Bench("throughput", "img/s and peak memory of the shipped configs"),
    "loader_vs_step": Bench("loader_vs_step", "CIFAR-10 loader vs training step", device_flag=False),
    "sampling_throughput": Bench(
        "sampling_throughput", "sampling img/s of the demo U-ViT", device_flag=False
    ),
    "diagnostics_overhead": Bench("diagnostics_overhead", "cost of the diagnostics", default=False),
    "sampler_quality": Bench(
        "sampler_quality",
        "FD-MNIST of DPM-Solver-50 vs Euler-Maruyama-1000",
        device_flag=False,
        default=False,
    ),
    "checkpoint_cost": Bench(
        "checkpoint_cost", "full-state checkpoint cost", device_flag=False, default=False
    ),
    "ideal_denoiser": Bench(
        "ideal_denoiser",
        "per-noise-level x0 error of the training set's posterior mean",
        device_flag=False,
        default=False,
    ),
    "fd_mnist_scale": Bench(
        "fd_mnist_scale",
        "FD-MNIST of held-out digits under controlled damage",
        device_flag=False,
        default=False,
    ),
    "sweep_pool": Bench(
        "sweep_pool", "a tiny sweep: 2 workers sharing the cores vs one after another", device_flag=False
    ),
    "startup": Bench(
        "startup", "start-up of scalelong info, a refused value, a dry run / import torch", device_flag=False
    ),
}


def run(names: list[str], quick: bool, device: str) -> dict[str, float]:
    """Run each benchmark in a subprocess; return its wall time (a failure stops nothing else)."""
    walls = {}
    for name in names:
        b = REGISTRY[name]
        cmd = [sys.executable, "-m", f"benchmarks.{b.module}", *b.extra]
        cmd += ["--quick"] if quick and name != "diagnostics_overhead" else []
        cmd += ["--device", device] if b.device_flag and device != "auto" else []
        print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        code = subprocess.run(cmd, cwd=ROOT).returncode
        walls[name] = time.perf_counter() - t0
        if code:
            print(f"!! {name} failed with exit code {code}", file=sys.stderr)
    return walls


# ----------------------------------------------------------------------------- summary


def load(name: str, quick: bool) -> tuple[dict | None, str]:
    """The result of ``name`` in the requested mode, else the other mode; and a mode label."""
    order = [(f"{name}_quick", "quick"), (name, "full")]
    for stem, mode in order if quick else order[::-1]:
        path = RESULTS / f"{stem}.json"
        if path.is_file():
            return json.loads(path.read_text()), mode
    return None, ""


def _met(ratio: float, goal: float) -> str:
    return "met" if ratio <= goal else "**not met**"


def overhead_section(quick: bool) -> list[str]:
    r, mode = load("method_overhead", quick)
    if r is None:
        return []
    goals = {"sqrt2": 1.01, "cs": 1.01, "ls": 1.03, "ls-nonshare": 1.03}
    rows = []
    for backbone, res in r["results"].items():
        # a goal finer than the noise floor is not resolved, whatever the point estimate says
        unresolved = [res["noise_floor"] > g - 1 for g in goals.values()]
        cells = [
            f"{res['ratio'][m]:.3f} ({'unresolved' if u else _met(res['ratio'][m], g)})"
            for (m, g), u in zip(goals.items(), unresolved, strict=True)
        ]
        rows.append(
            [
                f"{backbone} ({res['shape'].split(',', 1)[1].strip()})",
                *cells,
                f"±{100 * res['noise_floor']:.1f}%",
            ]
        )
    a, _ = load("adapter_overhead", quick)
    if a is not None:
        ar = a["ratio"]
        rows.append(
            [
                "diffusers UNet2DModel + apply_scalelong",
                "",
                f"{ar['cs']:.3f} ({_met(ar['cs'], 1.01)})",
                f"{ar['ls']:.3f} ({_met(ar['ls'], 1.03)})",
                f"{ar['ls-nonshare']:.3f} ({_met(ar['ls-nonshare'], 1.03)})",
                "",
            ]
        )
    header = [
        "backbone",
        "sqrt2 (goal ≤1.01)",
        "cs (≤1.01)",
        "ls (≤1.03)",
        "ls-nonshare (≤1.03)",
        "noise floor",
    ]
    return [
        f"**What ScaleLong costs**: step time of each method / `none`, same weights, interleaved ({mode}).",
        "",
        markdown_table(header, rows),
    ]


def reference_section(quick: bool) -> list[str]:
    rows = []
    r, mode = load("uvit_vs_reference", quick)
    if r is not None:
        x = r["ratio"]["ours, none"]
        rows.append(
            ["U-ViT (none) / plain reference U-ViT, same weights", f"{x:.3f}", "≤ 1.0", _met(x, 1.0), mode]
        )
        rows.append(["U-ViT (cs) / plain reference U-ViT", f"{r['ratio']['ours, cs']:.3f}", "", "", mode])
    u, mode = load("unet_vs_diffusers", quick)
    if u is not None:
        x = u["ratio"]["ours (UNet)"]
        rows.append(
            ["UNet / diffusers UNet2DModel, DDPM CIFAR-10 layout", f"{x:.3f}", "≤ 0.9", _met(x, 0.9), mode]
        )
        if "ours, channels_last" in u["ratio"]:
            y = u["ratio"]["ours, channels_last"]
            rows.append(
                ["UNet channels_last / diffusers UNet2DModel", f"{y:.3f}", "≤ 0.9", _met(y, 0.9), mode]
            )
    if not rows:
        return []
    return [
        "**Against other implementations** (training-step time ratio, interleaved).",
        "",
        markdown_table(["comparison", "ratio", "goal", "", "mode"], rows),
    ]


def throughput_section(quick: bool) -> list[str]:
    r, mode = load("throughput", quick)
    if r is None:
        return []
    rows = []
    for name, x in r["results"].items():
        growth = f"{x['step_growth_mib']:,.0f}" if "step_growth_mib" in x else ""
        rows.append(
            [name, f"{x['parameters']:,}", x["batch"], f"{x['img_s']:.2f}", f"{x['peak_mib']:,.0f}", growth]
        )
    dev = r["device"]
    threads = r["machine"].get("threads")
    return [
        f"**Training throughput and peak memory** ({dev}, {threads} threads, fp32, {mode}; "
        "one process per config; memory: peak RSS, and its growth once training starts).",
        "",
        markdown_table(["config", "parameters", "batch", "img/s", "peak MiB", "growth MiB"], rows),
    ]


# What became of each candidate, by measurement (ratios below 0.97 count as a gain).
DECISIONS = {
    "UNet channels_last": "not the default (no gain on CPU); benchmarks time it",
    "U-ViT bf16 autocast": "opt-in: `train.mixed_precision=bf16`",
    "UNet bf16 autocast": "opt-in: `train.mixed_precision=bf16`",
    "U-ViT torch.compile": "opt-in: `train.compile=true` (pays off after the compile time)",
    "UNet torch.compile": "opt-in: `train.compile=true`",
    "cs, fused into merge": "rejected: SkipScaling stays the single choke point",
}


BF16_DECISIONS = {
    "bf16 faster": "use `train.mixed_precision=bf16` at this width",
    "fp32 faster": "keep fp32 at this width",
    "tie": "either: within 5%",
}


def fast_path_section(quick: bool) -> list[str]:
    rows = []
    r, mode = load("fast_paths", quick)
    if r is not None:
        for case, x in r["results"].items():
            cand = list(x["ratio"])[1]
            note = f"; compile {x['compile_s']:.0f} s" if "compile_s" in x else ""
            rows.append([case, f"{x['ratio'][cand]:.3f}", DECISIONS.get(case, "") + note, mode])
    w, mode = load("bf16_widths", quick)
    if w is not None:
        for x in w["results"].values():
            conv = ", mlp_conv" if x["block"] == "mlp_conv" else ""
            rows.append(
                [
                    f"U-ViT width {x['width']}{conv} bf16 autocast "
                    f"(depth 12, batch {w['batch']}, {w['threads']} thread(s))",
                    f"{x['ratio']:.3f}",
                    BF16_DECISIONS[x["verdict"]],
                    mode,
                ]
            )
    m, mode = load("method_overhead", quick)
    if m is not None and "cs, fused" in m["results"].get("U-ViT", {}).get("ratio", {}):
        ratio = m["results"]["U-ViT"]["ratio"]
        rows.append(
            [
                "cs, fused into merge",
                f"{ratio['cs, fused'] / ratio['cs']:.3f}",
                DECISIONS["cs, fused into merge"],
                mode,
            ]
        )
    if not rows:
        return []
    return [
        "**Fast paths** (step-time ratio fast / plain, interleaved; below 1 is faster).",
        "",
        markdown_table(["path", "ratio", "decision", "mode"], rows),
        "",
        "bf16 per width: `python -m benchmarks.bf16_widths` (batch 32, 2 threads). The quick U-ViT row "
        "(batch 8, 1 thread) can read otherwise: the answer depends on the size of the matrices, so "
        "measure at the width and batch of the run at hand.",
    ]


def train_step_section(quick: bool) -> list[str]:
    """The demo U-ViT's training step, every candidate path beside eager fp32 (benchmarks/train_step.py)."""
    r, mode = load("train_step", quick)
    if r is None:
        return []
    a = r["args"]
    return [
        f"**The demo U-ViT's training step** (`python -m benchmarks.train_step`: the {a['preset']} preset "
        f"at batch {a['batch']}, {r['threads']} thread(s), {r['repeats']} interleaved repeats, {mode}).",
        "",
        r["table"],
    ]


def cpu_processes_section(quick: bool) -> list[str]:
    """One run of the demo U-ViT on the CPU's cores as one process or as processes of one thread each."""
    r, mode = load("cpu_processes", quick)
    if r is None:
        return []
    return [
        f"**One run on {r['cores']} cores** (`python -m benchmarks.cpu_processes`: `scalelong train "
        f"demo_uvit`, {r['steps']} steps, `train.cpu_processes`, {r['repeats']} alternating repeats, {mode}; "
        "the logged training throughput after the first quarter of the steps, and the command's wall time).",
        "",
        r["table"],
    ]


def data_sampling_section(quick: bool) -> list[str]:
    rows = []
    r, mode = load("loader_vs_step", quick)
    if r is not None:
        rows.append(
            [
                "CIFAR-10 loader (0 workers) / U-ViT-S/2 step, img/s",
                f"{r['ratio']:,.0f}x",
                "≥ 5x",
                "met" if r["ratio"] >= 5 else "**not met**",
                mode,
            ]
        )
    s, mode = load("sampling_throughput", quick)
    if s is not None:
        for batch, x in s["batches"].items():
            rows.append(
                [
                    f"demo U-ViT sampling, batch {batch}: DPM-Solver-50 / EM-1000 img/s",
                    f"{x['dpm_solver_50_img_s']:.2f} / {x['euler_maruyama_1000_img_s']:.3f}",
                    "",
                    "",
                    mode,
                ]
            )
    q, mode = load("sampler_quality", quick)
    if q is not None:
        fast, slow = q["results"]["dpm_solver-50"], q["results"]["euler_maruyama-1000"]
        rows.append(
            [
                f"FD-MNIST, DPM-Solver-50 / EM-1000 ({q['n']} samples, demo U-ViT at 3k steps)",
                f"{fast['fd_mnist']:.1f} / {slow['fd_mnist']:.1f} ({100 * q['relative_difference']:+.1f}%)",
                "within 10% at 20x fewer NFE",
                "met" if q["relative_difference"] <= 0.10 else "**not met**",
                mode,
            ]
        )
    if not rows:
        return []
    return ["**Data and sampling**.", "", markdown_table(["what", "value", "goal", "", "mode"], rows)]


def studies_section(quick: bool) -> list[str]:
    r, mode = load("sweep_pool", quick)
    if r is None:
        return []
    rows = [
        [arm, r["threads"][arm], f"{r['median_s'][arm]:.1f}", f"{r['ratio'][arm]:.2f}"] for arm in r["ratio"]
    ]
    return [
        f"**Studies on a shared CPU**: wall time of a tiny `scalelong sweep` ({r['runs']} runs of "
        f"{r['steps']} steps, {r['cores']} cores), interleaved ({mode}).",
        "",
        markdown_table(["arm", "torch threads per run", "median s", "ratio to --jobs 1"], rows),
    ]


def demo_backbones_section(quick: bool) -> list[str]:
    """The demo UNet's training step against the demo U-ViT's (benchmarks/demo_backbones.py)."""
    r, mode = load("demo_backbones", quick)
    if r is None:
        return []
    return [
        f"**The demo's two backbones** (`python -m benchmarks.demo_backbones`, {mode}: the step counts of "
        f"`scalelong train demo` and `make demo` assume a UNet step costs at most {r['target']}x a U-ViT "
        "step).",
        "",
        r["table"].strip(),
    ]


def startup_section(quick: bool) -> list[str]:
    """The command line's start-up against importing torch (benchmarks/startup.py), target <= 1.5x each."""
    r, mode = load("startup", quick)
    if r is None:
        return []
    return [
        f"**The command line's start-up** (`python -m benchmarks.startup`: fresh processes of one thread, "
        f"{r['repeats']} interleaved repeats, {mode}; median wall time / `import torch`'s, goal ≤ "
        f"{r['target']} each).",
        "",
        r["table"],
    ]


def summary(quick: bool) -> str:
    parts = [
        overhead_section,
        reference_section,
        throughput_section,
        fast_path_section,
        train_step_section,
        demo_backbones_section,
        cpu_processes_section,
        data_sampling_section,
        studies_section,
        startup_section,
    ]
    blocks = ["\n".join(p(quick)) for p in parts]
    m, _ = load("method_overhead", quick)
    machine = (m or {}).get("machine", {})
    head = (
        f"Regenerated by `python -m benchmarks{' --quick' if quick else ''}` (`make bench`) on "
        f"{datetime.date.today().isoformat()}: torch {machine.get('torch', '?')}, "
        f"{machine.get('gpu') or machine.get('cpu', '?')}. Ratios are medians of interleaved repetitions "
        "in one process; on a CPU shared with other jobs, ratios within the noise floor are ties."
    )
    return "\n\n".join([head, *[b for b in blocks if b]]) + "\n"


def update_readme(text: str, readme: Path = ROOT / "docs" / "benchmarks.md") -> None:
    """Replace the marked block of the benchmarks page (or append it under '## Performance')."""
    body = readme.read_text()
    block = f"{START}\n{text.rstrip()}\n{END}"
    if START in body and END in body:
        head, rest = body.split(START, 1)
        body = head + block + rest.split(END, 1)[1]
    else:
        body = body.rstrip() + f"\n\n## Performance\n\n{block}\n"
    readme.write_text(body)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="each benchmark's --quick mode")
    p.add_argument("--only", nargs="+", choices=list(REGISTRY), help="run these (default: all default ones)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda, for the benchmarks that take it")
    p.add_argument("--summary", action="store_true", help="run nothing; rebuild the summaries")
    p.add_argument("--no-readme", action="store_true", help="leave docs/benchmarks.md alone")
    p.add_argument("--list", action="store_true")
    args = p.parse_args(argv)
    if args.list:
        for name, b in REGISTRY.items():
            print(f"{name:22} {'' if b.default else '(extra) '}{b.what}")
        return
    walls = {}
    if not args.summary:
        walls = run(args.only or [n for n, b in REGISTRY.items() if b.default], args.quick, args.device)
    text = summary(args.quick)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "SUMMARY.md").write_text(text)
    collected = {name: load(name, args.quick)[0] for name in REGISTRY}
    (RESULTS / "SUMMARY.json").write_text(
        json.dumps({"quick": args.quick, "wall_s": walls, **collected}, indent=1)
    )
    if not args.no_readme:
        update_readme(text)
    print(text)


if __name__ == "__main__":
    main()
