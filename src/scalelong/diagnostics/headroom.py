"""How close a run came to fp16's largest finite value: :func:`fp16_headroom` of one step's
largest absolute values (``fp16/headroom``), and :func:`headroom_warning`, the one line
``scalelong analyze`` prints when a run came within ``HEADROOM_WARNING`` times of it."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from scalelong.diagnostics import metric_names
from scalelong.diagnostics.overflow import FP16_MAX

HEADROOM_WARNING = 10.0  # `scalelong analyze` speaks up when a run came within this factor of FP16_MAX


def fp16_headroom(absmaxes: Iterable[float]) -> float:
    """``FP16_MAX`` / the largest of ``absmaxes`` (the recorded largest absolute values): how many
    times larger the features could grow before half precision overflows. Below 1 they already
    exceed it (measured in fp32 or bf16). 0 when a value is not finite, inf or NaN: that is an
    overflow, not an unknown (in fp16 an overflow is inf, and the next LayerNorm or GroupNorm turns
    it into NaN, so every block after it reports NaN). NaN when none was measured; inf when every
    value is 0."""
    values = list(absmaxes)
    if not values:
        return math.nan
    if not all(math.isfinite(v) for v in values):
        return 0.0
    largest = max(values)
    return FP16_MAX / largest if largest > 0 else math.inf


def headroom_warning(records: Sequence[Mapping[str, object]]) -> str | None:
    """One line when a run came within ``HEADROOM_WARNING`` times of fp16's largest finite value
    (an overflow, headroom 0, included): the first such step, the tensor with the largest absolute
    value there (a non-finite one first) and that value, and the lowest headroom of the run; None
    when it never did (or logged no ``fp16/headroom``)."""

    def number(value: object) -> float:
        try:
            return float(value)  # type: ignore[arg-type]  # the log's "nan" / "inf" strings too
        except (TypeError, ValueError):
            return math.nan

    close = [
        (int(r["step"]), number(r[metric_names.FP16_HEADROOM]), r)
        for r in records
        if metric_names.FP16_HEADROOM in r and number(r[metric_names.FP16_HEADROOM]) < HEADROOM_WARNING
    ]
    if not close:
        return None
    step, headroom, record = min(close, key=lambda c: c[0])
    absmax = {k: number(v) for k, v in record.items() if metric_names.is_absmax(str(k))}
    # At headroom 0 a NaN is the overflow too (an inf a norm layer turned NaN): it ranks below an inf
    # and above every finite value, the first of ties first. At any other headroom every measured
    # value was finite, and a NaN is a block or skip that did not run.
    nan_rank = (1, 0.0) if headroom == 0 else (-1, 0.0)

    def rank(kv: tuple[str, float]) -> tuple[int, float]:
        return nan_rank if math.isnan(kv[1]) else (2, 0.0) if math.isinf(kv[1]) else (0, kv[1])

    tensor, value = max(absmax.items(), key=rank, default=("?", math.nan))
    lowest_step, lowest, _ = min(close, key=lambda c: c[1])
    came = "went past" if headroom < 1 else f"came within {HEADROOM_WARNING:g}x of"
    return (
        f"fp16 headroom: at step {step} the run {came} fp16's largest value ({FP16_MAX:g}): "
        f"{tensor} = {value:.4g} (headroom {headroom:.3g}); "
        f"lowest headroom {lowest:.3g} at step {lowest_step}"
    )
