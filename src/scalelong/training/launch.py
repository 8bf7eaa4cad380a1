"""Where a run executes: the device, the Accelerate processes, signals, a pool of runs.

``scalelong train --num-processes N`` starts N processes of this machine with
:func:`launch_processes`; ``accelerate launch -m scalelong.cli train ...`` does the same across
nodes. Each process then builds its :func:`make_accelerator` from the config. The processes of a
run end together: with their launcher, killed or not, and all of them when one dies, which the
launcher then reports in one line, the run's summary and the log ``workers.log``.

Studies (``scalelong compare``, ``scalelong sweep``) run many independent runs: one after
another, or ``--jobs J`` at a time with :func:`pool_map`, whose workers divide the machine's
cores among them (:func:`share_cores`) so that J runs never ask for more threads than there are
cores. Torch processes that each take every core slow each other down many times over. On a
machine with GPUs, :func:`place_runs` gives each worker its own GPU (or a group of G, for runs
that span G GPUs through Accelerate's processes) through ``CUDA_VISIBLE_DEVICES``, set in the
spawned worker before anything in it touches CUDA.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import torch

from scalelong.errors import ScaleLongError
from scalelong.runlog.lock import read_lock
from scalelong.training.config import Config


def resolve_device(name: str = "auto", option: str = "--device ") -> torch.device:
    """``auto`` -> CUDA when available, else the CPU; ``cuda`` without a GPU is a user error that
    names the ``option`` it came from (``--device `` or ``train.device=``)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ScaleLongError(f"{option}cuda but no CUDA device is available; use {option}auto")
    return torch.device(name)


def make_accelerator(cfg: Config):
    """The Accelerator for train.device and train.mixed_precision (processes come from the environment).

    fp16 on the CPU, and bf16 on a CPU without bf16 units, get an fp32 Accelerator: the trainer computes
    CUDA's autocast itself (:func:`gpu_autocast_dtype`) and, in fp16, scales the loss with its own
    ``torch.amp.GradScaler("cpu")``."""
    from accelerate import Accelerator  # imported when a run starts: it takes seconds

    end_with_launcher()  # a launched process ends with its launcher (where the kernel does not see to it)

    t = cfg.train
    device = resolve_device(t.device, "train.device=")
    cpu = device.type == "cpu"
    precision = resolve_precision(str(t.mixed_precision), device)
    emulated = gpu_autocast_dtype(precision, device)
    if emulated is not None:
        if t.compile:
            # Inductor keeps a fused kernel's intermediates in fp32 (unless
            # torch._inductor.config.emulate_precision_casts): compiled, the forward would not round to
            # fp16, nor overflow, where the eager one and a GPU do (a toy Linear-GELU-Linear fed past
            # 65,504: 1 non-finite output compiled, 64 eager).
            where = "the CPU" if emulated == torch.float16 else "a CPU without bf16 units"
            raise ScaleLongError(
                f"train.compile=true with train.mixed_precision={precision} on {where}: the compiled "
                f"forward would not round to {precision} where a GPU does; use train.compile=false"
            )
        return Accelerator(cpu=True, mixed_precision="no")
    return Accelerator(cpu=cpu, mixed_precision=precision)


@functools.cache
def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX), as oneDNN reports it."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch built without oneDNN
        return False


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """A ``mixed_precision`` setting as it runs on ``device``: ``auto`` is ``bf16`` where the hardware
    computes it (a GPU with bf16, a CPU with bf16 units: :func:`cpu_has_bf16`) and ``no`` (fp32)
    elsewhere, for speed alone; ``no``, ``bf16`` and ``fp16`` run as asked on every device."""
    if precision != "auto":
        return precision
    kind = torch.device(device).type
    native = cpu_has_bf16() if kind == "cpu" else kind == "cuda" and torch.cuda.is_bf16_supported()
    return "bf16" if native else "no"


