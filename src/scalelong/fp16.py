"""A GPU's fp16 or bf16 autocast, computed on the CPU: :class:`gpu_autocast` (:func:`gpu_fp16_autocast`).

The ScaleLong release trains in fp16 autocast on GPUs, where a tensor past 65,504 becomes inf; that
overflow is what the method's stability claims are about. ``torch.autocast("cpu", dtype=float16)``
does not reproduce it: the CPU's autocast lists differ from CUDA's (softmax, layer_norm, group_norm
and the upsampling ops follow their input's dtype on the CPU, CUDA runs them in fp32), and a CPU
without fp16 units runs torch's fp16 matrix products about ten times slower than fp32 ones.

:class:`gpu_autocast` is a :class:`torch.overrides.TorchFunctionMode` that applies CUDA's policy:
the op lists of ``aten/src/ATen/autocast_mode.h`` (shipped as ``torch/include/ATen/autocast_mode.h``;
these are torch 2.14's), which ``autocast_mode.cpp`` registers for CUDA:

* :data:`LOWER_PRECISION` (``lower_precision_fp``): matrix products, convolutions, ``prelu``, RNN
  cells and attention return fp16. They run as the op on ``t.half().float()`` of each floating input
  (fp16 values, fp32 accumulation, as GPU tensor cores compute) and ``.half()`` the result, so an
  output past 65,504 is inf exactly where a GPU's is. ``einsum`` is on CUDA's list itself (it
  reaches ``bmm`` inside, which is too).
* :data:`FP32` (``fp32``): exp, log, pow, layer_norm, rms_norm, group_norm, the losses, the norms,
  upsampling: fp16 inputs are cast to fp32, the result is fp32.
* :data:`FP32_SET_OPT_DTYPE` (``fp32_set_opt_dtype``, and ``norm``'s ``fp32_append_dtype``):
  softmax, log_softmax, sum, prod, cumsum, cumprod, the linalg norms run in fp32 unless the call
  gives a ``dtype``.
* :data:`PROMOTE` (``promote``): addcmul, addcdiv, dot, index_put, ... cast their floating inputs to
  the widest of them. cat and stack left the list once they promoted types themselves; they still
  give fp32 for fp16 with fp32.
* Everything else runs on its inputs as given: an elementwise op on fp16 stays fp16, fp16 with
  fp32 follows torch's type promotion, integer and bool tensors are never touched.

CUDA applies the policy at the dispatcher, so it also sees the ops inside composite ones. This mode
sees Python-level calls, so the composites whose inner op changes the result are classified by
what they reach (:data:`COMPOSITES`: ``square`` -> ``pow``, ``F.normalize`` -> ``norm``,
``1 / x`` -> ``reciprocal``, ``F.interpolate`` -> ``upsample_*``, ``F.cross_entropy`` ->
``log_softmax``, ...). ``F.multi_head_attention_forward`` runs as one lower-precision op: its
output is fp16 as on a GPU, its intermediate roundings are not.

The mode works above autograd: every cast it inserts is recorded, so backward needs no mode and
rounds the gradients to fp16 where a GPU's backward kernels produce fp16. Inside the region,
``torch.autocast("cuda", enabled=False)`` (or :func:`disabled`) turns the policy off, as on a GPU:
the mode raises torch's CUDA autocast flag while it is active and reads it.

CUDA's bf16 autocast applies the same lists with bf16 as the lower precision, and so does
``gpu_autocast(torch.bfloat16)``: bf16 values, fp32 accumulation, at about the fp32 cost. That is
how a CPU without bf16 units trains in bf16 (torch's own bf16 kernels there run about ten times
slower than fp32); a CPU with them runs torch's ``autocast("cpu")``, whose bf16 products also
accumulate in fp32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode

# CUDA's lists, by aten name (autocast_mode.h: AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32,
# AT_FORALL_FP32_SET_OPT_DTYPE, AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE, AT_FORALL_PROMOTE).
LOWER_PRECISION = frozenset(
    "_convolution conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d "
    "convolution prelu addmm addmv addr matmul einsum mm mv linalg_vecdot linear addbmm baddbmm bmm "
    "chain_matmul linalg_multi_dot _thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell "
    "rnn_tanh_cell rnn_relu_cell _scaled_dot_product_flash_attention scaled_dot_product_attention".split()
)
FP32 = frozenset(
    "acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow softplus "
    "layer_norm native_layer_norm rms_norm group_norm frobenius_norm nuclear_norm cosine_similarity "
    "poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div l1_loss "
    "smooth_l1_loss huber_loss mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss "
    "triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm "
    "logsumexp upsample_nearest1d _upsample_nearest_exact1d upsample_nearest2d "
    "_upsample_nearest_exact2d upsample_nearest3d _upsample_nearest_exact3d upsample_linear1d "
    "upsample_bilinear2d _upsample_bilinear2d_aa upsample_trilinear3d upsample_bicubic2d "
    "_upsample_bicubic2d_aa".split()
)
FP32_SET_OPT_DTYPE = frozenset(
    "prod softmax log_softmax cumprod cumsum linalg_vector_norm linalg_matrix_norm sum norm".split()
)
PROMOTE = frozenset(
    "addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add".split()
)
# Python-level composites whose inner aten op is on a list (CUDA sees the inner op): what they reach.
COMPOSITES = {
    "square": "fp32",  # pow(x, 2)
    "__pow__": "fp32",
    "__rpow__": "fp32",  # pow(scalar, x)
    "__rdiv__": "fp32",  # reciprocal(x) * scalar
    "__rtruediv__": "fp32",
    "normalize": "fp32",  # x / norm(x): fp32 norm, so an fp32 quotient
    "cross_entropy": "fp32",  # log_softmax, nll_loss
    "softmin": "fp32_set_opt_dtype",  # softmax(-x)
    "interpolate": "upsample",  # upsample_* (fp32), except mode="area" (adaptive_avg_pool)
    "upsample": "upsample",
    "upsample_nearest": "upsample",
    "upsample_bilinear": "upsample",
    "__matmul__": "lower",
    "__rmatmul__": "lower",
    "multi_head_attention_forward": "lower",  # linear, bmm/sdpa inside: fp16 out, inner roundings not
}
_NAMESPACES = (torch, torch.Tensor, torch.nn.functional, torch._C._nn, torch.special)


def _policy_table() -> dict[Callable, str]:
    """Every Python entry point of the listed aten ops -> its class."""
    kinds = [(LOWER_PRECISION, "lower"), (FP32, "fp32"), (FP32_SET_OPT_DTYPE, "fp32_set_opt_dtype")]
    kinds += [(PROMOTE, "promote"), *(((name,), kind) for name, kind in COMPOSITES.items())]
    table = {}
    for names, kind in kinds:
        for name in names:
            found = [getattr(ns, name, None) for ns in _NAMESPACES]
            if name.startswith("linalg_"):
                found.append(getattr(torch.linalg, name.removeprefix("linalg_"), None))
            table.update((f, kind) for f in found if callable(f))
    return table


_TABLE = _policy_table()
_LOW = (torch.float16, torch.bfloat16)
_ELIGIBLE = (torch.float32, torch.float16, torch.bfloat16)  # CUDA never casts fp64


def _map(fn: Callable[[torch.Tensor], torch.Tensor], args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``fn`` applied to every tensor of ``args``/``kwargs``, one list level deep (TensorList args)."""

    def one(a):
        if isinstance(a, torch.Tensor):
            return fn(a)
        if isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
            return type(a)(fn(x) if isinstance(x, torch.Tensor) else x for x in a)
        return a

    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}


