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
    exceed it (measured in fp32 or bf16; in fp16 they are inf, giving 0). NaN when a value is NaN
    (nothing can be said) or none was measured; inf when every value is 0."""
    values = list(absmaxes)
    if not values or any(math.isnan(v) for v in values):
        return math.nan
    largest = max(values)
    return FP16_MAX / largest if largest > 0 else math.inf


def headroom_warning(records: Sequence[Mapping[str, object]]) -> str | None:
    """One line when a run came within ``HEADROOM_WARNING`` times of fp16's largest finite value:
    the first such step, the tensor with the largest absolute value there and that value, and the
    lowest headroom of the run; None when it never did (or logged no ``fp16/headroom``)."""

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
    tensor, value = max(absmax.items(), key=lambda kv: kv[1], default=("?", math.nan))
    lowest_step, lowest, _ = min(close, key=lambda c: c[1])
    came = "went past" if headroom < 1 else f"came within {HEADROOM_WARNING:g}x of"
    return (
        f"fp16 headroom: at step {step} the run {came} fp16's largest value ({FP16_MAX:g}): "
        f"{tensor} = {value:.4g} (headroom {headroom:.3g}); "
        f"lowest headroom {lowest:.3g} at step {lowest_step}"
    )
