"""Where a run executes: the device, the Accelerate processes, signals.

``scalelong train --num-processes N`` starts N processes of this machine with
:func:`launch_processes`; ``accelerate launch -m scalelong.cli train ...`` does the same across
nodes. Each process then builds its :func:`make_accelerator` from the config.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

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
    return Accelerator(cpu=cpu, mixed_precision=t.mixed_precision)


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


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C, so both end a run the same clean way."""

    def handler(signum, frame):
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
    for rank in range(n):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n))
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
