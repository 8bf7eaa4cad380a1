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


def write_text_atomic(path: str | Path, text: str | bytes) -> None:
    """Write a file under a temporary name, then rename it: a kill leaves the old file or the new
    one, never a cut one. Bytes are written as they are (damaged lines keep their exact bytes)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb" if isinstance(text, bytes) else "w") as f:
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


def _record(line: str) -> dict | None:
    """The record of one line of the log; None for a line that is no JSON object with an integer
    ``step`` (a cut or edited line), which nothing can place in the run."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    if isinstance(step, float) and step.is_integer():
        step = int(step)
    if isinstance(step, bool) or not isinstance(step, int):
        return None
    return {k: step if k == "step" else _from_json(v) for k, v in record.items()}


class MetricsLog:
    """``metrics.jsonl``: one JSON object per logged step, with an integer ``step``. Non-finite
    numbers are written as the strings ``"nan"`` / ``"inf"`` / ``"-inf"`` and read back as floats.

    A kill can cut the last line short; reading leaves out such a line (and any other that is no
    record) with one warning through ``warn``. :meth:`truncate_after` (which a resumed run calls)
    moves those lines to ``metrics.jsonl.bad`` beside it, where they can be repaired, never
    deleting them, and rewrites the log without them, atomically."""

    _warned: set[tuple[str, int, int]] = set()  # (file, size, mtime) already reported

    def __init__(self, path: str | Path, warn: Warn = warn_user):
        self.path = Path(path)
        self.bad_path = self.path.with_name(self.path.name + ".bad")
        self.warn = warn

    def write(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({k: _to_json(v) for k, v in record.items()}) + "\n")

    def scan(self) -> list[tuple[int, bytes, dict | None]]:
        """(line number, exact bytes, record or None if unreadable) of each non-blank line."""
        if not self.path.is_file():
            return []
        lines = self.path.read_bytes().split(b"\n")
        return [
            (i + 1, raw, _record(raw.decode(errors="replace"))) for i, raw in enumerate(lines) if raw.strip()
        ]

    def read(self) -> list[dict]:
        lines = self.scan()
        bad = [n for n, _, record in lines if record is None]
        if bad:
            self._report(bad, lines[-1][0])
        return [record for _, _, record in lines if record is not None]

    @staticmethod
    def _what(bad: list[int], last: int) -> str:
        if bad == [last]:
            return "its last line is cut short (a run stopped while writing it)"
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        return f"line(s) {', '.join(map(str, bad[:5]))}{more} are not JSON records with an integer step"

    def _report(self, bad: list[int], last: int) -> None:
        stat = self.path.stat()
        key = (str(self.path.resolve()), stat.st_size, stat.st_mtime_ns)
        if key in MetricsLog._warned:  # one warning per state of the file, however often it is read
            return
        MetricsLog._warned.add(key)
        self.warn(f"warning: {self.path}: {self._what(bad, last)}; ignoring it")

    def truncate_after(self, step: int) -> None:
        """Drop records beyond ``step`` (a resumed run writes them again); unreadable lines are
        appended to :attr:`bad_path`, with one warning, before the log is rewritten without them."""
        lines = self.scan()
        if not lines:
            return
        bad = [(n, raw) for n, raw, record in lines if record is None]
        if bad:
            held = self.bad_path.read_bytes() if self.bad_path.is_file() else b""
            held += b"\n" if held and not held.endswith(b"\n") else b""
            # Written (and renamed into place) first: a kill in between leaves a line twice, never none.
            write_text_atomic(self.bad_path, held + b"".join(raw + b"\n" for _, raw in bad))
            self.warn(
                f"warning: {self.path}: {self._what([n for n, _ in bad], lines[-1][0])}; "
                f"moved to {self.bad_path}, kept there to repair by hand"
            )
        kept = [raw for _, raw, record in lines if record is not None and record["step"] <= step]
        write_text_atomic(self.path, b"".join(raw + b"\n" for raw in kept))  # kept lines as written


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
    ``step`` is no record and is left out, with one warning through ``warn``."""
    path = Path(path)
    file = path if path.suffix == ".jsonl" or path.is_file() else path / METRICS_FILE
    if not file.is_file():
        where = f"{path} does not exist" if not path.exists() else f"{path} holds no metrics.jsonl"
        raise ScaleLongError(
            f"nothing to plot: {where}; pass a run folder that `scalelong train` or scalelong.RunLog wrote"
        )
    # read() already left out (with its warning) every line without an integer step
    return [
        {k: v if k == "step" else as_float(v) for k, v in r.items()} for r in MetricsLog(file, warn).read()
    ]


def series(records: Records, key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the records that hold ``key``, in step order."""
    pairs = sorted((int(r["step"]), as_float(r[key])) for r in records if key in r and "step" in r)
    return [s for s, _ in pairs], [v for _, v in pairs]