def gpu_autocast_dtype(precision: str, device: torch.device | str) -> torch.dtype | None:
    """The dtype whose CUDA autocast the product computes itself on ``device``
    (:class:`scalelong.fp16.gpu_autocast`, fp32 products of low-precision values) for ``precision``
    (``no`` | ``bf16`` | ``fp16``): fp16 on any CPU (torch's CPU policy differs from CUDA's, and its
    fp16 kernels are slow), bf16 on a CPU without bf16 units (torch's bf16 kernels there run about
    ten times slower than fp32). None where torch's autocast runs: a GPU, fp32, bf16 on a CPU with
    bf16 units (:func:`cpu_has_bf16`)."""
    if torch.device(device).type != "cpu":
        return None
    if precision == "fp16":
        return torch.float16
    if precision == "bf16" and not cpu_has_bf16():
        return torch.bfloat16
    return None


def on_main_process(accelerator, fn: Callable[[], object]) -> object:
    """Run ``fn`` on the main process and hand its result (or its ScaleLongError) to all."""
    from accelerate.utils import broadcast_object_list

    box: list = [None, None]
    if accelerator.is_main_process:
        try:
            box = [fn(), None]
        except ScaleLongError as e:
            box = [None, str(e)]
    if accelerator.num_processes > 1:
        broadcast_object_list(box)
    if box[1] is not None:
        raise ScaleLongError(box[1])
    return box[0]


# Set in a pool worker once Ctrl-C or SIGTERM has reached it: the worker then starts no further
# item. The executor hands each worker its next item ahead of time, so cancelling the futures
# alone would let a queued run start after the interrupt, and the parent wait on it.
_stop_requested = threading.Event()


class PoolStopped(ScaleLongError):
    """An item that a pool worker did not start, because the pool was interrupted."""


# In a pool worker: the pool's flags, one per item, that a worker sets as it starts the item. They
# live in memory shared with the parent, so a flag set survives its worker's death, SIGKILL included.
_started = None

# An item that ran when its pool broke: its own worker died, or the executor stopped it as another
# worker died (it then terminates the pool's remaining workers).
WORKER_DIED = "its worker process died (killed by a signal, or out of memory?)"


def _start_unless_stopped(i: int, fn: Callable, *args):
    if _stop_requested.is_set():
        raise PoolStopped("not started: the pool was interrupted")
    _started[i] = 1
    return fn(*args)


