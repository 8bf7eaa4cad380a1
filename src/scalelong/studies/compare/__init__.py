"""``scalelong compare``: train several skip methods side by side at one config and write one report.

Every method of a seed starts from the same trunk weights (the skip module is built after the
backbone's initialisation), sees the same batches in the same order and the same noise, so the
methods differ only in how the skips are scaled. Claims rest on several seeds: the table gives
means with 95% t-intervals over seeds, and the change in final FD and the speed-up against the
baseline are paired by seed (:func:`scalelong.studies.statistics.contrast`).

What is specific to a comparison lives in this package, one module a job:

* :mod:`~scalelong.studies.compare.entry`: what the command calls, :func:`run_comparison` and
  :func:`report_comparison`;
* :mod:`~scalelong.studies.compare.configs`: its runs, one per method and seed;
* :mod:`~scalelong.studies.compare.summary`: the steps each method needs to reach the baseline's
  final FD, and the per-method summaries;
* :mod:`~scalelong.studies.compare.table`: the summary table;
* :mod:`~scalelong.studies.compare.reading`: the table in plain sentences;
* :mod:`~scalelong.studies.compare.report`: the report, assembled.

Running, the divergence rule, the statistics, the per-seed summaries and the report's pieces are
the :mod:`scalelong.studies` package's.
"""

# The names this module held before it became a package: the command line imports the entry's
# (scalelong.cli), and 0.1's scalelong.compare forwards here (scalelong.MOVED), so all keep this path.
from scalelong.studies.compare.configs import comparison_configs, method_config
from scalelong.studies.compare.entry import report_comparison, run_comparison
from scalelong.studies.compare.report import write_report
from scalelong.studies.compare.summary import TargetResult, steps_to_target, summarise
from scalelong.studies.compare.table import summary_table

__all__ = [
    "TargetResult",
    "comparison_configs",
    "method_config",
    "report_comparison",
    "run_comparison",
    "steps_to_target",
    "summarise",
    "summary_table",
    "write_report",
]
