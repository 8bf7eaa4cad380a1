"""Evaluation of a run: Fréchet distance of EMA samples during training and the final re-score
of the best step; ``scalelong eval`` and ``scalelong fid-stats``.

The recipe (U-ViT code base): every 50k steps, FID of 10k EMA samples drawn with a 50-step
DPM-Solver; at the end the best checkpoint by that FID is re-scored on 50k samples. Here the
numbers come from the ``eval`` config section and the metric may be the offline FD-MNIST.

The evaluator's records go to the run's ``metrics.jsonl``, from which
:meth:`scalelong.training.runs.RunDir.best_step` picks the best step (this run's records only, and only
steps whose checkpoint exists).

With several processes every process draws its share of the evaluation seeds and computes
their features; the main process gathers them and computes the distance. Each image depends
only on its seed, so the distance is that of one process drawing them all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from scalelong.diagnostics import metric_names
from scalelong.diffusion import mean_image_error, noise_level_errors
from scalelong.errors import ScaleLongError
from scalelong.fp16 import gpu_autocast
from scalelong.metrics.fd_mnist import digit_score_of_features, real_digit_score
from scalelong.metrics.frechet import (
    FeatureFn,
    batch_features,
    feature_fn,
    feature_stats,
    frechet_distance,
    load_stats,
    mnist_reference_stats,
    save_stats,
    stored_metric,
    stored_resolution,
)
from scalelong.models import conditioning
from scalelong.runlog.records import write_text_atomic
from scalelong.sampling import generate
from scalelong.training.build import build_dataset, build_schedule, model_input_shape
from scalelong.training.checkpoint import DamagedCheckpoint
from scalelong.training.config import HELDOUT_DATASETS, Config, EvalConfig
from scalelong.training.launch import gpu_autocast_dtype, resolve_precision
from scalelong.training.runs import RunDir, load_model, writer_of

if TYPE_CHECKING:
    from scalelong.metrics.clip_score import ClipScore

EVAL_SEED_OFFSET = 1_000_003  # evaluation noise never coincides with the training noise streams


def reference(metric: str, fid_stats: str | Path | None, missing: str) -> tuple[np.ndarray, np.ndarray]:
    """The reference statistics: the file ``fid_stats`` (read first, so a wrong path fails before any
    sampling), or for fd-mnist without a file the embedded training digits; else ``missing`` is the error."""
    if fid_stats:
        return load_stats(fid_stats, metric)
    if metric == "fd-mnist":
        return mnist_reference_stats("train")
    raise ScaleLongError(missing)


def reference_for(e: EvalConfig) -> tuple[np.ndarray, np.ndarray]:
    """The reference statistics of the config's ``eval`` section."""
    return reference(
        e.metric,
        e.fid_stats,
        "eval.metric=fid needs eval.fid_stats=PATH (make it with `scalelong fid-stats`)",
    )


def forward_precision(cfg: Config, device: torch.device | str) -> str:
    """What the sampler's network forward runs in on ``device``, ``bf16``, ``fp16`` or ``fp32``:
    ``eval.mixed_precision``, with ``auto`` resolved (:func:`scalelong.training.launch.resolve_precision`)."""
    precision = resolve_precision(str(cfg.eval.mixed_precision), device)
    return "fp32" if precision == "no" else precision


def forward_autocast(precision: str, device: torch.device | str) -> contextlib.AbstractContextManager:
    """The autocast of :func:`forward_precision`'s ``precision`` on ``device``. fp16 on the CPU, and
    bf16 on a CPU without bf16 units, are CUDA's autocast computed there
    (:func:`scalelong.training.launch.gpu_autocast_dtype`), as training does."""
    kind = torch.device(device).type
    emulated = gpu_autocast_dtype(precision, device)
    if emulated is not None:
        return gpu_autocast(emulated)
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    return torch.autocast(kind, dtype=dtype, enabled=precision in ("bf16", "fp16"))


def read_caption_list(path: str | Path) -> list[str]:
    """Every caption of an MS-COCO captions file (``{"annotations": [{"image_id", "caption"}, ...]}``,
    e.g. captions_val2014.json), stripped, in file order."""
    path = Path(path)
    if not path.is_file():
        raise ScaleLongError(
            f"captions file not found: {path}; expected e.g. annotations/captions_val2014.json"
        )
    try:
        annotations = json.loads(path.read_text())["annotations"]
        captions = [str(a["caption"]).strip() for a in annotations if "image_id" in a]
        if len(captions) != len(annotations):
            raise KeyError("image_id")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise ScaleLongError(
            f'{path} is not an MS-COCO captions file: expected {{"annotations": [{{"image_id", '
            f'"caption"}}, ...]}} ({e!r})'
        ) from None
    if not captions:
        raise ScaleLongError(f"{path} holds no captions")
    return captions


