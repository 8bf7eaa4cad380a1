"""fp16 (or bf16) on the CPU against torch's own kernels: the same training run, step by step.

    python -m benchmarks.fp16_faithful                  # 100 steps of the stability preset, batch 32
    python -m benchmarks.fp16_faithful --steps 30       # fewer: torch's CPU fp16 kernels take seconds a step
    python -m benchmarks.fp16_faithful --against cuda   # with a GPU: against CUDA's own fp16 autocast
    python -m benchmarks.fp16_faithful --dtype bf16 --against cpu   # bf16: against torch's CPU autocast

Both arms train the stability preset's U-ViT from the same initial weights on the same batches,
times and noise, with the trainer's fp16 step: the forward under CUDA's fp16 autocast policy
(:mod:`scalelong.fp16`) with fp32 outputs, the loss scaled by a ``torch.amp.GradScaler("cpu")``,
the gradients unscaled before their norm (and clipping), the scaler's step and update, the preset's
AdamW and lr schedule. They differ in the lower-precision ops (matrix products, convolutions,
attention) alone:

* ``policy``: fp32 products of fp16 values, rounded to fp16 (what ``train.mixed_precision=fp16`` runs
  on the CPU, as GPU tensor cores accumulate in fp32);
* ``native``: torch's own fp16 kernels on fp16 tensors (``gpu_autocast(native=True)``): CUDA's
  autocast arranged on the CPU, about ten times slower on a CPU without fp16 units;
* ``cuda`` (``--against cuda``, with a GPU at hand): the same steps on the GPU under
  ``torch.autocast("cuda", dtype=torch.float16)`` with a ``GradScaler("cuda")``, the thing itself;
* ``cpu`` (``--against cpu``): torch's own CPU autocast, whose lists differ from CUDA's (it leaves
  layer_norm, softmax and the upsampling ops in their input's dtype): with ``--dtype bf16``, what
  ``train.mixed_precision=bf16`` runs on a CPU with bf16 units, against what it runs on one without.

``--dtype bf16`` runs every arm in bf16 instead, without loss scaling (bf16 has fp32's range).

Reported: each step's loss (the largest relative difference, and that of the run's mean loss), the
steps the scaler skipped in each arm, the final loss scale and the time per step. Goal: losses
within 1%, the same steps skipped.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from benchmarks.harness import add_common_args, markdown_table, result_name, setup, write_result


def run(arm: str, steps: int, batch: int, preset: str, dtype: torch.dtype = torch.float16) -> dict:
    """``steps`` trainer-like ``dtype`` steps of ``preset`` in ``arm`` (``policy``, ``native``: CUDA's
    lists on the CPU; ``cpu``: torch's CPU autocast; ``cuda``: on the GPU under its own autocast):
    losses, skipped steps, scale, seconds."""
    from scalelong.data import embedded_mnist
    from scalelong.diffusion import denoising_loss
    from scalelong.fp16 import autocast_forward
    from scalelong.optim import lr_factor
    from scalelong.training.build import build_model, build_schedule
    from scalelong.training.config import load_config
    from scalelong.training.train import grad_norm, make_optimizer

    cfg = load_config(preset)
    o, clip = cfg.optim, cfg.train.grad_clip
    torch.manual_seed(cfg.train.seed)
    device = torch.device("cuda" if arm == "cuda" else "cpu")
    model = build_model(cfg.model).to(device)  # initialised on the CPU: the same weights in every arm
    schedule = build_schedule(cfg.diffusion)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params, o, device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    if arm in ("cuda", "cpu"):

        def net(*a, **k):
            with torch.autocast(device.type, dtype=dtype):
                return model(*a, **k).float()
    else:
        net = autocast_forward(model, native=arm == "native", dtype=dtype)
    images, _ = embedded_mnist("train")
    gen = torch.Generator().manual_seed(cfg.train.seed)  # the same draws in both arms
    out: dict = {"loss": [], "skipped": [], "seconds": []}
    for step in range(steps):
        x0 = images[torch.randint(len(images), (batch,), generator=gen)]
        t = schedule.sample_t(batch, gen)
        noise = torch.randn(x0.shape, generator=gen)
        x0, t, noise = x0.to(device), t.to(device), noise.to(device)
        for group in opt.param_groups:
            group["lr"] = o.lr * lr_factor(
                step, o.warmup_steps, cfg.train.steps, o.lr_schedule, o.min_lr_ratio
            )
        t0 = time.perf_counter()
        loss = denoising_loss(net, schedule, x0, t, noise).mean()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        gnorm = grad_norm(params)
        finite = bool(torch.isfinite(gnorm))
        if finite and clip > 0:
            torch._foreach_mul_([p.grad for p in params], (clip / (gnorm + 1e-6)).clamp(max=1.0))
        scaler.step(opt)  # skips the update when a gradient is not finite, as the trainer's does
        scaler.update()
        opt.zero_grad(set_to_none=True)
        out["seconds"].append(time.perf_counter() - t0)
        out["loss"].append(loss.item())
        if not finite:
            out["skipped"].append(step + 1)
    out["scale"] = scaler.get_scale() if scaler.is_enabled() else None
    return out


def compare(policy: dict, native: dict) -> dict:
    """How far the two runs' losses lie apart, and whether the scaler skipped the same steps."""
    a, b = policy["loss"], native["loss"]
    finite = [(x, y) for x, y in zip(a, b, strict=True) if math.isfinite(x) and math.isfinite(y)]
    return {
        "max_step_rel": max(abs(x - y) / abs(y) for x, y in finite),
        "median_step_rel": statistics.median(abs(x - y) / abs(y) for x, y in finite),
        "mean_loss_rel": abs(sum(x for x, _ in finite) - sum(y for _, y in finite))
        / abs(sum(y for _, y in finite)),
        "same_skips": policy["skipped"] == native["skipped"],
        "step_s": {
            "policy": statistics.median(policy["seconds"]),
            "native": statistics.median(native["seconds"]),
        },
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p, threads=1)
    p.add_argument("--preset", default="stability", help="the preset whose model, loss and optimizer train")
    p.add_argument("--steps", type=int, default=0, help="steps of each arm (default 100; --quick 20)")
    p.add_argument("--batch", type=int, default=32, help="training batch (the preset's: 32)")
    p.add_argument(
        "--against",
        default="native",
        choices=("native", "cpu", "cuda"),
        help="the reference arm (cpu: torch's CPU autocast; cuda: needs a GPU)",
    )
    p.add_argument(
        "--dtype", default="fp16", choices=("fp16", "bf16"), help="the lower precision of every arm"
    )
    args = p.parse_args(argv)
    device = setup(args)
    if device.type != "cpu":
        p.error(
            "the arms place themselves; for the GPU's own fp16 autocast as the reference use --against cuda"
        )
    if args.against == "cuda" and not torch.cuda.is_available():
        p.error("--against cuda needs a CUDA device")
    steps = args.steps or (20 if args.quick else 100)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    arms = {}
    for name in ("policy", args.against):
        t0 = time.perf_counter()
        arms[name] = run(name, steps, args.batch, args.preset, dtype)
        print(f"{name}: {steps} steps in {time.perf_counter() - t0:.0f} s", flush=True)
    arms["native"] = arms[args.against]  # the reference, under the name the table uses
    c = compare(arms["policy"], arms["native"])
    rows = [
        ["largest relative difference of a step's loss", f"{c['max_step_rel']:.2e}", "≤ 1%"],
        ["median relative difference of a step's loss", f"{c['median_step_rel']:.2e}", ""],
        ["relative difference of the mean loss", f"{c['mean_loss_rel']:.2e}", "≤ 1%"],
        [
            f"steps the scaler skipped: policy / {args.against}",
            f"{arms['policy']['skipped']} / {arms['native']['skipped']}",
            "the same",
        ],  # fmt: skip
        [
            f"final loss scale: policy / {args.against}",
            f"{arms['policy']['scale']} / {arms['native']['scale']}",
            "",
        ],
        [
            f"step s: policy / {args.against}",
            f"{c['step_s']['policy']:.2f} / {c['step_s']['native']:.2f}",
            "",
        ],
    ]
    met = c["max_step_rel"] <= 0.01 and c["mean_loss_rel"] <= 0.01 and c["same_skips"]
    text = markdown_table(
        [
            f"{args.dtype} on the CPU: CUDA's policy in fp32 products vs {args.against} {args.dtype}",
            "value",
            "goal",
        ],
        rows,
    )
    text += (
        f"\n\n{args.preset} preset, batch {args.batch}, {steps} steps, {torch.get_num_threads()} thread(s): "
        f"{'met' if met else 'NOT met'}.\n"
    )
    print(text)
    write_result(
        result_name(
            f"{args.dtype}_faithful",
            device,
            args.quick,
            "" if args.against == "native" else args.against,
        ),
        {
            "args": vars(args),
            "steps": steps,
            "arms": arms,
            "comparison": c,
            "met": met,
            "table": text.strip(),
        },
        text,
    )


if __name__ == "__main__":
    main()
