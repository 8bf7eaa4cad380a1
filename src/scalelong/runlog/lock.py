"""One writer per folder: the ``.lock`` a run folder's writer holds (pid, host, start time).

Shared by ``scalelong train`` (:class:`scalelong.training.runs.RunDir`) and a loop of your own
(:class:`scalelong.runlog.RunLog`), so neither writes into a folder the other holds.

* The lock is created with ``O_EXCL`` and holds the writer's pid, host and process start time; a
  second writer is refused in one line naming the holder.
* A lock whose process is gone (same host: the pid no longer runs, or runs another program) is
  taken over with a warning. A lock from another host is never taken over: this machine cannot
  see that process, so the message says to delete ``.lock`` once it has stopped.
* Readers take no lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from scalelong.errors import ScaleLongError

Warn = Callable[[str], None]

LOCK_NAME = ".lock"
STALE_UNREADABLE_S = 5.0  # an unreadable lock this old is not one being written this instant


def warn_user(message: str) -> None:
    """The library's way to say something went oddly but on: a :class:`UserWarning` (the command
    line passes ``print`` instead, which keeps its ``warning: ...`` lines)."""
    warnings.warn(message.removeprefix("warning: "), UserWarning, stacklevel=3)


def _process_start(pid: int) -> str | None:
    """When process ``pid`` started (Linux: clock ticks after boot), so a reused pid is told apart;
    None where /proc does not say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]  # field 22, counted after the command name
    except (OSError, IndexError):
        return None


def _process_alive(pid: int, start: str | None) -> bool:
    """Whether process ``pid`` of this host still runs, and is the one that started at ``start``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    except OSError:
        return False
    now = _process_start(pid)
    return start is None or now is None or now == start


def _lock_record() -> dict:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "start": _process_start(os.getpid()),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def read_lock(path: Path) -> tuple[bytes, dict | None] | None:
    """The raw bytes of a lock file and its record (None when unreadable); None when there is no lock."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError:
        return b"", None
    try:
        record = json.loads(raw)
        ok = isinstance(record, dict) and isinstance(record.get("pid"), int) and record["pid"] > 0
        return raw, record if ok and isinstance(record.get("host"), str) else None
    except ValueError:
        return raw, None


def lock_state(path: Path) -> tuple[str, dict | None]:
    """What a lock file says: ``("none", None)``, ``("mine", rec)``, ``("live", rec)`` (held by a
    running process, or by one on another host, which cannot be checked from here), ``("stale",
    rec)`` (its process is gone) or ``("unreadable", None)``."""
    found = read_lock(path)
    return ("none", None) if found is None else _judge(found[1])


def _judge(record: dict | None) -> tuple[str, dict | None]:
    if record is None:
        return "unreadable", None
    if record["host"] != socket.gethostname():
        return "live", record
    if record["pid"] == os.getpid() and record.get("start") == _process_start(os.getpid()):
        return "mine", record
    return ("live" if _process_alive(record["pid"], record.get("start")) else "stale"), record


def holder(record: dict) -> str:
    """``pid N on host H (since ...)``: who holds a lock, as messages name it."""
    return f"pid {record['pid']} on host {record['host']} (since {record.get('since', '?')})"


def writer_of(path: str | Path) -> str | None:
    """Who else writes ``path`` or a folder above it: ``"<folder> (pid N on host H ...)"`` for a
    live lock of another process, None when nobody does."""
    path = Path(path).absolute()
    for folder in (path, *path.parents):
        state, record = lock_state(folder / LOCK_NAME)
        if state == "live":
            return f"{folder} ({holder(record)})"
    return None


