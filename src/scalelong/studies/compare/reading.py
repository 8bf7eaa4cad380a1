"""A comparison's table in plain sentences (:func:`reading`), from its numbers alone: what the seed
count allows, whether the samples are digits, the final FD, the hidden-feature norm against the
paper's Fig. 1, the speed-ups and what the evaluation spacing can resolve, the runs that broke."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from scalelong.studies.divergence import criteria
from scalelong.studies.report import has_digits
from scalelong.studies.statistics import Contrast, mean_ci, percent
from scalelong.studies.summary import MethodSummary

MIN_SEEDS = 5  # fewer seeds than this: no difference of a small-model comparison is evidence
DIGITS_FD = 200.0  # FD-MNIST at or below this ...
DIGITS_CONFIDENT = 0.5  # ... with at least this share of confident digits: the samples are digits
FIG1_ORDER = (("none",), ("sqrt2",), ("cs", "ls", "ls-nonshare"))  # the paper's Fig. 1, highest norm first


def _num(x: float) -> str:
    """A number as a sentence rounds it: whole from 100 on, three significant digits below."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _and(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _mean(s: MethodSummary, key: str) -> float:
    return mean_ci(s.values(key))[0]


def _over(seeds: int) -> str:
    return "1 seed" if seeds == 1 else f"mean over {seeds} seeds"


def _change(c: Contrast | None) -> str:
    """A ratio contrast as a change in a sentence: ``-30%, -31% to -28%``."""
    if c is None:
        return "n/a"
    point = percent(100 * (c.estimate - 1))
    if math.isnan(c.low):
        return point
    lo, hi = (percent(100 * (x - 1)) for x in (c.low, c.high))
    return f"{point}, {lo} to {hi}" + ("" if c.paired else ", unpaired")


def _seeds_sentence(
    summaries: Sequence[MethodSummary], base: MethodSummary, seeds: int, evaluated: bool
) -> str:
    if seeds < MIN_SEEDS:
        return (
            f"With {seeds} seed{'' if seeds == 1 else 's'}, no difference in this table is evidence: on "
            f"small models seed-to-seed noise is larger than the effect, so train --seeds {MIN_SEEDS} or "
            "more before concluding."
        )
    others = [s for s in summaries if s is not base]
    if not others or not evaluated:
        what = "there is no other method" if not others else "no run logged an FD to pair"
        return f"With {seeds} seeds a paired difference could be tested, but {what}."
    clear, unclear, untested = [], [], []
    for s in others:
        change = s.fd_change(base)
        pairs = 0 if change is None else change.n
        if pairs < MIN_SEEDS:  # seeds without a finite FD on both sides pair nothing
            untested.append(s.method + ("" if change is None else f" ({_change(change)} on {pairs})"))
            continue
        (clear if change.excludes_null() else unclear).append(f"{s.method} ({_change(change)})")
    few = (
        f"{_and(untested)} paired fewer than {MIN_SEEDS} seeds with a finite final FD, too few to test."
        if untested
        else ""
    )
    head = f"With {seeds} seeds, the 95% interval of the paired change in final FD against {base.method}"
    if not clear and not unclear:
        return f"With {seeds} seeds, no paired change in final FD against {base.method} was tested: {few}"
    if not unclear:
        said = f"{head} excludes 0 for {_and(clear)}."
    elif not clear:
        said = f"{head} includes 0 for {_and(unclear)}: no difference in final FD is evidence."
    else:
        which = "that difference is" if len(unclear) == 1 else "those differences are"
        said = (
            f"{head} excludes 0 for {_and(clear)}; it includes 0 for {_and(unclear)}: {which} not evidence."
        )
    return f"{said} {few}".strip()