def _interrupt(signum, frame):
    _stop_requested.set()
    raise KeyboardInterrupt


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C, so both end a run the same clean way. Once one has arrived, more
    are ignored until the block ends, so a second one cannot cut short the winding down."""

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _stop_requested.set()
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _signals_deferred(signums: Sequence[int] = (signal.SIGTERM, signal.SIGINT)) -> Iterator[None]:
    """Hold ``signums`` back while the block runs, then raise each that arrived again, for whatever
    handles it after the block (a KeyboardInterrupt, the process's end): an interrupt comes late,
    never lost. Blocking them (``pthread_sigmask``) would not do: the kernel hands a process's
    signal to any thread that does not block it, and Python runs the handler in the main thread."""
    arrived: list[int] = []
    try:
        previous = {s: signal.signal(s, lambda signum, frame: arrived.append(signum)) for s in signums}
    except ValueError:  # not the main thread, whose waits a signal never interrupts: nothing to hold
        yield
        return
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(arrived):  # each one once, in the order they came
            signal.raise_signal(s)


# ----------------------------------------------------------------------------- the processes of one run

# What each launched process runs after the interpreter (tests put a wrapper script here).
WORKER_PROGRAM: list[str] = ["-m", "scalelong.cli"]
# Set in each launched process: the launcher's pid, for the watcher of a system without PR_SET_PDEATHSIG.
LAUNCHER_PID = "SCALELONG_LAUNCHER_PID"
WORKERS_LOG = "workers.log"  # in the run directory: the processes' output, once one of them died
STOP_GRACE_S = 60.0  # how long a stopped process may take to end its run cleanly before SIGKILL
USER_ERROR_WAIT_S = 5.0  # how long rank 0 may take to end on a user error another rank ended on
_POLL_S = 0.1
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Signals that stop a process from outside (a user, a scheduler, the out-of-memory killer): a run
# one of them ends is "interrupted"; a process that crashed (SIGSEGV, SIGABRT, ...) "failed" it.
_STOP_SIGNALS = {
    getattr(signal, s) for s in ("SIGTERM", "SIGINT", "SIGKILL", "SIGHUP", "SIGQUIT") if hasattr(signal, s)
}
# Where a traceback starts: the rest of that process's stderr goes to the log, not to the console.
_TRACEBACK = (b"Traceback (most recent call last):", b"Fatal Python error:")


def launch_processes(
    n: int, cli_args: list[str], ignore_signals: Sequence[int] = (), run_dir: str | Path | None = None
) -> int:
    """Run ``python -m scalelong.cli <cli_args>`` as ``n`` processes of one machine (what
    ``torchrun --nproc-per-node n`` does); Accelerate picks them up from the environment. Returns
    the exit code: 0; 2 when they ended on a user error (which rank 0 printed, in one line); 1 when
    a process died. Multi-node runs use ``accelerate launch`` directly.

    * The processes die with this one, SIGKILL included: each then gets SIGTERM (Linux:
      ``PR_SET_PDEATHSIG``; elsewhere a thread of its own, :func:`end_with_launcher`) and ends its
      run the way SIGTERM does (last complete checkpoint kept, summary "interrupted").
    * This process interrupted (Ctrl-C, SIGTERM): each process gets SIGTERM and
      :data:`STOP_GRACE_S` to end its run cleanly before it is killed.
    * A process that dies (a signal, an exception, out of memory) stops the others the same way;
      then the run's summary.json says which and how (unless rank 0 wrote it about its own
      failure), ``workers.log`` in the run directory holds every process's output, and one line on
      stderr says all that and the command to resume.

    Rank 0's stdout is this process's; its stderr is passed on up to a traceback; the other ranks'
    output goes only to the log; ``run_dir`` is the directory of the run they train (None: no
    summary or log is written for them). ``ignore_signals``: signals the processes ignore (a
    scheduler's warning signal, which only the process that launched them acts on). Call it from a thread that
    outlives the processes (the main thread): Linux ties ``PR_SET_PDEATHSIG`` to the thread that
    started them.
    """
    from scalelong.training.runs import RunDir

    with _Launch(n, None if run_dir is None else RunDir(run_dir)) as launch:
        try:
            with sigterm_as_interrupt():
                launch.start(cli_args, ignore_signals)
                failure = launch.watch()
        finally:
            launch.stop()  # interrupted, or a process died: the others end their run cleanly
        return launch.report(failure)


def end_with_launcher() -> None:
    """In a process :func:`launch_processes` started, on a system without ``PR_SET_PDEATHSIG``: a
    thread sends this process SIGTERM once the launcher is gone (:func:`_end_with_parent`), so that
    it ends its run the way SIGTERM does instead of training on for nobody. Does nothing on Linux,
    where the kernel sends that SIGTERM, nor in a process that no launcher started."""
    launcher = os.environ.get(LAUNCHER_PID)
    if launcher is None or _prctl() is not None or _watching_launcher.is_set():
        return
    _watching_launcher.set()
    threading.Thread(target=_end_with_parent, args=(int(launcher),), daemon=True).start()


_watching_launcher = threading.Event()


@functools.cache
def _prctl():
    """libc's ``prctl`` where it sets ``PR_SET_PDEATHSIG`` (Linux), else None; loaded here, in the
    launcher, so that the forked child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def _in_child(launcher: int, ignore: tuple[int, ...], prctl) -> None:
    """Run in each launched process between fork and exec; what it sets survives exec."""
    for signum in ignore:
        signal.signal(signum, signal.SIG_IGN)
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)  # when the launcher dies, SIGKILL too
        if os.getppid() != launcher:  # it died before prctl took effect: no signal would come
            os._exit(1)


def _command() -> str:
    """This process's command as a user types it: ``scalelong ...`` for the entry point and for
    ``python -m scalelong.cli`` alike."""
    if not sys.argv or not sys.argv[0]:
        return "scalelong"
    first = Path(sys.argv[0])
    inside = first.name == "scalelong" or first.resolve().is_relative_to(Path(__file__).resolve().parents[1])
    return shlex.join(["scalelong" if inside else first.name, *sys.argv[1:]])


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


