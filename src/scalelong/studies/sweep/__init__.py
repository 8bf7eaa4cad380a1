"""``scalelong sweep``: the stability map. Which learning rates does each skip method survive, and
how does that change with depth?

Every cell (depth, lr, method) trains K seeds (``train.seed + k``) as ordinary runs under
``<out_dir>/<name>-sweep/runs/d12-lr0.01-cs-seed0``. A run that diverges is a result: each run is
judged by :func:`scalelong.studies.divergence.divergence` and the others go on. The report covers every
finished run of the same base config in that folder, so a later call with more seeds or other
learning rates adds to the cells, and the report shows the union (with each cell's seed count).

What is specific to the grid lives in this package, one module a job:

* :mod:`~scalelong.studies.sweep.entry`: what the command calls, :func:`run_sweep` and
  :func:`report_sweep`;
* :mod:`~scalelong.studies.sweep.grid`: the cells, each run's config, the plan, the runs read back;
* :mod:`~scalelong.studies.sweep.tables`: the stability, cell, gap, Fig. 1 and cause tables;
* :mod:`~scalelong.studies.sweep.figures`: the heatmaps and Fig. 1 by depth;
* :mod:`~scalelong.studies.sweep.basin`: the lr basin (Wortsman et al. 2023) and its LR sensitivity;
* :mod:`~scalelong.studies.sweep.edges`: the largest stable lr, on each set of seeds that methods share;
* :mod:`~scalelong.studies.sweep.length`: the gap by length, over training;
* :mod:`~scalelong.studies.sweep.paired`: failure paired by seed against ``none``;
* :mod:`~scalelong.studies.sweep.beside`: the same grid in another precision, set beside this one
  (``--beside``): the basin, the failures by cause and fp16 headroom as a prediction of overflow;
* :mod:`~scalelong.studies.sweep.mapfile`: map.json, written and read back;
* :mod:`~scalelong.studies.sweep.report`: the report, assembled.

Running, the divergence rule, the statistics, the per-seed and per-cell summaries and the report's
pieces are the :mod:`scalelong.studies` package's.
"""

# The names this module held before it became a package: the command line imports the entry's
# (scalelong.cli), and 0.1's scalelong.sweep forwards here (scalelong.MOVED), so all keep this path.
from scalelong.studies.sweep.entry import report_sweep, run_sweep
from scalelong.studies.sweep.figures import check_fig1_lr, draw_map, fig1_section, figure_lr
from scalelong.studies.sweep.grid import cell_config, cell_of, collect, parse_numbers, plan
from scalelong.studies.sweep.mapfile import write_map_json
from scalelong.studies.sweep.report import write_sweep_report
from scalelong.studies.sweep.tables import (
    cause_section,
    cell_table,
    fig1_table,
    gap_table,
    least_headroom,
    stability_table,
)

__all__ = [
    "cause_section",
    "cell_config",
    "cell_of",
    "cell_table",
    "check_fig1_lr",
    "collect",
    "draw_map",
    "fig1_section",
    "fig1_table",
    "figure_lr",
    "gap_table",
    "least_headroom",
    "parse_numbers",
    "plan",
    "report_sweep",
    "run_sweep",
    "stability_table",
    "write_map_json",
    "write_sweep_report",
]
