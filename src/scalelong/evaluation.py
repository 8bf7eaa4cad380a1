"""Evaluation of a run: Fréchet distance of EMA samples during training, best step, final re-score.

The recipe (U-ViT code base): every 50k steps, FID of 10k EMA samples drawn with a 50-step
DPM-Solver; at the end the best checkpoint by that FID is re-scored on 50k samples. Here the
numbers come from the ``eval`` config section and the metric may be the offline FD-MNIST.

Unlike the release, the best step is chosen from this run's own ``metrics.jsonl`` only (the
release appended every run's evaluations to one log and never cleared it, so stale lines could
name the "best" checkpoint), and only among steps whose checkpoint exists.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from scalelong.config import Config, EvalConfig
from scalelong.data import to_uint8
from scalelong.errors import ScaleLongError
from scalelong.frechet import FeatureFn, feature_fn, feature_stats, frechet_distance, load_stats
from scalelong.runs import RunDir, load_model
from scalelong.sampling import generate

EVAL_SEED_OFFSET = 1_000_003  # evaluation noise never coincides with the training noise streams


def reference_for(e: EvalConfig) -> tuple[np.ndarray, np.ndarray]:
    """The reference statistics of the config: its file, or for fd-mnist the embedded training digits."""
    if e.fid_stats:
        return load_stats(e.fid_stats, e.metric)
    if e.metric == "fd-mnist":
        from scalelong.frechet import mnist_reference_stats

        return mnist_reference_stats("train")
    raise ScaleLongError("eval.metric=fid needs eval.fid_stats=PATH (make it with `scalelong fid-stats`)")


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
) -> torch.Tensor:
    """Features (N, D) of images drawn from ``model`` with one seed per image; labels cycle over classes."""
    from tqdm import tqdm

    from scalelong.build import build_schedule, model_input_shape

    schedule, shape = build_schedule(cfg.diffusion), model_input_shape(cfg.model)
    num_classes = max(getattr(model, "num_classes", 0), 1)
    out = []
    for start in tqdm(range(0, len(seeds), batch_size), disable=not progress, unit="batch"):
        chunk = list(seeds[start : start + batch_size])
        labels = torch.tensor(chunk) % num_classes
        images = generate(model, schedule, sampler, steps, chunk, shape, labels, device)
        out.append(features(images))
    return torch.cat(out)


def fd_of_model(
    model: nn.Module,
    cfg: Config,
    features: FeatureFn,
    ref: tuple[np.ndarray, np.ndarray],
    n: int,
    sampler: str | None = None,
    steps: int | None = None,
    device: torch.device | str = "cpu",
    progress: bool = False,
) -> float:
    """Fréchet distance of ``n`` samples of ``model`` (seeds fixed by the config) to ``ref``."""
    base = cfg.train.seed * EVAL_SEED_OFFSET
    feats = sample_features(
        model,
        cfg,
        features,
        range(base, base + n),
        sampler or cfg.eval.sampler,
        steps or cfg.eval.steps,
        cfg.eval.batch_size,
        device,
        progress,
    )
    return frechet_distance(*feature_stats(feats), *ref)


def eval_records(run_dir: str | Path, metric: str | None = None) -> dict[int, dict]:
    """This run's evaluation records by step, from its own ``metrics.jsonl``; a later line for the
    same step (written after a resume) replaces an earlier one."""
    records: dict[int, dict] = {}
    for r in RunDir(run_dir).metrics():
        fd = r.get("fd")
        if "step" not in r or not isinstance(fd, (int, float)) or not math.isfinite(fd):
            continue
        if metric is None or r.get("fd_metric") == metric:
            records[int(r["step"])] = r
    return records


def best_step(run_dir: str | Path, metric: str | None = None, require_checkpoint: bool = True) -> int | None:
    """The step with the lowest Fréchet distance in this run's records (None if there are none).

    Only steps whose checkpoint folder exists are candidates when ``require_checkpoint``, so the
    answer can always be re-evaluated; ties go to the earlier step.
    """
    run = RunDir(run_dir)
    records = eval_records(run, metric)
    if require_checkpoint:
        records = {s: r for s, r in records.items() if run.checkpoint(s).is_dir()}
    if not records:
        return None
    return min(records, key=lambda s: (records[s]["fd"], s))


class TrainingEvaluator:
    """Fréchet distance of EMA samples during training, and the final re-score of the best step.

    Call contract (the trainer, main process only)::

        evaluator = TrainingEvaluator(cfg, run_dir, device)  # reads reference stats now: bad paths fail early
        for step in ...:                                     # step = optimizer steps completed (1-based)
            ...
            if evaluator.due(step):                          # cfg.eval.every > 0 and step % every == 0
                record = evaluator(step, ema)                # samples cfg.eval.num_samples images
                metrics_log.write({"step": step, **record})  # best_step() reads these lines back
        ...                                                  # after the last checkpoint is saved:
        final = evaluator.finalize()                         # None if nothing was evaluated

    ``evaluator(step, ema)`` returns ``{"fd": float, "fd_metric": "fd-mnist" | "fid", "fd_samples": n,
    "fd_sampler": name, "fd_steps": k, "fd_seconds": s}``; it leaves the model's train/eval mode as
    it found it and touches no global RNG. ``finalize()`` loads ``ema.safetensors`` of
    :func:`best_step`, scores it on ``cfg.eval.final_num_samples`` samples and writes and returns
    ``{"best_step", "fd", "fd_metric", "fd_samples", "fd_at_eval", ...}`` to ``run_dir/eval_final.json``.
    Config keys: ``eval.every, num_samples, metric, fid_stats, inception_weights, sampler, steps,
    batch_size, final_num_samples``.
    """

    def __init__(self, cfg: Config, run_dir: str | Path, device: torch.device | str = "cpu"):
        self.cfg, self.run, self.device = cfg, RunDir(run_dir), torch.device(device)
        self.e = cfg.eval
        self._features: FeatureFn | None = None
        self.ref = reference_for(self.e) if self.e.every > 0 else None
        if self.e.every > 0 and self.e.metric == "fd-mnist":
            from scalelong.build import model_input_shape

            if model_input_shape(cfg.model) != (1, 32, 32):
                raise ScaleLongError(
                    f"eval.metric=fd-mnist scores 1x32x32 digits but the model makes "
                    f"{model_input_shape(cfg.model)}; use eval.metric=fid with eval.fid_stats"
                )

    @property
    def features(self) -> FeatureFn:
        if self._features is None:  # the Inception network loads on first use only
            self._features = feature_fn(self.e.metric, self.device, self.e.inception_weights)
        return self._features

    def due(self, step: int) -> bool:
        return self.e.every > 0 and step > 0 and step % self.e.every == 0

    def __call__(self, step: int, ema_model: nn.Module, n: int | None = None) -> dict:
        if self.ref is None:
            self.ref = reference_for(self.e)
        n = n or self.e.num_samples
        was_training = ema_model.training
        ema_model.eval()
        t0 = time.perf_counter()
        try:
            fd = fd_of_model(ema_model, self.cfg, self.features, self.ref, n, device=self.device)
        finally:
            ema_model.train(was_training)
        return {
            "fd": fd,
            "fd_metric": self.e.metric,
            "fd_samples": n,
            "fd_sampler": self.e.sampler,
            "fd_steps": self.e.steps,
            "fd_seconds": time.perf_counter() - t0,
        }

    def finalize(self) -> dict | None:
        """Re-score the best checkpoint on ``eval.final_num_samples`` samples (the recipe's last step)."""
        step = best_step(self.run, self.e.metric)
        if step is None or self.e.final_num_samples <= 0:
            return None
        model = load_model(self.run.checkpoint(step), self.cfg.model, "ema", self.device)
        result = self(step, model, self.e.final_num_samples)
        result = {
            "best_step": step,
            **result,
            "fd_at_eval": eval_records(self.run, self.e.metric)[step]["fd"],
        }
        self.run.eval_final_file.write_text(json.dumps(result, indent=1))
        return result


# ----------------------------------------------------------------------------- runs on disk


def checkpoint_step(run: RunDir, step: int | str | None) -> int | None:
    """A ``--step`` value as a step number: None or "latest" stay None (the newest checkpoint),
    "best" is :func:`best_step` by the run's own eval.metric."""
    if step in (None, "latest"):
        return None
    if step == "best":
        best = best_step(run, run.config().eval.metric)
        if best is None:
            raise ScaleLongError(f"{run} has no evaluation records to pick a best step from")
        return best
    return int(step)


def load_run(
    run_dir: str | Path,
    step: int | str | None = None,
    weights: str = "ema",
    device: torch.device | str = "cpu",
) -> tuple[Config, nn.Module, Path]:
    """A run's resolved config and a model holding a checkpoint's weights (EMA by default).

    ``step``: None or "latest" for the newest checkpoint, "best" for :func:`best_step`, or a step number.
    """
    run = RunDir(run_dir).require()
    return run.load_model(checkpoint_step(run, step), weights, device)


def _to_uint8(images: torch.Tensor) -> np.ndarray:
    """(B, C, H, W) in [-1, 1] -> (B, H, W, C) uint8."""
    return to_uint8(images).permute(0, 2, 3, 1).cpu().numpy()


def _write_png(array: np.ndarray, path: Path) -> None:
    from PIL import Image

    tmp = path.with_name(f".{path.name}.tmp")
    Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array).save(tmp, format="PNG")
    tmp.replace(path)  # a killed run never leaves a half-written PNG under the final name


