"""The trainer: AdamW with warm-up, EMA, mixed precision, a non-finite policy, atomic checkpoints
with exact resume, metrics, sample grids.

Device placement and processes go through Hugging Face Accelerate (:mod:`scalelong.training.launch`):
the same code runs on one CPU, one GPU, several GPUs or nodes (``scalelong train
--num-processes N`` or ``accelerate launch -m scalelong.cli train ...``). ``train.batch_size``
is the global batch of one optimizer step; each process takes its slice of it and runs it in
``train.grad_accum`` micro-batches, accumulating their gradients (synchronised across processes
once, after the last). The run's files go to its run directory (:class:`scalelong.training.runs.RunDir`).

Determinism: one seed drives model initialisation, data order (:class:`EpochBatches`) and the
noise. Flips, times and noise are drawn for the whole global batch from one generator that
every process advances alike, and each process and micro-batch takes its slice, so a run gives
the same result on any number of processes and any ``train.grad_accum`` (up to float summation
order; dropout masks come from each process's own generator) and, on the CPU, identical weights
twice.

Resume: re-running the same command continues a run directory from its newest checkpoint that
verifies and loads (``--resume`` insists on one). A different config in an existing run
directory is an error; only :data:`scalelong.training.runs.RESUME_FREE_KEYS` (run length, logging,
sampling) may change. The main process holds the run's lock from before it looks at the folder
until it exits, so a second trainer on the same run is refused.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import math
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn
from torch.utils.data import DataLoader

from scalelong.data import EpochBatches
from scalelong.diagnostics import Diagnostics
from scalelong.diagnostics.overflow import FP16_MAX, locate_overflow
from scalelong.diffusion import denoising_loss, input_free_loss
from scalelong.errors import ScaleLongError, first_line
from scalelong.fp16 import autocast_forward
from scalelong.models import conditioning
from scalelong.optim import ema_update, lr_factor
from scalelong.runlog.provenance import PRECISION_NAMES, provenance
from scalelong.runlog.tracking import Tracker
from scalelong.sampling import generate
from scalelong.training.build import (
    build_dataset,
    build_model,
    build_schedule,
    check_data_fits_model,
    count_parameters,
    model_input_shape,
)
from scalelong.training.checkpoint import (
    DamagedCheckpoint,
    check_resume_precision,
    load_newest,
    load_state,
    load_training_state,
    save_checkpoint,
)
from scalelong.training.config import Config, config_to_dict, save_config
from scalelong.training.evaluation import NoiseLevelProbe, TrainingEvaluator
from scalelong.training.launch import (
    gpu_autocast_dtype,
    make_accelerator,
    on_main_process,
    resolve_precision,
    sigterm_as_interrupt,
)
from scalelong.training.runs import RunDir

# Hooks a caller passes in (extensions, and tests: a forced NaN loss, a run that waits to be
# killed), never config keys. ``step`` counts completed steps, 1-based.
# Extra metrics of a step: a non-empty dict is merged into (or becomes) the record of that step.
MetricHook = Callable[[int, "Trainer"], dict]
# The loss of a step (of each micro-batch with train.grad_accum > 1), before backward: returns
# the loss to backpropagate.
LossHook = Callable[[int, torch.Tensor], torch.Tensor]
# After a step, its log record, checkpoint and sample grid.
StepHook = Callable[[int, "Trainer"], None]


@dataclass
class TrainState:
    """The trainer's counters and the cause of its last skipped step: with the weights, optimizer,
    scaler, noise generator and RNG states, what a resume restores. Each field is listed once;
    trainer.pt keeps ``step`` and ``counters`` (the rest)."""

    step: int = 0  # optimizer steps done, skipped ones included
    nonfinite_total: int = 0  # steps skipped for a non-finite loss or gradient
    nonfinite_streak: int = 0  # ... of them in a row, up to now
    overflow_total: int = 0  # fp16 steps whose update the loss scaler skipped
    last_skipped: str = ""  # why the last skipped step was skipped (Trainer.locate), kept across resumes

    def state_dict(self) -> dict:
        counters = dataclasses.asdict(self)
        return {"step": counters.pop("step"), "counters": counters}

    def load_state_dict(self, state: dict) -> None:
        for name, value in {"step": state["step"], **state["counters"]}.items():
            setattr(self, name, value)


def what_to_try(cause: str) -> str:
    """What to change after a run stopped on non-finite steps, by the cause of the last one
    (:meth:`Trainer.locate`): an fp16 overflow in forward fits in bf16's range, and one at a long
    skip's merge is what a LayerNorm after each merge bounded in the fp16 lr basin."""
    if not cause.startswith("fp16 overflow in forward"):
        return "lower optim.lr, set train.grad_clip or use train.mixed_precision=no"
    said = "lower optim.lr, or train in bf16 (train.mixed_precision=bf16, fp32's range)"
    if ".skip_linear " in cause:  # the merge of a long skip into the decoder stream
        said += (
            "; at a long skip's merge, model.skip.method=merge-norm (a LayerNorm after each merge) "
            "kept fp16 training alive where plain skips overflowed (docs/studies.md, the basin in fp16)"
        )
    return said


