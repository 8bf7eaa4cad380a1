"""A study's progress while it trains: one line per run, read from the runs' own ``metrics.jsonl``.

:func:`scalelong.studies.running.run_all` shows, for every run in training, its name, step /
total, latest loss, latest Fréchet distance (where one was evaluated), elapsed time and ETA. The
parent process reads what each run appends to its ``metrics.jsonl`` (written at every log step,
``train.log_every``), so the workers send nothing and do nothing more, and a run that resumes
(its log rewritten up to its checkpoint) is simply read again. On a terminal the lines are one
block redrawn in place every second; elsewhere (a log file, CI) the block is printed as plain
lines every :data:`PLAIN_EVERY_S` seconds. ``--no-progress`` turns all of it off.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

POLL_S = 1.0  # how often the runs' logs are read (and a terminal's block redrawn)
PLAIN_EVERY_S = 30.0  # how often the block is printed where the output is not a terminal


class MetricsTail:
    """The records appended to a ``metrics.jsonl`` since the last :meth:`read`.

    Only complete lines are read: a last line still being written (no newline yet) is read whole
    on a later call. A line that is not a JSON object is skipped. A file rewritten in the meantime
    (a resumed run truncates its log atomically: a new file, maybe shorter) is read from its start
    again, which :meth:`read` says with its second value."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.offset = 0
        self.inode: int | None = None

    def read(self) -> tuple[list[dict], bool]:
        """(new records, whether the file was replaced since the last read: forget the old ones)."""
        try:
            with self.path.open("rb") as f:
                st = os.fstat(f.fileno())
                replaced = self.inode is not None and (st.st_ino != self.inode or st.st_size < self.offset)
                if replaced or self.inode is None:
                    self.inode, self.offset = st.st_ino, 0
                f.seek(self.offset)
                data = f.read()
        except OSError:  # not written yet (or removed)
            return [], False
        end = data.rfind(b"\n") + 1  # 0: no complete line yet
        self.offset += end
        records = []
        for line in data[:end].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records, replaced


