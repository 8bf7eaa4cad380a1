"""The demo U-ViT's training step, every candidate path side by side in one process.

    python -m benchmarks.train_step                  # the demo U-ViT at its batch (32), 2 threads
    python -m benchmarks.train_step --quick          # fewer repeats
    python -m benchmarks.train_step --preset stability --batch 32
    python -m benchmarks.train_step --preset stability --threads 1 --no-compile   # the fp16 row's target

One step is what the trainer runs: forward of the configured backbone on x_t, the configured loss
(the demo: x0-prediction with the v-loss weighting), backward, the global gradient norm, AdamW,
and the EMA update. The arms:

* precision and compilation: eager fp32, eager bf16 autocast (torch's CPU kernels), eager fp16
  (``train.mixed_precision=fp16`` on the CPU: CUDA's fp16 autocast policy computed in fp32 on fp16
  values, :mod:`scalelong.fp16`, with the trainer's loss scaler), eager bf16 the same way (what
  ``train.mixed_precision=bf16`` runs on a CPU without bf16 units), ``torch.compile`` fp32, compiled bf16;
* the AdamW implementation (``optim.implementation``): for-loop (torch's CPU default), foreach, fused;
* the EMA update: one fused ``_foreach_lerp_`` over all parameters (the trainer's) or one lerp per
  parameter;
* threads of a single run: 1 or 2 (``torch.set_num_threads``).

Compilation is timed apart: the first compiled step minus a compiled step is the compile time, in a
fresh process with an empty inductor cache and again in a second process that finds the first
one's cache (``TORCHINDUCTOR_CACHE_DIR``), which is what the runs of ``make demo`` after the first
see.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import torch

from benchmarks.harness import (
    add_common_args,
    interleaved_medians,
    markdown_table,
    result_name,
    setup,
    write_result,
)


def demo_parts(preset: str, batch: int):
    """(model, schedule, x0 batch) of a preset, built as the trainer builds them."""
    from scalelong.data import embedded_mnist
    from scalelong.training.build import build_model, build_schedule
    from scalelong.training.config import load_config

    cfg = load_config(preset)
    torch.manual_seed(0)
    model = build_model(cfg.model)
    images, _ = embedded_mnist("train")
    return model, build_schedule(cfg.diffusion), images[:batch].clone(), cfg


def step_fn(
    preset: str,
    batch: int,
    *,
    amp: torch.dtype | None = None,
    policy: torch.dtype | None = None,
    compiled: bool = False,
    adamw: str = "loop",
    ema: str = "foreach",
) -> Callable[[], None]:
    """A closure running one trainer-like step of ``preset``'s model on one fixed batch; ``policy``
    (fp16 or bf16): the trainer's CPU step in that precision, the forward under CUDA's autocast policy
    (:mod:`scalelong.fp16`) and, in fp16, the loss scaled, the gradients unscaled before their norm, the
    scaler's step and update."""
    from scalelong.diffusion import denoising_loss
    from scalelong.fp16 import autocast_forward

    model, schedule, x0, cfg = demo_parts(preset, batch)
    ema_model = copy.deepcopy(model).requires_grad_(False)
    params = list(model.parameters())
    flags = {"loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[adamw]
    o = cfg.optim
    opt = torch.optim.AdamW(params, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay, **flags)
    net = torch.compile(model) if compiled else model
    net = autocast_forward(net, dtype=policy) if policy is not None else net
    scaler = torch.amp.GradScaler("cpu") if policy == torch.float16 else None
    gen = torch.Generator().manual_seed(0)
    t = schedule.sample_t(batch, gen)
    noise = torch.randn(x0.shape, generator=gen)
    ema_p = list(ema_model.parameters())

    def step() -> None:
        ctx = torch.autocast("cpu", dtype=amp) if amp is not None else contextlib.nullcontext()
        with ctx:
            loss = denoising_loss(net, schedule, x0, t, noise).mean()
        (loss if scaler is None else scaler.scale(loss)).backward()
        if scaler is not None:
            scaler.unscale_(opt)
        torch.linalg.vector_norm(torch.stack(torch._foreach_norm([p.grad for p in params]))).item()
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            if ema == "foreach":
                torch._foreach_lerp_(ema_p, [p.detach() for p in params], 1 - cfg.train.ema_decay)
            else:
                for pe, p in zip(ema_p, params, strict=True):
                    pe.lerp_(p.detach(), 1 - cfg.train.ema_decay)

    step.model, step.ema = model, ema_model  # what the step trains, for a test to look at
    return step


def with_threads(fn: Callable[[], None], threads: int) -> Callable[[], None]:
    def run() -> None:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            fn()
        finally:
            torch.set_num_threads(before)

    return run


def compile_seconds(preset: str, batch: int, amp: str, cache_dir: str, threads: int) -> dict:
    """Compile time of the training step in a fresh process (its own interpreter and caches)."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir)
    code = (
        "import json, time, torch; from benchmarks.train_step import step_fn;"
        f"torch.set_num_threads({threads});"
        f"amp = {'torch.bfloat16' if amp == 'bf16' else 'None'};"
        f"s = step_fn({preset!r}, {batch}, amp=amp, compiled=True); t0 = time.perf_counter(); s();"
        "first = time.perf_counter() - t0; ts = []\n"
        "for _ in range(3):\n t0 = time.perf_counter(); s(); ts.append(time.perf_counter() - t0)\n"
        "print(json.dumps({'first_s': first, 'step_s': sorted(ts)[1]}))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["compile_s"] = r["first_s"] - r["step_s"]
    return r


def forward_fn(preset: str, batch: int, amp: torch.dtype | None) -> Callable[[], None]:
    """One network forward at the evaluation's batch, as the sampler runs it (inference mode)."""
    model, schedule, _, _ = demo_parts(preset, batch)
    model.eval()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((batch, *model_shape(model)), generator=gen)
    t = schedule.model_time(torch.rand(batch, generator=gen))

    def forward() -> None:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp is not None):
            model(x, t)

    return forward