class Draws(NamedTuple):
    """The random draws of one step, for this process's slice of the global batch."""

    flip: torch.Tensor  # (B,) bool: flip the image horizontally (used when data.hflip)
    t: torch.Tensor  # (B,) times
    noise: torch.Tensor  # (B, C, H, W)
    drop_caption: torch.Tensor | None  # (B,) bool: use the empty caption; None unless text data

    def part(self, rows: slice) -> Draws:
        """The draws of the samples ``rows`` (a micro-batch)."""
        return Draws(*(None if x is None else x[rows] for x in self))


class TrainingStopped(ScaleLongError):
    """The non-finite policy ended a run early (``train.max_nonfinite_steps`` in a row).

    A result of the run rather than a mistake: the run directory keeps its last good checkpoint
    and a summary.json with status "stopped" whose ``stopped`` entry records ``step``, ``kind``
    and ``cause`` (where the last skipped step went non-finite: :meth:`Trainer.locate`). The
    command line still reports it as one line with exit code 2; studies (``scalelong compare``,
    ``sweep``) record it and go on with the other runs.
    """

    def __init__(self, message: str, step: int, kind: str = "nonfinite", cause: str = ""):
        super().__init__(message)
        self.step, self.kind, self.cause = step, kind, cause

    def __reduce__(self):  # pickles whole across worker processes
        return type(self), (str(self), self.step, self.kind, self.cause)


class TrainingInterrupted(ScaleLongError):
    """Ctrl-C or SIGTERM ended a run; the run directory holds its last complete checkpoint."""


@dataclass
class RunResult:
    run_dir: Path
    final_loss: float
    checkpoint: Path
    samples: Path | None


# ----------------------------------------------------------------------------- small pieces


def make_optimizer(params, o, device: torch.device) -> torch.optim.AdamW:
    """AdamW of ``optim`` (:class:`~scalelong.training.config.OptimConfig`) with the kernel it names; a torch
    without a fused AdamW for ``device`` falls back to the default kernel with one line."""
    kernel = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[o.implementation]
    params = list(params)
    make = functools.partial(
        torch.optim.AdamW, params, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay
    )
    try:
        return make(**kernel)
    except (RuntimeError, TypeError) as e:  # e.g. "`fused=True` requires all the params to be ..."
        print(f"warning: optim.implementation={o.implementation} is not available on {device.type} "
              f"({first_line(e, limit=200)}); using torch's default AdamW")  # fmt: skip
        return make()


def _is_compile_failure(e: BaseException) -> bool:
    """Whether ``e`` came out of torch.compile's machinery (dynamo or inductor), not out of the model."""
    mod = type(e).__module__ or ""
    return mod.startswith(("torch._dynamo", "torch._inductor")) or "InductorError" in type(e).__name__


def grad_norm(params: list[torch.Tensor]) -> torch.Tensor:
    """Global L2 norm of the gradients (inf or nan when any gradient is)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))


def save_grid(images: torch.Tensor, path: Path) -> torch.Tensor:
    """Save images in [-1, 1] as a PNG grid; return the grid (3, H, W) in [0, 1]."""
    from torchvision.utils import make_grid, save_image

    path.parent.mkdir(parents=True, exist_ok=True)
    grid = make_grid((images.float().cpu() + 1) / 2, nrow=int(len(images) ** 0.5) or 1)
    save_image(grid, path)
    return grid


@torch.no_grad()
def sample_images(model: nn.Module, cfg: Config, n: int, device: torch.device, seed: int) -> torch.Tensor:
    """Draw ``n`` images with the config's sampler; labels cycle through the classes."""
    labels = torch.arange(n) % max(getattr(model, "num_classes", 0) or 0, 1)
    seeds = [seed * 100_003 + i for i in range(n)]
    schedule = build_schedule(cfg.diffusion)
    shape = model_input_shape(cfg.model)
    return generate(model, schedule, cfg.sample.sampler, cfg.sample.steps, seeds, shape, labels, device)


def micro_batch_size(global_batch: int, processes: int, grad_accum: int) -> int:
    """Images one process runs at a time: ``global_batch / (processes * grad_accum)``."""
    parts = processes * grad_accum
    if global_batch % parts:
        raise ScaleLongError(
            f"train.batch_size={global_batch} must be divisible by {processes} process(es) x "
            f"train.grad_accum={grad_accum} = {parts}; change the batch size or train.grad_accum"
        )
    return global_batch // parts


def next_batch(batches: Iterator) -> tuple[torch.Tensor, torch.Tensor]:
    """The next batch; a loader worker's error becomes one line again."""
    try:
        return next(batches)
    except ScaleLongError as e:
        # A DataLoader worker re-raises our error with its traceback folded into the message.
        message = str(e).strip().splitlines()[-1].split("ScaleLongError: ", 1)[-1]
        # The re-raised error and its traceback form a cycle that keeps the loader alive until
        # a garbage collection, which closes its queues first and then waits 5 s for each worker.
        e.__traceback__ = None
    raise ScaleLongError(message)  # outside the handler: no traceback into the loader's frames


# ----------------------------------------------------------------------------- the trainer


