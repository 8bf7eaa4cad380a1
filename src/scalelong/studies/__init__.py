"""What every study shares: ``scalelong compare`` (methods side by side at one config,
:mod:`scalelong.studies.compare`) and ``scalelong sweep`` (a grid of depth x lr x method,
:mod:`scalelong.studies.sweep`) are packages of their own over these modules.

* :mod:`~scalelong.studies.running`: plan, check, train (reusing finished runs) and record the
  outcome of every run of a study;
* :mod:`~scalelong.studies.divergence`: the rule that says whether and how a run diverged;
* :mod:`~scalelong.studies.statistics`: means with t-intervals, the one paired estimator of a
  method against its baseline (:func:`~scalelong.studies.statistics.contrast`), rate intervals;
* :mod:`~scalelong.studies.summary`: a run read back, the one per-seed summary of it, and the
  groups of seeds the tables read (a method of a comparison, a cell of a map);
* :mod:`~scalelong.studies.report`: markdown reports with embedded images, sample grids, captions.

What is one study's alone lives in its package: the lr basin, the gap by length, failure paired
by seed and map.json in :mod:`scalelong.studies.sweep`; the reading of a comparison in plain
sentences in :mod:`scalelong.studies.compare`.

The metric names every study reads are built and parsed in :mod:`scalelong.diagnostics.metric_names`.
"""