def _tensors(args: tuple, kwargs: dict) -> Iterator[torch.Tensor]:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (x for x in a if isinstance(x, torch.Tensor))


def _to32(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in _LOW else t


class gpu_autocast(TorchFunctionMode):  # noqa: N801 (used as a context manager, like torch.autocast)
    """Compute as CUDA's autocast to ``dtype`` (fp16 or bf16) does, on any device (see the module's
    docstring).

    ``with gpu_autocast(torch.float16): out = model(x)`` gives the output, the overflows to inf and
    (after ``out.backward()``, outside the block) the gradients a GPU gives, up to the order of fp32
    summation. ``native=True`` runs the lower-precision ops with torch's own ``dtype`` kernels
    instead of fp32 accumulation of ``dtype`` values: torch's CUDA autocast arranged on the CPU, as a
    reference (about ten times slower on a CPU without units for ``dtype``).
    """

    def __init__(self, dtype: torch.dtype = torch.float16, native: bool = False):
        super().__init__()
        if dtype not in _LOW:
            raise ValueError(f"gpu_autocast computes in torch.float16 or torch.bfloat16, not {dtype}")
        self.dtype, self.native = dtype, native
        self._flag: list[bool] = []

    def _round(self, t: torch.Tensor) -> torch.Tensor:
        """``dtype`` values held in fp32: the inputs of a GPU's kernel, accumulated in fp32."""
        if t.dtype == self.dtype:
            return t.float()
        return t.to(self.dtype).float() if t.dtype in _ELIGIBLE else t

    def _lower(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.dtype) if t.dtype in _ELIGIBLE else t

    def _outputs(self, out):
        """The op's floating fp32 outputs rounded to ``dtype``: in fp16 past 65,504 they become inf,
        as on a GPU."""
        if isinstance(out, torch.Tensor):
            return out.to(self.dtype) if out.dtype == torch.float32 else out
        if isinstance(out, (list, tuple)):
            return type(out)(self._outputs(o) for o in out)
        return out

    def __enter__(self):
        # torch.autocast("cuda", enabled=False) inside the block lowers this flag: the mode reads it.
        self._flag.append(torch.is_autocast_enabled("cuda"))
        torch.set_autocast_enabled("cuda", True)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            torch.set_autocast_enabled("cuda", self._flag.pop())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            kind = _TABLE.get(func)
        except TypeError:  # an unhashable callable: never one of torch's entry points
            kind = None
        if kind is None or kwargs.get("out") is not None or not torch.is_autocast_enabled("cuda"):
            return func(*args, **kwargs)  # autocast leaves out= variants alone too
        if kind == "lower":
            a, k = _map(self._lower if self.native else self._round, args, kwargs)
            return func(*a, **k) if self.native else self._outputs(func(*a, **k))
        if kind == "upsample" and "area" in (kwargs.get("mode"), *(a for a in args if isinstance(a, str))):
            return func(*args, **kwargs)  # area: adaptive_avg_pool, on no list
        if kind == "fp32_set_opt_dtype" and (
            kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype) for a in args)
        ):
            return func(*args, **kwargs)  # a given dtype is kept
        if kind == "promote":
            dtypes = {t.dtype for t in _tensors(args, kwargs) if t.dtype in _ELIGIBLE}
            if len(dtypes) < 2:
                return func(*args, **kwargs)
            wide = torch.float32
            a, k = _map(lambda t: t.to(wide) if t.dtype in _ELIGIBLE else t, args, kwargs)
            return func(*a, **k)
        a, k = _map(_to32, args, kwargs)  # fp32, upsample, fp32_set_opt_dtype without a dtype
        return func(*a, **k)


