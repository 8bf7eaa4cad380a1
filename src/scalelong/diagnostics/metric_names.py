"""The names of the metrics a run logs, built and parsed here and nowhere else.

The trainer, :class:`scalelong.Diagnostics`, the evaluation, the plots and the studies all write
or read these flat names (``metrics.jsonl``, TensorBoard); a user's own loop that logs them is
read by ``scalelong analyze`` the same way. Only the standard library is imported, so the library
half (diagnostics) and the application half (plots, studies) can both use it.

* ``loss``, ``fd`` (Frechet distance of an evaluation), ``feature_norm`` (hidden-feature norm,
  mean over blocks), ``block_grad_norm``, ``spikes``;
* ``skip/<i>/<stat>``: per long skip, 1 the outermost (``norm_in``, ``coef_mean``, ...);
* ``block/<name>/<stat>``: per block (``feature_norm``, ``grad_norm``);
* ``osc/<series>_<stat>``: a sliding-window statistic of a series (``osc/feature_norm_std``);
* ``noise/<kind>_mse@<level>``: the held-out denoising error of the EMA weights at a noise level,
  kind ``x0`` or ``eps`` (``noise/raw/<kind>_mse@<level>``: of the trained weights), and
  ``noise/x0_mse_mean_image``, the mean image's x0 error;
* ``digits/confident``, ``digits/entropy``: the digit score of an fd-mnist evaluation;
* ``fp16/headroom``: 65,504 over the largest ``absmax`` / ``absmax_in`` of a logged step;
  ``fp16/headroom_ops`` / ``fp16/headroom_grad``: over the largest output / gradient ``|value|``
  of the ops fp16 autocast runs in half precision; ``fp16/least_op``: the op with the largest
  output (a string, the module's name).
"""

from __future__ import annotations

import re

LOSS = "loss"
FD = "fd"
FEATURE_NORM = "feature_norm"
BLOCK_GRAD_NORM = "block_grad_norm"
SPIKES = "spikes"
X0_MEAN_IMAGE = "noise/x0_mse_mean_image"
DIGITS_CONFIDENT = "digits/confident"
DIGITS_ENTROPY = "digits/entropy"
FP16_HEADROOM = "fp16/headroom"  # fp16's largest finite value over the step's largest absolute value
FP16_HEADROOM_OPS = "fp16/headroom_ops"  # ... over the largest output of an op autocast runs in fp16
FP16_HEADROOM_GRAD = "fp16/headroom_grad"  # ... over the largest gradient reaching such an output
FP16_LEAST_OP = "fp16/least_op"  # the name of the op with the largest output: a string
ABSMAX_STATS = ("absmax", "absmax_in")  # the largest absolute value of a block's output / a skip's input

_SKIP = re.compile(r"^skip/(\d+)/(\w+)$")
_BLOCK = re.compile(r"^block/(.+)/(\w+)$")
_NOISE = re.compile(r"^noise/(eps|x0)_mse@([0-9.]+)$")
_RAW_NOISE = re.compile(r"^noise/raw/(eps|x0)_mse@([0-9.]+)$")


def skip(index: int, stat: str) -> str:
    """``skip/<index>/<stat>``, e.g. ``skip/1/coef_mean`` (skip 1 is the outermost)."""
    return f"skip/{index}/{stat}"


def block(name: str, stat: str) -> str:
    """``block/<name>/<stat>``, e.g. ``block/out_blocks.0/feature_norm``."""
    return f"block/{name}/{stat}"


def osc(series: str, stat: str) -> str:
    """``osc/<series>_<stat>``, e.g. ``osc/feature_norm_std``."""
    return f"osc/{series}_{stat}"


def noise(kind: str, level: float, weights: str = "ema") -> str:
    """``noise/<kind>_mse@<level>`` with the level to two decimals, e.g. ``noise/x0_mse@0.50``: the
    EMA weights' error; ``weights="raw"``: the trained weights', ``noise/raw/x0_mse@0.50``."""
    return f"noise/{'raw/' if weights == 'raw' else ''}{kind}_mse@{level:.2f}"


def parse_skip(name: str) -> tuple[int, str] | None:
    """``skip/3/coef_mean`` -> ``(3, "coef_mean")``; None for any other name."""
    m = _SKIP.match(name)
    return (int(m.group(1)), m.group(2)) if m else None


def parse_block(name: str) -> tuple[str, str] | None:
    """``block/out_blocks.0/feature_norm`` -> ``("out_blocks.0", "feature_norm")``; None otherwise."""
    m = _BLOCK.match(name)
    return (m.group(1), m.group(2)) if m else None


def is_absmax(name: str) -> bool:
    """Whether ``name`` is a largest absolute value: ``block/<name>/absmax`` or ``skip/<i>/absmax_in``."""
    parsed = parse_skip(name) or parse_block(name)
    return parsed is not None and parsed[1] in ABSMAX_STATS


def parse_noise(name: str, weights: str = "ema") -> tuple[str, float] | None:
    """``noise/x0_mse@0.50`` -> ``("x0", 0.5)`` (with ``weights="raw"``: ``noise/raw/x0_mse@0.50``);
    None otherwise (the mean-image error and the other weights' names included)."""
    m = (_RAW_NOISE if weights == "raw" else _NOISE).match(name)
    return (m.group(1), float(m.group(2))) if m else None
