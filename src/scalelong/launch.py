"""Where a run executes: the device, the Accelerate processes, signals, a pool of runs.

``scalelong train --num-processes N`` starts N processes of this machine with
:func:`launch_processes`; ``accelerate launch -m scalelong.cli train ...`` does the same across
nodes. Each process then builds its :func:`make_accelerator` from the config.

Studies (``scalelong compare``, ``scalelong sweep``) run many independent runs: one after
another, or ``--jobs J`` at a time with :func:`pool_map`, whose workers divide the machine's
cores among them (:func:`share_cores`) so that J runs never ask for more threads than there are
cores. Torch processes that each take every core slow each other down many times over.
"""

from __future__ import annotations

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
    cpu = resolve_device(t.device, "train.device=").type == "cpu"
    if cpu and t.mixed_precision == "fp16":
        raise ScaleLongError("train.mixed_precision=fp16 needs a GPU; on the CPU use bf16 or no")
    precision = t.mixed_precision
    if cpu and precision == "bf16" and not cpu_has_bf16():
        print("warning: train.mixed_precision=bf16: this CPU has no bf16 instructions, where bf16 runs "
              "several times slower than fp32; training in fp32")  # fmt: skip
        precision = "no"
    return Accelerator(cpu=cpu, mixed_precision=precision)


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX), as oneDNN reports it."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch built without oneDNN
        return False


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


def launch_processes(n: int, cli_args: list[str]) -> int:
    """Run ``python -m scalelong.cli <cli_args>`` as ``n`` processes of one machine (what
    ``torchrun --nproc-per-node n`` does); Accelerate picks them up from the environment.

    Multi-node runs use ``accelerate launch`` directly. When one process fails, the others are
    stopped; the exit code is the first failure's.
    """
    with socket.socket() as s:  # a free port for the process group's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    # Each process's share of the cores (as torchrun does), unless the caller set it: n processes of
    # the machine's thread count each would oversubscribe the CPU many times over.
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, cpu_cores() // n))
    for rank in range(n):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n))
        env["OMP_NUM_THREADS"] = threads
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(n))
        procs.append(subprocess.Popen([sys.executable, "-m", "scalelong.cli", *cli_args], env=env))
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


def _init_worker(threads: int) -> None:
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
    fn: Callable, args: Sequence[tuple], jobs: int = 1, threads: int | None = None
) -> Iterator[tuple[int, object]]:
    """``(i, fn(*args[i]))`` for every i, in the order they finish.

    ``jobs`` 1: one after another in this process, its thread settings untouched. ``jobs`` > 1:
    that many spawned worker processes (at most one per core and per item), each with ``threads``
    torch threads (default: its share of the cores, :func:`share_cores`); ``fn`` and ``args`` must
    then pickle. An exception ends only its own item: it is yielded in place of the result and
    the other items go on. Ctrl-C, SIGTERM (to this process alone, as a job scheduler sends it) or
    the caller's own exception ends them all: items not started are cancelled and every worker
    gets SIGTERM, so a run in flight ends the way an interrupted run does (its last complete
    checkpoint kept), and no worker outlives the pool.
    """
    workers = min(share_cores(jobs)[0] if jobs > 1 else 1, len(args))
    if workers <= 1:
        for i, a in enumerate(args):
            try:
                yield i, fn(*a)
            except Exception as e:  # one item's failure is its result
                yield i, e
        return
    pool = ProcessPoolExecutor(
        workers,
        mp_context=get_context("spawn"),  # no fork of a process that already runs torch threads
        initializer=_init_worker,
        initargs=(threads or max(1, cpu_cores() // workers),),
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
