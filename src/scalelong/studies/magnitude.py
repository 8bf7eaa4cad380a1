"""How large the values get along the network: the peak |value| of every block's output over a run.

fp16 overflows where a value passes 65,504, so where a run's values are largest says what could keep
it finite. In a U-ViT the encoder blocks' outputs are the long skips' inputs, and each decoder
block's merge (``skip_linear(cat[x, skip])``) writes the decoder stream, so the profile along the
blocks, in forward order, shows whether the skips carry the large values (which scaling them
shrinks) or the decoder stream does (which a norm after the merge bounds). Read from the
``block/<name>/absmax`` the diagnostics log at every ``diagnostics.every`` steps.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence

from scalelong.diagnostics import metric_names as names
from scalelong.runlog.records import Records, as_float

# Encoder, middle and decoder blocks as the diagnostics name them: U-ViT (in_blocks.0, mid_block,
# out_blocks.0), the package's UNet (down.0, mid.0, up.0), diffusers UNets (down_blocks.0, mid_block,
# up_blocks.0) and U-ViT (transformer_in_blocks.0, transformer_mid_block, transformer_out_blocks.0.block),
# denoising-diffusion-pytorch (downs.0.0, mid_block1, ups.0.0).
_STAGES = (
    re.compile(r"^(?:transformer_)?(?:in_blocks|down_blocks|downs?)\.[\d.]+$"),
    re.compile(r"^(?:transformer_)?mid(?:_block)?[\d.]*$"),
    re.compile(r"^(?:transformer_)?(?:out_blocks|up_blocks|ups?)\.[\d.]+(?:\.block)?$"),
)


def forward_order(blocks: Sequence[str]) -> list[str]:
    """The encoder, middle and decoder blocks among ``blocks``, in forward order (by stage, then by
    the numbers in the name); others (a final block) left out."""
    keyed = []
    for name in blocks:
        for stage, pattern in enumerate(_STAGES):
            if pattern.match(name):
                keyed.append(((stage, tuple(int(n) for n in re.findall(r"\d+", name))), name))
    return [name for _, name in sorted(keyed)]


def peak_absmax(records: Records) -> dict[str, float]:
    """Per block (forward order), the largest finite |value| its output reached over the logged
    steps (``block/<name>/absmax``); inf where it logged only non-finite values."""
    seen: dict[str, list[float]] = {}
    for r in records:
        for key, value in r.items():
            if (parsed := names.parse_block(key)) and parsed[1] == "absmax":
                seen.setdefault(parsed[0], []).append(as_float(value))
    out = {}
    for name in forward_order(list(seen)):
        finite = [v for v in seen[name] if math.isfinite(v)]
        out[name] = max(finite) if finite else math.inf
    return out


def reached(records: Records, limit: float) -> bool:
    """Whether any block's output reached ``limit`` (fp16's 65,504) or went non-finite at a logged
    step: an fp16 run's overflowed forward logs inf or NaN there."""
    return any(
        not as_float(value) < limit
        for r in records
        for key, value in r.items()
        if (parsed := names.parse_block(key)) and parsed[1] == "absmax"
    )


def median_profile(runs: Sequence[Records]) -> tuple[list[str], list[float], list[float], list[float]]:
    """Over a cell's seeds: the blocks (forward order), and per block the median, least and largest
    peak |value| (:func:`peak_absmax`) of the seeds that logged it."""
    peaks = [peak_absmax(r) for r in runs]
    blocks = forward_order(sorted({b for p in peaks for b in p}))
    mid, lo, hi = [], [], []
    for b in blocks:
        values = [p[b] for p in peaks if b in p]
        mid.append(statistics.median(values))
        lo.append(min(values))
        hi.append(max(values))
    return blocks, mid, lo, hi


def decoder_growth(peaks: Mapping[str, float]) -> tuple[float, float, float] | None:
    """From one run's :func:`peak_absmax`: the largest peak of the encoder blocks (the long skips'
    inputs), of the middle block, and of the last decoder block; None without all three."""
    order = forward_order(list(peaks))
    encoder = [peaks[b] for b in order if _STAGES[0].match(b)]
    middle = [peaks[b] for b in order if _STAGES[1].match(b)]
    decoder = [peaks[b] for b in order if _STAGES[2].match(b)]
    if not (encoder and middle and decoder):
        return None
    return max(encoder), middle[0], decoder[-1]