def write_missing_pngs(
    out: Path, n: int, batch_size: int, draw: Callable[[list[int]], torch.Tensor], progress: bool = True
) -> int:
    """Write ``out/000000.png ...`` for the indices in 0..n-1 that have no file yet, ``batch_size``
    at a time; ``draw(indices)`` returns their images in [-1, 1]. Returns how many were drawn."""
    from tqdm import tqdm

    todo = [i for i in range(n) if not (out / f"{i:06d}.png").is_file()]
    bar = tqdm(total=n, initial=n - len(todo), disable=not progress, unit="img")
    for start in range(0, len(todo), batch_size):
        idx = todo[start : start + batch_size]
        for i, array in zip(idx, _to_uint8(draw(idx)), strict=True):
            _write_png(array, out / f"{i:06d}.png")
        bar.update(len(idx))
    bar.close()
    return len(todo)


def sample_to_dir(
    run_dir: str | Path,
    out: str | Path,
    n: int,
    sampler: str | None = None,
    steps: int | None = None,
    seed: int = 0,
    batch_size: int = 64,
    label: int | None = None,
    step: int | str | None = None,
    weights: str = "ema",
    device: torch.device | str = "cpu",
    progress: bool = True,
) -> dict:
    """Draw ``n`` images of a run into ``out/000000.png ...`` and ``out/samples.npz``; resumable.

    Image i comes from seed ``seed + i`` (and label ``label`` or ``i % num_classes``), so a second call
    only draws what is missing and the result does not depend on ``batch_size``. ``out/sampling.json``
    records the settings; resuming with different ones is refused instead of mixing two sets.
    """

    from scalelong.build import build_schedule, model_input_shape
    from scalelong.sampling import get_sampler

    if n <= 0 or batch_size <= 0:
        raise ScaleLongError(f"--n and --batch-size must be > 0, got {n}, {batch_size}")
    cfg, model, ckpt = load_run(run_dir, step, weights, device)
    if getattr(model, "context_embed", None) is not None:
        raise ScaleLongError(f"{run_dir} is a text-to-image run: pass --prompt TEXT or --prompts-file FILE")
    sampler, steps = sampler or cfg.sample.sampler, steps or cfg.sample.steps
    get_sampler(sampler)
    num_classes = getattr(model, "num_classes", 0)
    if label is not None and not 0 <= label < max(num_classes, 1):
        raise ScaleLongError(f"--label {label} is outside the model's {num_classes} classes")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"run": str(run_dir), "checkpoint": ckpt.name, "weights": weights, "sampler": sampler}
    meta.update(steps=steps, seed=seed, label=label)
    meta_path = out / "sampling.json"
    if meta_path.is_file() and json.loads(meta_path.read_text()) != meta:
        raise ScaleLongError(
            f"{out} holds samples made with other settings ({meta_path}); choose another --out"
        )
    meta_path.write_text(json.dumps(meta, indent=1))

    labels = [label if label is not None else i % max(num_classes, 1) for i in range(n)]
    schedule, shape = build_schedule(cfg.diffusion), model_input_shape(cfg.model)

    def draw(idx: list[int]) -> torch.Tensor:
        labels_idx = torch.tensor([labels[i] for i in idx])
        return generate(model, schedule, sampler, steps, [seed + i for i in idx], shape, labels_idx, device)

    drawn = write_missing_pngs(out, n, batch_size, draw, progress)

    from PIL import Image

    arrays = np.stack([np.asarray(Image.open(out / f"{i:06d}.png")) for i in range(n)])
    arrays = arrays[..., None] if arrays.ndim == 3 else arrays  # (N, H, W, C) for grey images too
    np.savez(out / "samples.npz", images=arrays, labels=np.array(labels))
    return {"out": out, "drawn": drawn, "total": n, "checkpoint": ckpt}


