"""The held-out denoising error of a run, read from its logged records: the model on 256 fixed
held-out images at fixed noise levels (``noise/x0_mse@L``), far less noisy than the training loss;
what the failure rule (:mod:`scalelong.studies.divergence`) and the lr basin judge a run by.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from scalelong.diagnostics import metric_names as names
from scalelong.runlog.records import Records, as_float


def _x0_levels(record: Mapping, weights: str, kind: str = "x0") -> list[float]:
    """The held-out errors per noise level of one record (``noise/x0_mse@L``, or with
    ``weights="raw"`` ``noise/raw/x0_mse@L``; ``kind="eps"``: the noise's, ``noise/eps_mse@L``);
    empty where the record holds none."""
    return [as_float(v) for k, v in record.items() if (p := names.parse_noise(k, weights)) and p[0] == kind]


def _level_mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if all(math.isfinite(v) for v in values) else math.inf


def heldout_error(records: Records, kind: str = "x0", weights: str = "ema") -> float:
    """The last logged held-out error after step 0 (``noise/x0_mse@L``; ``weights="raw"``: the
    trained weights' ``noise/raw/x0_mse@L``; ``kind="eps"``: of the predicted noise,
    ``noise/eps_mse@L``), averaged over the noise levels L: the model on fixed held-out images, far
    less noisy than the last training loss. NaN where no probe after step 0 was logged; inf where
    the last one was not finite (the model's output was not)."""
    last = next((r for r in reversed(records) if int(r["step"]) > 0 and _x0_levels(r, weights, kind)), None)
    return math.nan if last is None else _level_mean(_x0_levels(last, weights, kind))


def heldout_x0_error(records: Records, weights: str = "ema") -> float:
    """The held-out x0 error (:func:`heldout_error`); a network that predicts the noise is judged by
    its noise error instead, ``heldout_error(records, "eps")``: its x0 error divides the noise's by
    alpha^2, thousands of times at the highest levels."""
    return heldout_error(records, "x0", weights)


def heldout_x0_series(records: Records, weights: str = "ema") -> tuple[list[int], list[float]]:
    """Every held-out probe of a run: ``(steps, x0 errors)``, each averaged over the noise levels as
    :func:`heldout_x0_error` averages the last one (inf where a probe was not finite); step 0 is
    the untrained model where the run measured it."""
    probes = [(int(r["step"]), _x0_levels(r, weights)) for r in records]
    return [s for s, v in probes if v], [_level_mean(v) for _, v in probes if v]


def initial_x0_error(records: Records, kind: str = "x0") -> float:
    """The held-out x0 error (``kind="eps"``: the noise's) of the untrained model, measured at step
    0 (``diagnostics.noise_levels_at_start``), averaged over the noise levels; NaN where the run did
    not measure it, inf where it was not finite. At step 0 the EMA is the initial model itself."""
    first = next((r for r in records if int(r["step"]) == 0 and _x0_levels(r, "ema", kind)), None)
    return math.nan if first is None else _level_mean(_x0_levels(first, "ema", kind))