class Trainer:
    """One training run: model, EMA, optimizer, data, noise, counters; ``fit`` runs it.

    Only the main process writes files. Everything a resume restores is in :meth:`state_dict` /
    :meth:`load_state_dict` (trainer.pt) and :meth:`save` / :meth:`load_checkpoint` (the rest).
    ``metric_hooks``, ``loss_hooks`` and ``step_hooks`` (see :data:`MetricHook`) are lists a caller
    may extend.
    """

    def __init__(self, cfg: Config, accelerator, run_dir: str | Path):
        self.cfg, self.acc, self.run = cfg, accelerator, RunDir(run_dir)
        t = cfg.train
        self.micro_batch = micro_batch_size(t.batch_size, accelerator.num_processes, t.grad_accum)
        self.dataset = build_dataset(cfg.data)
        check_data_fits_model(cfg, self.dataset, accelerator.num_processes)  # before any file is written
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg.model)
        self.ema = copy.deepcopy(model).requires_grad_(False).to(accelerator.device)
        self.schedule = build_schedule(cfg.diffusion)
        optimizer = make_optimizer(model.parameters(), cfg.optim, accelerator.device)
        # DDP copies the gradient of a depthwise conv weight (mlp_conv: shape (C, 1, 3, 3), whose
        # strides are ambiguous along the axis of size 1) into its bucket and warns once per
        # process; the copy is correct and costs nothing measurable at this size.
        warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
        self.model, self.optimizer = accelerator.prepare(model, optimizer)
        # train.compile: a compiled view of the prepared model, used for the training forward only.
        # It shares the parameters; state_dict, EMA (copied above), checkpoints and sampling keep
        # using the eager module, and diagnostic steps run eager so their hooks and the skip probe
        # never cause a recompile (benchmarks/train_step.py measures compile time and speed).
        self.compiled = torch.compile(self.model) if cfg.train.compile else None
        # train.mixed_precision=fp16 on the CPU (and bf16 on a CPU without bf16 units): Accelerate runs
        # fp32 (make_accelerator), and the trainer does what Accelerate does with a GPU: the forward
        # under CUDA's autocast policy (scalelong.fp16, computed in fp32 on fp16 or bf16 values) with
        # fp32 outputs, and in fp16 a loss scaler.
        asked = resolve_precision(str(cfg.train.mixed_precision), accelerator.device)
        self.cpu_autocast = gpu_autocast_dtype(asked, accelerator.device)
        self.cpu_fp16 = self.cpu_autocast == torch.float16
        self.scaler = torch.amp.GradScaler("cpu") if self.cpu_fp16 else accelerator.scaler
        # what the run computes in
        self.precision = asked if self.cpu_autocast else accelerator.mixed_precision
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        # One generator for the whole global batch, advanced alike on every process.
        self.noise_gen = torch.Generator().manual_seed(cfg.train.seed)
        self.state = TrainState()
        self.metric_hooks: list[MetricHook] = []
        self.loss_hooks: list[LossHook] = []
        self.step_hooks: list[StepHook] = []
        d = cfg.diagnostics
        # Hooks are armed only on diagnostic steps; other steps run no diagnostic code at all.
        self.diagnostics = (
            Diagnostics(self.unwrapped, d.every, d.window, d.spike_factor) if d.every > 0 else None
        )
        self.diag_metrics: dict = {}
        # Text data: captions replaced by the empty caption at this rate (classifier-free guidance).
        self.null_context = getattr(self.dataset, "null_context", None)
        self.caption_dropout = cfg.t2i.caption_dropout if self.null_context is not None else 0.0
        self.evaluator = None
        if cfg.eval.every > 0:
            # Built now so a bad reference path fails before any training. Every process samples its
            # share of each evaluation; the main process computes the distance.
            self.evaluator = TrainingEvaluator(cfg, self.run, accelerator.device, accelerator)
        self.noise_probe = None
        if cfg.diagnostics.noise_levels > 0 and accelerator.is_main_process:
            self.noise_probe = NoiseLevelProbe(cfg, accelerator.device)

    def lr_at(self, step: int) -> float:
        """Learning rate of the update that follows ``step`` completed steps."""
        o = self.cfg.optim
        return o.lr * lr_factor(step, o.warmup_steps, self.cfg.train.steps, o.lr_schedule, o.min_lr_ratio)

    @property
    def step(self) -> int:
        return self.state.step

    @property
    def lr(self) -> float:
        return self.lr_at(self.step)

    @property
    def unwrapped(self) -> nn.Module:
        return self.acc.unwrap_model(self.model)

    # --- data and noise

    def batches(self) -> Iterator:
        """Endless local batches from the current step on (the order follows from the step alone)."""
        sampler = EpochBatches(
            len(self.dataset),
            self.cfg.train.batch_size,
            self.cfg.train.seed,
            rank=self.acc.process_index,
            world_size=self.acc.num_processes,
            start_step=self.step,
        )
        workers = self.cfg.data.num_workers
        loader = DataLoader(
            self.dataset,
            batch_sampler=sampler,
            num_workers=workers,
            pin_memory=self.acc.device.type == "cuda",
            persistent_workers=workers > 0,
            prefetch_factor=4 if workers > 0 else None,
        )
        return iter(loader)

    def draws(self, local_shape: torch.Size) -> Draws:
        """This step's draws for this process's slice of the global batch (drawn on the CPU for the
        whole global batch, so every process advances the generator alike)."""
        g, n = self.noise_gen, self.cfg.train.batch_size
        flip = torch.rand(n, generator=g) < 0.5
        t = self.schedule.sample_t(n, g)
        noise = torch.randn((n, *local_shape[1:]), generator=g)
        drop = None
        if self.caption_dropout > 0:  # drawn only for text data, so other runs keep their streams
            drop = torch.rand(n, generator=g) < self.caption_dropout
        lo = self.acc.process_index * local_shape[0]
        mine = slice(lo, lo + local_shape[0])
        return Draws(flip[mine], t[mine], noise[mine], None if drop is None else drop[mine])

    # --- one step

    def train_step(
        self, images: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, str]:
        """One update; returns (global mean loss, grad norm, outcome) with outcome ``ok``,
        ``nonfinite`` (loss or gradients not finite: skipped) or ``overflow`` (fp16 loss-scale
        overflow: skipped by the scaler, which lowers the scale)."""
        step = self.step + 1
        diagnose = self.diagnostics is not None and self.diagnostics.arm(step)
        draws = self.draws(images.shape)
        loss = self.accumulate(step, images, labels, draws, eager=diagnose)
        loss_all, gnorm, finite = self.gradients(loss)
        if diagnose:  # before the update: gradients and features of this very step
            self.diag_metrics = self.diagnostics.collect(step, float(loss_all))
        outcome = self.update(gnorm, *finite)
        if outcome != "ok":  # the weights are those of the failed forward: the update was skipped
            self.state.last_skipped = self.locate(step, images, labels, draws, loss_ok=finite[0])
        return loss_all, gnorm, outcome

    def locate(self, step: int, images: torch.Tensor, labels: torch.Tensor, d: Draws, loss_ok: bool) -> str:
        """Why ``step`` was skipped, in one line: its forward replayed on the first micro-batch
        (same draws, no gradient, the plain module) names the first fp16 op whose output overflowed
        (:func:`scalelong.diagnostics.overflow.locate_overflow`; in an fp32 or bf16 run the first non-finite
        one); with a finite forward, the gradients overflowed (fp16: the scaler lowered its scale)."""
        rows = slice(0, self.micro_batch)
        fp16 = self.precision == "fp16"
        limit = FP16_MAX if fp16 else math.inf  # an fp32 or bf16 run overflows only at inf

        def forward() -> None:
            with torch.no_grad():
                self.loss(images[rows], labels[rows], d.part(rows), eager=True, net=self.unwrapped)

        if self.diagnostics is not None:
            found = self.diagnostics.locate_overflow(forward, limit=limit, step=step)
        else:
            found = locate_overflow(self.unwrapped, forward, limit=limit, step=step)
        if found is not None:
            before = (
                ""
                if found.largest_before is None
                else f", {found.largest_before:.3g} on the logged steps before"
            )
            what = "fp16 overflow" if fp16 else "non-finite output, as fp32 would show too,"
            return f"{what} in forward at {found.module} (step {step}: |value| {found.value:.3g}{before})"
        if self.scaler is not None and loss_ok:
            scale = float(self.scaler.get_scale())
            return f"gradient overflow: the loss scale lowered to {scale:g} (step {step})"
        if not loss_ok:
            return f"non-finite loss with a finite forward of every fp16 op (step {step})"
        return f"non-finite gradients with a finite forward (step {step}): a divergence fp32 shows too"

    def accumulate(
        self, step: int, images: torch.Tensor, labels: torch.Tensor, d: Draws, eager: bool = False
    ) -> torch.Tensor:
        """Backpropagate this process's batch in micro-batches of ``self.micro_batch``; return its
        mean loss (detached).

        Each micro-batch backpropagates its mean loss divided by their number, so the accumulated
        gradient is that of the batch's mean loss. Under DDP only the last backward synchronises
        the gradients (``accelerator.no_sync`` for the others).
        """
        parts = images.shape[0] // self.micro_batch
        total = torch.zeros((), device=self.acc.device)
        free = torch.zeros((), device=self.acc.device)
        for k in range(parts):
            rows = slice(k * self.micro_batch, (k + 1) * self.micro_batch)
            last = k == parts - 1
            with contextlib.nullcontext() if last else self.acc.no_sync(self.model):
                loss, loss_free = self.loss(images[rows], labels[rows], d.part(rows), eager=eager)
                for hook in self.loss_hooks:
                    loss = hook(step, loss)
                self.acc.backward(self.scaler.scale(loss / parts) if self.cpu_fp16 else loss / parts)
            total += loss.detach()
            free += loss_free
        self.input_free = free / parts
        return total / parts

    def loss(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        d: Draws,
        eager: bool = False,
        net: nn.Module | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean denoising loss of ``images`` (a micro-batch of this process) under their draws ``d``
        (flips, times, noise, dropped captions), and the mean loss of the best guess that ignores
        x_t (:func:`~scalelong.diffusion.input_free_loss`); ``eager`` bypasses the compiled forward
        (diagnostic steps); ``net`` runs that module instead of the prepared one (a replay)."""
        dev = self.acc.device
        x0 = images.to(dev, non_blocking=True)
        if self.cfg.data.hflip:
            x0 = torch.where(d.flip.to(dev)[:, None, None, None], x0.flip(-1), x0)
        labels = labels.to(dev)
        if d.drop_caption is not None:  # classifier-free guidance learns the unconditional model
            null = self.null_context.to(dev, labels.dtype)
            labels = torch.where(d.drop_caption.to(dev)[:, None, None], null, labels)
        cond = conditioning(self.unwrapped, labels)
        t, noise = d.t.to(dev), d.noise.to(dev)
        if self.compiled is not None and not eager:
            try:
                loss = denoising_loss(self.forward(self.compiled), self.schedule, x0, t, noise, **cond)
            except Exception as e:  # inductor without a C++ compiler, an unsupported op, ...
                if not _is_compile_failure(e):
                    raise
                why = first_line(e, limit=200)
                print(f"warning: train.compile: torch.compile failed ({why}); training eager")
                self.compiled = None
        if self.compiled is None or eager:
            loss = denoising_loss(self.forward(net or self.model), self.schedule, x0, t, noise, **cond)
        return loss.mean(), input_free_loss(self.schedule, x0, t, noise, self.mean_image).mean()

    def forward(self, net: Callable) -> Callable:
        """The training forward of ``net``: under CUDA's autocast policy when the run computes it on
        the CPU (:func:`gpu_autocast_dtype`; Accelerate's prepared model autocasts elsewhere)."""
        return autocast_forward(net, dtype=self.cpu_autocast) if self.cpu_autocast else net

    @functools.cached_property
    def mean_image(self) -> torch.Tensor:
        """The training images' per-pixel mean (C, H, W), from up to 1,024 evenly spaced images (the
        same on every process), mirrored as the data are when ``data.hflip`` is on."""
        n = len(self.dataset)
        picks = torch.linspace(0, n - 1, min(n, 1024)).long().unique().tolist()
        mean = torch.stack([torch.as_tensor(self.dataset[i][0]).float() for i in picks]).mean(dim=0)
        if self.cfg.data.hflip:
            mean = (mean + mean.flip(-1)) / 2
        return mean.to(self.acc.device)

    def gradients(self, loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[bool, bool]]:
        """After :meth:`accumulate`: (``loss`` averaged over processes, gradient norm, (loss finite,
        gradients finite)). One host sync, which every process answers alike."""
        if self.cpu_fp16:  # the norm, the check and clipping need true gradients
            self.scaler.unscale_(self.optimizer.optimizer)
        elif self.scaler is not None:
            self.acc.unscale_gradients()
        gnorm = grad_norm(self.params)
        loss_all = self.acc.reduce(loss.detach(), "mean") if self.acc.num_processes > 1 else loss.detach()
        # Skipping a step must be decided before the update. gnorm comes from all-reduced
        # gradients and loss_all is reduced, so every process agrees.
        loss_ok, grads_ok = torch.stack([torch.isfinite(loss_all), torch.isfinite(gnorm)]).tolist()
        return loss_all, gnorm, (loss_ok, grads_ok)

    def update(self, gnorm: torch.Tensor, loss_ok: bool, grads_ok: bool) -> str:
        """Clip, step the optimizer unless the step is skipped, count, update the EMA; the outcome."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
        clip = self.cfg.train.grad_clip
        if loss_ok and grads_ok and clip > 0:
            grads = [p.grad for p in self.params if p.grad is not None]
            torch._foreach_mul_(grads, (clip / (gnorm + 1e-6)).clamp(max=1.0))
        if self.cpu_fp16:  # as AcceleratedOptimizer.step does with a GPU's scaler
            self.scaler.step(self.optimizer.optimizer)  # skips non-finite gradients itself
            self.scaler.update()  # and then lowers the scale
        elif (loss_ok and grads_ok) or self.scaler is not None:
            self.optimizer.step()  # fp16: the scaler skips non-finite gradients itself and lowers the scale
        self.optimizer.zero_grad(set_to_none=True)
        s = self.state
        s.step += 1
        if not loss_ok or (not grads_ok and self.scaler is None):
            s.nonfinite_total += 1
            s.nonfinite_streak += 1
            return "nonfinite"
        if not grads_ok or self.optimizer.step_was_skipped:
            s.overflow_total += 1
            return "overflow"
        s.nonfinite_streak = 0
        ema_update(self.ema, self.unwrapped, self.cfg.train.ema_decay)
        return "ok"

    # --- checkpoints

    def rng_state(self) -> dict:
        state = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    def state_dict(self, rng_states: list[dict]) -> dict:
        """trainer.pt: everything a resume restores but the weights and the optimizer; ``rng_states``
        holds one entry per process (restored by :meth:`restore_rng`)."""
        scaler = self.scaler
        return {
            **self.state.state_dict(),  # step, counters
            "noise_gen": self.noise_gen.get_state(),
            "precision": PRECISION_NAMES.get(self.precision, self.precision),  # a resume must match it
            "scaler": scaler.state_dict() if scaler is not None else None,
            "rng": rng_states,
            "data": self.data_position(),
            "lr_schedule": {"kind": self.cfg.optim.lr_schedule, "lr": self.lr},  # a function of the step
            "diagnostics": self.diagnostics.state_dict() if self.diagnostics is not None else None,
            "num_processes": self.acc.num_processes,
        }

    def load_state_dict(self, state: dict, source: Path) -> None:
        """Restore what :meth:`state_dict` wrote (but the RNG states: see :meth:`restore_rng`)."""
        written = state["data"]
        if (written["global_batch"], written["seed"]) != (self.cfg.train.batch_size, self.cfg.train.seed):
            raise ScaleLongError(f"checkpoint {source} was written with another batch size or seed")
        self.state.load_state_dict(state)
        self.noise_gen.set_state(state["noise_gen"])
        if self.scaler is not None:  # check_resume_precision made sure the checkpoint holds its state
            self.scaler.load_state_dict(state["scaler"])
        if self.diagnostics is not None and state.get("diagnostics") is not None:
            self.diagnostics.load_state_dict(state["diagnostics"])  # oscillation windows, spike count

    def data_position(self) -> dict:
        """Where the data order stands: it follows from the step, the seed and the global batch."""
        return {"position": self.step, "seed": self.cfg.train.seed, "global_batch": self.cfg.train.batch_size}

    def save(self) -> Path:
        """Checkpoint the current step (all processes call it; the main process writes)."""
        from accelerate.utils import gather_object

        rng_states = gather_object([self.rng_state()]) if self.acc.num_processes > 1 else [self.rng_state()]
        path = self.run.checkpoint(self.step)
        if self.acc.is_main_process:
            save_checkpoint(
                self.run.checkpoints_dir,
                self.step,
                self.unwrapped,
                self.ema,
                config_to_dict(self.cfg),
                optimizer=self.optimizer.state_dict(),
                trainer=self.state_dict(rng_states),
                keep=self.cfg.train.keep_checkpoints,
            )
        self.acc.wait_for_everyone()
        return path

    def load_checkpoint(self, path: Path) -> dict:
        """Restore weights, EMA, optimizer and trainer.pt; return trainer.pt's dict (its RNG states
        are set by :meth:`restore_rng` once the data iterator exists).

        Every file is verified first; a file that fails, or whose content does not load (right
        checksums over garbage), raises :class:`DamagedCheckpoint`, and a later call with an older
        checkpoint replaces whatever this one restored."""
        state = load_training_state(path)
        # Not a damaged checkpoint: every checkpoint of the run was written in that precision.
        check_resume_precision(state["trainer"], PRECISION_NAMES.get(self.precision, self.precision), path)
        load_state(self.unwrapped, state["model"], str(path / "model.safetensors"))
        load_state(self.ema, state["ema"], str(path / "ema.safetensors"))
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except (KeyError, ValueError, TypeError, IndexError, RuntimeError) as e:
            raise DamagedCheckpoint(path, f"optimizer.pt does not fit, {type(e).__name__}") from None
        try:
            self.load_state_dict(state["trainer"], path)
            self.restore_rng(state["trainer"], check_only=True)
        except (KeyError, ValueError, TypeError, IndexError, RuntimeError) as e:
            raise DamagedCheckpoint(path, f"trainer.pt does not fit, {type(e).__name__}: {e}") from None
        return state["trainer"]

    def restore_rng(self, trainer_state: dict, check_only: bool = False) -> None:
        """Set this process's RNG states from trainer.pt (``check_only``: only check they are there)."""
        rng = trainer_state["rng"]
        if check_only:
            like = torch.get_rng_state()
            for state in rng:
                t = state["torch"]
                if not isinstance(t, torch.Tensor) or t.dtype != like.dtype or t.shape != like.shape:
                    raise TypeError("an RNG state is not a torch generator state")
            return
        if len(rng) != self.acc.num_processes:
            if self.acc.is_main_process:
                print(
                    f"warning: checkpoint from {len(rng)} processes, resuming on {self.acc.num_processes}: "
                    "weights, data order and noise continue exactly, per-process RNG streams restart"
                )
            return
        mine = rng[self.acc.process_index]
        torch.set_rng_state(mine["torch"])
        if "cuda" in mine and torch.cuda.is_available():
            torch.cuda.set_rng_state(mine["cuda"])

    # --- the loop

    def sample_grid(self, tracker: Tracker | None) -> Path | None:
        """EMA sample grid at the current step (main process)."""
        s = self.cfg.sample
        if s.num_images <= 0 or not self.acc.is_main_process:
            return None
        self.ema.eval()
        images = sample_images(self.ema, self.cfg, s.num_images, self.acc.device, self.cfg.train.seed)
        path = self.run.sample_grid(self.step)
        grid = save_grid(images, path)
        if tracker is not None:
            tracker.images("samples", grid, self.step)
        return path

    def fit(self, tracker: Tracker | None, start_state: dict | None, progress: bool = True) -> RunResult:
        """Train from ``self.step`` to ``train.steps``; checkpoint, log and sample on the way."""
        from tqdm import tqdm

        t = self.cfg.train
        batches = self.batches()
        if start_state is not None:
            self.restore_rng(start_state)
        bar = tqdm(
            total=t.steps, initial=self.step, disable=not (progress and self.acc.is_main_process), unit="step"
        )
        if self.step == 0 and self.noise_probe is not None and self.cfg.diagnostics.noise_levels_at_start:
            # the untrained model's error: what a study caps a diverged or worse-than-initial run at
            start = self.noise_probe.measure(self.ema, self.unwrapped)
            if tracker is not None:
                tracker.log({"step": 0, **start})
        window = self._new_window()
        t_last, steps_since, last_loss, samples = time.perf_counter(), 0, float("nan"), None
        checkpoint = self.run.checkpoint(self.step)
        try:
            while self.step < t.steps:
                images, labels = next_batch(batches)
                loss, gnorm, outcome = self.train_step(images, labels)
                window[outcome] += 1
                if outcome == "ok":
                    window["loss"] += loss
                    window["input_free"] += self.input_free
                steps_since += 1
                step = self.step
                img_s = steps_since * t.batch_size / (time.perf_counter() - t_last)
                if self.state.nonfinite_streak >= t.max_nonfinite_steps:
                    self._log(tracker, step, window, gnorm, img_s, {})
                    raise self._stopped(step)
                extra, self.diag_metrics = self.diag_metrics, {}
                if self.evaluator is not None and self.evaluator.due(step):
                    extra.update(self.evaluator(step, self.ema))
                if self.noise_probe is not None and self.noise_probe.due(step):
                    extra.update(self.noise_probe.measure(self.ema, self.unwrapped))
                for hook in self.metric_hooks:
                    extra.update(hook(step, self))
                if step % t.log_every == 0 or step == t.steps:
                    record = self._log(tracker, step, window, gnorm, img_s, extra)
                    if record.get("loss") is not None:
                        last_loss = record["loss"]
                        bar.set_postfix(loss=f"{last_loss:.4f}", img_s=f"{record['img_per_s']:.0f}")
                    window, t_last, steps_since = self._new_window(), time.perf_counter(), 0
                elif extra and tracker is not None:  # e.g. an evaluation between log steps
                    tracker.log({"step": step, **extra})
                if (t.checkpoint_every and step % t.checkpoint_every == 0) or step == t.steps:
                    checkpoint = self.save()
                if (self.cfg.sample.every and step % self.cfg.sample.every == 0) or step == t.steps:
                    samples = self.sample_grid(tracker) or samples
                bar.update(1)
                for hook in self.step_hooks:
                    hook(step, self)
        finally:
            bar.close()
            del batches  # the loader's workers stop now, also when an error ends the run
        if self.acc.num_processes > 1:
            self.check_processes_agree()
        return RunResult(self.run.path, last_loss, checkpoint, samples)

    def check_processes_agree(self) -> None:
        """All processes must end with bitwise identical weights (one collective, at the end)."""
        from accelerate.utils import gather_object

        digest = hashlib.sha256()
        for p in self.unwrapped.state_dict().values():
            digest.update(p.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
        digests = gather_object([digest.hexdigest()])
        if len(set(digests)) != 1:
            raise ScaleLongError(
                f"the {len(digests)} processes ended with different weights; please report this"
            )
        if self.acc.is_main_process:
            print(f"{len(digests)} processes hold identical weights (sha256 {digests[0][:12]})")

    def _new_window(self) -> dict:
        """Running sums between two log steps; the loss stays on the device (no sync per step)."""
        zero = torch.zeros((), device=self.acc.device)
        return {"loss": zero, "input_free": zero.clone(), "ok": 0, "nonfinite": 0, "overflow": 0}

    def _stopped(self, step: int) -> TrainingStopped:
        streak, limit = self.state.nonfinite_streak, self.cfg.train.max_nonfinite_steps
        return TrainingStopped(
            f"training stopped at step {step}: {streak} steps in a row had a non-finite loss or gradient "
            f"(train.max_nonfinite_steps={limit}; the last: {self.state.last_skipped}); "
            f"{what_to_try(self.state.last_skipped)}; {self.run} keeps the last good checkpoint",
            step,
            cause=self.state.last_skipped,
        )

    def _log(
        self, tracker: Tracker | None, step: int, window: dict, gnorm: torch.Tensor, img_s: float, extra: dict
    ):
        """Reduce the window's numbers into one record (one sync) and write it (main process)."""
        n_ok = window["ok"]
        free = window["input_free"]
        if self.acc.num_processes > 1:  # each process saw its own slice of the batch
            free = self.acc.reduce(free, "mean")
        record = {
            "step": step,
            "loss": (window["loss"].item() / n_ok) if n_ok else None,
            "loss_input_free": (free.item() / n_ok) if n_ok else None,
            "lr": self.lr_at(step - 1),
            "grad_norm": float(gnorm),
            "img_per_s": img_s,
            "nonfinite_steps": window["nonfinite"],
            "nonfinite_total": self.state.nonfinite_total,
        }
        if self.scaler is not None:
            record["overflow_steps"] = window["overflow"]
            record["loss_scale"] = float(self.scaler.get_scale())
        record.update(extra)
        if tracker is not None:
            tracker.log({k: v for k, v in record.items() if v is not None})
        return record


# ----------------------------------------------------------------------------- entry point


def train(
    cfg: Config,
    overwrite: bool = False,
    progress: bool = True,
    resume: bool | None = None,
    metric_hooks: list[MetricHook] | None = None,
    loss_hooks: list[LossHook] | None = None,
    step_hooks: list[StepHook] | None = None,
) -> RunResult:
    """Train a model as the config says and return where its outputs are.

    ``resume``: None continues an existing run directory of the same config automatically,
    True requires a checkpoint to continue from. ``overwrite`` starts over (removing only the
    files scalelong wrote). The hooks (see :data:`MetricHook`) add metrics to the log, change a
    step's loss, or run after each step.

    The main process first takes the run's lock (:meth:`RunDir.writing`: a run another process
    writes is refused at once) and holds it until the end, on every way out; everything else is
    checked before anything is written into the run directory (a folder the lock had to create is
    removed again when the run fails before writing). Resuming loads the newest
    checkpoint that verifies and loads, falling back with a warning. summary.json is written on
    every way the run ends after that: complete (also when a complete run is run again),
    stopped, interrupted or failed. A run the non-finite policy stops raises
    :class:`TrainingStopped`; its summary's ``stopped`` entry says at which step.
    """
    from accelerate.state import AcceleratorState

    if overwrite and resume:
        raise ScaleLongError("--overwrite and --resume contradict each other; pass one of them")
    accelerator = make_accelerator(cfg)
    main = accelerator.is_main_process
    say = print if main else (lambda message: None)
    try:
        with sigterm_as_interrupt(), contextlib.ExitStack() as held:
            run = RunDir(cfg.run_dir)

            # The lock first (released when this block ends, however it ends): a run that another
            # process writes is refused before the seconds of building the model, data and optimizer.
            def lock_run() -> None:
                held.enter_context(run.writing())

            on_main_process(accelerator, lock_run)
            trainer = Trainer(cfg, accelerator, run)
            trainer.metric_hooks += metric_hooks or []
            trainer.loss_hooks += loss_hooks or []
            trainer.step_hooks += step_hooks or []
            checkpoints = on_main_process(accelerator, lambda: run.prepare(cfg, overwrite, resume))
            checkpoint, start_state = run.checkpoint(0), None
            if checkpoints:
                advice = (
                    f"; restore one from a backup, or pass --overwrite to train {run} again from step 0 "
                    "(it removes only files scalelong wrote)"
                )
                checkpoint, start_state = load_newest(checkpoints, trainer.load_checkpoint, say, advice)
                if main:
                    save_config(cfg, run.config_file)  # the run-length / logging keys may have changed
                say(f"resuming {run} from {checkpoint.name}")
            if trainer.step >= cfg.train.steps:
                say(f"{run} is complete at step {trainer.step} (train.steps={cfg.train.steps})")
                if not run.finished:  # e.g. killed after its last checkpoint (every process reads it)
                    final = _rescore(trainer)
                    if main:
                        _end(trainer, "complete", _last_loss(run), final=final)
                return RunResult(run.path, float("nan"), checkpoint, None)
            if main:
                run.summary_file.unlink(missing_ok=True)  # the run goes on; a new one is written at its end
            return _fit(trainer, progress, start_state)
    finally:
        # The Accelerate state is a process-wide singleton; a later run in this process may
        # want another precision.
        AcceleratorState._reset_state()


def _fit(trainer: Trainer, progress: bool, start_state: dict | None) -> RunResult:
    """Train to the end; write summary.json however training ends (main process)."""
    cfg, acc, run = trainer.cfg, trainer.acc, trainer.run
    tracker = None
    if acc.is_main_process:
        t = cfg.train
        tracker = Tracker(
            run, config_to_dict(cfg), trainer.step, tensorboard=t.tensorboard, wandb=t.wandb, warn=print
        )
        # what the run computes in, said once: bf16 is CUDA's policy on a CPU without bf16 units
        computed = PRECISION_NAMES.get(trainer.precision, trainer.precision)
        computed += " (CUDA's autocast policy)" if trainer.cpu_autocast is not None else ""
        print(
            f"scalelong: {count_parameters(trainer.unwrapped):,} parameters, skips: "
            f"{cfg.model.skip.method}, {acc.num_processes} process(es) on "
            f"{acc.device.type} in {computed}, run: {run}"
        )
    status, error, stopped = "failed", None, None
    try:
        result = trainer.fit(tracker, start_state, progress)
        status = "complete"
    except KeyboardInterrupt:
        status = "interrupted"
        error = (
            f"interrupted at step {trainer.step}; {run} holds the last complete checkpoint, "
            "re-run the same command to resume"
        )
        raise TrainingInterrupted(error) from None
    except TrainingStopped as e:  # an outcome of the run: where it stopped goes in the summary
        status, error, stopped = "stopped", str(e), {"step": e.step, "kind": e.kind, "cause": e.cause}
        raise
    except ScaleLongError as e:
        status, error = "stopped", str(e)
        raise
    except Exception as e:
        error = first_line(e, name=True)
        raise
    finally:
        if tracker is not None:
            tracker.close()
        if acc.is_main_process and status != "complete":
            with contextlib.suppress(OSError):  # never hide the error that ended the run
                _end(trainer, status, _last_loss(run), error, stopped=stopped)
    final = _rescore(trainer)
    if acc.is_main_process:
        _end(trainer, "complete", result.final_loss, final=final)
    acc.wait_for_everyone()
    return result


def _rescore(trainer: Trainer) -> dict | None:
    """The recipe's re-score of the best step with more samples; every process samples its share.
    It goes into summary.json (``best``) and eval_final.json; ``scalelong train`` prints it once,
    among its evaluation lines."""
    return trainer.evaluator.finalize() if trainer.evaluator is not None else None


def _end(
    trainer: Trainer,
    status: str,
    final_loss: float,
    error: str | None = None,
    final: dict | None = None,
    stopped: dict | None = None,
) -> None:
    """Write summary.json (main process), with the re-score of the best step when there is one."""
    run = trainer.run
    summary = {
        "status": status,
        "final_loss": final_loss,
        "steps": trainer.step,
        "nonfinite_steps": trainer.state.nonfinite_total,
    }
    if trainer.scaler is not None:  # fp16: steps whose update the loss scaler skipped, apart
        summary["overflow_steps"] = trainer.state.overflow_total
    if error is not None:
        summary["error"] = error
    if stopped is not None:
        summary["stopped"] = stopped
    if final is not None:
        summary["best"] = final
    if trainer.state.last_skipped:  # where the last skipped step went non-finite (Trainer.locate)
        summary["last_skipped"] = trainer.state.last_skipped
    gpu_policy = trainer.cpu_autocast is not None
    summary["provenance"] = provenance(trainer.precision, trainer.acc.device, gpu_policy)
    run.write_summary(summary)


def _last_loss(run: RunDir) -> float:
    """The loss of the last record of the run's metrics log that has one (NaN if none)."""
    losses = [r["loss"] for r in run.metrics() if isinstance(r.get("loss"), (int, float))]
    return float(losses[-1]) if losses else float("nan")