def model_shape(model: torch.nn.Module) -> tuple[int, int, int]:
    return (model.in_channels, model.img_size, model.img_size)


def training_arms(preset: str, batch: int, threads: int, compiled: bool) -> dict[str, Callable[[], None]]:
    bf16 = torch.bfloat16
    S = lambda **kw: step_fn(preset, batch, **kw)  # noqa: E731
    arms = {
        "eager fp32": S(),
        "eager bf16": S(amp=bf16),
        "eager fp16 (CUDA's policy)": S(policy=torch.float16),
    }
    arms["eager bf16 (CUDA's policy)"] = S(policy=bf16)
    if compiled:
        arms |= {"compiled fp32": S(compiled=True), "compiled bf16": S(amp=bf16, compiled=True)}
    arms |= {
        "eager fp32, AdamW foreach": S(adamw="foreach"),
        "eager fp32, AdamW fused": S(adamw="fused"),
        "eager bf16, AdamW fused": S(amp=bf16, adamw="fused"),
    }
    if compiled:
        arms["compiled bf16, AdamW fused"] = S(amp=bf16, compiled=True, adamw="fused")
    arms["eager fp32, EMA one lerp per parameter"] = S(ema="loop")
    if threads > 1:
        arms["eager fp32, 1 thread"] = with_threads(S(), 1)
    return arms


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p, threads=2)
    p.add_argument(
        "--preset", default="demo_uvit", help="the preset whose model, loss and optimizer are timed"
    )
    p.add_argument("--batch", type=int, default=32, help="training batch (the demo's: 32)")
    p.add_argument("--eval-batch", type=int, default=256, help="the sampler's batch (the demo's: 256)")
    p.add_argument("--no-compile", action="store_true", help="skip the compiled arms and compile times")
    args = p.parse_args(argv)
    device = setup(args)
    if device.type != "cpu":
        p.error("this benchmark times the CPU paths; on a GPU use benchmarks/gpu_check.sh")
    repeats = args.repeats or (5 if args.quick else 15)
    threads = torch.get_num_threads()
    arms = training_arms(args.preset, args.batch, threads, not args.no_compile)
    for name, fn in arms.items():  # compile (and warm) every arm before timing any
        t0 = time.perf_counter()
        fn()
        print(f"{name}: first step {time.perf_counter() - t0:.1f} s", flush=True)
    med = interleaved_medians(arms, repeats=repeats, warmup=2)
    res: dict = {"train": {"median_s": med, "ratio": {k: v / med["eager fp32"] for k, v in med.items()}}}
    fwd = {"fp32": forward_fn(args.preset, args.eval_batch, None)}
    fwd["bf16"] = forward_fn(args.preset, args.eval_batch, torch.bfloat16)
    fmed = interleaved_medians(fwd, repeats=max(3, repeats // 3), warmup=1)
    res["sample"] = {"median_s": fmed, "ratio": fmed["bf16"] / fmed["fp32"]}
    if not args.no_compile:
        with tempfile.TemporaryDirectory() as cache:
            for amp in ("fp32", "bf16"):
                cold = compile_seconds(args.preset, args.batch, amp, cache, threads)
                res[f"compile {amp}"] = {
                    "cold": cold,
                    "warm": compile_seconds(args.preset, args.batch, amp, cache, threads),
                }
                print(f"compile {amp}:", res[f"compile {amp}"], flush=True)
    text = tables(res, args, threads, repeats)
    print(text)
    write_result(
        result_name("train_step", device, args.quick),
        {"args": vars(args), "threads": threads, "repeats": repeats, "results": res, "table": text.strip()},
        text,
    )


def tables(res: dict, args, threads: int, repeats: int) -> str:
    """The step-time table, the sampler's forward and the compile cost, as markdown."""
    med, base = res["train"]["median_s"], res["train"]["median_s"]["eager fp32"]
    rows = [[name, f"{v * 1e3:.1f}", f"{v / base:.3f}"] for name, v in med.items()]
    text = markdown_table(["training step", "ms", "ratio to eager fp32"], rows)
    f = res["sample"]["median_s"]
    text += "\n\n" + markdown_table(
        ["sampler forward (inference)", "fp32 ms", "bf16 ms", "ratio"],
        [
            [
                f"batch {args.eval_batch}",
                f"{f['fp32'] * 1e3:.0f}",
                f"{f['bf16'] * 1e3:.0f}",
                f"{res['sample']['ratio']:.3f}",
            ]
        ],
    )
    if "compile fp32" in res:
        crow = [
            [
                amp,
                f"{res[f'compile {amp}']['cold']['compile_s']:.1f}",
                f"{res[f'compile {amp}']['warm']['compile_s']:.1f}",
            ]
            for amp in ("fp32", "bf16")
        ]
        text += "\n\n" + markdown_table(["torch.compile of the step", "empty cache s", "warm cache s"], crow)
    return text + (
        f"\n\n{args.preset} preset, training batch {args.batch}, {threads} thread(s), {repeats} interleaved "
        "repeats; the warm cache is the inductor cache a first process left (a second run on the machine).\n"
    )


if __name__ == "__main__":
    main()