def _digits_sentence(summaries: Sequence[MethodSummary]) -> str:
    bar = f"final FD <= {DIGITS_FD:g} and at least {DIGITS_CONFIDENT:.0%} of the samples confident digits"
    failing = []
    for s in summaries:
        fd, confident = _mean(s, "final_fd"), _mean(s, "confident")
        if fd <= DIGITS_FD and confident >= DIGITS_CONFIDENT:  # NaN fails both
            continue
        score = "no digit score" if math.isnan(confident) else f"{confident:.0%} confident"
        failing.append(f"{s.method} ({'no finite FD' if math.isnan(fd) else 'FD ' + _num(fd)}, {score})")
    if not failing:
        return f"Every method ended drawing digits ({bar})."
    if len(failing) == len(summaries):
        return f"No method ended drawing digits ({bar}): {_and(failing)}."
    return f"{_and(failing)} did not end drawing digits ({bar}); the others did."


def _fd_sentence(summaries: Sequence[MethodSummary], seeds: int) -> str:
    ranked = sorted((fd, s.method) for s in summaries if math.isfinite(fd := _mean(s, "final_fd")))
    missing = [s.method for s in summaries if math.isnan(_mean(s, "final_fd"))]
    over = _over(seeds)
    (lo, lo_m), (hi, hi_m) = ranked[0], ranked[-1]
    if len(ranked) == 1:
        text = f"The final FD ({over}) is {_num(lo)} for {lo_m}"
    else:
        text = f"The final FD ({over}) is lowest for {lo_m} ({_num(lo)}) and highest for {hi_m} ({_num(hi)})"
        if len(ranked) > 2:
            text += "; " + ", ".join(f"{m} {_num(fd)}" for fd, m in ranked[1:-1])
    return text + (f"; {_and(missing)} ended with no finite FD." if missing else ".")


def fig1_order(norms: Mapping[str, float]) -> bool | None:
    """Whether the final hidden-feature norms order as in the paper's Fig. 1 (none highest, then
    sqrt2, then cs / ls); None when fewer than two of those three groups are present."""
    groups = [[norms[m] for m in group if m in norms] for group in FIG1_ORDER]
    groups = [g for g in groups if g]
    if len(groups) < 2:
        return None
    return all(min(high) > max(low) for high, low in zip(groups[:-1], groups[1:], strict=True))


def _norm_sentence(summaries: Sequence[MethodSummary], base: MethodSummary, seeds: int) -> str:
    logged = [s for s in summaries if math.isfinite(_mean(s, "feature_norm"))]
    norms = {s.method: _mean(s, "feature_norm") for s in logged}
    if not norms:
        return "No run logged the hidden-feature norm (diagnostics.every=0), so Fig. 1 cannot be read."
    base_norm = norms.get(base.method, math.nan)
    if math.isfinite(base_norm) and base_norm > 0:

        def ratio(s: MethodSummary) -> str:
            c = s.against(base, "feature_norm", ratio=True)
            return "n/a" if c is None else f"{c.estimate:.2f}x"

        ratios = ", ".join(f"{s.method} {ratio(s)}" for s in logged if s is not base)
        text = f"The hidden-feature norm at the end ({_over(seeds)}) is {_num(base_norm)} for {base.method}"
        text += f"; as a ratio to it, {ratios}" if ratios else ""
    else:
        text = f"The hidden-feature norm at the end ({_over(seeds)}) is " + ", ".join(
            f"{m} {_num(v)}" for m, v in norms.items()
        )
    order = fig1_order(norms)
    paper = "the paper's Fig. 1 (none highest, then sqrt2, then cs and ls)"
    if order is None:
        return text + "."
    if order:
        return f"{text}: the order of {paper}."
    here = " > ".join(sorted(norms, key=norms.__getitem__, reverse=True))
    return f"{text}: not the order of {paper}, but {here}."


