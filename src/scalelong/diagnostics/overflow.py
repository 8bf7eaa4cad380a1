"""Where half precision overflows: the ops fp16 autocast runs in fp16, their outputs and gradients.

Under fp16 autocast (how the ScaleLong release trains) a value past 65,504 becomes inf. The values
that can do so are the outputs of the ops autocast runs in fp16: Linear and convolution outputs,
attention, the MLP's hidden layer, the U-ViT's skip merge ``skip_linear(cat[x, skip])``, whose
output replaces the residual stream; and the gradients that reach those outputs in backward.

* :func:`fp16_ops` lists those modules of a model by their ``named_modules`` names;
* :class:`OpWatch` records, on the steps it is armed, the largest ``|value|`` of each one's output
  and of the gradient reaching it (one absmax each, left on the device until read);
* :func:`locate_overflow` runs one forward and names the first op whose output went past fp16's
  largest value (:func:`locate_grad_overflow`: the first gradient, in backward order).

:class:`scalelong.Diagnostics` uses them for ``fp16/headroom_ops``, ``fp16/headroom_grad`` and
``fp16/least_op``, and :meth:`scalelong.Diagnostics.locate_overflow` adds what each module reached
on the logged steps before. The limit is fp16's whatever the run's precision: in an fp32 or bf16
run the same values say how close fp16 would come.

Measured per module output: what happens between modules (a residual ``x + attn(x)`` inside a
block) is seen by the next op it feeds, and by ``fp16/headroom``'s block outputs. Attention logits
inside ``scaled_dot_product_attention`` are not materialised and not measured; the attention's
output is a convex combination of v, so it is bounded by the qkv projection's output, which is.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

FP16_MAX = 65504.0  # torch.finfo(torch.float16).max: the largest finite half-precision value

# What a GPU's fp16 autocast computes in fp16 (its lower-precision op list: linear, conv*,
# conv_transpose*, the fused attention and RNN kernels, matmul); LayerNorm, softmax, losses run in fp32.
FP16_MODULES: tuple[type[nn.Module], ...] = (
    nn.Linear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.MultiheadAttention,
    nn.RNNBase,
)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DDP / DataParallel / torch.compile wrappers."""
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        else:
            return model


@functools.cache
def _attends(cls: type) -> bool:
    """Whether modules of ``cls`` compute attention themselves: the class is named for it (the
    project's and timm's ``Attention``, diffusers' ``Attention`` whose processor calls the kernel),
    or its forward calls ``scaled_dot_product_attention`` or takes a softmax of a product."""
    if "attention" in cls.__name__.lower():
        return True
    if cls.__module__.startswith("torch."):
        return False  # torch's own modules are covered by FP16_MODULES
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):  # no source (built in, compiled, interactive)
        return False
    if "scaled_dot_product_attention" in source:
        return True
    return "softmax" in source and any(op in source for op in ("@", "matmul", "einsum", "bmm"))


def is_fp16_op(module: nn.Module) -> bool:
    """Whether fp16 autocast computes ``module``'s output in fp16 (see :func:`fp16_ops`)."""
    return isinstance(module, FP16_MODULES) or _attends(type(module))


def fp16_ops(model: nn.Module) -> dict[str, nn.Module]:
    """The modules of ``model`` whose outputs a GPU's fp16 autocast computes in fp16, by their
    ``named_modules`` names, in registration order (wrappers looked through, see :func:`unwrap`).

    Every ``nn.Linear``, ``nn.Conv1d/2d/3d``, ``nn.ConvTranspose1d/2d/3d``,
    ``nn.MultiheadAttention`` and RNN, and every module that computes attention itself (named
    ``*Attention*``, or whose forward calls ``scaled_dot_product_attention`` or a softmax of a
    product). In the project's U-ViT: per block ``attn.qkv`` (q, k and v), ``attn.proj``, ``attn``
    (the attention's output), ``mlp.fc1`` (the MLP's hidden layer), ``mlp.dwconv`` (with
    ``mlp_conv``), ``mlp.fc2`` and in the out-blocks ``skip_linear`` (the skip merge); and
    ``patch_embed.proj``, ``decoder_pred``, ``final_layer``."""
    return {name: m for name, m in unwrap(model).named_modules() if is_fp16_op(m)}


