"""Train a diffusers UNet2DModel from scratch with ScaleLong on its long skips.

The shape of diffusers' ``examples/unconditional_image_generation/train_unconditional.py``
(Accelerate, a DDPMScheduler, AdamW with warm-up, an EMA, checkpoints, a DDPMPipeline at the
end), with the four lines ScaleLong adds to any loop:

* ``apply_scalelong(unet, method, kappa)`` after building the UNet and before the optimizer;
* ``Diagnostics(unet, every=N)``, whose ``arm(step)`` installs its hooks before the forward of a
  logged step and ``collect(step, loss, grad_scale=...)`` reads them after backward, before the
  optimizer step (``grad_scale``: the fp16 loss scale the gradients still carry there, else 1);
* ``RunLog(output_dir)``, which writes ``metrics.jsonl`` as ``scalelong train`` does, so
  ``scalelong analyze OUTPUT_DIR`` draws the hidden-feature norm, gradient oscillation and skip
  coefficients of this run;
* ``save_scalelong(unet, OUTPUT_DIR/unet)`` at the end: diffusers' files plus the method and
  its learned gates, read back by ``load_scalelong(UNet2DModel.from_pretrained(...), ...)``.

Data: the 4,000 real MNIST training digits that ship with scalelong (the default; nothing is
downloaded), or a folder of images in torchvision's ImageFolder layout (``--train-data-dir``).
Loss, learning rate and the diagnostics go to TensorBoard (``OUTPUT_DIR/logs``, Accelerate's
tracker) and to ``OUTPUT_DIR/metrics.jsonl``; ``OUTPUT_DIR/samples.png`` is a grid drawn from
the EMA weights at the end.

    python examples/train_diffusers_unet.py --skip-method cs --output-dir runs/unet-cs
    accelerate launch examples/train_diffusers_unet.py --mixed-precision bf16 --output-dir runs/unet-ls \\
        --skip-method ls --train-data-dir /data/flowers --resolution 64
    scalelong analyze runs/unet-cs
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from scalelong import METHODS, ScaleLongError

# What a checkpoint must share with the command that resumes it: the network and its skips.
RESUME_KEYS = (
    "skip_method",
    "kappa",
    "block_out_channels",
    "layers_per_block",
    "resolution",
    "prediction_type",
)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line and exit 2, not argparse's usage block
        raise ScaleLongError(f"{self.prog}: {message} (see --help)")


def widths(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive widths, got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(prog="train_diffusers_unet.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--output-dir", required=True, help="run folder: metrics.jsonl, logs/, unet/, samples.png")
    p.add_argument(
        "--train-data-dir",
        help="ImageFolder layout (root/<class>/<image>); default: the embedded MNIST digits",
    )
    p.add_argument(
        "--resolution", type=int, default=32, help="images are resized (and centre-cropped) to this"
    )
    p.add_argument("--random-flip", action="store_true", help="random horizontal flips (image folders)")
    # ScaleLong
    p.add_argument("--skip-method", default="cs", choices=METHODS, help="how the long skips are scaled")
    p.add_argument(
        "--kappa", type=float, default=None, help="base of cs: skip i gets kappa**(i-1); default 0.9"
    )
    p.add_argument(
        "--diagnostics-every", type=int, default=50, help="log skip/block statistics every N steps"
    )
    # the network
    p.add_argument("--block-out-channels", type=widths, default=[64, 128, 256, 256])
    p.add_argument("--layers-per-block", type=int, default=2)
    p.add_argument("--norm-num-groups", type=int, default=32)
    # training
    p.add_argument("--train-batch-size", type=int, default=64)
    p.add_argument("--max-train-steps", type=int, default=10_000)
    p.add_argument("--learning-rate", type=float, default=1e-4)
    p.add_argument("--lr-scheduler", default="cosine", help="diffusers' get_scheduler name")
    p.add_argument("--lr-warmup-steps", type=int, default=500)
    p.add_argument("--adam-beta1", type=float, default=0.95)
    p.add_argument("--adam-beta2", type=float, default=0.999)
    p.add_argument("--adam-weight-decay", type=float, default=1e-6)
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="0: no clipping")
    p.add_argument("--prediction-type", default="epsilon", choices=("epsilon", "v_prediction", "sample"))
    p.add_argument("--ddpm-num-steps", type=int, default=1000)
    p.add_argument("--ddpm-beta-schedule", default="linear")
    p.add_argument("--use-ema", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--ema-max-decay", type=float, default=0.9999)
    p.add_argument("--ema-inv-gamma", type=float, default=1.0)
    p.add_argument("--ema-power", type=float, default=3 / 4)
    p.add_argument("--mixed-precision", default="no", choices=("no", "fp16", "bf16"))
    p.add_argument("--dataloader-num-workers", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    # logging, checkpoints, samples
    p.add_argument("--logging-steps", type=int, default=10, help="log loss and lr every N steps")
    p.add_argument("--logger", default="tensorboard", choices=("tensorboard", "wandb", "none"))
    p.add_argument(
        "--save-steps", type=int, default=1000, help="Accelerate checkpoint every N steps; 0: none"
    )
    p.add_argument("--resume-from-checkpoint", help="'latest' or a checkpoint-<step> folder of OUTPUT_DIR")
    p.add_argument("--num-sample-images", type=int, default=16)
    p.add_argument("--sample-steps", type=int, default=1000, help="DDPM steps of the final sample grid")
    args = p.parse_args(argv)
    check_args(args)
    return args


def check_args(args: argparse.Namespace) -> None:
    """The mistakes that need no model to find: one line each, before anything is built."""
    positive = ("resolution", "train_batch_size", "max_train_steps", "layers_per_block", "logging_steps")
    for name in (*positive, "num_sample_images", "sample_steps", "ddpm_num_steps"):
        if getattr(args, name) < 1:
            raise ScaleLongError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("diagnostics_every", "save_steps", "lr_warmup_steps", "dataloader_num_workers"):
        if getattr(args, name) < 0:
            raise ScaleLongError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    levels = len(args.block_out_channels)
    if args.resolution % 2 ** (levels - 1):
        raise ScaleLongError(
            f"--resolution {args.resolution} must be divisible by {2 ** (levels - 1)} "
            f"for {levels} levels of --block-out-channels"
        )
    if args.train_data_dir is not None and not Path(args.train_data_dir).is_dir():
        raise ScaleLongError(f"--train-data-dir {args.train_data_dir} is not a folder")


# ----------------------------------------------------------------------------- data and model


def build_dataset(args: argparse.Namespace):
    """(dataset of (image, label) in [-1, 1], channels): an ImageFolder, or the embedded digits."""
    import torch.nn.functional as F
    from torchvision import datasets, transforms

    from scalelong.data import TensorImages, embedded_mnist

    if args.train_data_dir is None:
        images, labels = embedded_mnist("train")  # (4000, 1, 32, 32) in [-1, 1]
        if args.resolution != images.shape[-1]:
            images = F.interpolate(images, size=args.resolution, mode="bilinear", antialias=True).clamp(-1, 1)
        return TensorImages(images, labels), 1
    steps = [transforms.Resize(args.resolution), transforms.CenterCrop(args.resolution)]
    steps += [transforms.RandomHorizontalFlip()] if args.random_flip else []
    steps += [transforms.ToTensor(), transforms.Normalize([0.5], [0.5])]
    try:
        dataset = datasets.ImageFolder(args.train_data_dir, transform=transforms.Compose(steps))
    except (FileNotFoundError, OSError) as e:
        raise ScaleLongError(
            f"--train-data-dir {args.train_data_dir}: {e} (ImageFolder reads root/<class>/<image>)"
        ) from None
    return dataset, 3


def build_unet(args: argparse.Namespace, channels: int):
    """A fresh UNet2DModel: plain blocks, self-attention at the second-lowest resolution."""
    from diffusers import UNet2DModel

    levels = len(args.block_out_channels)
    down, up = ["DownBlock2D"] * levels, ["UpBlock2D"] * levels
    if levels >= 2:
        down[-2], up[1] = "AttnDownBlock2D", "AttnUpBlock2D"
    try:
        return UNet2DModel(
            sample_size=args.resolution,
            in_channels=channels,
            out_channels=channels,
            layers_per_block=args.layers_per_block,
            block_out_channels=tuple(args.block_out_channels),
            down_block_types=tuple(down),
            up_block_types=tuple(up),
            norm_num_groups=args.norm_num_groups,
        )
    except (ValueError, TypeError) as e:  # e.g. widths that --norm-num-groups does not divide
        raise ScaleLongError(f"UNet2DModel rejects --block-out-channels / --norm-num-groups: {e}") from None


def find_checkpoint(output_dir: Path, which: str) -> Path:
    if which != "latest":
        path = Path(which) if Path(which).is_dir() else output_dir / which
        if not path.is_dir():
            raise ScaleLongError(f"--resume-from-checkpoint {which}: no such checkpoint folder")
        return path
    found = sorted(
        (p for p in output_dir.glob("checkpoint-*") if p.name.split("-")[1].isdigit()),
        key=lambda p: int(p.name.split("-")[1]),
    )
    if not found:
        raise ScaleLongError(
            f"--resume-from-checkpoint latest: {output_dir} holds no checkpoint-<step> folder"
        )
    return found[-1]


def check_resumable(checkpoint: Path, args: argparse.Namespace) -> None:
    try:
        saved = json.loads((checkpoint / "training_args.json").read_text())
    except (OSError, ValueError):
        raise ScaleLongError(
            f"{checkpoint} holds no readable training_args.json; resume another one"
        ) from None
    differ = [k for k in RESUME_KEYS if saved.get(k) != vars(args)[k]]
    if differ:
        got = ", ".join(f"--{k.replace('_', '-')} {saved.get(k)} (now {vars(args)[k]})" for k in differ)
        raise ScaleLongError(f"{checkpoint} was trained with {got}; resume with the same settings")


def describe_skips(scaling) -> str:
    """``ScaleLong cs: 4 long skips, coefficients 1, 0.9, 0.81, 0.729`` (or ``learned`` for ls)."""
    coefs = scaling.coefficients()  # None where a gate learns it
    shown = "learned" if None in coefs else "coefficients " + ", ".join(f"{c:.3g}" for c in coefs)
    return f"ScaleLong {scaling.method}: {scaling.num_skips} long skips, {shown}"


def infinite(loader):
    while True:
        yield from loader


# ----------------------------------------------------------------------------- training


def train(args: argparse.Namespace) -> None:
    out = Path(args.output_dir)
    checkpoint = None
    if args.resume_from_checkpoint:  # a checkpoint of other settings is refused before anything is built
        checkpoint = find_checkpoint(out, args.resume_from_checkpoint)
        check_resumable(checkpoint, args)

    import torch
    import torch.nn.functional as F
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed
    from diffusers import DDPMScheduler, UNet2DModel
    from diffusers.optimization import get_scheduler
    from diffusers.training_utils import EMAModel
    from tqdm.auto import tqdm

    from scalelong import Diagnostics, RunLog, apply_scalelong

    try:
        accelerator = Accelerator(
            mixed_precision=args.mixed_precision,
            log_with=None if args.logger == "none" else args.logger,
            project_config=ProjectConfiguration(project_dir=str(out), logging_dir=str(out / "logs")),
        )
    except ValueError as e:  # e.g. fp16 without a GPU
        raise ScaleLongError(f"Accelerate: {e}") from None
    set_seed(args.seed)
    dataset, channels = build_dataset(args)
    if len(dataset) < args.train_batch_size:
        raise ScaleLongError(f"the data holds {len(dataset)} images, fewer than --train-batch-size")
    loader = torch.utils.data.DataLoader(
        dataset, args.train_batch_size, shuffle=True, drop_last=True, num_workers=args.dataloader_num_workers
    )

    unet = build_unet(args, channels)
    apply_scalelong(unet, method=args.skip_method, kappa=args.kappa)  # before the optimizer: ls adds gates
    accelerator.print(describe_skips(unet.scalelong))
    noise_scheduler = DDPMScheduler(
        num_train_timesteps=args.ddpm_num_steps,
        beta_schedule=args.ddpm_beta_schedule,
        prediction_type=args.prediction_type,
    )
    optimizer = torch.optim.AdamW(
        unet.parameters(),
        lr=args.learning_rate,
        betas=(args.adam_beta1, args.adam_beta2),
        weight_decay=args.adam_weight_decay,
    )
    try:  # a prepared scheduler steps once per process, hence the factors (as in diffusers' examples)
        lr_scheduler = get_scheduler(
            args.lr_scheduler,
            optimizer,
            num_warmup_steps=args.lr_warmup_steps * accelerator.num_processes,
            num_training_steps=args.max_train_steps * accelerator.num_processes,
        )
    except ValueError as e:
        raise ScaleLongError(f"--lr-scheduler {args.lr_scheduler}: {e}") from None
    ema = None
    if args.use_ema:  # after apply_scalelong too: its shadow parameters include the gates
        ema = EMAModel(
            unet.parameters(),
            decay=args.ema_max_decay,
            use_ema_warmup=True,
            inv_gamma=args.ema_inv_gamma,
            power=args.ema_power,
            model_cls=UNet2DModel,
            model_config=unet.config,
        )
        ema.to(accelerator.device)
        accelerator.register_for_checkpointing(ema)
    unet, optimizer, loader, lr_scheduler = accelerator.prepare(unet, optimizer, loader, lr_scheduler)
    model = accelerator.unwrap_model(unet)  # the diagnostics and the saved files see the plain UNet

    global_step = 0
    if checkpoint is not None:
        accelerator.load_state(str(checkpoint))  # weights and gates, optimizer, lr, EMA, RNG
        global_step = int(checkpoint.name.split("-")[1])
        accelerator.print(f"resumed from {checkpoint} at step {global_step}")

    # Every process arms and reads the hooks (the gradients are the all-reduced ones); one writes.
    diag = Diagnostics(model, every=args.diagnostics_every)  # listens from here on
    if args.logger != "none":
        accelerator.init_trackers("train_diffusers_unet")
    batches = infinite(loader)
    bar = tqdm(total=args.max_train_steps, initial=global_step, disable=not accelerator.is_local_main_process)
    log = RunLog(out, start_step=global_step) if accelerator.is_main_process else None  # holds the lock
    try:
        while global_step < args.max_train_steps:
            step = global_step + 1
            x0 = next(batches)[0]
            noise = torch.randn_like(x0)
            t = torch.randint(0, args.ddpm_num_steps, (x0.shape[0],), device=x0.device)
            noisy = noise_scheduler.add_noise(x0, noise, t)
            target = {
                "epsilon": noise,
                "v_prediction": noise_scheduler.get_velocity(x0, noise, t),
                "sample": x0,
            }[args.prediction_type]
            logged = diag.arm(step)  # True on logged steps: hooks for this forward
            loss = F.mse_loss(unet(noisy, t).sample.float(), target.float())
            accelerator.backward(loss)  # under fp16: (loss * the GradScaler's scale).backward()
            # The gradients still carry that scale here (clip_grad_norm_ unscales them next), so the
            # diagnostics divide it out of their gradient norms; 1 without a scaler (bf16, fp32).
            grad_scale = accelerator.scaler.get_scale() if logged and accelerator.scaler is not None else 1.0
            record = diag.collect(step, loss.item(), grad_scale=grad_scale)  # before step; {} if not armed
            if args.max_grad_norm > 0:
                accelerator.clip_grad_norm_(unet.parameters(), args.max_grad_norm)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            if ema is not None:
                ema.step(unet.parameters())
            global_step = step
            bar.update(1)

            if step % args.logging_steps == 0 or logged:
                mean_loss = accelerator.reduce(loss.detach(), "mean").item()  # every process takes part
                lr = lr_scheduler.get_last_lr()[0]
                extra = {**record, **({"ema_decay": ema.cur_decay_value} if ema is not None else {})}
                accelerator.log({"loss": mean_loss, "lr": lr, **extra}, step=step)  # TensorBoard
                if log is not None:
                    log.write(step, extra, loss=mean_loss, lr=lr)  # metrics.jsonl, for scalelong analyze
                bar.set_postfix(loss=f"{mean_loss:.4f}")
            if args.save_steps and step % args.save_steps == 0:
                path = out / f"checkpoint-{step}"
                accelerator.save_state(str(path))
                if accelerator.is_main_process:
                    (path / "training_args.json").write_text(json.dumps(vars(args), indent=1))
        bar.close()
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            finish(args, model, ema, noise_scheduler, accelerator.device)
    finally:
        diag.detach()
        if log is not None:
            log.close()
        accelerator.end_training()


def finish(args: argparse.Namespace, model, ema, noise_scheduler, device) -> None:
    """Save the EMA weights (diffusers' files + ScaleLong's) and draw the sample grid from them."""
    import torch
    from diffusers import DDPMPipeline
    from torchvision.utils import save_image

    from scalelong import save_scalelong

    out = Path(args.output_dir)
    model.eval()
    if ema is not None:
        ema.copy_to(model.parameters())  # the gates' EMA too: they are parameters of the UNet
    save_scalelong(model, out / "unet")
    noise_scheduler.save_pretrained(out / "scheduler")
    pipeline = DDPMPipeline(unet=model, scheduler=noise_scheduler).to(device)
    pipeline.set_progress_bar_config(disable=True)
    generator = torch.Generator().manual_seed(args.seed)
    images = pipeline(
        batch_size=args.num_sample_images,
        generator=generator,
        num_inference_steps=args.sample_steps,
        output_type="np",
    ).images  # (N, H, W, C) in [0, 1]
    grid = torch.from_numpy(images).permute(0, 3, 1, 2)
    save_image(grid, out / "samples.png", nrow=math.ceil(math.sqrt(len(grid))))
    print(f"saved {out / 'unet'} (load_scalelong) and {out / 'samples.png'}")
    print(f"plots: scalelong analyze {out}")


def main(argv: list[str] | None = None) -> int:
    try:
        train(parse_args(argv))
    except ScaleLongError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