def first_evaluation_seed(cfg: Config) -> int:
    """The seed of evaluation sample 0 (sample i has this + i), a function of ``train.seed`` alone."""
    return cfg.train.seed * EVAL_SEED_OFFSET


def choose_captions(captions: Sequence[str], n: int, seed: int) -> list[str]:
    """The caption of each of ``n`` samples: a permutation of ``captions`` drawn from ``seed``, sample i
    taking entry i (modulo the count, so ``n`` beyond it wraps). It depends on nothing else: not on
    ``n``'s split over processes, nor on the batch size."""
    order = torch.randperm(len(captions), generator=torch.Generator().manual_seed(seed)).tolist()
    return [captions[order[i % len(order)]] for i in range(n)]


@dataclasses.dataclass
class CaptionSampling:
    """How a text-to-image run's evaluation samples are drawn: sample i (seed ``base`` + i) shows
    ``captions[i]``, with classifier-free guidance, and is decoded by the autoencoder."""

    captions: list[str]
    base: int
    tokenizer: object
    text_encoder: nn.Module
    autoencoder: nn.Module
    guidance_scale: float
    latent_scale: float

    def texts(self, seeds: Sequence[int]) -> list[str]:
        """The caption each of ``seeds`` shows."""
        return [self.captions[s - self.base] for s in seeds]

    def draw(self, model, schedule, sampler, steps, seeds, shape, device) -> torch.Tensor:
        from scalelong.training.t2i import decode_latents, encode_prompts, generate_from_context

        texts = self.texts(seeds)
        context = encode_prompts(texts, self.tokenizer, self.text_encoder, device)
        null = encode_prompts([""], self.tokenizer, self.text_encoder, device)[0]
        scale = self.guidance_scale
        latents = generate_from_context(
            model, schedule, sampler, steps, seeds, context, null, scale, shape, device
        )
        return decode_latents(latents.float(), self.autoencoder, self.latent_scale)


def caption_sampling(
    cfg: Config,
    captions: Sequence[str],
    n: int,
    device: torch.device | str = "cpu",
    guidance_scale: float | None = None,
    text_encoder: str | None = None,
    autoencoder: str | None = None,
) -> CaptionSampling:
    """How ``n`` evaluation samples of a text-to-image run are drawn: sample i shows caption i of
    :func:`choose_captions` seeded by :func:`first_evaluation_seed`, guided by ``guidance_scale``
    (default the run's ``t2i.guidance_scale``) and decoded by the autoencoder; ``text_encoder`` and
    ``autoencoder`` default to the run's ``t2i`` ones. A first ``m < n`` samples show the same
    captions as ``m`` samples would."""
    from scalelong.training.t2i import load_autoencoder, load_text_encoder

    scale = cfg.t2i.guidance_scale if guidance_scale is None else float(guidance_scale)
    vae = load_autoencoder(autoencoder or cfg.t2i.autoencoder).to(device)
    tokenizer, text_model = load_text_encoder(text_encoder or cfg.t2i.text_encoder)
    base = first_evaluation_seed(cfg)
    chosen = choose_captions(captions, n, base)
    return CaptionSampling(chosen, base, tokenizer, text_model.to(device), vae, scale, cfg.t2i.latent_scale)


@torch.no_grad()
def sample_features(
    model: nn.Module,
    cfg: Config,
    features: FeatureFn,
    seeds: Sequence[int],
    sampler: str,
    steps: int,
    batch_size: int,
    device: torch.device | str,
    progress: bool = False,
    captions: CaptionSampling | None = None,
    clip: ClipScore | None = None,
) -> torch.Tensor:
    """Features (N, D) of images drawn from ``model`` with one seed per image; labels cycle over classes
    (text-to-image runs: ``captions`` gives each seed its caption and decodes the latents).

    With ``clip`` (and ``captions``) each row ends with one more column, the CLIP score of the image
    with its caption, so the scores go wherever the features go (gathered over processes)."""
    if clip is not None and captions is None:
        raise ValueError("the CLIP score needs the captions of the samples")
    from tqdm import tqdm

    schedule, shape = build_schedule(cfg.diffusion), model_input_shape(cfg.model)
    num_classes = max(getattr(model, "num_classes", 0), 1)
    # eval.mixed_precision=bf16 or fp16: the network's forward only; the sampler's arithmetic stays in
    # fp32 (model_eps_fn casts the output; the policies leave fp32 elementwise ops alone), and so do the
    # features.
    precision = forward_precision(cfg, device)
    out = []
    for start in tqdm(range(0, len(seeds), batch_size), disable=not progress, unit="batch"):
        chunk = list(seeds[start : start + batch_size])
        labels = torch.tensor(chunk) % num_classes
        with forward_autocast(precision, device):
            if captions is not None:
                images = captions.draw(model, schedule, sampler, steps, chunk, shape, device)
            else:
                images = generate(model, schedule, sampler, steps, chunk, shape, labels, device)
        feats = features(images.float())
        if clip is not None:  # in fp32, outside the sampler's autocast, as the features
            scores = clip(images.float(), captions.texts(chunk)).to(feats)
            feats = torch.cat([feats, scores[:, None]], 1)
        out.append(feats)
    return torch.cat(out)