@dataclass(frozen=True)
class _Ended:
    """A launched process that ended with a non-zero exit code (negative: the signal that killed it)."""

    rank: int
    code: int

    @property
    def how(self) -> str:
        """``was killed by SIGKILL``, ``exited with code 1``."""
        if self.code >= 0:
            return f"exited with code {self.code}"
        try:
            return f"was killed by {signal.Signals(-self.code).name}"
        except ValueError:
            return f"was killed by signal {-self.code}"

    @property
    def status(self) -> str:
        """The run's summary status once this process ended it."""
        return "interrupted" if -self.code in _STOP_SIGNALS else "failed"

    @property
    def user_error(self) -> bool:
        """Rank 0 ended on a user error (or was interrupted itself), having printed the one line."""
        return self.rank == 0 and self.code == 2

    def cause(self) -> tuple[bool, int]:
        """Sort key of the processes that ended together: one a signal killed first (the others died
        of its absence: a collective's "Connection reset by peer"), then by rank."""
        return self.code >= 0, self.rank


class _Output:
    """What one launched process writes, in an anonymous file (nothing is left behind, whoever dies
    first); read with ``pread``, which never moves the offset the process writes at."""

    def __init__(self):
        self.file = tempfile.TemporaryFile()
        self.read_to = 0
        self.rest = b""  # the start of a line not yet passed on
        self.withheld = False  # a traceback began: from there on, the log only

    def _read(self, start: int) -> bytes:
        chunks = []
        while chunk := os.pread(self.file.fileno(), 1 << 20, start):
            chunks.append(chunk)
            start += len(chunk)
        return b"".join(chunks)

    def echo(self, final: bool = False) -> None:
        """Pass on to stderr what the process wrote since the last call, line by line (a carriage
        return ends one too, so that a progress bar moves), up to the first traceback."""
        new = self._read(self.read_to)
        self.read_to += len(new)
        data = self.rest + new
        cut = len(data) if final else max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        self.rest = data[cut:]
        for segment in re.split(rb"(?<=[\r\n])", data[:cut]):
            self.withheld = self.withheld or any(mark in segment for mark in _TRACEBACK)
            if segment and not self.withheld:
                sys.stderr.write(segment.decode(errors="replace"))
        sys.stderr.flush()

    def text(self) -> str:
        """All that the process wrote, for the log: each line as last drawn (a progress bar's)."""
        lines = self._read(0).decode(errors="replace").split("\n")
        return "\n".join(next((s for s in reversed(line.split("\r")) if s), "") for line in lines)


