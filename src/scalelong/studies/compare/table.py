"""A comparison's summary table: per method its means over seeds and its change against the
baseline, paired by seed."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from scalelong.studies.divergence import criteria
from scalelong.studies.markdown import markdown_table
from scalelong.studies.report import digit_headers, has_digits
from scalelong.studies.statistics import fmt_ci, fmt_contrast
from scalelong.studies.summary import MethodSummary


def summary_table(
    summaries: Sequence[MethodSummary], baseline: str, real_digits: Mapping | None = None
) -> str:
    """Markdown table of the comparison: means ± 95% t-intervals over seeds, and the change in
    final FD and the speed-up against ``baseline`` with their 95% intervals, paired by seed
    (``unpaired`` where no seed is shared). The digit-score columns appear when the runs logged
    them (eval.metric fd-mnist); ``real_digits`` is their yardstick (default
    :func:`scalelong.metrics.fd_mnist.real_digit_score`)."""
    base = next(s for s in summaries if s.method == baseline)
    digits = has_digits(*(s.values(k) for s in summaries for k in ("confident", "entropy")))
    extra = digit_headers(real_digits) if digits else []
    head = ["method", "final FD", f"final FD vs {baseline} (95% CI)", *extra, "final loss"]
    head += ["feature-norm osc. std", "loss spikes", f"steps to {baseline}'s final FD"]
    head += [f"speed-up vs {baseline} (95% CI)", "diverged"]
    rows = []
    for s in summaries:
        n, reached = s.count, [x for x in s.steps_to_target if x is not None]
        steps = (
            f"{statistics.median(reached):.0f} ({len(reached)}/{n} seeds)"
            if reached
            else f"not reached (0/{n})"
        )
        change = "(baseline)" if s is base else fmt_contrast(s.fd_change(base), as_percent=True)
        speedup = "(baseline)" if s is base else fmt_contrast(s.speedup(base), unit="x")
        scores = [fmt_ci(s.values("confident"), 2), fmt_ci(s.values("entropy"), 2)] if digits else []
        row = [s.method, fmt_ci(s.values("final_fd")), change, *scores, fmt_ci(s.values("final_loss"))]
        row += [
            fmt_ci(s.values("feature_osc")),
            fmt_ci(s.values("spikes")),
            steps,
            speedup,
            criteria(s.breaks),
        ]
        rows.append(row)
    return markdown_table(head, rows)
