"""Train scalelong's U-ViT on the embedded MNIST digits in a plain PyTorch loop (no Accelerate).

Everything a training loop needs is written out here in a few lines each, so it can be copied
into a loop of your own: the DDPM epsilon-prediction loss, warm-up, gradient clipping, an EMA
made by ``copy.deepcopy``, safetensors checkpoints that resume exactly, and a DDIM sample grid.
ScaleLong itself is one argument of the model, ``UViT(..., skip_method="cs", kappa=0.5)``; the
diagnostics are two calls per step (``Diagnostics.arm`` before the forward, ``collect`` after
backward) and ``RunLog`` writes ``OUTPUT_DIR/metrics.jsonl`` as ``scalelong train`` does, so
``scalelong analyze OUTPUT_DIR`` draws this run's plots. The warm-up and the EMA are the
trainer's own (``scalelong.optim``, which imports nothing of the trainer).

    python examples/train_uvit_plain.py --skip-method cs --output-dir runs/uvit-cs
    python examples/train_uvit_plain.py --skip-method cs --output-dir runs/uvit-cs \
        --max-train-steps 6000 --resume                     # continues from the newest checkpoint
    scalelong analyze runs/uvit-cs

Data order and noise follow from ``--seed`` and the step alone, so a resumed run trains exactly as
one that was never stopped (on the CPU, bit for bit).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from pathlib import Path

from scalelong import METHODS, ScaleLongError

NUM_STEPS = 1000  # DDPM's chain, with its linear betas from 1e-4 to 0.02


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line and exit 2, not argparse's usage block
        raise ScaleLongError(f"{self.prog}: {message} (see --help)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(prog="train_uvit_plain.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--output-dir", required=True, help="run folder: metrics.jsonl, checkpoints/, samples.png")
    p.add_argument("--skip-method", default="cs", choices=METHODS, help="how the long skips are scaled")
    p.add_argument("--kappa", type=float, default=0.5, help="base of cs: skip i gets kappa**(i-1)")
    p.add_argument("--img-size", type=int, default=32, help="the 32x32 digits are resized to this")
    p.add_argument("--patch-size", type=int, default=4)
    p.add_argument("--embed-dim", type=int, default=64)
    p.add_argument("--depth", type=int, default=12, help="transformer blocks; depth // 2 long skips")
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-train-steps", type=int, default=3000)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--warmup-steps", type=int, default=100)
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="0: no clipping")
    p.add_argument("--ema-decay", type=float, default=0.999)
    p.add_argument(
        "--diagnostics-every", type=int, default=50, help="log skip/block statistics every N steps"
    )
    p.add_argument("--logging-steps", type=int, default=10, help="log loss and lr every N steps")
    p.add_argument(
        "--tensorboard", action="store_true", help="also write TensorBoard events to OUTPUT_DIR/tb"
    )
    p.add_argument("--save-steps", type=int, default=500, help="checkpoint every N steps (and at the end)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint of OUTPUT_DIR")
    p.add_argument("--num-sample-images", type=int, default=64)
    p.add_argument("--sample-steps", type=int, default=50, help="DDIM steps of the final sample grid")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = p.parse_args(argv)
    positive = ("img_size", "patch_size", "embed_dim", "depth", "num_heads", "batch_size", "max_train_steps")
    for name in (*positive, "save_steps", "logging_steps", "num_sample_images", "sample_steps"):
        if getattr(args, name) < 1:
            raise ScaleLongError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.diagnostics_every < 0 or args.warmup_steps < 0:
        raise ScaleLongError("--diagnostics-every and --warmup-steps must be >= 0")
    if args.img_size % args.patch_size:
        raise ScaleLongError(
            f"--img-size {args.img_size} must be divisible by --patch-size {args.patch_size}"
        )
    if args.embed_dim % args.num_heads:
        raise ScaleLongError(
            f"--embed-dim {args.embed_dim} must be divisible by --num-heads {args.num_heads}"
        )
    if args.depth < 2:
        raise ScaleLongError(f"--depth {args.depth} leaves no long skip; use 2 or more")
    if not 0 <= args.ema_decay < 1:
        raise ScaleLongError(f"--ema-decay must be in [0, 1), got {args.ema_decay}")
    return args


def model_kwargs(args: argparse.Namespace) -> dict:
    """The ``UViT`` arguments, stored with every checkpoint so a resume or a reader rebuilds it."""
    return dict(
        img_size=args.img_size,
        patch_size=args.patch_size,
        in_channels=1,
        embed_dim=args.embed_dim,
        depth=args.depth,
        num_heads=args.num_heads,
        skip_method=args.skip_method,
        kappa=args.kappa,
    )


def build_model(kwargs: dict):
    """The U-ViT, checked with one forward pass so a bad shape is one line now, not a traceback later."""
    import torch

    from scalelong import UViT

    x = torch.zeros(1, 1, kwargs["img_size"], kwargs["img_size"])
    try:
        model = UViT(**kwargs)
        with torch.no_grad():
            if model(x, torch.zeros(1)).shape != x.shape:
                raise ValueError("its output does not have the input's shape")
    except ScaleLongError:
        raise
    except (ValueError, RuntimeError, AssertionError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        advice = "check --img-size, --patch-size, --embed-dim and --num-heads"
        raise ScaleLongError(f"UViT rejects these sizes ({first}); {advice}") from None
    return model


# ----------------------------------------------------------------------------- checkpoints


def save_checkpoint(folder: Path, step: int, model, ema, opt, diag, kwargs: dict) -> Path:
    """``checkpoints/step-XXXXXX/``: weights and EMA as safetensors, the optimizer, the step, the model's
    arguments and the diagnostics' sliding windows. Written to a temporary folder and renamed, so a
    kill never leaves half a checkpoint."""
    import torch
    from safetensors.torch import save_file

    final = folder / f"step-{step:06d}"
    tmp = folder / f".tmp-step-{step:06d}"
    tmp.mkdir(parents=True, exist_ok=True)
    save_file(model.state_dict(), tmp / "model.safetensors")
    save_file(ema.state_dict(), tmp / "ema.safetensors")
    torch.save(opt.state_dict(), tmp / "optimizer.pt")
    state = {"step": step, "model": kwargs, "diagnostics": diag.state_dict()}
    (tmp / "state.json").write_text(json.dumps(state, indent=1))
    if final.exists():  # the same step written again (a rerun): replace it
        import shutil

        shutil.rmtree(final)
    tmp.rename(final)
    return final


def load_checkpoint(folder: Path, model, ema, opt, diag, kwargs: dict) -> int:
    """Restore the newest checkpoint of ``folder`` into model, EMA, optimizer and diagnostics; return
    its step."""
    import torch
    from safetensors.torch import load_file

    found = sorted(folder.glob("step-*"))
    if not found:
        raise ScaleLongError(f"--resume: {folder} holds no checkpoint; drop --resume to start afresh")
    path = found[-1]
    state = json.loads((path / "state.json").read_text())
    if state["model"] != kwargs:
        differ = ", ".join(
            f"{k} {state['model'].get(k)} (now {v})" for k, v in kwargs.items() if state["model"].get(k) != v
        )
        raise ScaleLongError(f"{path} holds a model with {differ}; resume with the same model arguments")
    model.load_state_dict(load_file(path / "model.safetensors"))
    ema.load_state_dict(load_file(path / "ema.safetensors"))
    opt.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    diag.load_state_dict(state["diagnostics"])
    return int(state["step"])


# ----------------------------------------------------------------------------- diffusion, in a few lines


def ddpm_loss(model, x0, alpha_bar, gen):
    """Epsilon prediction: ||eps - model(sqrt(a) x0 + sqrt(1 - a) eps, t)||^2, t uniform in the chain."""
    import torch
    import torch.nn.functional as F

    t = torch.randint(0, NUM_STEPS, (x0.shape[0],), generator=gen)
    noise = torch.randn(x0.shape, generator=gen).to(x0.device)
    a = alpha_bar[t].view(-1, 1, 1, 1).to(x0.device)
    return F.mse_loss(model(a.sqrt() * x0 + (1 - a).sqrt() * noise, t.float().to(x0.device)), noise)


def ddim_sample(model, alpha_bar, n: int, size: int, steps: int, seed: int, device):
    """Deterministic DDIM (eta = 0) from pure noise to images in [-1, 1]."""
    import torch

    x = torch.randn((n, 1, size, size), generator=torch.Generator().manual_seed(seed)).to(device)
    ts = torch.linspace(NUM_STEPS - 1, 0, steps).round().long()
    alpha_bar = alpha_bar.to(device)
    with torch.no_grad():
        for i, t in enumerate(ts):
            a = alpha_bar[t]
            a_next = alpha_bar[ts[i + 1]] if i + 1 < len(ts) else torch.ones((), device=device)
            eps = model(x, torch.full((n,), float(t), device=device))
            x0 = ((x - (1 - a).sqrt() * eps) / a.sqrt()).clamp(-1, 1)
            x = a_next.sqrt() * x0 + (1 - a_next).sqrt() * eps
    return x.clamp(-1, 1)


# ----------------------------------------------------------------------------- training


def train(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file
    from torchvision.utils import save_image

    from scalelong import Diagnostics, RunLog
    from scalelong.data import embedded_mnist
    from scalelong.optim import ema_update, lr_factor

    if args.device == "cuda" and not torch.cuda.is_available():
        raise ScaleLongError("--device cuda but no CUDA device is available; use --device auto")
    device = torch.device("cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu")
    out = Path(args.output_dir)
    if not args.resume and any((out / "checkpoints").glob("step-*")):
        raise ScaleLongError(
            f"{out} holds checkpoints: pass --resume to continue, or choose another --output-dir"
        )
    images, _ = embedded_mnist("train")  # the 4,000 real training digits, (N, 1, 32, 32) in [-1, 1]
    if args.img_size != images.shape[-1]:
        images = F.interpolate(images, size=args.img_size, mode="bilinear", antialias=True).clamp(-1, 1)
    alpha_bar = torch.cumprod(1 - torch.linspace(1e-4, 0.02, NUM_STEPS, dtype=torch.float64), 0).float()

    kwargs = model_kwargs(args)
    torch.manual_seed(args.seed)
    model = build_model(kwargs).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)  # after the model: ls gates too
    ema = copy.deepcopy(model).requires_grad_(False)  # its own copy of the skip gates
    diag = Diagnostics(model, every=args.diagnostics_every)  # listens from here on
    step = load_checkpoint(out / "checkpoints", model, ema, opt, diag, kwargs) if args.resume else 0
    if step >= args.max_train_steps:
        raise ScaleLongError(f"the checkpoint is at step {step}; raise --max-train-steps to train on")
    with RunLog(out, start_step=step, tensorboard=args.tensorboard) as log:  # holds the folder's lock
        size = sum(p.numel() for p in model.parameters())
        skips = model.skip_scaling.num_skips
        print(
            f"U-ViT, {size:,} parameters, {args.skip_method} on {skips} long skips, "
            f"from step {step} to {args.max_train_steps}"
        )
        while step < args.max_train_steps:
            step += 1
            gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step)  # this step's batch and noise
            x0 = images[torch.randint(len(images), (args.batch_size,), generator=gen)].to(device)
            lr = args.learning_rate * lr_factor(
                step - 1, args.warmup_steps, args.max_train_steps, "constant", 0.0
            )
            for group in opt.param_groups:
                group["lr"] = lr
            logged = diag.arm(step)  # True on logged steps: hooks for this forward
            loss = ddpm_loss(model, x0, alpha_bar, gen)
            loss.backward()
            record = diag.collect(step, loss.item())  # after backward, before step; {} if not armed
            if args.max_grad_norm > 0:
                record["grad_norm"] = torch.nn.utils.clip_grad_norm_(
                    model.parameters(), args.max_grad_norm
                ).item()
            opt.step()
            opt.zero_grad(set_to_none=True)
            ema_update(ema, model, args.ema_decay)  # ema <- decay * ema + (1 - decay) * model
            if logged or step % args.logging_steps == 0:
                log.write(step, record, loss=loss.item(), lr=lr)
            if step % args.save_steps == 0 or step == args.max_train_steps:
                save_checkpoint(out / "checkpoints", step, model, ema, opt, diag, kwargs)
        diag.detach()

        # The EMA weights on their own, with the arguments that rebuild the model, then a grid.
        save_file(ema.state_dict(), out / "ema.safetensors")
        (out / "model_args.json").write_text(json.dumps(kwargs, indent=1))
        ema.eval()
        samples = ddim_sample(
            ema, alpha_bar, args.num_sample_images, args.img_size, args.sample_steps, args.seed, device
        )
        save_image((samples + 1) / 2, out / "samples.png", nrow=math.ceil(math.sqrt(len(samples))))
        if args.img_size == 32:  # the FD-MNIST classifier reads 32x32 digits
            from scalelong.metrics.fd_mnist import digit_score, format_digit_score

            score = digit_score(samples.cpu())
            log.write(step, {"digits/confident": score["confident"], "digits/entropy": score["entropy"]})
            print(f"digits: {format_digit_score(score)} ({len(samples)} samples)")
    print(f"wrote {out / 'samples.png'} and {out / 'ema.safetensors'}; plots: scalelong analyze {out}")


def main(argv: list[str] | None = None) -> int:
    try:
        train(parse_args(argv))
    except ScaleLongError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