class _Launch:
    """The ``n`` processes of one run (:func:`launch_processes`): started, watched, stopped, and
    what is left to say once one of them died."""

    def __init__(self, n: int, run):
        self.n, self.run = n, run  # run: its RunDir, or None when unknown
        self.procs: list[subprocess.Popen] = []
        self.outputs: list[_Output] = []
        self.summary_before = _mtime(run.summary_file) if run is not None else None
        self.ran_it = False  # rank 0 took the run's lock: the run is this launch's to write

    def __enter__(self) -> _Launch:
        return self

    def __exit__(self, *exc) -> None:
        for output in self.outputs:
            output.file.close()

    def start(self, cli_args: Sequence[str], ignore_signals: Sequence[int]) -> None:
        with socket.socket() as s:  # a free port for the process group's rendezvous
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        # Each process's share of the cores (as torchrun does), unless the caller set it: n processes
        # of the machine's thread count each would oversubscribe the CPU many times over.
        threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, cpu_cores() // self.n))
        prctl, ignore = _prctl(), tuple(ignore_signals)
        setup = functools.partial(_in_child, os.getpid(), ignore, prctl) if prctl or ignore else None
        for rank in range(self.n):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(self.n))
            env.update(RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(self.n))
            env.update(OMP_NUM_THREADS=threads, **{LAUNCHER_PID: str(os.getpid())})
            self.outputs.append(_Output())
            out = self.outputs[-1].file
            command = [sys.executable, *WORKER_PROGRAM, *cli_args]
            self.procs.append(
                subprocess.Popen(
                    command, env=env, stdout=None if rank == 0 else out, stderr=out, preexec_fn=setup
                )
            )

    def watch(self) -> _Ended | None:
        """Wait for the processes to end, passing rank 0's stderr on. Returns the process that ended
        the run: one that died, or rank 0 on a user error (None: all ended well). The others may
        still run."""
        since = None  # when a rank other than 0 ended on a user error
        while True:
            codes = [p.poll() for p in self.procs]
            self._note_lock()
            ended = sorted(
                (_Ended(r, c) for r, c in enumerate(codes) if c not in (None, 0)), key=_Ended.cause
            )
            if ended and ended[0].code == 2 and codes[0] is None:
                # a user error: every rank raises it and rank 0 prints it, once it ends too
                since = since or time.monotonic()
                if time.monotonic() - since > USER_ERROR_WAIT_S:
                    return ended[0]
            elif ended:
                if ended[0].user_error:
                    self.outputs[0].echo(final=True)
                return ended[0]
            elif all(c is not None for c in codes):
                self.outputs[0].echo(final=True)
                return None
            self.outputs[0].echo()
            time.sleep(_POLL_S)

    def _note_lock(self) -> None:
        """Whether rank 0 holds the run's lock (its pid is in it); once it did, the run is this
        launch's to write."""
        if self.ran_it or self.run is None:
            return
        found = read_lock(self.run.lock_file)
        record = found[1] if found else None
        self.ran_it = (
            record is not None
            and record["pid"] == self.procs[0].pid
            and record["host"] == socket.gethostname()
        )

    def stop(self) -> None:
        """SIGTERM to each process still running (it ends its run the clean way, see train.train),
        SIGKILL to any still running :data:`STOP_GRACE_S` later. Ctrl-C and SIGTERM that arrive
        meanwhile take effect once it is done (:func:`_signals_deferred`): cutting the wait short
        would skip the SIGKILL, and a process could outlive its launcher."""
        with _signals_deferred():
            for p in self.procs:
                if p.poll() is None:
                    p.terminate()
            deadline = time.monotonic() + STOP_GRACE_S
            for p in self.procs:
                try:
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    def report(self, failure: _Ended | None) -> int:
        """The exit code; for a process that died, the log, the summary and the one line first."""
        if failure is None:
            return 0
        if failure.user_error:
            return 2
        self._note_lock()  # a lock that rank 0, killed, left behind
        self.ran_it = self.ran_it or self._summary_written()
        log, began = self._record(failure)
        print(self._line(failure, log, began), file=sys.stderr, flush=True)
        return 1

    def _record(self, failure: _Ended) -> tuple[Path, bool]:
        """Write the log and the summary into the run, holding its lock, and say where the log is and
        whether the run began. The log goes to a temporary file instead when the run is not this
        launch's to write: rank 0 never took its lock, or died before it wrote the run's config (a
        folder without one holds no run, and the next start would refuse it)."""
        text = self._log(failure)
        if self.ran_it:
            try:
                with self.run.writing(warn=lambda message: None):  # takes over a lock rank 0 left
                    if self.run.config_file.is_file():
                        log = self.run.path / WORKERS_LOG
                        log.write_text(text)
                        self._summarize(failure, log)
                        return log, True
            except (ScaleLongError, OSError):  # another process took the run meanwhile
                pass
        fd, name = tempfile.mkstemp(prefix="scalelong-workers-", suffix=".log")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return Path(name), False

    def _summary_written(self) -> bool:
        """Whether a process wrote the run's summary.json during this launch."""
        return self.run is not None and _mtime(self.run.summary_file) not in (None, self.summary_before)

    def _log(self, failure: _Ended) -> str:
        parts = [f"scalelong train on {self.n} processes: rank {failure.rank} {failure.how}\n"]
        for rank, output in enumerate(self.outputs):
            parts.append(
                f"\n----- rank {rank} ({'stderr' if rank == 0 else 'stdout and stderr'})\n{output.text()}"
            )
        return "".join(parts)

    def _summarize(self, failure: _Ended, log: Path) -> None:
        """summary.json with the run's status and what ended it; rank 0's own summary when rank 0
        ended it with an exception (the launcher adds nothing to its error)."""
        run = self.run
        written = self._summary_written()
        summary = (run.summary or {}) if written else {}
        if written and failure.rank == 0 and failure.code > 0:
            return
        error = f"rank {failure.rank} of {self.n} processes {failure.how}; the others were stopped ({log})"
        summary.update(status=failure.status, error=error)
        if not written:
            checkpoints = run.checkpoints()
            summary["steps"] = int(checkpoints[-1].name.removeprefix("step-")) if checkpoints else 0
        run.write_summary(summary)

    def _line(self, failure: _Ended, log: Path, began: bool) -> str:
        """The one line: which process died and how, where the run stands, how to resume."""
        checkpoints = self.run.checkpoints() if began else []
        if not began:
            where = "the run had not begun"
        elif checkpoints:
            where = f"{self.run} holds its last complete checkpoint ({checkpoints[-1].name})"
        else:
            where = f"{self.run} has no checkpoint yet"
        return (
            f"error: rank {failure.rank} of {self.n} processes {failure.how}, so the others were stopped; "
            f"{where}; the processes' output is in {log}; re-run the same command to "
            f"{'resume' if began else 'start'} it: {_command()}"
        )