def _first_tensor(output: object) -> torch.Tensor | None:
    """The tensor a module returned (the first of a tuple: ``nn.MultiheadAttention``, RNNs)."""
    if isinstance(output, (tuple, list)) and output:
        output = output[0]
    if isinstance(output, torch.Tensor) and output.is_floating_point() and output.numel():
        return output
    return None


def absmax(x: torch.Tensor) -> torch.Tensor:
    """max |x| as a 0-d float32 tensor on x's device, NaN if x holds a NaN; no host sync.

    ``aminmax`` reads x once without the full-size temporary of ``x.abs().amax()`` (on the CPU
    2x as fast; ``vector_norm(x, inf)`` is 10x slower there)."""
    x = x.detach()
    if not x.is_contiguous():
        # A transposed view (the U-ViT's depthwise conv output) or a slice (the gradient reaching
        # it): read in memory order, which the CPU's reductions do 5x faster than the view's order.
        x = x.permute(sorted(range(x.dim()), key=x.stride, reverse=True))
    # aminmax of a slice with gaps is slower than two reductions
    lo, hi = torch.aminmax(x) if x.is_contiguous() else (x.amin(), x.amax())
    return torch.maximum(hi, -lo).float()


def _keep_max(values: dict[str, torch.Tensor], name: str, new: torch.Tensor) -> None:
    old = values.get(name)
    # torch.maximum propagates NaN: a non-finite forward is never hidden by a finite one
    values[name] = new if old is None else torch.maximum(old, new.to(old.device))


