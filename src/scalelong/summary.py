"""Text summaries of a model's long skips (``scalelong info``)."""

from __future__ import annotations

from torch import nn

from scalelong.diagnostics import find_skip_scaling


def skip_rows(model: nn.Module) -> list[tuple[int, tuple[int, ...], str]]:
    """(index, skip shape without batch, coefficient) per skip, outermost (index 1) first."""
    scaling = find_skip_scaling(model)
    if scaling is None:
        raise ValueError("model has no SkipScaling module")
    shapes = model.skip_shapes(batch_size=1)
    rows = []
    for i, (shape, coef) in enumerate(zip(shapes, scaling.coefficients(), strict=True), start=1):
        if coef is not None:
            text = f"{coef:.6g}"
        else:
            # which gate serves this skip: e.g. "ls: shared SharedChannelGate" / "ls-nonshare: ChannelGate 3"
            kind = type(scaling.gate_for(i)).__name__
            text = f"{scaling.method}: " + (f"shared {kind}" if len(scaling.gates) == 1 else f"{kind} {i}")
        rows.append((i, tuple(shape[1:]), text))
    return rows


def skip_table(model: nn.Module) -> str:
    rows = skip_rows(model)
    lines = [f"{'skip':>4}  {'shape':<18}  coefficient", f"{'-' * 4}  {'-' * 18}  {'-' * 11}"]
    for index, shape, coef in rows:
        lines.append(f"{index:>4}  {'x'.join(map(str, shape)):<18}  {coef}")
    lines.append("(skip 1 is the outermost, next to the input and output)")
    return "\n".join(lines)
