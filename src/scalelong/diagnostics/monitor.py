"""The stability probe: :class:`Diagnostics` records the skip, block, fp16 and oscillation
statistics of a model every ``every`` steps, from ``scalelong train`` or your own loop (see
:mod:`scalelong.diagnostics` for a complete loop).

:class:`Diagnostics` listens to every long skip (through ``SkipScaling.probe``) and to the
hidden feature of every block (forward hooks), reads the blocks' parameter gradients after
backward, and keeps sliding-window oscillation statistics and a loss-spike counter. It works on
every backbone with a :class:`~scalelong.skips.SkipScaling`: the package's ``UViT`` and ``UNet``,
a diffusers UNet after ``apply_scalelong`` (raw or inside ``DiffusersUNet2D``), and without one
it still records the blocks. Hooks are installed only on logged steps, so every other step runs
no diagnostic code at all.

Per step the protocol is two calls: ``arm(step)`` before the forward (True on a logged step,
whose forward it then listens to; False, and nothing runs, on any other), ``collect(step, loss)``
after backward and before ``optimizer.step()`` / ``zero_grad()`` (it reads the gradients and
returns the record; ``{}`` on a step that was not armed, leaving the oscillation windows alone).
Under a loss scaler (fp16) the gradients still carry the loss scale there: pass it,
``collect(step, loss, grad_scale=scaler.get_scale())`` (see :meth:`Diagnostics.collect`).
Misuse is never silent: a step armed and not collected warns when the next one is armed,
``collect`` for another step than the armed one and arming after :meth:`Diagnostics.detach` are
errors. Create :class:`Diagnostics` after ``apply_scalelong``; it listens from construction.

Metric names (flat, ready for metrics.jsonl and TensorBoard; skip 1 is the outermost):

* ``skip/<i>/norm_in``, ``skip/<i>/norm_out``: mean per-sample L2 norm of skip i before and
  after scaling (after ``skip-norm``'s normalisation: the tensor that is merged);
  ``skip/<i>/coef_mean|coef_min|coef_max``: its coefficient (for LS over the batch and tokens;
  for constant methods all three equal the constant; left out under ``skip-norm``, which has
  none); ``skip/<i>/absmax_in``: the largest absolute value of skip i before scaling.
* ``block/<name>/feature_norm``: mean per-sample L2 norm of the block's output (the paper's
  "norm of feature", Fig. 1); ``block/<name>/grad_norm``: L2 norm of its parameter gradient
  (the true one: divided by ``collect``'s ``grad_scale``, the loss scale the gradients carry);
  ``block/<name>/absmax``: the largest absolute value of its output.
  Block names are those of :func:`find_blocks` (a diffusers UNet: ``down_blocks.0``, ...,
  ``mid_block``, ``up_blocks.0``, ...).
* ``fp16/headroom``: fp16's largest finite value, 65,504, over the largest of this step's
  ``absmax`` and ``absmax_in``: how many times the features could still grow before half
  precision overflows (:func:`fp16_headroom`); 0 when one of them is inf or NaN (in fp16 an
  overflow is inf, which the next LayerNorm or GroupNorm turns into NaN). ``scalelong analyze``
  prints one line when a run came within 10x of it (:func:`headroom_warning`).
* ``fp16/headroom_ops``: 65,504 over the largest output ``|value|`` of the step's fp16 ops (the
  modules fp16 autocast runs in half precision, :func:`scalelong.diagnostics.overflow.fp16_ops`: every Linear
  and convolution, attention, the U-ViT's ``skip_linear`` merge); ``fp16/headroom_grad``: the same
  of the gradients reaching those outputs (the scaled ones under a GradScaler, measured in
  backward: what fp16 holds; ``grad_scale`` leaves it alone);
  ``fp16/least_op``: the name of the op with the largest output, the one with the least headroom.
  A non-finite value counts as inf (headroom 0). Measured in fp32, bf16 and fp16 runs alike;
  :meth:`Diagnostics.locate_overflow` names the first op that overflows in a forward.
* ``feature_norm`` (mean over blocks), ``block_grad_norm`` (L2 over all blocks), and for these
  and ``loss``: ``osc/<series>_std``, ``osc/<series>_range``, ``osc/<series>_peak_ratio``
  (largest / median) over the last ``window`` logged values.
* ``spikes``: loss spikes so far (loss above ``spike_factor`` x the window's median, or not
  finite); ``nonfinite_values``: non-finite values in this record; ``nonfinite_values_total``: so far.

The loss itself is not in the record: log it as ``loss`` (:meth:`RunLog.write` does).
Norms are per sample and averaged over the batch, so they do not depend on the batch size. If
an armed step runs several forwards (gradient-accumulation micro-batches), the statistics cover
them all (norms and mean coefficients averaged over every sample, min, max and absmax over all), so
they equal those of one forward of the whole batch, and the gradient norms are those of the
accumulated gradient.
Non-finite values are recorded as they are and counted, never dropped.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
from torch import nn

from scalelong.diagnostics import metric_names
from scalelong.diagnostics.blocks import find_blocks
from scalelong.diagnostics.headroom import fp16_headroom
from scalelong.diagnostics.overflow import FP16_MAX, OpWatch, Overflow, fp16_ops, unwrap
from scalelong.diagnostics.overflow import locate_overflow as _locate_overflow
from scalelong.errors import ScaleLongError
from scalelong.skips import find_skip_scaling

OSC_SERIES = ("feature_norm", "block_grad_norm", "loss")
SKIP_KEYS = ("norm_in", "norm_out", "coef_mean", "coef_min", "coef_max", "absmax_in")
# How the statistics of two forwards of one armed step combine (gradient-accumulation micro-batches).
_SKIP_KINDS = {
    "norm_in": "mean", "norm_out": "mean", "coef_mean": "mean", "coef_min": "min", "coef_max": "max",
    "absmax_in": "max",
}  # fmt: skip


def _sample_norm(x: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of per-sample L2 norms, in float32, detached: a 0-d tensor."""
    return x.detach().float().flatten(1).norm(dim=1).mean()