def gpu_fp16_autocast(native: bool = False) -> gpu_autocast:
    """CUDA's fp16 autocast on any device: ``gpu_autocast(torch.float16, native)``."""
    return gpu_autocast(torch.float16, native)


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Turn :class:`gpu_autocast` off inside its block (what ``torch.autocast("cuda",
    enabled=False)`` does on a GPU, and does here too); tensors keep the dtypes they have."""
    before = torch.is_autocast_enabled("cuda")
    torch.set_autocast_enabled("cuda", False)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", before)


def fp32_outputs(out):
    """Floating fp16/bf16 outputs cast to fp32 (what Accelerate's prepared model returns under
    mixed precision: ``convert_outputs_to_fp32``), through tuples, lists and dicts."""
    if isinstance(out, torch.Tensor):
        return out.float() if out.dtype in _LOW else out
    if isinstance(out, (list, tuple)) and not hasattr(out, "_fields"):
        return type(out)(fp32_outputs(o) for o in out)
    if isinstance(out, dict):
        converted = {k: fp32_outputs(v) for k, v in out.items()}
        try:
            return type(out)(converted)
        except TypeError:  # a dict subclass with its own constructor
            return converted
    return out


def autocast_forward(fn: Callable, native: bool = False, dtype: torch.dtype = torch.float16) -> Callable:
    """``fn`` (a model) called under :class:`gpu_autocast` to ``dtype``, its outputs cast to fp32: the
    forward that Accelerate prepares for mixed-precision training on a GPU (the loss then runs in fp32)."""

    def forward(*args, **kwargs):
        with gpu_autocast(dtype, native=native):
            out = fn(*args, **kwargs)
        return fp32_outputs(out)

    return forward


__all__ = [
    "COMPOSITES",
    "FP32",
    "FP32_SET_OPT_DTYPE",
    "LOWER_PRECISION",
    "PROMOTE",
    "autocast_forward",
    "disabled",
    "fp32_outputs",
    "gpu_autocast",
    "gpu_fp16_autocast",
]
