"""What made a run: the code, the libraries, the precision it really ran in and the machine.

Written into every run's ``summary.json`` (``provenance``) so that a study can say per run which
commit, torch and device produced it, and refuse to mix runs silently. The precision is the one the
run computed in, and ``autocast`` says whose policy computed it: torch's own autocast on the device, or
CUDA's computed on the CPU (:func:`scalelong.training.launch.gpu_autocast_dtype`: fp16 on a CPU,
bf16 on a CPU without bf16 units), which a reader of the config alone would not know.
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import subprocess
import sys
from pathlib import Path

import torch

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # scalelong/

# Accelerate's names for the precision a run computes in.
PRECISION_NAMES = {"no": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8"}


@functools.cache
def source_commit() -> str | None:
    """The git commit of the source tree this package runs from, ``+dirty`` when its tracked files
    differ from it; None for an installed wheel (no git tree around the package)."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(_PACKAGE_DIR), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".")
    return commit + ("+dirty" if dirty else "")


@functools.cache
def cpu_name() -> str:
    """The CPU's model name as the kernel reports it (``platform.processor()`` is empty on Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: torch.device | str) -> str:
    """``NVIDIA H200`` for a CUDA device, the CPU's model name otherwise."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def command_line() -> list[str]:
    """The ``scalelong`` command that started this process, as a user would type it, for the entry
    point and ``python -m scalelong.cli`` alike (a pool worker started by spawn reads its parent's
    command); empty when another program did (a user's script, a test runner, a cluster job's
    wrapper), whose command line would not make the run again."""
    if not sys.argv or not sys.argv[0]:
        return []
    first = Path(sys.argv[0])
    if first.name == "scalelong" or first.resolve().is_relative_to(_PACKAGE_DIR):
        return ["scalelong", *sys.argv[1:]]
    return []


def package_version() -> str | None:
    """The installed distribution's version (None when run from a bare source tree)."""
    try:
        return importlib.metadata.version("scalelong")
    except importlib.metadata.PackageNotFoundError:
        return None


def provenance(precision: str, device: torch.device | str, gpu_policy_on_cpu: bool = False) -> dict:
    """The run's provenance: ``precision`` is the mixed-precision setting the run really used (``no``,
    ``bf16``, ``fp16``); ``gpu_policy_on_cpu`` when :class:`scalelong.fp16.gpu_autocast` computed it."""
    name = PRECISION_NAMES.get(precision, precision)
    autocast = None if name == "fp32" else "cuda policy on cpu" if gpu_policy_on_cpu else "torch"
    return {
        "commit": source_commit(),
        "scalelong": package_version(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "precision": name,
        "autocast": autocast,
        "device": torch.device(device).type,
        "device_name": device_name(device),
        "threads": torch.get_num_threads(),
        "host": platform.node(),
        "argv": command_line(),
    }
