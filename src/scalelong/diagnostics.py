"""Stability diagnostics: what the ScaleLong paper measures, on any model with a :class:`SkipScaling`.

:class:`Diagnostics` listens to every long skip (through ``SkipScaling.probe``) and to the
hidden feature of every block (forward hooks), reads the blocks' parameter gradients after
backward, and keeps sliding-window oscillation statistics and a loss-spike counter. Hooks are
armed only on logged steps, so every other step runs no diagnostic code at all.

Per logged step the trainer does::

    logging = diag.active_for(step)          # arms the hooks when step is a logged step
    loss = training_loss(...).mean()
    loss.backward()
    if logging:
        record.update(diag.collect(step, loss.item()))   # reads grads, disarms the hooks
    optimizer.step(); optimizer.zero_grad()

Metric names (flat, ready for metrics.jsonl and TensorBoard; skip 1 is the outermost):

* ``skip/<i>/norm_in``, ``skip/<i>/norm_out``: mean per-sample L2 norm of skip i before and
  after scaling; ``skip/<i>/coef_mean|coef_min|coef_max``: its coefficient (for LS over the
  batch and tokens; for constant methods all three equal the constant).
* ``block/<name>/feature_norm``: mean per-sample L2 norm of the block's output (the paper's
  "norm of feature", Fig. 1); ``block/<name>/grad_norm``: L2 norm of its parameter gradient.
* ``feature_norm`` (mean over blocks), ``block_grad_norm`` (L2 over all blocks), and for these
  and ``loss``: ``osc/<series>_std``, ``osc/<series>_range``, ``osc/<series>_peak_ratio``
  (largest / median) over the last ``window`` logged values.
* ``spikes``: loss spikes so far (loss above ``spike_factor`` x the window's median, or not
  finite); ``nonfinite_values``: non-finite values in this record; ``nonfinite_values_total``: so far.

Norms are per sample and averaged over the batch, so they do not depend on the batch size. If
an armed step runs several forwards (``train.grad_accum`` micro-batches), the statistics cover
them all (norms and mean coefficients averaged over every sample, min and max over all), so
they equal those of one forward of the whole batch, and the gradient norms are those of the
accumulated gradient.
Non-finite values are recorded as they are and counted, never dropped.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from torch import nn

from scalelong.diffusion import add_noise
from scalelong.errors import ScaleLongError
from scalelong.runs import load_model
from scalelong.skips import SkipScaling, find_skip_scaling

OSC_SERIES = ("feature_norm", "block_grad_norm", "loss")
SKIP_KEYS = ("norm_in", "norm_out", "coef_mean", "coef_min", "coef_max")


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DDP / DataParallel / torch.compile wrappers."""
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        else:
            return model


def find_blocks(model: nn.Module) -> dict[str, nn.Module]:
    """Named blocks whose hidden features the diagnostics record, in forward order.

    A backbone may define ``diagnostic_blocks() -> dict[str, nn.Module]`` (or an iterable of
    ``(name, module)``). Otherwise every element of a top-level ``nn.ModuleList`` is a block
    (``in_blocks.0``, ...), and so is a top-level child whose name ends in ``block``
    (``mid_block``), in registration order.
    """
    model = unwrap(model)
    if hasattr(model, "diagnostic_blocks"):
        return dict(model.diagnostic_blocks())
    blocks: dict[str, nn.Module] = {}
    for name, child in model.named_children():
        if isinstance(child, SkipScaling):
            continue
        if isinstance(child, nn.ModuleList):
            blocks.update((f"{name}.{i}", m) for i, m in enumerate(child))
        elif name.endswith("block"):
            blocks[name] = child
    return blocks


