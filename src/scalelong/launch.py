"""Where a run executes: the device, the Accelerate processes, signals, a pool of runs.

``scalelong train --num-processes N`` starts N processes of this machine with
:func:`launch_processes`; ``accelerate launch -m scalelong.cli train ...`` does the same across
nodes. Each process then builds its :func:`make_accelerator` from the config.

Studies (``scalelong compare``, ``scalelong sweep``) run many independent runs: one after
another, or ``--jobs J`` at a time with :func:`pool_map`, whose workers divide the machine's
cores among them (:func:`share_cores`) so that J runs never ask for more threads than there are
cores. Torch processes that each take every core slow each other down many times over. On a
machine with GPUs, :func:`place_runs` gives each worker its own GPU (or a group of G, for runs
that span G GPUs through Accelerate's processes) through ``CUDA_VISIBLE_DEVICES``, set in the
spawned worker before anything in it touches CUDA.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import get_context

import torch

from scalelong.config import Config
from scalelong.errors import ScaleLongError


def resolve_device(name: str = "auto", option: str = "--device ") -> torch.device:
    """``auto`` -> CUDA when available, else the CPU; ``cuda`` without a GPU is a user error that
    names the ``option`` it came from (``--device `` or ``train.device=``)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ScaleLongError(f"{option}cuda but no CUDA device is available; use {option}auto")
    return torch.device(name)


def make_accelerator(cfg: Config):
    """The Accelerator for train.device and train.mixed_precision (processes come from the environment)."""
    from accelerate import Accelerator  # imported when a run starts: it takes seconds

    t = cfg.train
    device = resolve_device(t.device, "train.device=")
    cpu = device.type == "cpu"
    if cpu and t.mixed_precision == "fp16":
        raise ScaleLongError("train.mixed_precision=fp16 needs a GPU; on the CPU use bf16 or no")
    precision = bf16_where_it_pays(str(t.mixed_precision), device, "train.mixed_precision")
    return Accelerator(cpu=cpu, mixed_precision=precision)


@functools.cache
def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX), as oneDNN reports it."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch built without oneDNN
        return False


def bf16_runs_natively(device: torch.device | str) -> bool:
    """Whether bf16 pays on ``device``: a GPU, or a CPU with bf16 instructions. Elsewhere torch
    emulates it, several times slower than fp32 (the demo's training step 11x on an AVX2-only CPU)."""
    return torch.device(device).type != "cpu" or cpu_has_bf16()


def bf16_where_it_pays(precision: str, device: torch.device | str, option: str) -> str:
    """``precision`` (``no`` | ``bf16`` | ``fp16``) as it will run on ``device``: ``bf16`` where it is
    only emulated (:func:`bf16_runs_natively`) becomes ``no`` (fp32), with one warning line."""
    if precision == "bf16" and not bf16_runs_natively(device):
        print(f"warning: {option}=bf16: this CPU has no bf16 instructions, where bf16 runs several times "
              "slower than fp32; using fp32", flush=True)  # fmt: skip
        return "no"
    return precision


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


def _start_unless_stopped(fn: Callable, *args):
    if _stop_requested.is_set():
        raise PoolStopped("not started: the pool was interrupted")
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


def launch_processes(n: int, cli_args: list[str], ignore_signals: Sequence[int] = ()) -> int:
    """Run ``python -m scalelong.cli <cli_args>`` as ``n`` processes of one machine (what
    ``torchrun --nproc-per-node n`` does); Accelerate picks them up from the environment.

    Multi-node runs use ``accelerate launch`` directly. When one process fails, the others are
    stopped; the exit code is the first failure's. When this process is interrupted (Ctrl-C,
    SIGTERM under :func:`sigterm_as_interrupt`), each process gets SIGTERM and a minute to end its
    run cleanly before it is killed. ``ignore_signals``: signals the processes ignore (a
    scheduler's warning signal, which only the process that launched them acts on).
    """
    with socket.socket() as s:  # a free port for the process group's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def ignore() -> None:  # in the child, before it runs Python: SIG_IGN survives exec
        for signum in ignore_signals:
            signal.signal(signum, signal.SIG_IGN)

    procs = []
    # Each process's share of the cores (as torchrun does), unless the caller set it: n processes of
    # the machine's thread count each would oversubscribe the CPU many times over.
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, cpu_cores() // n))
    for rank in range(n):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n))
        env["OMP_NUM_THREADS"] = threads
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(n))
        command = [sys.executable, "-m", "scalelong.cli", *cli_args]
        procs.append(subprocess.Popen(command, env=env, preexec_fn=ignore if ignore_signals else None))
    code = 0
    try:
        while any(p.poll() is None for p in procs):
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if failed:
                code = failed[0]
                for p in procs:
                    if p.poll() is None:
                        p.terminate()
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()  # SIGTERM: each process ends its run the clean way (train.train)
        deadline = time.monotonic() + 60
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return code or max(p.returncode for p in procs)


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


def _init_worker(threads: int, devices=None) -> None:
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
    """A pool worker never learns that its parent died (SIGKILL, a crash): it would idle, or train
    on for nobody, for good. When the parent is gone this worker sends itself SIGTERM, which ends
    a run in flight cleanly (:func:`sigterm_as_interrupt`, which ignores the repeats while the run
    winds down) and then, back between runs, the worker itself."""
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
    go on. Ctrl-C, SIGTERM (to this process alone, as a job scheduler sends it) or the caller's own
    exception ends them all: items not started are cancelled and every worker gets SIGTERM, so a
    run in flight ends the way an interrupted run does (its last complete checkpoint kept), and no
    worker outlives the pool.
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
    devices = None
    if gpus:  # each worker takes one entry as it starts; the executor starts exactly `workers`
        devices = context.Queue()
        for entry in gpus[:workers]:
            devices.put(entry)
    pool = ProcessPoolExecutor(
        workers,
        mp_context=context,
        initializer=_init_worker,
        initargs=(threads or max(1, cpu_cores() // workers), devices),
    )
    try:
        with sigterm_as_interrupt():
            futures = {pool.submit(_start_unless_stopped, fn, *a): i for i, a in enumerate(args)}
            for future in as_completed(futures):
                try:
                    yield futures[future], future.result()
                except Exception as e:  # a worker that died (BrokenProcessPool) included
                    yield futures[future], e
    except BaseException:  # interrupted, or the caller stopped early (GeneratorExit included)
        workers = list((pool._processes or {}).values())  # the executor's own record (None once shut down)
        pool.shutdown(wait=False, cancel_futures=True)
        for worker in workers:
            if worker.is_alive():
                worker.terminate()  # SIGTERM: each training run ends cleanly (see train.train)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