def read(values: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """The 0-d tensors of ``values`` as floats in one device-to-host copy; NaN becomes inf (an
    overflow recorded, never dropped)."""
    if not values:
        return {}
    tensors = list(values.values())
    host = torch.stack([t.to(tensors[0].device) for t in tensors]).cpu().tolist()
    return {name: math.inf if math.isnan(v) else v for name, v in zip(values, host, strict=True)}


class OpWatch:
    """The largest ``|value|`` of each op's output, and of the gradient reaching it, on armed steps.

    Args:
        ops: ``{name: module}`` to watch, e.g. :func:`fp16_ops` of the model.
        grads: also record the gradients (a tensor hook on each output that requires grad).

    :meth:`arm` before the forward installs the forward hooks and forgets the last step's values;
    every forward of a watched module then records max |output| into :attr:`outputs` and, when the
    output requires grad, hooks it so that backward records max |gradient| into :attr:`grads`.
    Forwards of one step (gradient-accumulation micro-batches, a module called twice) merge by
    max. :meth:`disarm` removes the forward hooks; the outputs already hooked still report their
    gradients until the next :meth:`arm` / :meth:`clear`. The values are 0-d float32 tensors on
    the module's device, NaN where a value was NaN, so a caller can read them back with its other
    statistics in one copy; :meth:`values` reads them (NaN as inf).
    """

    def __init__(self, ops: Mapping[str, nn.Module], grads: bool = True):
        self.ops = dict(ops)
        self.record_grads = grads
        self.outputs: dict[str, torch.Tensor] = {}  # name -> max |output|, in the order they first ran
        self.grads: dict[str, torch.Tensor] = {}  # name -> max |gradient at the output|
        self.paused = False  # hooks installed but ignoring forwards (a forward that is no step's)
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._session = 0  # bumped by clear(): gradients of an older step's outputs are dropped

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    def arm(self) -> None:
        """Forget the last values and install the forward hooks (a no-op if armed)."""
        if self._handles:
            return
        self.clear()
        self._handles = [m.register_forward_hook(self._hook(name)) for name, m in self.ops.items()]

    def disarm(self) -> None:
        """Remove the forward hooks; the values stay until :meth:`arm` or :meth:`clear`."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def clear(self) -> None:
        """Forget the values (and the gradients still to come of outputs already hooked)."""
        self.outputs, self.grads = {}, {}
        self._session += 1

    def values(self) -> tuple[dict[str, float], dict[str, float]]:
        """(outputs, grads) as floats: two device-to-host copies, NaN read as inf."""
        return read(self.outputs), read(self.grads)

    def _hook(self, name: str):
        def hook(module: nn.Module, args: object, output: object) -> None:
            out = _first_tensor(output)
            if out is None or self.paused:
                return
            _keep_max(self.outputs, name, absmax(out))
            if self.record_grads and out.requires_grad:
                session = self._session
                out.register_hook(lambda grad: self._grad(name, grad, session))

        return hook

    def _grad(self, name: str, grad: torch.Tensor, session: int) -> None:
        if session == self._session and grad.numel():
            _keep_max(self.grads, name, absmax(grad))


@dataclass(frozen=True)
class Overflow:
    """Where fp16 overflowed: ``module`` (its ``named_modules`` name), the largest ``|value|``
    there (inf if non-finite), ``kind`` (``"forward"``: its output; ``"backward"``: the gradient
    reaching its output), the ``step`` if known, and ``largest_before``: the module's largest output
    ``|value|`` on the logged steps before (:meth:`scalelong.Diagnostics.locate_overflow`)."""

    module: str
    value: float
    kind: str = "forward"
    step: int | None = None
    largest_before: float | None = None

    def __str__(self) -> str:
        where = f"fp16 overflow in {self.kind} at {self.module or '(the model)'} (|value| {self.value:.3g})"
        if self.step is not None:
            where = f"step {self.step}: {where}"
        if self.largest_before is not None:
            where += f"; its largest |value| on the logged steps before: {self.largest_before:.3g}"
        return where


def _first_past(
    seen: list[tuple[str, torch.Tensor]], limit: float, kind: str, step: int | None
) -> Overflow | None:
    """The first of ``seen`` (name, absmax) above ``limit``, reading them all in one copy."""
    if not seen:
        return None
    device = seen[0][1].device
    values = torch.stack([t.to(device) for _, t in seen]).cpu().tolist()
    for (name, _), value in zip(seen, values, strict=True):
        if math.isnan(value) or value > limit:
            return Overflow(name, math.inf if math.isnan(value) else value, kind, step)
    return None


def locate_overflow(
    model: nn.Module, forward: Callable[[], object], limit: float = FP16_MAX, step: int | None = None
) -> Overflow | None:
    """Run ``forward()`` once and return the first fp16 op (:func:`fp16_ops`), in the order they
    finished, whose output holds a non-finite value or one above ``limit``; None if none did.

    ``forward`` calls the model, e.g. ``lambda: model(x_t, t)``, under the caller's autocast and
    ``torch.no_grad()`` if wanted; in an fp32 or bf16 run the values above 65,504 are those fp16
    would have turned into inf. An op nested in another finishes first, so the innermost is named.
    Under ``torch.compile`` call the plain module (``unwrap(model)``): hooks added after
    compilation do not run in the compiled graph. The hooks are removed afterwards, also when
    ``forward`` raises."""
    seen: list[tuple[str, torch.Tensor]] = []

    def hook(name: str):
        def record(module: nn.Module, args: object, output: object) -> None:
            out = _first_tensor(output)
            if out is not None:
                seen.append((name, absmax(out)))  # no sync: read once after the forward

        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in fp16_ops(model).items()]
    try:
        forward()
    finally:
        for h in handles:
            h.remove()
    return _first_past(seen, limit, "forward", step)


def locate_grad_overflow(
    model: nn.Module, forward_backward: Callable[[], object], limit: float = FP16_MAX, step: int | None = None
) -> Overflow | None:
    """Run ``forward_backward()`` (a forward and its backward, e.g. ``lambda:
    scaler.scale(loss_fn(model(x_t, t))).backward()``) and return the first fp16 op, in backward
    order, whose output received a gradient with a non-finite value or one above ``limit``; None
    if none did. Backward runs from the loss, so the first is where the overflow starts. With a
    GradScaler the gradients are the scaled ones, which is what fp16 holds. The parameters'
    ``.grad`` accumulate as in any backward: zero them afterwards."""
    seen: list[tuple[str, torch.Tensor]] = []
    live = True  # tensor hooks outlive the call on a retained graph: they record nothing after it

    def on_grad(name: str, grad: torch.Tensor) -> None:
        if live and grad.numel():
            seen.append((name, absmax(grad)))

    def hook(name: str):
        def record(module: nn.Module, args: object, output: object) -> None:
            out = _first_tensor(output)
            if out is not None and out.requires_grad:
                out.register_hook(lambda grad: on_grad(name, grad))

        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in fp16_ops(model).items()]
    try:
        forward_backward()
    finally:
        live = False
        for h in handles:
            h.remove()
    return _first_past(seen, limit, "backward", step)


__all__ = [
    "FP16_MAX",
    "FP16_MODULES",
    "OpWatch",
    "Overflow",
    "absmax",
    "fp16_ops",
    "is_fp16_op",
    "locate_grad_overflow",
    "locate_overflow",
    "read",
    "unwrap",
]