# ----------------------------------------------------------------------------- a pool of runs


def cpu_cores() -> int:
    """The cores this process may run on: its affinity mask where the system has one."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def share_cores(jobs: int, cores: int | None = None) -> tuple[int, int]:
    """(workers, torch threads per worker) for ``jobs`` runs at a time on ``cores`` cores.

    Each worker gets ``max(1, cores // jobs)`` threads, so all of them together stay within the
    machine. More jobs than cores run one thread each and time-share the cores, which is said in one
    line: single-threaded runs share a core without the waits that oversubscribed thread pools
    cost, so 3 runs on 2 cores finish sooner than 2 and then 1 (``benchmarks/sweep_pool.py``);
    beyond twice the cores they are clamped, with a warning (memory, not speed, is then the limit).
    """
    if jobs < 1:
        raise ScaleLongError(f"--jobs must be >= 1, got {jobs}")
    cores = cores or cpu_cores()
    if jobs > 2 * cores:
        print(
            f"warning: --jobs {jobs} exceeds twice the {cores} cores here; running {2 * cores} at a time",
            file=sys.stderr,
        )
        jobs = 2 * cores
    if jobs > cores:
        print(f"--jobs {jobs} on {cores} cores: one thread each, the runs share the cores", file=sys.stderr)
    return jobs, max(1, cores // jobs)


def visible_gpus() -> list[str]:
    """The GPUs this process may use, each named as ``CUDA_VISIBLE_DEVICES`` names it to a child
    process (an index, or the UUID where the variable lists UUIDs); [] without CUDA. The one place
    the pool learns the machine's GPUs (tests fake it here)."""
    if not torch.cuda.is_available():  # counts the devices; creates no CUDA context
        return []
    count = torch.cuda.device_count()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [d.strip() for d in listed.split(",")] if listed else [str(i) for i in range(count)]
    return names[:count]


@dataclass(frozen=True)
class Placement:
    """Where a study's runs train on this machine: ``workers`` at a time, each with ``threads``
    torch threads and, on a machine with GPUs, its own ``CUDA_VISIBLE_DEVICES`` (``gpus``, one
    entry per worker: ``"3"``, or ``"0,1"`` for a run on two GPUs through Accelerate's processes)."""

    workers: int
    threads: int
    gpus: tuple[str, ...] = ()
    gpus_per_run: int = 1

    def __str__(self) -> str:
        """The plan line: ``4 workers, one GPU each: 0, 1, 2, 3``."""
        g = self.gpus_per_run
        if not self.gpus:
            if self.workers == 1:
                return "one run at a time in this process, on the CPU"
            return f"{self.workers} workers on the CPU, {self.threads} torch thread(s) each"
        if self.workers == 1:
            where = f"GPU {self.gpus[0]}" if g == 1 else f"GPUs {self.gpus[0]} ({g} processes, Accelerate)"
            return f"one run at a time{' in this process' if g == 1 else ''}, on {where}"
        each = "one GPU each" if g == 1 else f"{g} GPUs each (one process per GPU, through Accelerate)"
        return f"{self.workers} workers, {each}: {(' | ' if g > 1 else ', ').join(self.gpus)}"

    def for_runs(self, runs: int) -> Placement:
        """This placement for ``runs`` runs: no idle worker (nor GPUs held by one), and the cores
        divided among the workers that are left (one worker keeps this process's threads)."""
        workers = min(self.workers, runs)
        threads = max(1, cpu_cores() // workers) if workers > 1 else torch.get_num_threads()
        return Placement(workers, threads, self.gpus[:workers], self.gpus_per_run)


def place_runs(jobs: int, gpus_per_run: int = 1, device: str = "auto", runs: int | None = None) -> Placement:
    """Where ``runs`` runs (None: any number) of ``train.device`` ``device`` train, ``jobs`` at a time.

    On the CPU (``device`` cpu, or no GPU visible): the cores are divided (:func:`share_cores`).
    With GPUs (:func:`visible_gpus`): worker k gets GPUs k*G .. k*G + G - 1 of the visible ones,
    G = ``gpus_per_run``, and the cores are divided among the workers as on the CPU. Asking for
    more GPUs than are visible, or for GPUs where there are none, is one error line.
    """
    if jobs < 1:
        raise ScaleLongError(f"--jobs must be >= 1, got {jobs}")
    if gpus_per_run < 1:
        raise ScaleLongError(f"--gpus-per-run must be >= 1, got {gpus_per_run}")
    gpus = visible_gpus() if device != "cpu" else []
    if not gpus:
        if device == "cuda":
            raise ScaleLongError("train.device=cuda but no GPU is visible here; use train.device=auto or cpu")
        if gpus_per_run > 1:
            raise ScaleLongError(
                f"--gpus-per-run {gpus_per_run}: no GPU is visible here (train.device={device}); "
                "on the CPU --jobs divides the cores instead"
            )
        place = Placement(share_cores(jobs)[0], 0)
        return place.for_runs(runs or place.workers)
    need = jobs * gpus_per_run
    if need > len(gpus):
        asked = f"--jobs {jobs}" + (f" x --gpus-per-run {gpus_per_run}" if gpus_per_run > 1 else "")
        raise ScaleLongError(
            f"{asked} asks for {need} GPUs; {len(gpus)} are visible here ({', '.join(gpus)}): "
            f"lower --jobs to {len(gpus) // gpus_per_run or 1}"
            + (" or --gpus-per-run" if gpus_per_run > 1 else "")
        )
    groups = tuple(",".join(gpus[k * gpus_per_run : (k + 1) * gpus_per_run]) for k in range(jobs))
    return Placement(jobs, 0, groups, gpus_per_run).for_runs(runs or jobs)


def _init_worker(threads: int, devices=None, started=None) -> None:
    global _started
    _started = started
    if devices is not None:  # this worker's GPUs, before anything in it initialises CUDA
        os.environ["CUDA_VISIBLE_DEVICES"] = devices.get(timeout=60)
    # Before any torch work of the worker: intra-op and inter-op pools both sized to its share.
    torch.set_num_threads(threads)
    signal.signal(signal.SIGINT, _interrupt)  # Ctrl-C reaches the workers too: no next item after it
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:  # settable only before the first parallel work; a fresh worker has done none
        pass
    threading.Thread(target=_end_with_parent, args=(os.getppid(),), daemon=True).start()


def _end_with_parent(parent: int, every: float = 1.0) -> None:
    """A pool worker (or, without PR_SET_PDEATHSIG, a process :func:`launch_processes` started)
    never learns that its parent died (SIGKILL, a crash): it would idle, or train on for nobody, for
    good. When the parent is gone this worker sends itself SIGTERM, which ends a run in flight
    cleanly (:func:`sigterm_as_interrupt`, which ignores the repeats while the run winds down) and
    then, back between runs, the worker itself."""
    while os.getppid() == parent:
        time.sleep(every)
    while True:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(every)


def pool_map(
    fn: Callable,
    args: Sequence[tuple],
    jobs: int = 1,
    threads: int | None = None,
    gpus: Sequence[str] = (),
) -> Iterator[tuple[int, object]]:
    """``(i, fn(*args[i]))`` for every i, in the order they finish.

    ``jobs`` 1: one after another in this process, its thread settings untouched. ``jobs`` > 1:
    that many spawned worker processes (at most one per item), each with ``threads`` torch threads.
    Without ``threads`` this divides the cores itself (:func:`share_cores`: at most twice the cores,
    each worker its share); with them, or with ``gpus``, the caller has placed the workers
    (:func:`place_runs`). ``fn`` and ``args`` must then pickle. ``gpus``: one
    ``CUDA_VISIBLE_DEVICES`` value per worker (:class:`Placement`), set in each worker before it
    runs anything, so worker k sees only its own GPUs as ``cuda:0`` (, ``cuda:1``, ...).

    An exception ends only its own item: it is yielded in place of the result and the other items
    go on. A worker process that dies (the out-of-memory killer's SIGKILL, a crash) breaks the pool,
    which then stops its other workers too: the items they had started, its own included, are
    yielded as a ScaleLongError (:data:`WORKER_DIED`), and those not started yet run in a fresh pool
    (and so on, as long as each pool gets an item done). Ctrl-C, SIGTERM (to this process alone,
    as a job scheduler sends it) or the caller's own exception ends them all: items not started are
    cancelled and every worker gets SIGTERM, so a run in flight ends the way an interrupted run does
    (its last complete checkpoint kept), and no worker outlives the pool.
    """
    if gpus or threads:  # placed by the caller (place_runs): its workers, as many as there are items
        workers = min(jobs, len(args), *([len(gpus)] if gpus else []))
    else:
        workers = min(share_cores(jobs)[0] if jobs > 1 else 1, len(args))
    if workers <= 1:
        for i, a in enumerate(args):
            try:
                yield i, fn(*a)
            except Exception as e:  # one item's failure is its result
                yield i, e
        return
    context = get_context("spawn")  # no fork of a process that already runs torch threads
    threads = threads or max(1, cpu_cores() // workers)
    started = context.RawArray("b", len(args))  # flags that the workers set (_start_unless_stopped)
    todo = list(range(len(args)))
    pool = _fresh_pool(context, workers, threads, gpus, started)
    try:
        with sigterm_as_interrupt():
            while True:
                again, broken = yield from _pool_round(pool, fn, args, todo, started)
                pool.shutdown(wait=True)  # a broken pool's workers gone before a fresh one takes their GPUs
                if not again:
                    return
                if len(again) == len(todo):  # no item done: workers that cannot even start, say
                    for i in again:
                        yield i, broken
                    return
                todo = again
                pool = _fresh_pool(context, min(workers, len(todo)), threads, gpus, started)
    except BaseException:  # interrupted, or the caller stopped early (GeneratorExit included)
        workers = list((pool._processes or {}).values())  # the executor's own record (None once shut down)
        pool.shutdown(wait=False, cancel_futures=True)
        for worker in workers:
            if worker.is_alive():
                worker.terminate()  # SIGTERM: each training run ends cleanly (see train.train)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _pool_round(
    pool: ProcessPoolExecutor, fn: Callable, args: Sequence[tuple], todo: list[int], started
) -> Generator[tuple[int, object], None, tuple[list[int], BrokenProcessPool | None]]:
    """:func:`pool_map`'s items ``todo`` on ``pool``: yields ``(i, result)`` as they finish, then
    returns the items to run again (not started when the pool broke) and the pool's breakage."""
    futures: dict = {}
    broken = None
    try:
        for i in todo:
            futures[pool.submit(_start_unless_stopped, i, fn, *args[i])] = i
    except BrokenProcessPool as e:  # a worker died already: the rest wait for the next pool
        broken = e
    again = todo[len(futures) :]
    for future in as_completed(futures):
        i = futures[future]
        try:
            result = future.result()
        except BrokenProcessPool as e:
            broken = e
            if not started[i]:
                again.append(i)
                continue
            result = ScaleLongError(WORKER_DIED)
        except Exception as e:
            result = e
        yield i, result
    return sorted(again), broken


def _fresh_pool(context, workers: int, threads: int, gpus: Sequence[str], started) -> ProcessPoolExecutor:
    """A pool of ``workers`` spawned workers for :func:`pool_map`, each given its entry of ``gpus``."""
    devices = None
    if gpus:  # each worker takes one entry as it starts; the executor starts exactly `workers`
        devices = context.Queue()
        for entry in gpus[:workers]:
            devices.put(entry)
    return ProcessPoolExecutor(
        workers, mp_context=context, initializer=_init_worker, initargs=(threads, devices, started)
    )