def _number(value: object) -> float | None:
    """A logged number (non-finite ones are logged as the strings "nan", "inf", "-inf")."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def duration(seconds: float) -> str:
    """``42s``, ``3m12s``, ``1h05m``."""
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass
class RunProgress:
    """What is known of one run: read from its log, timed from when it was first seen training."""

    name: str
    folder: Path
    total: int
    tail: MetricsTail = field(init=False)
    step: int | None = None
    loss: float | None = None
    fd: float | None = None
    fd_step: int | None = None
    started: float | None = None  # time.monotonic() when it was first seen training
    step0: int = 0  # its step then (a resumed run starts from its checkpoint)
    seen: float | None = None  # when its step last changed
    ended: float | None = None

    def __post_init__(self):
        self.tail = MetricsTail(self.folder / "metrics.jsonl")
        self._read()  # a resumed run's log so far: not progress of this study

    def _read(self) -> bool:
        records, replaced = self.tail.read()
        if replaced:
            self.step = self.loss = self.fd = self.fd_step = None
        for r in records:
            step = r.get("step")
            if isinstance(step, int) and not isinstance(step, bool):
                self.step = step
            loss = _number(r.get("loss"))
            if loss is not None:
                self.loss = loss
            fd = _number(r.get("fd"))
            if fd is not None:
                self.fd, self.fd_step = fd, self.step
        return bool(records) or replaced

    def update(self, now: float) -> None:
        before = self.step
        fresh = self._read()
        if self.started is None and (fresh or (self.folder / ".lock").exists()):
            self.started, self.step0 = now, before or 0
        if self.step != before:
            self.seen = now

    @property
    def running(self) -> bool:
        return self.started is not None and self.ended is None

    def numbers(self, now: float) -> str:
        """``loss 0.0312  FD 45.21 @1400  3m12s elapsed  ETA 1m36s``."""
        parts = []
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4g}")
        if self.fd is not None:
            parts.append(f"FD {self.fd:.4g} @{self.fd_step}")
        if self.started is not None:
            parts.append(f"{duration((self.ended or now) - self.started)} elapsed")
            eta = self.eta(now)
            if self.ended is None and eta is not None:
                parts.append(f"ETA {duration(eta)}")
        return "  ".join(parts)

    def eta(self, now: float) -> float | None:
        """Seconds left at the pace of this study so far (None: no step trained yet)."""
        if self.started is None or self.seen is None or self.step is None or self.step <= self.step0:
            return None
        rate = (self.step - self.step0) / max(self.seen - self.started, 1e-9)
        return max(0.0, (self.total - self.step) / rate - (now - self.seen))

    def steps(self) -> str:
        return f"{'-' if self.step is None else self.step}/{self.total}"


def _bar(step: int | None, total: int, width: int = 16) -> str:
    filled = 0 if not step or total <= 0 else min(width * 8, math.floor(step / total * width * 8))
    full, part = divmod(filled, 8)
    cells = "█" * full + (" ▏▎▍▌▋▊▉"[part] if part and full < width else "")
    return "▕" + cells.ljust(width) + "▏"


class StudyProgress:
    """Shows the progress of a study's runs on ``stream`` (default: stderr) from a thread of its
    own, until :meth:`close`. :meth:`note` prints a line (a run's outcome) without breaking the
    block; :meth:`finished` is what to add to a run's outcome line."""

    def __init__(
        self,
        runs: Sequence[tuple[str, str | Path, int]],
        stream: TextIO | None = None,
        live: bool | None = None,
        every: float | None = None,
    ):
        self.stream = stream or sys.stderr
        if live is None:
            isatty = getattr(self.stream, "isatty", None)
            live = bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"
        self.live = live
        self.every = PLAIN_EVERY_S if every is None else every
        self.runs = {name: RunProgress(name, Path(folder), total) for name, folder, total in runs}
        self.width = max((len(n) for n in self.runs), default=0)
        self.lock = threading.Lock()
        self.drawn = 0  # lines of the block on the terminal now
        self.stop = threading.Event()
        self.start = time.monotonic()
        self.thread = threading.Thread(target=self._loop, name="study-progress", daemon=True)
        self.thread.start()

    # --- what the study calls

    def note(self, line: str, file: TextIO | None = None) -> None:
        """Print one line above the block (to ``file``, default stdout)."""
        with self.lock:
            self._clear()
            print(line, file=file or sys.stdout, flush=True)
            self._draw(time.monotonic())

    def finished(self, name: str) -> str:
        """The run's last numbers, ``40/40 steps, loss 0.0312, FD 45.21 @40, 12s``, as it ends."""
        run = self.runs.get(name)
        if run is None:
            return ""
        with self.lock:
            now = time.monotonic()
            run.update(now)
            run.ended = now
            if run.started is None:  # it never began (refused, or its worker died first)
                return ""
            return f"{run.steps()} steps" + "".join(", " + p for p in run.numbers(now).split("  ") if p)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        with self.lock:
            self._clear()

    def __enter__(self) -> StudyProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the thread

    def _loop(self) -> None:
        printed = self.start
        while not self.stop.wait(POLL_S):
            with self.lock:
                now = time.monotonic()
                for run in self.runs.values():
                    if run.ended is None:
                        run.update(now)
                if self.live:
                    self._clear()
                    self._draw(now)
                elif now - printed >= self.every:
                    printed = now
                    for line in self.lines(now):
                        print(f"progress  {line}", file=self.stream, flush=True)

    def lines(self, now: float) -> list[str]:
        """A line per run in training, then one counting those waiting and finished."""
        running = [r for r in self.runs.values() if r.running]
        out = []
        for run in running:
            bar = _bar(run.step, run.total) + " " if self.live else ""
            out.append(f"{run.name:<{self.width}}  {bar}{run.steps():>11}  {run.numbers(now)}".rstrip())
        waiting = sum(r.started is None for r in self.runs.values())
        done = sum(r.ended is not None for r in self.runs.values())
        if out and (waiting or done):
            out.append(f"{len(self.runs)} runs: {len(running)} training, {waiting} waiting, {done} finished")
        return out

    def _draw(self, now: float) -> None:
        if not self.live:
            return
        size = shutil.get_terminal_size()
        lines = [line[: size.columns - 1] for line in self.lines(now)][: max(1, size.lines - 2)]
        if lines:
            self.stream.write("".join(f"\x1b[2K{line}\n" for line in lines))
            self.stream.flush()
        self.drawn = len(lines)

    def _clear(self) -> None:
        if self.live and self.drawn:
            self.stream.write(f"\x1b[{self.drawn}F\x1b[J")  # up to the block's first line, erase below
            self.stream.flush()
            self.drawn = 0