def _sample_norm(x: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of per-sample L2 norms, in float32, detached: a 0-d tensor."""
    return x.detach().float().flatten(1).norm(dim=1).mean()


def _merge(old: list | None, new: list, kinds: Sequence[str]) -> list:
    """Statistics of two forwards of one armed step as those of one: entries of ``kinds`` ``mean``
    (weighted by the sample counts, the last entry), ``min`` or ``max``. One forward: ``new`` as is."""
    if old is None:
        return new
    n_old, n_new = old[-1], new[-1]
    out = []
    for kind, a, b in zip(kinds, old, new, strict=False):
        if kind == "mean":
            out.append((a * n_old + b * n_new) / (n_old + n_new))
        else:
            out.append(torch.minimum(a, b) if kind == "min" else torch.maximum(a, b))
    return [*out, n_old + n_new]


def window_stats(values: Iterable[float]) -> dict[str, float]:
    """std, range and largest / median of the finite values (NaN when fewer than two)."""
    v = [x for x in values if math.isfinite(x)]
    if len(v) < 2:
        return {"std": math.nan, "range": math.nan, "peak_ratio": math.nan}
    med = statistics.median(v)
    return {
        "std": statistics.pstdev(v),
        "range": max(v) - min(v),
        "peak_ratio": max(v) / med if med > 0 else math.nan,
    }


class Diagnostics:
    """Skip, block and oscillation statistics of ``model`` every ``every`` steps.

    Args:
        model: the backbone (wrappers are looked through); its ``SkipScaling`` and blocks
            (see :func:`find_blocks`) are found automatically.
        every: log on steps that are multiples of ``every``; 0 switches diagnostics off.
        window: number of logged values the oscillation statistics look back over.
        spike_factor: a loss above this multiple of the window's median counts as a spike.
        blocks: explicit ``{name: module}`` to use instead of :func:`find_blocks`.
    """

    def __init__(
        self,
        model: nn.Module,
        every: int = 100,
        window: int = 20,
        spike_factor: float = 3.0,
        blocks: dict[str, nn.Module] | None = None,
    ):
        if every < 0 or window < 2 or spike_factor <= 1.0:
            raise ScaleLongError(
                f"diagnostics need every >= 0, window >= 2, spike_factor > 1; got {every}, {window}, "
                f"{spike_factor}"
            )
        self.model, self.every, self.window, self.spike_factor = model, every, window, spike_factor
        self.blocks = dict(blocks) if blocks is not None else find_blocks(model)
        self.scaling = find_skip_scaling(model)
        self.history: dict[str, deque[float]] = {k: deque(maxlen=window) for k in OSC_SERIES}
        self.spikes = 0
        self.nonfinite_total = 0
        self.attached = False
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._skips: dict[int, list] = {}  # index -> [norm_in, norm_out, coef mean, min, max, samples]
        self._features: dict[str, list] = {}  # block -> [feature norm, samples]
        self._armed_step: int | None = None

    # ------------------------------------------------------------------ switching

    def attach(self) -> Diagnostics:
        """Enable the diagnostics (no hook is installed until a logged step arms them)."""
        if self.scaling is not None and self.scaling.probe not in (None, self._probe):
            raise ScaleLongError("the model's SkipScaling already has another probe; detach it first")
        self.attached = True
        return self

    def detach(self) -> None:
        """Remove every hook and disable the diagnostics."""
        self.disarm()
        self.attached = False

    def state_dict(self) -> dict:
        """What a resumed run needs to continue the records exactly: the sliding windows and counts."""
        history = {k: list(v) for k, v in self.history.items()}
        return {"history": history, "spikes": self.spikes, "nonfinite_total": self.nonfinite_total}

    def load_state_dict(self, state: dict) -> None:
        for k, values in state["history"].items():
            if k in self.history:
                self.history[k].clear()
                self.history[k].extend(values)  # the newest ``window`` values
        self.spikes, self.nonfinite_total = state["spikes"], state["nonfinite_total"]

    def __enter__(self) -> Diagnostics:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def active_for(self, step: int) -> bool:
        """Whether ``step`` is a logged step; arms the hooks for its forward if so, else disarms."""
        active = self.attached and self.every > 0 and step % self.every == 0
        if active:
            self.arm()
            self._armed_step = step
        else:
            self.disarm()
        return active

    def arm(self) -> None:
        """Install the skip probe and the block hooks for the next forward (idempotent)."""
        if self._handles or (self.scaling is not None and self.scaling.probe == self._probe):
            return
        if self.scaling is not None and self.scaling.probe is not None:
            raise ScaleLongError("the model's SkipScaling already has another probe; detach it first")
        self._skips.clear()
        self._features.clear()
        if self.scaling is not None:
            self.scaling.probe = self._probe
        for name, block in self.blocks.items():
            self._handles.append(block.register_forward_hook(self._feature_hook(name)))

    def disarm(self) -> None:
        """Remove the probe and the hooks: the model runs exactly as without diagnostics."""
        self._armed_step = None
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self.scaling is not None and self.scaling.probe == self._probe:
            self.scaling.probe = None

    # ------------------------------------------------------------------ hooks

    # Kept as tensors (one device-to-host copy per logged step, in collect()), with the sample
    # count last, so the forwards of several micro-batches merge into the statistics of their union.
    _SKIP_KINDS = ("mean", "mean", "mean", "min", "max")  # norm_in, norm_out, coef_mean, coef_min, coef_max

    def _probe(self, index: int, skip: torch.Tensor, coef: torch.Tensor | float, out: torch.Tensor) -> None:
        if isinstance(coef, torch.Tensor):
            c = coef.detach().float()
            c_stats = [c.mean(), c.min(), c.max()]
        else:
            c_stats = [torch.tensor(float(coef))] * 3
        new = [_sample_norm(skip), _sample_norm(out), *c_stats, skip.shape[0]]
        self._skips[index] = _merge(self._skips.get(index), new, self._SKIP_KINDS)

    def _feature_hook(self, name: str):
        def hook(module: nn.Module, args: object, output: object) -> None:
            if isinstance(output, (tuple, list)):  # blocks that also return extras: first is the feature
                output = output[0]
            if isinstance(output, torch.Tensor):
                new = [_sample_norm(output), output.shape[0]]
                self._features[name] = _merge(self._features.get(name), new, ("mean",))

        return hook

    # ------------------------------------------------------------------ reading

    def collect(self, step: int, loss: float) -> dict[str, float]:
        """Metrics of the armed step (call after backward, before zero_grad); disarms the hooks."""
        if self._armed_step is not None and step != self._armed_step:
            raise ScaleLongError(
                f"collect(step={step}) but the hooks were armed by active_for({self._armed_step})"
            )
        self.disarm()
        names: list[str] = []
        tensors: list[torch.Tensor | None] = []
        n_skips = self.scaling.num_skips if self.scaling is not None else 0
        for i in range(1, n_skips + 1):
            # A skip that did not run this step is recorded as NaN rather than left out.
            stats = self._skips.get(i)
            names += [f"skip/{i}/{key}" for key in SKIP_KEYS]
            tensors += stats[:-1] if stats is not None else [None] * len(SKIP_KEYS)
        for name, block in self.blocks.items():
            grads = [p.grad.detach() for p in block.parameters() if p.grad is not None]
            gnorm = (
                torch.linalg.vector_norm(torch.stack([g.float().norm() for g in grads])) if grads else None
            )
            feature = self._features.get(name)
            names += [f"block/{name}/feature_norm", f"block/{name}/grad_norm"]
            tensors += [None if feature is None else feature[0], gnorm]
        # Missing measurements (a skip or block that did not run, a frozen block) become NaN in
        # the record but are not counted as non-finite values of the model.
        measured = [t for t in tensors if t is not None]
        values_measured = (
            torch.stack([t.float().to(measured[0].device) for t in measured]).cpu().tolist()
            if measured
            else []
        )
        it = iter(values_measured)
        values = [next(it) if t is not None else math.nan for t in tensors]
        out: dict[str, float] = dict(zip(names, values, strict=True))
        self._skips.clear()
        self._features.clear()

        feats = [out[f"block/{n}/feature_norm"] for n in self.blocks]
        grads = [out[f"block/{n}/grad_norm"] for n in self.blocks]
        out["feature_norm"] = sum(feats) / len(feats) if feats else math.nan
        out["block_grad_norm"] = math.sqrt(sum(g * g for g in grads)) if grads else math.nan
        loss = float(loss)
        # Counted over the measurements only: early window statistics are NaN by design.
        nonfinite = sum(not math.isfinite(v) for v in values_measured) + (not math.isfinite(loss))
        self.nonfinite_total += nonfinite
        if self._is_spike(loss):
            self.spikes += 1
        for series in OSC_SERIES:
            self.history[series].append(loss if series == "loss" else out[series])
            for k, v in window_stats(self.history[series]).items():
                out[f"osc/{series}_{k}"] = v
        out["spikes"] = self.spikes
        out["nonfinite_values"] = nonfinite
        out["nonfinite_values_total"] = self.nonfinite_total
        return out

    def _is_spike(self, loss: float) -> bool:
        if not math.isfinite(loss):
            return True
        past = [v for v in self.history["loss"] if math.isfinite(v)]
        # Three earlier values at least, so one odd value early in training is not a reference.
        return len(past) >= 3 and loss > self.spike_factor * statistics.median(past)


# ---------------------------------------------------------------------- robustness


@torch.no_grad()
def robustness(
    model: nn.Module | str | Path,
    schedule: object,
    x0: torch.Tensor,
    ts: Sequence[float],
    delta_scale: float = 1e-3,
    generator: torch.Generator | None = None,
    **cond: torch.Tensor,
) -> list[dict[str, float]]:
    """Empirical local Lipschitz ratio ||f(x_t + delta) - f(x_t)|| / ||delta|| per noise level.

    For each t in ``ts``: x_t = alpha(t) x0 + sigma(t) eps, delta = ``delta_scale`` * N(0, I), both
    drawn on the CPU from ``generator``; the ratio is computed per sample. Returns one row per t:
    ``{"t", "mean", "max"}`` over the batch. The paper bounds it by sum_i kappa_i M0^i + c0
    (see :func:`scalelong.theory.lipschitz_sum`). ``model`` may be a checkpoint folder
    (``checkpoints/step-XXXXXX``): its EMA weights are probed. The model runs in eval mode.
    """
    if not isinstance(model, nn.Module):
        model = load_model(model)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    x0 = x0.to(device)
    rows = []
    try:
        for t_val in ts:
            t = torch.full((x0.shape[0],), float(t_val))
            noise = torch.randn(x0.shape, generator=generator)
            delta = delta_scale * torch.randn(x0.shape, generator=generator)
            x_t = add_noise(schedule, x0, t, noise.to(device))
            tm = schedule.model_time(t).to(device)
            diff = model(x_t + delta.to(device), tm, **cond).float() - model(x_t, tm, **cond).float()
            ratio = diff.flatten(1).norm(dim=1).cpu() / delta.flatten(1).norm(dim=1)
            rows.append({"t": float(t_val), "mean": ratio.mean().item(), "max": ratio.max().item()})
    finally:
        model.train(was_training)
    return rows


__all__ = [
    "Diagnostics",
    "find_blocks",
    "window_stats",
    "robustness",
]
