"""A sweep beside the map of the same grid in another precision (``scalelong sweep ... --beside PATH``):
the report's section "The precisions side by side".

A bf16 run logs its least fp16 headroom (65,504 over the largest |activation| of a logged step);
below 1 it went past fp16's range, a prediction that the same run in fp16 overflows. Trained again in
fp16, the grid tests the prediction run by run. The section reads only the runs (depth, lr, method,
seed) both sweeps made: per precision the lr basin's largest stable lr (:mod:`.basin`'s one rule) and
the failures by cause (:func:`~scalelong.studies.sweep.tables.cause_table`), then per run the other
precision's least fp16 headroom beside what this sweep did, and their 2x2 count.

The map beside is read as a report made from map.json reads one (:func:`.mapfile.read_map`): every run
judged again by today's rule. Its precision is what its runs recorded, else its runs' config (a
runs.json beside it), else it is "the other precision". This sweep's map.json records where the map
beside is (:func:`beside_record`), so a report-only rebuild sets it beside again (:func:`recorded_beside`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from scalelong.errors import ScaleLongError
from scalelong.runlog.provenance import PRECISION_NAMES
from scalelong.skips import method_order
from scalelong.studies.divergence import cause, skip_cause
from scalelong.studies.markdown import markdown_table
from scalelong.studies.plots import plot_basin
from scalelong.studies.summary import CellSummary, SeedSummary
from scalelong.studies.sweep.basin import WEIGHTS, Basin, basin_table, basins, figure_points
from scalelong.studies.sweep.mapfile import read_map
from scalelong.studies.sweep.paired import paired_table
from scalelong.studies.sweep.tables import CAUSES_READ, cause_table

OTHER = "the other precision"  # the label of a map beside whose precision nothing records
RunKey = tuple  # (depth, lr, method, seed): one run of a sweep

# The prediction and what counts as its outcome, in words: the section states it, map.json keeps it.
OVERFLOW_RULE = (
    "A run beside whose least fp16 headroom (65,504, fp16's largest finite value, over the largest "
    "|activation| of a logged step) is below 1 went past fp16's range: its least fp16 headroom below 1 "
    "predicts that fp16 overflows on the same run (depth, lr, method, seed). This sweep's run "
    "**overflowed** when its forward went past fp16's range: a failure whose cause is an overflow, a "
    "step skipped for a non-finite loss, or a last skipped step that overflowed in forward (`fp16 "
    "overflow in forward at MODULE`). Steps the loss scaler skipped for overflowing gradients alone do "
    "not count: an fp16 run starts at a loss scale of 65,536 and skips its first steps until its "
    "gradients fit."
)


@dataclass(frozen=True)
class Beside:
    """The map of another precision set beside a sweep."""

    path: Path  # its map.json
    cells: list[CellSummary]  # its runs, judged by today's rule
    precision: str  # what its runs computed in, as the section names it
    rule: str  # the failure rule its map.json recorded ("" where none)


# ----------------------------------------------------------------------------- reading the map beside


def load_beside(given: str | Path) -> Beside:
    """The map of ``given``, a sweep's folder or its map.json; a :class:`ScaleLongError` of one line
    naming ``--beside`` where it is missing or not a sweep's map.json."""
    path = Path(given)
    if not path.exists():
        raise ScaleLongError(f"--beside {given}: no such file or folder")
    if path.is_dir():
        if not (path / "map.json").is_file():
            raise ScaleLongError(
                f"--beside {given}: the folder holds no map.json (a sweep's folder holds one)"
            )
        path = path / "map.json"
    data = _map_data(path, given)
    try:
        cells, _, _ = read_map(path)
    except (ScaleLongError, KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise _not_a_map(given, f"{type(e).__name__}: {e}") from None
    rule = data.get("rule") if isinstance(data.get("rule"), str) else ""
    return Beside(path, cells, map_precision(cells, path), rule)


def _not_a_map(given: str | Path, why: str) -> ScaleLongError:
    return ScaleLongError(
        f"--beside {given}: not a sweep's map.json ({why}); give a sweep's folder or its map.json"
    )


def _map_data(path: Path, given: str | Path) -> dict:
    """The JSON of ``path`` where it has a sweep map's shape: a list of cells, each with its depth,
    lr, method and seeds."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise _not_a_map(given, f"{type(e).__name__}: {e}") from None
    rows = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise _not_a_map(given, "no list of cells")
    for key in ("depth", "lr", "method", "seed"):
        if not all(isinstance(row, dict) and key in row for row in rows):
            raise _not_a_map(given, f"a cell without its {key}")
    return data


def run_keys(cells: Iterable[CellSummary]) -> set[RunKey]:
    """The runs of ``cells``, each as (depth, lr, method, seed)."""
    return {(c.cell.depth, c.cell.lr, c.cell.method, r.seed) for c in cells for r in c.runs}


def _grid(keys: Iterable[RunKey]) -> str:
    """``depth 12; lr 0.01, 0.02; methods none, cs; seeds 0, 1``: what a set of runs covers."""
    keys = list(keys)

    def values(i: int) -> str:
        found = sorted({k[i] for k in keys}, key=lambda v: (v is None, 0 if v is None else v))
        return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in found)

    return f"depths {values(0)}; lrs {values(1)}; methods {values(2)}; seeds {values(3)}"


def require_shared(side: Beside, keys: Iterable[RunKey], given: str | Path | None = None) -> None:
    """Refuse a map beside that shares no run (depth, lr, method, seed) with ``keys``, this sweep's."""
    keys = set(keys)
    if not run_keys(side.cells) & keys:
        theirs = _grid(run_keys(side.cells)) if side.cells else "no run"
        raise ScaleLongError(
            f"--beside {given or side.path}: shares no run (depth, lr, method, seed) with this sweep "
            f"(it holds {theirs}; this sweep {_grid(keys) if keys else 'no run'})"
        )


def _label(precisions: Iterable[str]) -> str:
    return " and ".join(sorted(set(precisions)))


def config_precision(mixed_precision: str) -> str:
    """A config's ``train.mixed_precision`` as the section names it: ``bf16, by its config`` (runs made
    before bf16 ran as a GPU computes it on CPUs without bf16 units computed there in fp32, which only
    their provenance says)."""
    return f"{PRECISION_NAMES.get(mixed_precision, mixed_precision)}, by its config"


def map_precision(cells: Sequence[CellSummary], path: Path) -> str:
    """What the runs of the map at ``path`` computed in: as they recorded it (map.json's
    ``precision``), else from the runs.json beside it (each run's provenance, else the base config),
    else :data:`OTHER`."""
    recorded = [r.precision for c in cells for r in c.runs if r.precision]
    if recorded:
        return _label(recorded)
    try:
        runs = json.loads((path.parent / "runs.json").read_text())
        made = [(r.get("provenance") or {}).get("precision") for c in runs["cells"] for r in c["runs"]]
        if any(made):
            return _label(p for p in made if p)
        return config_precision(runs["base_config"]["train"]["mixed_precision"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return OTHER


def sweep_precision(cells: Sequence[CellSummary], mixed_precision: str) -> str:
    """What this sweep's runs computed in: as they recorded it, else by its config."""
    recorded = [r.precision for c in cells for r in c.runs if r.precision]
    return _label(recorded) if recorded else config_precision(mixed_precision)


# ----------------------------------------------------------------------------- kept in map.json


def _relative(path: Path, folder: Path) -> str:
    """``path`` relative to ``folder`` (absolute where it cannot be), in the form a link takes."""
    try:
        return Path(os.path.relpath(path.resolve(), folder.resolve())).as_posix()
    except ValueError:  # another drive
        return path.resolve().as_posix()


def beside_record(side: Beside, sweep_dir: Path) -> dict:
    """What this sweep's map.json keeps of the map beside: its path (relative to the sweep's folder,
    so the two move together), its precision, its failure rule and the rule of the prediction."""
    return {
        "path": _relative(side.path, sweep_dir),
        "precision": side.precision,
        "rule": side.rule,
        "overflow_rule": OVERFLOW_RULE,
    }


def recorded_beside(
    sweep_dir: Path, keys: Iterable[RunKey], warn: Callable[[str], object] = print
) -> Beside | None:
    """The map beside that this sweep's map.json recorded, read again; None where it recorded none.
    One line through ``warn`` where the map is gone or no longer fits (the report then leaves the
    section out)."""
    saved = sweep_dir / "map.json"
    try:
        record = json.loads(saved.read_text()).get("beside")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("path"), str):
        return None
    path = sweep_dir / record["path"]
    try:
        side = load_beside(path)
        require_shared(side, keys)
    except ScaleLongError as e:
        state = "is gone" if not path.exists() else f"cannot be used ({e})"
        warn(
            f"{saved}: the map beside it recorded, {record['path']}, {state}; the report leaves out the "
            "precisions side by side (--beside PATH sets a map beside)"
        )
        return None
    return side


# ----------------------------------------------------------------------------- the runs both made


def shared_cells(cells: Sequence[CellSummary], keys: set[RunKey]) -> list[CellSummary]:
    """``cells`` with only the runs in ``keys``; a cell left without a run is left out."""
    out = []
    for c in cells:
        runs = [r for r in c.runs if (c.cell.depth, c.cell.lr, c.cell.method, r.seed) in keys]
        if runs:
            out.append(CellSummary(c.cell, runs, c.metric))
    return out


def by_run(cells: Sequence[CellSummary]) -> dict[RunKey, SeedSummary]:
    return {(c.cell.depth, c.cell.lr, c.cell.method, r.seed): r for c in cells for r in c.runs}


def _depth(depth: int | None) -> str:
    return "" if depth is None else str(depth)


def edge_table(found: Sequence[Basin], precision: str) -> str:
    """Per (depth, method): the largest stable lr by the basin's one rule
    (:meth:`~scalelong.studies.sweep.basin.Basin.stable_edge`) and failed k/n at each lr, counted
    on the seeds every method ran there (:meth:`~scalelong.studies.sweep.basin.Basin.deciding_counts`)."""
    grid = sorted({lr for b in found for lr in b.lrs})
    head = ["depth", "method", f"largest stable lr ({precision})", *(f"failed at {lr:g}" for lr in grid)]
    rows = []
    for b in found:
        counts = b.deciding_counts()
        cols = [f"{counts[lr][0]}/{counts[lr][1]}" if lr in counts else "" for lr in grid]
        rows.append([_depth(b.depth), b.method, b.stable_edge(), *cols])
    return markdown_table(head, rows)


def overflowed(run: SeedSummary) -> bool:
    """Whether a run's forward went past fp16's range (:data:`OVERFLOW_RULE`): a failure whose cause
    is an overflow, a step skipped for a non-finite loss, or a last skipped step that overflowed in
    forward. The loss scaler's skips of overflowing gradients alone do not count."""
    if run.breaks and "overflow" in cause(run.breaks[0]):
        return True
    if run.nonfinite_steps > 0:
        return True
    return skip_cause(run.last_skipped).startswith("fp16 overflow")


def _headroom(x: float) -> str:
    return f"{x:.2g}" if math.isfinite(x) else "not logged"


def _steps(x: float) -> str:
    return f"{x:g}" if math.isfinite(x) else "n/a"


def outcome(run: SeedSummary) -> str:
    """``trained`` or ``failed: CAUSE`` (:func:`~scalelong.studies.divergence.cause`), with the cause
    of the last skipped step of a run that trained."""
    if run.breaks:
        return f"failed: {cause(run.breaks[0])}"
    return "trained" + (f"; last skipped: {skip_cause(run.last_skipped)}" if run.last_skipped else "")


def skipped(run: SeedSummary) -> str:
    """``5 + 2``: the steps the loss scaler skipped with a finite loss and those skipped for a
    non-finite loss; ``not recorded`` where the run recorded neither."""
    if not (math.isfinite(run.overflow_steps) or math.isfinite(run.nonfinite_steps)):
        return "not recorded"
    return f"{_steps(run.overflow_steps)} + {_steps(run.nonfinite_steps)}"


Pair = tuple[RunKey, SeedSummary, SeedSummary]  # a run, this sweep's, the map beside's


def run_table(pairs: Sequence[Pair], this: str, other: str) -> str:
    """Per run both made: the other precision's least fp16 headroom (the prediction) beside this
    sweep's outcome, skipped steps, least fp16 headroom and whether it overflowed."""
    head = ["depth", "lr", "method", "seed", f"{other}: least fp16 headroom", f"{this}: outcome"]
    head += [f"{this}: steps skipped (loss scale + non-finite loss)", f"{this}: least fp16 headroom"]
    head += [f"{this}: overflowed"]
    rows = []
    for (depth, lr, method, seed), mine, theirs in pairs:
        cols = [_depth(depth), f"{lr:g}", method, str(seed), _headroom(theirs.fp16_headroom)]
        cols += [
            outcome(mine),
            skipped(mine),
            _headroom(mine.fp16_headroom),
            "yes" if overflowed(mine) else "no",
        ]
        rows.append(cols)
    return markdown_table(head, rows)


def prediction_square(pairs: Sequence[Pair], this: str, other: str) -> list[str]:
    """The 2x2 count of the prediction (the other precision's least fp16 headroom below 1) against
    what this sweep did (:func:`overflowed`), with a line on the runs left out (no headroom logged)."""
    judged = [
        (theirs.fp16_headroom < 1, overflowed(mine))
        for _, mine, theirs in pairs
        if math.isfinite(theirs.fp16_headroom)
    ]

    def count(predicted: bool, happened: bool) -> int:
        return sum(p == predicted and h == happened for p, h in judged)

    lines = [
        f"| {other}: least fp16 headroom | {this}: overflowed | {this}: no overflow |",
        "|---|---|---|",
        f"| below 1: predicts an overflow | {count(True, True)} | {count(True, False)} |",
        f"| 1 or more | {count(False, True)} | {count(False, False)} |",
    ]
    parts = ["\n".join(lines)]
    if (left := len(pairs) - len(judged)) > 0:
        parts.append(
            f"Left out: {left} run{'' if left == 1 else 's'} whose {other} run logged no fp16 headroom."
        )
    return parts


# ----------------------------------------------------------------------------- the report's section


def _labels(this: str, other: str) -> tuple[str, str]:
    """The two precisions as the tables name them, told apart where they read the same."""
    return (f"{this} (this sweep)", f"{other} (beside)") if this == other else (this, other)


def basin_and_pairs(
    mine: Sequence[CellSummary],
    theirs: Sequence[CellSummary],
    found: tuple[list[Basin], list[Basin]],
    precisions: tuple[str, str],
    labels: tuple[str, str],
    sweep_dir: Path,
) -> list[str]:
    """Per precision, on the shared runs: the lr basin as a figure (``basin_precisions.png``, one row
    of panels per precision) and a table with the LR sensitivity
    (:func:`~scalelong.studies.sweep.basin.basin_table`), and each method against ``none`` paired by
    seed (:func:`~scalelong.studies.sweep.paired.paired_table`); ``found``: the basins of ``mine`` and
    ``theirs``. Nothing where the shared runs hold fewer than two lrs or no held-out error."""
    if len({c.cell.lr for c in mine}) < 2 or not all(any(b.logged("ema") for b in f) for f in found):
        return []
    rows = {f"{p}, {WEIGHTS['ema']}": figure_points(f, "ema") for p, f in zip(precisions, found, strict=True)}
    png = plot_basin(rows, sweep_dir / "basin_precisions.png")
    parts = [
        "### The lr basin and each method against `none`, in each precision",
        "The lr basin of each precision on the shared runs (top row this sweep's, bottom row the other's), "
        "its table with the LR sensitivity (read as in the report's lr basin above) and the failures "
        "paired by seed against `none` (read as in the report's paired section above).",
        f"![the lr basin in each precision]({png.name})",
    ]
    for label, cells, f in zip(labels, (mine, theirs), found, strict=True):
        parts.append(label)
        depths = sorted({b.depth for b in f}, key=lambda d: -1 if d is None else d)
        for depth in depths:
            parts += [f"Depth {depth}:"] if len(depths) > 1 else []
            parts.append(basin_table([b for b in f if b.depth == depth]))
        parts.append(paired_table(cells) or "No method shares a seed with `none` here.")
    return parts


def beside_section(cells: Sequence[CellSummary], this: str, side: Beside, sweep_dir: Path) -> list[str]:
    """The report's "The precisions side by side": ``cells`` (this sweep, computed in ``this``)
    beside ``side`` on the runs both made (:func:`shared_cells`), per precision the lr basin's
    edges (:func:`edge_table`), the basin figure, LR sensitivity and the failures paired by seed
    against ``none`` (:func:`basin_and_pairs`), the failures by cause
    (:func:`~scalelong.studies.sweep.tables.cause_table`), the rule of the prediction, its 2x2
    count (:func:`prediction_square`) and every run (:func:`run_table`)."""
    where = _relative(side.path, sweep_dir)
    this, other = _labels(this, side.precision)
    heading = "## The precisions side by side"
    shared = run_keys(cells) & run_keys(side.cells)
    if not shared:
        return [
            heading,
            f"No run (depth, lr, method, seed) of this sweep ({this}) is in `{where}` ({other}).",
        ]
    mine, theirs = shared_cells(cells, shared), shared_cells(side.cells, shared)
    mine_runs, theirs_runs = by_run(mine), by_run(theirs)
    order = sorted(shared, key=lambda k: (k[0] or 0, k[1], method_order(k[2]), k[3] or 0))
    pairs = [(k, mine_runs[k], theirs_runs[k]) for k in order]
    mine_label, theirs_label = f"**{this}** (this sweep):", f"**{other}** (`{where}`):"
    found = (basins(mine), basins(theirs))
    n = len(pairs)
    scaled = sum(r.overflow_steps > 0 for _, r, _ in pairs)
    parts = [
        heading,
        f"This sweep ({this}) beside `{where}` ({other}): the {n} run{'' if n == 1 else 's'} (depth, lr, "
        "method, seed) that both made; every number of this section is on them alone, the runs of each "
        "precision judged by the failure rule above (the map beside judged again from its numbers, as a "
        "report made from map.json is).",
        "### The lr basin in each precision",
        "Per method, the largest stable lr by the lr basin's one rule (no seed failed there nor at any "
        "smaller lr, counted on the seeds that every method ran at that lr), here on the runs both "
        "precisions made; failed k/n at each lr on those seeds.",
        mine_label,
        edge_table(found[0], this),
        theirs_label,
        edge_table(found[1], other),
        *basin_and_pairs(mine, theirs, found, (this, other), (mine_label, theirs_label), sweep_dir),
        "### Failures by cause in each precision",
        CAUSES_READ,
        mine_label,
        cause_table(mine, this) or "No run failed.",
        theirs_label,
        cause_table(theirs, other) or "No run failed.",
        "### fp16 headroom as a prediction of fp16 overflow",
        f"**The rule.** {OVERFLOW_RULE} Here {scaled} of the {n} {this} runs skipped steps for "
        "overflowing gradients.",
    ]
    if not this.startswith("fp16"):
        parts.append(
            f"This sweep computed in {this}, not fp16: what its runs did does not test the prediction."
        )
    parts += ["The count:", *prediction_square(pairs, this, other), "Per run:", run_table(pairs, this, other)]
    return parts
