"""``metrics.jsonl``, the one log every run folder keeps, its records read back as numbers, and
the atomic text write it relies on.

One JSON object per logged step, ``step`` first; non-finite numbers are written as the strings
``"nan"`` / ``"inf"`` / ``"-inf"`` (JSON has none) and read back as floats. ``scalelong train``
(:class:`scalelong.training.runs.RunDir`) and a loop of your own (:class:`scalelong.runlog.RunLog`) both
write it through :class:`MetricsLog`; :func:`load_metrics` reads a run's records back with every
value a float and :func:`series` one metric of them in step order, for ``scalelong analyze``'s
plots and the studies alike.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from scalelong.errors import ScaleLongError
from scalelong.runlog.lock import Warn, warn_user

METRICS_FILE, TB_DIR, CONFIG_FILE = "metrics.jsonl", "tb", "config.yaml"


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write a text file under a temporary name, then rename it: a kill leaves the old file or the
    new one, never a cut one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- the metrics log

_NONFINITE = ("nan", "inf", "-inf")


def _to_json(value: object) -> object:
    # JSON has no NaN or infinity; write them as strings so they stay visible.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _from_json(value: object) -> object:
    return float(value) if isinstance(value, str) and value in _NONFINITE else value


class MetricsLog:
    """``metrics.jsonl``: one JSON object per logged step. Non-finite numbers are written as the
    strings ``"nan"`` / ``"inf"`` / ``"-inf"`` and read back as floats.

    A kill can cut the last line short; reading drops such a line (and any other that is not a
    JSON object) with one warning through ``warn``, and :meth:`truncate_after` (which a resumed run
    calls) rewrites the file without it, atomically."""

    _warned: set[tuple[str, int, int]] = set()  # (file, size, mtime) already reported

    def __init__(self, path: str | Path, warn: Warn = warn_user):
        self.path = Path(path)
        self.warn = warn

    def write(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({k: _to_json(v) for k, v in record.items()}) + "\n")

    def read(self) -> list[dict]:
        if not self.path.is_file():
            return []
        records, bad = [], []
        lines = self.path.read_text(errors="replace").split("\n")
        last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError("not an object")
            except ValueError:
                bad.append(i)
                continue
            records.append({k: _from_json(v) for k, v in record.items()})
        if bad:
            self._report(bad, last)
        return records

    def _report(self, bad: list[int], last: int) -> None:
        stat = self.path.stat()
        key = (str(self.path.resolve()), stat.st_size, stat.st_mtime_ns)
        if key in MetricsLog._warned:  # one warning per state of the file, however often it is read
            return
        MetricsLog._warned.add(key)
        if bad == [last]:
            what = "its last line is cut short (a run stopped while writing it)"
        else:
            what = f"line(s) {', '.join(str(i + 1) for i in bad[:5])} are not JSON records"
        self.warn(f"warning: {self.path}: {what}; ignoring it")

    def truncate_after(self, step: int) -> None:
        """Drop records beyond ``step`` (a resumed run rewrites them) and unreadable lines."""
        if self.path.is_file():
            kept = [r for r in self.read() if r.get("step", 0) <= step]
            text = "".join(json.dumps({k: _to_json(v) for k, v in r.items()}) + "\n" for r in kept)
            write_text_atomic(self.path, text)


# ----------------------------------------------------------------------------- records read back

Records = Sequence[Mapping[str, object]]


def as_float(value: object) -> float:
    """A logged value as a float: numbers as they are, ``"nan"`` / ``"inf"`` strings parsed, else NaN."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return math.nan
    return math.nan


def load_metrics(path: str | Path, warn: Warn = warn_user) -> list[dict]:
    """Records of a run directory (or of a ``metrics.jsonl`` file) with every value but the step
    as a float, ready to plot. The folder needs no ``config.yaml`` or checkpoint (a folder that
    :class:`scalelong.RunLog` wrote has neither); a line that is not a JSON object with an integer
    ``step`` is no record and is left out (unreadable lines with one warning through ``warn``)."""
    path = Path(path)
    file = path if path.suffix == ".jsonl" or path.is_file() else path / METRICS_FILE
    if not file.is_file():
        where = f"{path} does not exist" if not path.exists() else f"{path} holds no metrics.jsonl"
        raise ScaleLongError(
            f"nothing to plot: {where}; pass a run folder that `scalelong train` or scalelong.RunLog wrote"
        )
    records = []
    for r in MetricsLog(file, warn).read():
        step = r.get("step")
        if isinstance(step, float) and step.is_integer():
            step = int(step)
        if isinstance(step, int) and not isinstance(step, bool):
            records.append({k: step if k == "step" else as_float(v) for k, v in r.items()})
    return records


def series(records: Records, key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the records that hold ``key``, in step order."""
    pairs = sorted((int(r["step"]), as_float(r[key])) for r in records if key in r and "step" in r)
    return [s for s, _ in pairs], [v for _, v in pairs]