def _speed_sentences(
    summaries: Sequence[MethodSummary], base: MethodSummary, eval_every: int, steps: int
) -> list[str]:
    reached = [x for x in base.steps_to_target if x is not None]
    if not reached:
        return [f"{base.method} ended with no finite FD, so there is no target to measure speed-ups against."]
    at = statistics.median(reached)
    parts = []
    for s in summaries:
        if s is base:
            continue
        n, k = s.count, sum(x is not None for x in s.steps_to_target)
        speedup = s.speedup(base)
        if not k or speedup is None:
            parts.append(f"{s.method} never reached it")
            continue
        partial = f" ({k}/{n} seeds got there)" if k < n else ""
        parts.append(f"{s.method} {speedup.estimate:.2f}x{partial}")
    first = f"{base.method} first reached its final FD at step {at:.0f}"
    first += " (median over seeds)" if len(reached) > 1 else ""
    first += f"; speed-up to that FD: {_and(parts)}." if parts else "."
    if at <= eval_every:
        second = (
            f"That was its first evaluation (every {eval_every} steps), so no speed-up can show: "
            "evaluate more often (eval.every) or train longer."
        )
    else:
        # the evaluation before S: a multiple of E (a run is also evaluated at its last step, which
        # need not be one)
        before = math.ceil(at / eval_every - 1) * eval_every
        smallest = at / before
        second = (
            f"With evaluations every {eval_every} of {steps} steps, the smallest speed-up that can show is "
            f"{at:.0f} / {before:.0f} = {smallest:.2f}x"
        )
        second += (
            ", so 1.5x cannot be resolved: evaluate more often (eval.every) or train longer."
            if smallest > 1.5
            else "."
        )
    return [first, second]


def reading(
    summaries: Sequence[MethodSummary], baseline: str, eval_every: int, steps: int, seeds: int
) -> str:
    """One paragraph that reads a comparison's table aloud, from its numbers: what the seed count
    allows (with fewer than 5 no difference is evidence; with 5 or more, which changes in final
    FD against the baseline, paired by seed, have 95% intervals that exclude 0), whether every
    method ended drawing digits (final FD <= 200 and at least half the samples confident
    digits), the final FD of each method, the hidden-feature norm at the end against the paper's
    Fig. 1 (as a ratio to the baseline's, paired by seed), the speed-up to the baseline's final
    FD (a geometric mean over the seeds) with the smallest one the evaluation spacing can show
    (evaluations every E steps, the baseline there at step S: S / (S - E)), and the runs that
    diverged. Changes and ratios are those of :func:`scalelong.studies.statistics.contrast`.

    ``eval_every`` and ``steps`` are the config's ``eval.every`` and ``train.steps``; ``seeds`` is
    the number of seeds per method.
    """
    base = next(s for s in summaries if s.method == baseline)
    evaluated = eval_every > 0 and any(math.isfinite(v) for s in summaries for v in s.values("final_fd"))
    sentences = [_seeds_sentence(summaries, base, seeds, evaluated)]
    if evaluated:
        if has_digits(*(s.values("confident") for s in summaries)):  # fd-mnist: the samples read as digits
            sentences.append(_digits_sentence(summaries))
        sentences.append(_fd_sentence(summaries, seeds))
    else:
        losses = sorted((v, s.method) for s in summaries if math.isfinite(v := _mean(s, "final_loss")))
        why = "No run was evaluated (eval.every=0)" if eval_every <= 0 else "No run ended with a finite FD"
        text = f"{why}, so there is no FD, digit score or speed-up to read"
        if losses:
            text += f"; the final loss is lowest for {losses[0][1]} ({losses[0][0]:.3g})"
            if len(losses) > 1:
                text += f" and highest for {losses[-1][1]} ({losses[-1][0]:.3g})"
        sentences.append(text + ".")
    sentences.append(_norm_sentence(summaries, base, seeds))
    if evaluated:
        sentences += _speed_sentences(summaries, base, eval_every, steps)
    broken = []
    for s in summaries:
        if s.diverged:
            count, _, named = criteria(s.breaks).partition(" ")  # "2/5 (loss)"
            broken.append(f"{s.method} in {count} seeds" + (f" {named}" if named else ""))
    sentences.append(f"Diverged: {_and(broken)}." if broken else "No run diverged.")
    return " ".join(sentences)