def _absmax(x: torch.Tensor) -> torch.Tensor:
    """The largest absolute value in ``x``, in float32, detached: a 0-d tensor (NaN if any is NaN)."""
    return x.detach().abs().amax().float()


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


def _inf_for_nan(values: Iterable[float]) -> list[float]:
    """An op's NaN as inf: an overflow is recorded, never dropped (headroom 0, not unknown)."""
    return [math.inf if math.isnan(v) else v for v in values]


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
            (see :func:`find_blocks`) are found automatically. Create this after
            ``apply_scalelong``, which installs the ``SkipScaling`` on a diffusers UNet.
        every: log on steps that are multiples of ``every``; 0 switches diagnostics off.
        window: number of logged values the oscillation statistics look back over.
        spike_factor: a loss above this multiple of the window's median counts as a spike.
        blocks: explicit ``{name: module}`` to use instead of :func:`find_blocks`.
        ops: explicit ``{name: module}`` whose outputs and gradients ``fp16/headroom_ops``,
            ``fp16/headroom_grad`` and ``fp16/least_op`` cover, instead of
            :func:`scalelong.diagnostics.overflow.fp16_ops` (every module fp16 autocast runs in fp16);
            ``{}`` leaves the three out of the record.

    It listens from construction. Each step, ``arm(step)`` before the forward, and
    ``collect(step, loss)`` after backward, before the optimizer step (an empty record on steps
    that were not armed; under an fp16 loss scaler ``collect(step, loss, grad_scale=...)``, the
    scale the gradients carry, so the gradient norms are the true ones). ``detach()`` (or the end
    of a ``with`` block) removes every hook. On a step whose loss is not finite,
    ``locate_overflow(lambda: model(x_t, t))`` names the first op whose output went past fp16's
    range in that forward.
    With the package's U-ViT and a plain loop::

        import torch

        from scalelong import Diagnostics, RunLog, UViT
        from scalelong.diffusion import VPSDE, training_loss

        model = UViT(img_size=8, patch_size=2, in_channels=1, embed_dim=32, depth=4, num_heads=2,
                     skip_method="cs")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with Diagnostics(model, every=5) as diag, RunLog("runs/my-uvit") as log:
            for step in range(1, 21):
                diag.arm(step)  # True on steps 5, 10, ...: their forward is listened to
                loss = training_loss(model, VPSDE(), torch.randn(16, 1, 8, 8)).mean()
                loss.backward()
                log.write(step, diag.collect(step, loss.item()), loss=loss.item())  # {} on other steps
                opt.step()
                opt.zero_grad()
    """

    def __init__(
        self,
        model: nn.Module,
        every: int = 100,
        window: int = 20,
        spike_factor: float = 3.0,
        blocks: dict[str, nn.Module] | None = None,
        ops: Mapping[str, nn.Module] | None = None,
    ):
        if every < 0 or window < 2 or spike_factor <= 1.0:
            raise ScaleLongError(
                f"diagnostics need every >= 0, window >= 2, spike_factor > 1; got {every}, {window}, "
                f"{spike_factor}"
            )
        self.model, self.every, self.window, self.spike_factor = model, every, window, spike_factor
        self.blocks = dict(blocks) if blocks is not None else find_blocks(model)
        if not self.blocks and blocks is None and every > 0:
            # Without blocks the paper's feature norm would be NaN on every step, silently.
            raise ScaleLongError(
                f"found no blocks in {type(unwrap(model)).__name__} to record the feature norm of; pass "
                "Diagnostics(model, blocks={name: module}) or give the model a diagnostic_blocks() method"
            )
        self.scaling = find_skip_scaling(model)
        self.history: dict[str, deque[float]] = {k: deque(maxlen=window) for k in OSC_SERIES}
        self.spikes = 0
        self.nonfinite_total = 0
        self.attached = False
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._skips: dict[int, list] = {}  # index -> [norm_in, norm_out, coef mean, min, max, samples]
        self._features: dict[str, list] = {}  # block -> [feature norm, samples]
        # One absmax per op output and per gradient reaching it, on armed steps only (fp16/headroom_ops).
        self.op_watch = OpWatch(fp16_ops(model) if ops is None else ops)
        self._op_history: dict[str, float] = {}  # op -> its largest finite output |value| so far
        self._quiet = False  # a forward that is no step's (locate_overflow) is not recorded
        self._armed_step: int | None = None
        self.attach()  # listening from construction: a forgotten attach() can no longer log nothing

    # ------------------------------------------------------------------ switching

    def attach(self) -> Diagnostics:
        """Listen again after :meth:`detach` (construction attaches); returns ``self``."""
        if self.scaling is not None and self.scaling.probe not in (None, self._probe):
            raise ScaleLongError("the model's SkipScaling already has another probe; detach it first")
        self.attached = True
        return self

    def detach(self) -> None:
        """Remove every hook and stop listening; :meth:`arm` is then an error until :meth:`attach`."""
        self.disarm()
        self.attached = False

    def state_dict(self) -> dict:
        """What a resumed run needs to continue the records exactly: the sliding windows, counts and
        every op's largest output so far (:meth:`largest_op_values`)."""
        history = {k: list(v) for k, v in self.history.items()}
        return {
            "history": history,
            "spikes": self.spikes,
            "nonfinite_total": self.nonfinite_total,
            "op_history": dict(self._op_history),
        }

    def load_state_dict(self, state: dict) -> None:
        for k, values in state["history"].items():
            if k in self.history:
                self.history[k].clear()
                self.history[k].extend(values)  # the newest ``window`` values
        self.spikes, self.nonfinite_total = state["spikes"], state["nonfinite_total"]
        self._op_history = dict(state.get("op_history", {}))  # absent in states written before it

    # ------------------------------------------------------------------ fp16 overflow

    def largest_op_values(self) -> dict[str, float]:
        """Per fp16 op, its largest finite output ``|value|`` over the logged steps so far (a
        non-finite one is no history: it is what :meth:`locate_overflow` is for)."""
        return dict(self._op_history)

    def locate_overflow(
        self, forward: Callable[[], object], limit: float = FP16_MAX, step: int | None = None
    ) -> Overflow | None:
        """:func:`scalelong.diagnostics.overflow.locate_overflow` on this model: run ``forward()`` (e.g.
        ``lambda: model(x_t, t)``, the batch of a step whose loss was not finite) and return the
        first fp16 op whose output went past ``limit``, with ``largest_before``, its largest output
        ``|value|`` over the logged steps before; None if none did. The statistics of an armed step
        are left alone: this forward is not recorded."""
        quiet, paused = self._quiet, self.op_watch.paused
        self._quiet = self.op_watch.paused = True
        try:
            found = _locate_overflow(self.model, forward, limit, step)
        finally:
            self._quiet, self.op_watch.paused = quiet, paused
        if found is None:
            return None
        return dataclasses.replace(found, largest_before=self._op_history.get(found.module))

    def __enter__(self) -> Diagnostics:
        return self if self.attached else self.attach()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def arm(self, step: int) -> bool:
        """Get ready for ``step``, before its forward: return whether it is a logged step (a
        multiple of ``every``), and if so install the hooks for its forward; otherwise remove them,
        so the step runs no diagnostic code. Call it on every step, then :meth:`collect`."""
        if not self.attached:
            raise ScaleLongError(
                f"arm({step}): these Diagnostics were detached; call attach() again (or make new ones) "
                "before arming a step"
            )
        if self._armed_step is not None and step != self._armed_step:
            warnings.warn(
                f"Diagnostics: step {self._armed_step} was armed but not collected; its statistics are "
                "dropped (call collect(step, loss) after backward on every step arm() returned True for)",
                UserWarning,
                stacklevel=2,
            )
        logged = self.every > 0 and step % self.every == 0
        if logged:
            self._install()
            self._armed_step = step
        else:
            self.disarm()
        return logged

    def active_for(self, step: int) -> bool:
        """Deprecated name of :meth:`arm`, which says what it does: it installs hooks."""
        warnings.warn(
            "Diagnostics.active_for(step) is now Diagnostics.arm(step)", DeprecationWarning, stacklevel=2
        )
        return self.arm(step)

    def _install(self) -> None:
        """Install the skip probe and the block hooks for the next forward (idempotent)."""
        if self._handles or (self.scaling is not None and self.scaling.probe == self._probe):
            return
        if self.scaling is not None and self.scaling.probe is not None:
            raise ScaleLongError("the model's SkipScaling already has another probe; detach it first")
        self._skips.clear()
        self._features.clear()
        self.op_watch.arm()
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
        self.op_watch.disarm()
        if self.scaling is not None and self.scaling.probe == self._probe:
            self.scaling.probe = None

    # ------------------------------------------------------------------ hooks

    # Kept as tensors (one device-to-host copy per logged step, in collect()), with the sample
    # count last, so the forwards of several micro-batches merge into the statistics of their union.

    def _skip_keys(self) -> tuple[str, ...]:
        """The per-skip statistics this model's method has: no ``coef_*`` under ``skip-norm``."""
        if self.scaling is not None and not self.scaling.has_coefficients:
            return tuple(k for k in SKIP_KEYS if not k.startswith("coef_"))
        return SKIP_KEYS

    def _probe(
        self, index: int, skip: torch.Tensor, coef: torch.Tensor | float | None, out: torch.Tensor
    ) -> None:
        if self._quiet:
            return
        if isinstance(coef, torch.Tensor):
            c = coef.detach().float()
            c_stats = [c.mean(), c.min(), c.max()]
        elif coef is not None:
            c_stats = [torch.tensor(float(coef))] * 3
        else:  # skip-norm: the skip is normalised, not scaled
            c_stats = []
        new = [_sample_norm(skip), _sample_norm(out), *c_stats, _absmax(skip), skip.shape[0]]
        kinds = [_SKIP_KINDS[k] for k in self._skip_keys()]
        self._skips[index] = _merge(self._skips.get(index), new, kinds)

    def _feature_hook(self, name: str):
        def hook(module: nn.Module, args: object, output: object) -> None:
            if self._quiet:
                return
            if isinstance(output, (tuple, list)):  # blocks that also return extras: first is the feature
                output = output[0]
            if isinstance(output, torch.Tensor):
                new = [_sample_norm(output), _absmax(output), output.shape[0]]
                self._features[name] = _merge(self._features.get(name), new, ("mean", "max"))

        return hook

    # ------------------------------------------------------------------ reading

    def collect(self, step: int, loss: float, *, grad_scale: float = 1.0) -> dict[str, float | str]:
        """Metrics of the armed step (call after backward, before zero_grad); removes the hooks.

        On a step :meth:`arm` did not arm it returns ``{}`` and leaves the oscillation windows and
        the spike count as they are, so ``log.write(step, diag.collect(step, loss), loss=...)`` can
        run on every step.

        ``grad_scale`` is the loss scale the gradients carry: under fp16 loss scaling, backward
        ran on ``loss * scale``, so every gradient is ``scale`` times the true one until the scaler
        unscales it. The gradient norms (``block/<name>/grad_norm``, ``block_grad_norm`` and their
        oscillation) are divided by it, so they neither come out ``scale`` times too large nor jump
        when the scaler changes its scale. With a torch ``GradScaler`` pass ``scaler.get_scale()``
        (before ``scaler.update()``, which may change it); under Accelerate
        ``accelerator.scaler.get_scale()``, where ``accelerator.scaler`` is not None (fp16 only).
        Leave it at 1 without a scaler, in bf16 and fp32, and once the gradients are unscaled
        (``scaler.unscale_(optimizer)``, ``accelerator.clip_grad_norm_``). ``fp16/headroom_grad`` is
        not divided: it is measured in backward on the gradients fp16 holds, the scaled ones."""
        grad_scale = float(grad_scale)
        if not (math.isfinite(grad_scale) and grad_scale > 0):
            raise ScaleLongError(
                f"collect(grad_scale={grad_scale}): the loss scale the gradients carry must be finite and "
                "positive (scaler.get_scale(); 1.0 without a scaler or after unscaling)"
            )
        if self._armed_step is None:
            return {}
        if step != self._armed_step:
            raise ScaleLongError(f"collect(step={step}) but arm({self._armed_step}) armed the hooks")
        self.disarm()
        names: list[str] = []
        tensors: list[torch.Tensor | None] = []
        n_skips = self.scaling.num_skips if self.scaling is not None else 0
        skip_keys = self._skip_keys()
        for i in range(1, n_skips + 1):
            # A skip that did not run this step is recorded as NaN rather than left out.
            stats = self._skips.get(i)
            names += [metric_names.skip(i, key) for key in skip_keys]
            tensors += stats[:-1] if stats is not None else [None] * len(skip_keys)
        for name, block in self.blocks.items():
            grads = [p.grad.detach() for p in block.parameters() if p.grad is not None]
            gnorm = (
                torch.linalg.vector_norm(torch.stack([g.float().norm() for g in grads])) / grad_scale
                if grads
                else None
            )
            feature = self._features.get(name) or [None, None]
            names += [metric_names.block(name, key) for key in ("feature_norm", "grad_norm", "absmax")]
            tensors += [feature[0], gnorm, feature[1]]
        # Missing measurements (a skip or block that did not run, a frozen block) become NaN in
        # the record but are not counted as non-finite values of the model.
        measured = [t for t in tensors if t is not None]
        # ... read back with the ops' largest outputs and gradients, in one device-to-host copy.
        op_outputs, op_grads = self.op_watch.outputs, self.op_watch.grads
        self.op_watch.clear()
        everything = [*measured, *op_outputs.values(), *op_grads.values()]
        host = (
            torch.stack([t.float().to(everything[0].device) for t in everything]).cpu().tolist()
            if everything
            else []
        )
        n, n_out = len(measured), len(op_outputs)
        values_measured = host[:n]
        op_out = dict(zip(op_outputs, _inf_for_nan(host[n : n + n_out]), strict=True))
        op_grad = dict(zip(op_grads, _inf_for_nan(host[n + n_out :]), strict=True))
        it = iter(values_measured)
        values = [next(it) if t is not None else math.nan for t in tensors]
        out: dict[str, float | str] = dict(zip(names, values, strict=True))
        self._skips.clear()
        self._features.clear()

        feats = [out[metric_names.block(n, "feature_norm")] for n in self.blocks]
        grads = [out[metric_names.block(n, "grad_norm")] for n in self.blocks]
        out["feature_norm"] = sum(feats) / len(feats) if feats else math.nan
        out["block_grad_norm"] = math.sqrt(sum(g * g for g in grads)) if grads else math.nan
        # Over what was measured: a skip or block that did not run is no NaN of the model's.
        absmax = (
            v
            for k, t, v in zip(names, tensors, values, strict=True)
            if t is not None and metric_names.is_absmax(k)
        )
        out[metric_names.FP16_HEADROOM] = fp16_headroom(absmax)
        if self.op_watch.ops:
            out[metric_names.FP16_HEADROOM_OPS] = fp16_headroom(op_out.values())
            out[metric_names.FP16_HEADROOM_GRAD] = fp16_headroom(op_grad.values())
            if op_out:
                out[metric_names.FP16_LEAST_OP] = max(op_out, key=op_out.__getitem__)  # first of ties
            for name, value in op_out.items():
                if math.isfinite(value) and value > self._op_history.get(name, -math.inf):
                    self._op_history[name] = value
        loss = float(loss)
        # Counted over the measurements only: early window statistics are NaN by design.
        nonfinite = sum(not math.isfinite(v) for v in values_measured) + (not math.isfinite(loss))
        self.nonfinite_total += nonfinite
        if self._is_spike(loss):
            self.spikes += 1
        for series in OSC_SERIES:
            self.history[series].append(loss if series == "loss" else out[series])
            for k, v in window_stats(self.history[series]).items():
                out[metric_names.osc(series, k)] = v
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
