"""What every study shares: ``scalelong compare`` (methods side by side at one config) and
``scalelong sweep`` (a grid of depth x lr x method) are thin front ends over these modules.

* :mod:`~scalelong.studies.running`: plan, check, train (reusing finished runs) and record the
  outcome of every run of a study;
* :mod:`~scalelong.studies.divergence`: the rule that says whether and how a run diverged;
* :mod:`~scalelong.studies.statistics`: means with t-intervals, the one paired estimator of a
  method against its baseline (:func:`~scalelong.studies.statistics.contrast`), rate intervals;
* :mod:`~scalelong.studies.summary`: a run read back, the one per-seed summary of it, and the
  groups of seeds the tables read (a method of a comparison, a cell of a map);
* :mod:`~scalelong.studies.basin`: the lr basin of a sweep (Wortsman et al. 2023): the largest stable
  lr and the LR sensitivity per method and depth;
* :mod:`~scalelong.studies.reading`: a comparison's table in plain sentences;
* :mod:`~scalelong.studies.report`: markdown reports with embedded images, sample grids, captions.

The metric names every study reads are built and parsed in :mod:`scalelong.diagnostics.metric_names`.
"""
