"""The runs of a comparison: one per method and seed, each a config of its own under
``<report_dir>/runs``."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

from scalelong.training.config import Config


def method_config(base: Config, method: str, seed: int, out_dir: Path) -> Config:
    """The config of one run of a comparison: ``method`` at ``seed``, named ``<method>-seed<k>``."""
    cfg = copy.deepcopy(base)
    cfg.model.skip.method = method
    cfg.train.seed = seed
    cfg.out_dir = str(out_dir)
    cfg.name = f"{method}-seed{seed}"
    return cfg


def comparison_configs(base: Config, methods: Sequence[str], seeds: int, report_dir: Path) -> list[Config]:
    """Every run of a comparison, seed by seed, under ``report_dir/runs``: seed ``train.seed + k``."""
    return [
        method_config(base, m, base.train.seed + k, report_dir / "runs")
        for k in range(seeds)
        for m in methods
    ]
