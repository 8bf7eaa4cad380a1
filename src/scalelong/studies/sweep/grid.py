"""The grid of a sweep: its cells (depth, lr, method), the config of each run of a cell, the plan
of every run, and the concluded runs of a sweep's folder read back by cell."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from pathlib import Path

from scalelong.errors import ScaleLongError
from scalelong.studies.divergence import DEFAULT_RULE, DivergenceRule
from scalelong.studies.running import STUDY_FREE_KEYS, concluded
from scalelong.studies.summary import Cell, StudyRun, read_run
from scalelong.training.config import Config, config_from_dict, config_to_dict, validate
from scalelong.training.runs import RunDir, config_differences


def parse_numbers(text: str, flag: str, kind: type = float) -> list:
    """``"2e-3,5e-3"`` -> [0.002, 0.005]: positive, finite, distinct numbers of ``kind``."""
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ScaleLongError(
            f"{flag} {text!r}: give comma-separated numbers, e.g. {flag} 2e-3,5e-3"
        ) from None
    if not values or any(not (math.isfinite(v) and v > 0) for v in values):
        raise ScaleLongError(f"{flag} {text!r}: every value must be a positive number")
    if len(set(values)) != len(values):
        raise ScaleLongError(f"{flag} {text!r} names a value twice")
    return values


def cell_of(cfg: Config) -> Cell:
    """The cell a run's config trains: its depth (None without a U-ViT), lr and skip method."""
    depth = cfg.model.uvit.depth if cfg.model.type == "uvit" else None
    return Cell(depth, cfg.optim.lr, cfg.model.skip.method)


def cell_config(base: Config, cell: Cell, seed: int, runs_dir: Path) -> Config:
    """The config of one run of ``cell``, validated (an invalid cell is named in the error)."""
    cfg = copy.deepcopy(base)
    cfg.model.skip.method, cfg.optim.lr, cfg.train.seed = cell.method, cell.lr, seed
    if cell.depth is not None:
        cfg.model.uvit.depth = cell.depth
    cfg.out_dir, cfg.name = str(runs_dir), cell.name(seed)
    try:
        validate(cfg)
    except ScaleLongError as e:
        raise ScaleLongError(f"sweep cell {cfg.name}: {e}") from None
    return cfg


def plan(
    base: Config,
    methods: Sequence[str],
    lrs: Sequence[float],
    depths: Sequence[int] | None,
    seeds: int,
    runs_dir: Path,
) -> list[Config]:
    """Every run of the sweep, each config validated before any run starts; seed by seed, so a
    sweep cut short covers every cell with its first seeds."""
    if seeds < 1:
        raise ScaleLongError(f"--seeds must be >= 1, got {seeds}")
    if depths and base.model.type != "uvit":
        raise ScaleLongError(
            f"--depths sets model.uvit.depth; model.type={base.model.type} has no single depth to "
            f"sweep: run one sweep per size, with overrides of model.{base.model.type}"
        )
    depth_list = list(depths or [cell_of(base).depth])
    folders: dict[str, float] = {}
    for lr in lrs if methods else []:  # run folders name an lr by its 6 significant digits
        folder = Cell(depth_list[0], lr, methods[0]).name(base.train.seed)
        if folder in folders:
            raise ScaleLongError(
                f"--lrs {folders[folder]!r} and {lr!r} would share the run folder {folder}: "
                "give lrs that differ within 6 significant digits"
            )
        folders[folder] = lr
    return [
        cell_config(base, Cell(d, lr, m), base.train.seed + k, runs_dir)
        for k in range(seeds)
        for d in depth_list
        for lr in lrs
        for m in methods
    ]


def collect(base: Config, runs_dir: Path, rule: DivergenceRule = DEFAULT_RULE) -> dict[Cell, list[StudyRun]]:
    """Every concluded run in ``runs_dir`` of the base config (up to its cell, seed and
    :data:`~scalelong.studies.running.STUDY_FREE_KEYS`), by cell, in seed order."""
    found: dict[Cell, list[tuple[int, StudyRun]]] = {}
    for path in sorted(runs_dir.iterdir()) if runs_dir.is_dir() else []:
        run = RunDir(path)
        if not concluded(run):
            continue
        try:  # config.yaml, or the newest checkpoint's copy when it is damaged (read_run warns of that)
            data = run.stored_config(warn=lambda message: None)
        except ScaleLongError as e:  # no copy of the run's config is readable: the others still report
            print(f"warning: run {path.name} left out: {' '.join(str(e).split())}")
            continue
        try:
            cfg = config_from_dict(data)
            expected = cell_config(base, cell_of(cfg), cfg.train.seed, runs_dir)
        except ScaleLongError:  # a config of another version or base: not part of this map
            continue
        if not config_differences(data, config_to_dict(expected), free=STUDY_FREE_KEYS):
            found.setdefault(cell_of(cfg), []).append((cfg.train.seed, read_run(path, rule)))
    return {cell: [r for _, r in sorted(runs, key=lambda x: x[0])] for cell, runs in found.items()}