def make_folder(path: Path, advice: str = "choose another folder") -> list[Path]:
    """Create the folder ``path`` and its missing parents; return those created, deepest first.
    A file in the way, or a folder that cannot be made, is one ScaleLongError ending in ``advice``."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                what = "the run directory" if p == path else "a folder on its path"
                raise ScaleLongError(
                    f"{p} is a file, not a folder, so it cannot hold {what} {path}; {advice}"
                )
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ScaleLongError(f"cannot create the run directory {path} ({e.strerror}); {advice}") from None
    return missing


class FolderLock:
    """The ``.lock`` of one folder, held by this process between :meth:`acquire` and :meth:`release`.

    Args:
        folder: the folder it guards (it must exist when the lock is taken).
        verb: how messages call what the holder does to it (``written``; the trainer: ``trained``).
        advice: the end of the message that refuses a second writer (``choose another folder``).
    """

    def __init__(
        self, folder: str | os.PathLike, verb: str = "written", advice: str = "choose another folder"
    ):
        self.folder = Path(folder)
        self.file = self.folder / LOCK_NAME
        self.verb, self.advice = verb, advice
        self.held = False

    def acquire(self, warn: Warn = warn_user) -> None:
        """Create ``.lock`` (``O_EXCL``) holding this process's pid, host and start time.

        Held by a live process (or by one on another host): a ScaleLongError naming it. Held by a
        process of this host that is gone: taken over with a warning through ``warn``."""
        for _ in range(200):
            try:
                fd = os.open(self.file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                pass
            except OSError as e:
                raise ScaleLongError(
                    f"cannot write in the run directory {self.folder} ({e.strerror})"
                ) from None
            else:
                with os.fdopen(fd, "w") as f:
                    f.write(json.dumps(_lock_record()))
                    f.flush()
                    os.fsync(f.fileno())
                self.held = True
                return
            found = read_lock(self.file)
            if found is None:  # released meanwhile
                continue
            judged, record = found
            state, record = _judge(record)
            if state in ("live", "mine"):
                if record["host"] != socket.gethostname():
                    raise ScaleLongError(
                        f"{self.folder} is locked by {holder(record)}, another host this one cannot check; "
                        f"if no process there writes it any more, delete {self.file}"
                    )
                raise ScaleLongError(
                    f"{self.folder} is being {self.verb} by {holder(record)}; only one process may write a "
                    f"run: wait for it to end or stop it, or {self.advice}"
                )
            if state == "unreadable":
                try:
                    age = time.time() - self.file.stat().st_mtime
                except FileNotFoundError:
                    continue
                if age < STALE_UNREADABLE_S:  # being written this instant
                    time.sleep(0.05)
                    continue
            if self._take_over(judged):
                gone = holder(record) if record else "an unreadable lock"
                warn(
                    f"warning: {self.folder} was locked by {gone}, which no longer runs; taking the lock over"
                )
        raise ScaleLongError(f"cannot lock {self.folder}: {self.file} keeps changing; try again")

    def _take_over(self, judged: bytes) -> bool:
        """Remove the stale lock whose bytes are ``judged``, unless another process replaced it
        meanwhile: the lock is renamed away first (atomic) and compared; a fresh lock moved by
        mistake is put back."""
        moved = self.file.with_name(f"{LOCK_NAME}.stale-{os.getpid()}")
        try:
            os.replace(self.file, moved)
        except FileNotFoundError:
            return False
        try:
            if moved.read_bytes() != judged:
                with contextlib.suppress(FileExistsError):
                    os.link(moved, self.file)  # another process's fresh lock: put it back
                return False
            return True
        finally:
            moved.unlink(missing_ok=True)

    def release(self) -> None:
        """Remove ``.lock`` if this process holds it (never another process's)."""
        if not self.held:
            return
        self.held = False
        if lock_state(self.file)[0] == "mine":
            self.file.unlink(missing_ok=True)

    @contextlib.contextmanager
    def holding(self, warn: Warn = warn_user) -> Iterator[FolderLock]:
        """Hold the lock for the ``with`` block: the folder is created when missing (and removed
        again if it is still empty at the end), the lock is released on every way out."""
        created = make_folder(self.folder, self.advice)
        try:
            self.acquire(warn)
            try:
                yield self
            finally:
                self.release()
        finally:
            for folder in created:  # deepest first; only empty folders made here
                with contextlib.suppress(OSError):
                    folder.rmdir()