def dataset_images(cfg: Config, limit: int | None = None) -> torch.Tensor:
    """The images of the config's dataset (N, C, H, W) in [-1, 1], the first ``limit`` if given."""
    from scalelong.build import build_dataset

    dataset = build_dataset(cfg.data)
    count = len(dataset) if limit is None else min(limit, len(dataset))
    return torch.stack([dataset[i][0] for i in range(count)])


def compute_reference_stats(
    cfg: Config,
    out: str | Path,
    metric: str = "fid",
    inception_weights: str | Path | None = None,
    limit: int | None = None,
    batch_size: int = 250,
    device: torch.device | str = "cpu",
    random_init: bool = False,
) -> tuple[Path, int]:
    """Reference statistics of the config's dataset to ``out`` (the first stage of FID)."""
    from scalelong.frechet import batch_features, save_stats

    features = feature_fn(metric, device, inception_weights, random_init)  # fails fast without weights
    images = dataset_images(cfg, limit)
    mu, sigma = feature_stats(batch_features(features, images.split(batch_size)))
    return save_stats(out, mu, sigma, metric, len(images)), len(images)


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
) -> dict:
    """Sample ``n`` images of a run's checkpoint and score them; the result goes to ``run_dir/eval/``.

    The reference statistics are read before anything else, so a wrong path fails at once.
    """
    run = RunDir(run_dir)
    run_cfg = run.config()
    if fid_stats is not None and metric is None:  # a statistics file says which features it holds
        from scalelong.frechet import stored_metric

        metric = stored_metric(fid_stats) or "fid"
    metric = metric or run_cfg.eval.metric
    if fid_stats is not None:
        ref = load_stats(fid_stats, metric)
    elif metric == "fd-mnist":
        from scalelong.frechet import mnist_reference_stats

        ref = mnist_reference_stats("train")
    else:
        raise ScaleLongError(
            "FID needs reference statistics: pass --fid-stats PATH (made by `scalelong fid-stats`)"
        )
    if n < 2:
        raise ScaleLongError(f"--n must be >= 2, got {n}")
    features = feature_fn(metric, device, inception_weights, random_init)
    cfg, model, ckpt = run.load_model(checkpoint_step(run, step), "ema", device)
    if batch_size:
        cfg.eval.batch_size = batch_size
    sampler, steps = sampler or cfg.eval.sampler, steps or cfg.eval.steps
    t0 = time.perf_counter()
    fd = fd_of_model(model, cfg, features, ref, n, sampler, steps, device, progress)
    result = {
        "checkpoint": ckpt.name,
        "fd": fd,
        "fd_metric": metric,
        "fd_samples": n,
        "fd_sampler": sampler,
        "fd_steps": steps,
        "fd_seconds": time.perf_counter() - t0,
        "reference": str(fid_stats) if fid_stats else "embedded MNIST train",
    }
    run.eval_dir.mkdir(exist_ok=True)
    name = f"{metric}-{ckpt.name}-n{n}-{sampler}{steps}.json"
    (run.eval_dir / name).write_text(json.dumps(result, indent=1))
    return result


__all__ = [
    "TrainingEvaluator",
    "compute_reference_stats",
    "evaluate_run",
    "load_run",
    "sample_to_dir",
    "best_step",
    "eval_records",
    "fd_of_model",
    "reference_for",
    "sample_features",
]