@dataclasses.dataclass
class SampleScore:
    """What :func:`score_model` measured of a model's samples."""

    fd: float  # Fréchet distance to the reference statistics
    digits: dict | None = None  # scalelong.metrics.fd_mnist.digit_score of the same samples (fd-mnist only)
    clip: float | None = None  # mean CLIP score of the same samples with their captions (text-to-image)
    # the samples' features in seed order (with a CLIP column where ``clip`` is set): a later, larger
    # score of the same weights reuses them (``drawn=``) instead of drawing these seeds again
    features: np.ndarray | None = dataclasses.field(default=None, repr=False)


def score_model(
    model: nn.Module,
    cfg: Config,
    features: FeatureFn,
    ref: tuple[np.ndarray, np.ndarray],
    n: int,
    sampler: str | None = None,
    steps: int | None = None,
    device: torch.device | str = "cpu",
    progress: bool = False,
    accelerator=None,
    digits: bool = False,
    captions: CaptionSampling | None = None,
    clip: ClipScore | None = None,
    drawn: int | np.ndarray = 0,
) -> SampleScore | None:
    """Fréchet distance of ``n`` samples of ``model`` (seeds fixed by the config) to ``ref``, and with
    ``digits`` (``features`` must then be FD-MNIST's) the digit score of the same samples; with
    ``clip`` (text-to-image: ``captions`` given) the mean CLIP score of the samples with their captions.

    ``drawn``: the features (``SampleScore.features``) of the first samples, already drawn from the
    same weights with the same settings; only the other seeds are sampled. Every process passes it
    (the processes other than the main one may pass its row count alone).

    With an ``accelerator`` of several processes (all of them call this), process r draws the
    r-th contiguous share of the seeds; the main process gathers the features and returns the
    score, the others return None.
    """
    first = min(drawn if isinstance(drawn, int) else len(drawn), n)
    base = first_evaluation_seed(cfg) + first
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    todo = n - first
    seeds = range(base + rank * todo // world, base + (rank + 1) * todo // world)  # shares differ by <= 1
    feats = None
    if len(seeds):
        feats = sample_features(
            model,
            cfg,
            features,
            seeds,
            sampler or cfg.eval.sampler,
            steps or cfg.eval.steps,
            cfg.eval.batch_size,
            device,
            progress and rank == 0,
            captions,
            clip,
        )
        feats = feats.cpu().numpy()
    if world > 1:
        from accelerate.utils import gather_object

        shares = gather_object([feats])  # in rank order
        if not accelerator.is_main_process:
            return None
        feats = np.concatenate([s for s in shares if s is not None]) if todo else None
    if first:
        if isinstance(drawn, int):  # only the other processes may pass a count
            raise ValueError("score_model: the main process passes the drawn features, not their count")
        known = drawn[:first]
        feats = known if feats is None else np.concatenate([known, feats.astype(known.dtype)])
    return score_features(feats, ref, digits, clip is not None)


def score_features(
    feats: np.ndarray, ref: tuple[np.ndarray, np.ndarray], digits: bool, clip: bool
) -> SampleScore:
    """The score of samples' features (N, D), the last column a CLIP score where ``clip``."""
    clip_score, scored = None, feats
    if clip:  # sample_features' last column: one score per sample, gathered with the features
        clip_score, scored = float(np.asarray(feats[:, -1], dtype=np.float64).mean()), feats[:, :-1]
    fd = frechet_distance(*feature_stats(scored), *ref)
    # The classifier's head on the features FD-MNIST already holds: the same samples, no second draw.
    digit = digit_score_of_features(torch.as_tensor(scored)) if digits else None
    return SampleScore(fd, digit, clip_score, feats)


def digit_record(score: dict | None) -> dict:
    """The digit score as flat metrics-log entries (``digits/confident``, ``digits/entropy``)."""
    if score is None:
        return {}
    return {metric_names.DIGITS_CONFIDENT: score["confident"], metric_names.DIGITS_ENTROPY: score["entropy"]}


def _from_main(accelerator, value):
    """The main process's ``value`` on every process (``value`` itself with one process)."""
    if accelerator is None or accelerator.num_processes == 1:
        return value
    from accelerate.utils import broadcast_object_list

    box = [value]
    broadcast_object_list(box)
    return box[0]


class TrainingEvaluator:
    """Fréchet distance of EMA samples during training, and the final re-score of the best step.

    Call contract (the trainer, on every process alike)::

        evaluator = TrainingEvaluator(cfg, run_dir, device, accelerator)  # reads reference stats now:
                                                             # bad paths fail early
        for step in ...:                                     # step = optimizer steps completed (1-based)
            ...
            if evaluator.due(step):                          # every eval.every steps, and the last one
                record = evaluator(step, ema)                # samples cfg.eval.num_samples images
                metrics_log.write({"step": step, **record})  # main process; RunDir.best_step reads them
        ...                                                  # after the last checkpoint is saved:
        final = evaluator.finalize()                         # None if nothing was evaluated

    ``evaluator(step, ema)`` returns ``{"fd": float, "fd_metric": "fd-mnist" | "fid", "fd_samples": n,
    "fd_sampler": name, "fd_steps": k, "fd_seconds": s}`` on the main process and ``{}`` on the
    others; with fd-mnist also ``"digits/confident"`` and ``"digits/entropy"``, the digit score of
    the same samples (:func:`scalelong.metrics.fd_mnist.digit_score`). It leaves the model's train/eval
    mode as it found it and touches no global RNG. ``evaluator(step, ema, n, drawn)`` scores ``n``
    samples instead, reusing ``drawn`` as :func:`score_model` does.
    ``finalize()`` loads ``ema.safetensors`` of ``RunDir.best_step``, scores it on
    ``cfg.eval.final_num_samples`` samples (reusing those its evaluation of that step drew) and, on
    the main process, writes and returns
    ``{"best_step", "fd", "fd_metric", "fd_samples", "fd_at_eval", "fd_samples_reused", ...}`` to
    ``run_dir/eval_final.json`` (None on the others). With an ``accelerator`` of several processes
    the samples are split over them (see :func:`score_model`).
    Config keys: ``eval.every, num_samples, metric, fid_stats, inception_weights, sampler, steps,
    batch_size, final_num_samples``.

    A text-to-image run (``data.name=coco_latents``) is scored as ``scalelong eval --captions``
    scores it: sample i shows caption i of ``eval.captions`` (:func:`caption_sampling`), the same
    captions at every evaluation and on any number of processes, with the run's
    ``t2i.guidance_scale``, decoded by its autoencoder. The records keep the keys above;
    eval_final.json adds the captions file, their count, the guidance scale and the encoders.
    """

    def __init__(
        self, cfg: Config, run_dir: str | Path, device: torch.device | str = "cpu", accelerator=None
    ):
        self.cfg, self.run, self.device = cfg, RunDir(run_dir), torch.device(device)
        self.acc = accelerator
        self.main = accelerator is None or accelerator.is_main_process
        self.e = cfg.eval
        self._features: FeatureFn | None = None
        self.ref = reference_for(self.e) if self.e.every > 0 else None
        if self.e.every > 0 and self.e.metric == "fd-mnist":
            if model_input_shape(cfg.model) != (1, 32, 32):
                raise ScaleLongError(
                    f"eval.metric=fd-mnist scores 1x32x32 digits but the model makes "
                    f"{model_input_shape(cfg.model)}; use eval.metric=fid with eval.fid_stats"
                )
        self.captions: CaptionSampling | None = None
        self.protocol: dict = {}  # what a text-to-image score rests on, beside the best step's re-score
        # (step, fd, features) of this process's best evaluation so far (main process): the re-score
        # of that step draws only the seeds beyond them
        self._best: tuple[int, float, np.ndarray] | None = None
        if self.e.every > 0 and is_text_to_image(cfg):
            self.captions = self._caption_sampling()

    def _caption_sampling(self) -> CaptionSampling:
        """A text-to-image run's captions and encoders, read now: a captions file that is not
        MS-COCO's, reference statistics that do not fit the decoded samples or encoders that cannot
        be loaded are refused before the first training step."""
        captions = read_caption_list(self.e.captions)
        # Loading builds networks whose initialisation must not move the training's random streams.
        with torch.random.fork_rng(devices=[]):
            check_reference_fits(
                self.e.fid_stats, self.ref, self.features, scored_image_shape(self.cfg), self.e.metric
            )
            n = max(self.e.num_samples, self.e.final_num_samples)  # the re-score's first samples: the same
            sampling = caption_sampling(self.cfg, captions, n, self.device)
        t = self.cfg.t2i
        self.protocol = {
            "captions": str(self.e.captions),
            "captions_count": len(captions),
            "guidance_scale": sampling.guidance_scale,
            "text_encoder": t.text_encoder,
            "autoencoder": t.autoencoder,
        }
        return sampling

    @property
    def features(self) -> FeatureFn:
        if self._features is None:  # the Inception network loads on first use only
            self._features = feature_fn(self.e.metric, self.device, self.e.inception_weights)
        return self._features

    def due(self, step: int) -> bool:
        """Every ``eval.every`` steps, and at the last step: a run always ends with its final score."""
        if self.e.every <= 0 or step <= 0:
            return False
        return step % self.e.every == 0 or step == self.cfg.train.steps

    def __call__(
        self, step: int, ema_model: nn.Module, n: int | None = None, drawn: int | np.ndarray = 0
    ) -> dict:
        if self.ref is None:
            self.ref = reference_for(self.e)
        n = n or self.e.num_samples
        was_training = ema_model.training
        ema_model.eval()
        t0 = time.perf_counter()
        try:
            score = score_model(
                ema_model,
                self.cfg,
                self.features,
                self.ref,
                n,
                device=self.device,
                accelerator=self.acc,
                digits=self.e.metric == "fd-mnist",
                captions=self.captions,
                drawn=drawn,
            )
        finally:
            ema_model.train(was_training)
        if score is None:  # not the main process
            return {}
        plain = n == self.e.num_samples and isinstance(drawn, int) and drawn == 0  # a training evaluation
        if plain and math.isfinite(score.fd) and (self._best is None or score.fd < self._best[1]):
            self._best = (step, score.fd, score.features)  # ties go to the earlier step, as best_step's
        return {
            metric_names.FD: score.fd,
            "fd_metric": self.e.metric,
            "fd_samples": n,
            "fd_sampler": self.e.sampler,
            "fd_steps": self.e.steps,
            "fd_precision": forward_precision(self.cfg, self.device),
            "fd_seconds": time.perf_counter() - t0,
            **digit_record(score.digits),
        }

    def finalize(self) -> dict | None:
        """Re-score the best checkpoint on ``eval.final_num_samples`` samples (the recipe's last step).
        Every process calls it; the main process picks the step (from the log it wrote).

        Where this evaluator scored that step itself, the re-score reuses its samples: seed i draws
        the same image from the same weights, so only the seeds beyond ``eval.num_samples`` are
        drawn (``fd_samples_reused`` says how many were not; the recipe's 10k of 50k)."""
        if self.e.final_num_samples <= 0:
            return None
        best = self.run.best_step(self.e.metric) if self.main else None
        known = self._best[2] if self._best and self._best[0] == best else np.empty((0, 0))
        step, drawn = _from_main(self.acc, (best, len(known)))  # the seeds already drawn at that step
        if step is None:
            return None
        try:
            model = load_model(self.run.checkpoint(step), self.cfg.model, "ema", self.device)
        except DamagedCheckpoint as e:
            print(f"warning: {e}; the best step is not re-scored")
            return None
        result = self(step, model, self.e.final_num_samples, known if self.main else drawn)
        if not self.main:
            return None
        result = {
            "best_step": step,
            **result,
            "fd_at_eval": self.run.eval_records(self.e.metric)[step][metric_names.FD],
            "fd_samples_reused": min(drawn, self.e.final_num_samples),  # the evaluation's, not drawn again
            **self.protocol,
        }
        self.run.eval_final_file.write_text(json.dumps(result, indent=1))
        return result


# ----------------------------------------------------------------------------- noise levels

# Datasets with a split the model never trains on (and folder / array with data.heldout > 0, whose
# held-out images are that split); the others are probed on training images.
HELD_OUT_SPLIT = {"mnist": "test", "cifar10": "test"}


def probe_images(cfg: Config, n: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``n`` images spread evenly over the held-out split (or the training set, where the dataset
    has none), their labels, and whether they are held out."""
    split = HELD_OUT_SPLIT.get(cfg.data.name)
    if cfg.data.name in HELDOUT_DATASETS and cfg.data.heldout:  # a folder / array: its data.heldout images
        split = "heldout"
    data = dataclasses.replace(cfg.data, split=split) if split else cfg.data
    dataset = build_dataset(data, check=False)  # a few images: the run checked them all at its start
    index = torch.linspace(0, len(dataset) - 1, min(n, len(dataset))).long().unique()
    items = [dataset[int(i)] for i in index]  # even spacing: sorted datasets stay class-balanced
    images = torch.stack([img for img, _ in items])
    labels = torch.stack([torch.as_tensor(label) for _, label in items])
    return images, labels, split is not None


class NoiseLevelProbe:
    """The EMA model's denoising error per noise level on held-out images, during training.

    Logs ``noise/eps_mse@L`` and ``noise/x0_mse@L`` for each level L of
    :data:`scalelong.diffusion.NOISE_LEVELS` (a fraction of the schedule's time range: 1 is pure
    noise), and ``noise/x0_mse_mean_image``, the x0 error of the mean image: where a model's
    x0 error exceeds it, it has not learnt that noise level. Config: ``diagnostics.noise_levels``
    (images), ``diagnostics.noise_levels_every`` (0: with each evaluation and at the last step).
    """

    def __init__(self, cfg: Config, device: torch.device | str = "cpu"):
        self.cfg, self.device = cfg, torch.device(device)
        self.schedule = build_schedule(cfg.diffusion)
        self._data: tuple[torch.Tensor, dict, float] | None = None

    def due(self, step: int) -> bool:
        d, e, t = self.cfg.diagnostics, self.cfg.eval, self.cfg.train
        if d.noise_levels <= 0:
            return False
        if step == t.steps:
            return True
        every = d.noise_levels_every or e.every
        return every > 0 and step % every == 0

    def data(self, model: nn.Module) -> tuple[torch.Tensor, dict, float]:
        if self._data is None:  # read on first use: a run that never probes never loads it
            images, labels, _ = probe_images(self.cfg, self.cfg.diagnostics.noise_levels)
            images = images.to(self.device)
            self._data = images, conditioning(model, labels.to(self.device)), mean_image_error(images)
        return self._data

    def measure(self, ema: nn.Module, model: nn.Module) -> dict:
        """The record of one measurement: the EMA weights' errors, and the trained weights' too
        where ``diagnostics.noise_levels_raw`` asks for them."""
        record = self(ema)
        if self.cfg.diagnostics.noise_levels_raw:
            record |= self(model, weights="raw")
        return record

    @torch.no_grad()
    def __call__(self, model: nn.Module, weights: str = "ema") -> dict:
        """The errors of ``model`` per noise level, named as ``weights`` (``ema`` or ``raw``) says."""
        images, cond, baseline = self.data(model)
        was_training = model.training
        model.eval()
        try:
            errors = noise_level_errors(model, self.schedule, images, **cond)
        finally:
            model.train(was_training)
        record = {metric_names.X0_MEAN_IMAGE: baseline}
        for level, err in errors.items():
            record[metric_names.noise("eps", level, weights)] = err["eps_mse"]
            record[metric_names.noise("x0", level, weights)] = err["x0_mse"]
        return record


# ----------------------------------------------------------------------------- runs on disk


def dataset_images(cfg: Config, limit: int | None = None) -> torch.Tensor:
    """The images of the config's dataset (N, C, H, W) in [-1, 1], the first ``limit`` if given."""
    dataset = build_dataset(cfg.data)
    count = len(dataset) if limit is None else min(limit, len(dataset))
    return torch.stack([dataset[i][0] for i in range(count)])


LATENT_DOWNSAMPLING = 8  # the KL-f8 autoencoder: a 32x32 latent is a 256x256 image


def is_text_to_image(cfg: Config) -> bool:
    """Whether a run trains on the caption and latent shards of ``scalelong extract-features``."""
    return cfg.data.name == "coco_latents"


def run_resolution(cfg: Config) -> int:
    """The side of the images a run makes: 8 x the latent side for text-to-image (latent) runs."""
    side = model_input_shape(cfg.model)[-1]
    return side * LATENT_DOWNSAMPLING if is_text_to_image(cfg) else side


def scored_image_shape(cfg: Config) -> tuple[int, ...]:
    """The shape of one image an evaluation scores: a text-to-image run's decoded RGB image, else
    the model's output."""
    side = run_resolution(cfg)
    return (3, side, side) if is_text_to_image(cfg) else tuple(model_input_shape(cfg.model))


def check_reference_fits(
    fid_stats: str | Path | None,
    ref: tuple[np.ndarray, np.ndarray],
    features: FeatureFn,
    shape: Sequence[int],
    metric: str,
) -> None:
    """Refuse reference statistics ``ref`` (read from ``fid_stats``) that cannot describe images of
    ``shape``: of another feature size than ``metric`` computes, or, where the file records it, of
    images of another side (Inception resizes whatever it is given, so FID would not say)."""
    size = features(torch.zeros(1, *shape)).shape[1]
    if size != len(ref[0]):
        raise ScaleLongError(
            f"{fid_stats} holds statistics of {len(ref[0])} features but {metric} computes {size}; "
            "make them again with `scalelong fid-stats`"
        )
    side = stored_resolution(fid_stats) if fid_stats else None
    if side is not None and side != shape[-1]:
        raise ScaleLongError(
            f"{fid_stats} holds statistics of {side}x{side} images but the run's samples are "
            f"{shape[-1]}x{shape[-1]}; make them at the run's resolution with `scalelong fid-stats`"
        )


def image_folder(path: str | Path, side: int):
    """Every image under ``path`` centre-cropped to ``side`` as ``scalelong extract-features`` crops
    them (shorter side resized, bicubic; the centre square), RGB in [-1, 1]."""
    from PIL import Image

    from scalelong.data import load_folder
    from scalelong.training.t2i import center_crop

    dataset = load_folder(str(path), side, 3)
    dataset.transform = lambda img, _path: Image.fromarray(center_crop(img, side))
    return dataset


def compute_reference_stats(
    cfg: Config,
    out: str | Path,
    metric: str = "fid",
    inception_weights: str | Path | None = None,
    limit: int | None = None,
    batch_size: int = 250,
    device: torch.device | str = "cpu",
    random_init: bool = False,
    images: str | Path | None = None,
    center_crop: int | None = None,
) -> tuple[Path, int]:
    """Reference statistics of the config's dataset to ``out`` (the first stage of FID).

    ``images``: a folder of images instead (e.g. MS-COCO val2014), each centre-cropped to
    ``center_crop`` (default :func:`run_resolution`, 256 for the MS-COCO recipe) as the training
    images were. The images are read one batch at a time, so 40k images at 256 fit in memory.
    """
    features = feature_fn(metric, device, inception_weights, random_init)  # fails fast without weights
    if images is not None:
        side = center_crop or run_resolution(cfg)
        dataset = image_folder(images, side)
    else:
        dataset = build_dataset(cfg.data)
        height, width = dataset[0][0].shape[-2:]
        side = int(width) if height == width else None
    count = len(dataset) if limit is None else min(limit, len(dataset))
    batches = (
        torch.stack([dataset[i][0] for i in range(start, min(start + batch_size, count))])
        for start in range(0, count, batch_size)
    )
    mu, sigma = feature_stats(batch_features(features, batches))
    return save_stats(out, mu, sigma, metric, count, resolution=side), count


def evaluate_run(
    run_dir: str | Path,
    n: int,
    fid_stats: str | Path | None = None,
    metric: str | None = None,
    sampler: str | None = None,
    steps: int | None = None,
    step: int | str | None = None,
    inception_weights: str | Path | None = None,
    batch_size: int | None = None,
    device: torch.device | str = "cpu",
    progress: bool = True,
    random_init: bool = False,
    weights: str = "ema",
    mixed_precision: str | None = None,
    captions: str | Path | None = None,
    guidance_scale: float | None = None,
    text_encoder: str | None = None,
    autoencoder: str | None = None,
    clip: str | Path | None = None,
) -> dict:
    """Sample ``n`` images of a run's checkpoint and score them; the result goes to ``run_dir/eval/``.

    A text-to-image run is scored as U-ViT scores MS-COCO: ``captions`` is an MS-COCO captions file
    (captions_val2014.json; default the run's ``eval.captions``); sample i shows caption i of
    :func:`choose_captions` (seeded by the evaluation seed), drawn with classifier-free guidance
    ``guidance_scale`` (default the run's ``t2i.guidance_scale``) and decoded by the autoencoder;
    ``text_encoder`` and ``autoencoder`` default to the run's ``t2i`` config. ``clip``, a local folder of
    a CLIP model (:func:`scalelong.metrics.clip_score.load_clip_score`), adds ``clip_score``, the mean
    CLIP score of the samples with their captions, and ``clip_model`` to the result.

    ``mixed_precision`` (``no`` | ``bf16`` | ``fp16``; default: the run's ``eval.mixed_precision``) is the
    precision of the sampler's network forward.

    ``weights``: the checkpoint's ``ema`` (the default, what the recipe scores) or raw ``model``
    weights, loaded as :meth:`scalelong.training.runs.RunDir.load_model` does: verified against their
    checksums, the newest checkpoint falling back to the one before when they are damaged.

    With fd-mnist the result also holds ``digits``, the :func:`scalelong.metrics.fd_mnist.digit_score` of
    the same samples, and ``digits_real``, that of held-out real digits (the yardstick).

    The reference statistics are read before anything else, so a wrong path fails at once.
    """
    run = RunDir(run_dir)
    run_cfg = run.config()
    if fid_stats is None and metric in (None, run_cfg.eval.metric):
        fid_stats = run_cfg.eval.fid_stats  # those its evaluations during training were scored against
    if fid_stats is not None and metric is None:  # a statistics file says which features it holds
        metric = stored_metric(fid_stats) or "fid"
    metric = metric or run_cfg.eval.metric
    missing = "FID needs reference statistics: pass --fid-stats PATH (made by `scalelong fid-stats`)"
    ref = reference(metric, fid_stats, missing)
    if n < 2:
        raise ScaleLongError(f"--n must be >= 2, got {n}")
    captions = captions if captions is not None else run_cfg.eval.captions  # those it was scored on
    caption_list = read_caption_list(captions) if captions is not None else None
    writer = writer_of(run.eval_dir)
    if writer is not None:  # never write into a folder another process owns
        print(f"warning: {writer} writes this run; the result is printed, not saved to {run.eval_dir}")
    cfg, model, ckpt = run.load_model(step, weights, device)
    t2i = getattr(model, "context_embed", None) is not None
    if caption_list is not None and not t2i:
        raise ScaleLongError(f"{run_dir} is not a text-to-image run; drop --captions")
    if t2i and caption_list is None:
        raise ScaleLongError(
            f"{run_dir} is a text-to-image run: pass --captions captions_val2014.json (MS-COCO's validation "
            "captions, one drawn for each sample)"
        )
    if clip is not None and not t2i:
        raise ScaleLongError(
            f"{run_dir} is not a text-to-image run; drop --clip (it scores samples by captions)"
        )
    clip_score = None
    if clip is not None:  # read before any sampling: a folder that is not a CLIP model fails now
        from scalelong.metrics.clip_score import load_clip_score

        clip_score = load_clip_score(clip, device)
    features = feature_fn(metric, device, inception_weights, random_init)
    shape = (3, run_resolution(cfg), run_resolution(cfg)) if t2i else model_input_shape(cfg.model)
    check_reference_fits(fid_stats, ref, features, shape, metric)
    sampling = None
    if t2i:
        sampling = caption_sampling(cfg, caption_list, n, device, guidance_scale, text_encoder, autoencoder)
    if batch_size:
        cfg.eval.batch_size = batch_size
    if mixed_precision is not None:
        cfg.eval.mixed_precision = mixed_precision
    sampler, steps = sampler or cfg.eval.sampler, steps or cfg.eval.steps
    t0 = time.perf_counter()
    score = score_model(
        model, cfg, features, ref, n, sampler, steps, device, progress, digits=metric == "fd-mnist",
        captions=sampling, clip=clip_score,
    )  # fmt: skip
    fd = score.fd
    if not math.isfinite(fd):
        raise ScaleLongError(
            f"the {metric} of {ckpt.name} is {fd}: the samples or their features are not finite; "
            "nothing was written"
        )
    result = {
        "checkpoint": ckpt.name,
        "weights": weights,
        "fd": fd,
        "fd_metric": metric,
        "fd_samples": n,
        "fd_sampler": sampler,
        "fd_steps": steps,
        "fd_precision": forward_precision(cfg, device),
        "fd_seconds": time.perf_counter() - t0,
        "reference": str(fid_stats) if fid_stats else "embedded MNIST train",
    }
    if sampling is not None:  # the protocol of a text-to-image score (U-ViT's MS-COCO FID)
        result.update(
            captions=str(captions),
            captions_count=len(caption_list),
            captions_sampled=sampling.captions,
            guidance_scale=sampling.guidance_scale,
            text_encoder=text_encoder or cfg.t2i.text_encoder,
            autoencoder=autoencoder or cfg.t2i.autoencoder,
        )
    if score.clip is not None:
        result.update(clip_score=score.clip, clip_model=str(clip))
    if score.digits is not None:  # beside FD-MNIST: the digit score of the same samples, and of real digits
        result["digits"] = score.digits
        result["digits_real"] = real_digit_score()
    if writer is None and writer_of(run.eval_dir) is None:
        run.eval_dir.mkdir(exist_ok=True)
        tag = "" if weights == "ema" else f"-{weights}"  # the raw weights' score never replaces the EMA's
        tag += "" if result["fd_precision"] == "fp32" else f"-{result['fd_precision']}"  # nor the fp32 one
        tag += "" if sampling is None else f"-cfg{sampling.guidance_scale:g}"  # nor another guidance's
        name = f"{metric}-{ckpt.name}{tag}-n{n}-{sampler}{steps}.json"
        write_text_atomic(run.eval_dir / name, json.dumps(result, indent=1))
    return result


__all__ = [
    "CaptionSampling",
    "TrainingEvaluator",
    "caption_sampling",
    "check_reference_fits",
    "choose_captions",
    "compute_reference_stats",
    "evaluate_run",
    "first_evaluation_seed",
    "is_text_to_image",
    "reference",
    "read_caption_list",
    "reference_for",
    "sample_features",
    "scored_image_shape",
    "score_model",
    "SampleScore",
]
