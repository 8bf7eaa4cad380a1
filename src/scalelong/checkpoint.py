"""Checkpoints: one folder per step, written atomically, verified by checksums on load.

Layout of ``checkpoints/step-000500/``::

    model.safetensors   the trained weights
    ema.safetensors     the EMA weights (what samplers use)
    optimizer.pt        the optimizer's state_dict (torch.save; read back with weights_only=True)
    trainer.pt          lr schedule, grad scaler, RNG states of every process, data position, counters
    meta.json           step, format, the resolved config, size and sha256 of every file above

A checkpoint is written into ``.tmp-step-000500`` and renamed when complete, so a crash never
leaves a half-written folder under the final name; ``meta.json`` is written last and its
checksums let :func:`find_resumable` skip a checkpoint that was damaged afterwards. The run
directory around the checkpoints is :mod:`scalelong.runs`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from scalelong.errors import ScaleLongError

FORMAT = 1
TMP_PREFIX = ".tmp-"
WEIGHTS = ("model.safetensors", "ema.safetensors")
TRAINING_STATE = ("optimizer.pt", "trainer.pt")  # what a resume needs besides the weights


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def _state_for_safetensors(module: nn.Module | dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    state = module.state_dict() if isinstance(module, nn.Module) else module
    return {k: v.detach().cpu().contiguous() for k, v in state.items()}


def nonfinite_tensors(tree: Any, prefix: str = "") -> list[str]:
    """Names of floating tensors in a nested dict / list / tensor that hold NaN or infinity."""
    if isinstance(tree, torch.Tensor):
        return [prefix] if tree.is_floating_point() and not bool(torch.isfinite(tree).all()) else []
    items = (
        tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list | tuple) else []
    )
    return [name for k, v in items for name in nonfinite_tensors(v, f"{prefix}.{k}" if prefix else str(k))]


def _sha256(path: Path, sync: bool = False) -> str:
    """Checksum of the file; ``sync`` also flushes it to disk (the rename must not overtake the data)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
        if sync:
            os.fsync(f.fileno())
    return digest.hexdigest()


def save_checkpoint(
    root: Path,
    step: int,
    model: nn.Module | dict[str, torch.Tensor],
    ema: nn.Module | dict[str, torch.Tensor],
    config: dict,
    optimizer: dict | None = None,
    trainer: dict | None = None,
    keep: int = 0,
) -> Path:
    """Write ``root/step-XXXXXX`` atomically and keep only the newest ``keep`` (0: all).

    Refuses (ScaleLongError) to write a non-finite tensor: a checkpoint is always a state that
    training can continue from.
    """
    weights = {"model": _state_for_safetensors(model), "ema": _state_for_safetensors(ema)}
    bad = nonfinite_tensors({**weights, "optimizer": optimizer or {}})
    if bad:
        raise ScaleLongError(
            f"refusing to write checkpoint step {step}: non-finite values in {', '.join(bad[:3])}"
            + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        )
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = root / f"{TMP_PREFIX}{step_dir_name(step)}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        save_file(weights["model"], tmp / "model.safetensors")
        save_file(weights["ema"], tmp / "ema.safetensors")
        if optimizer is not None:
            torch.save(optimizer, tmp / "optimizer.pt")
        if trainer is not None:
            torch.save(trainer, tmp / "trainer.pt")
        files = {
            p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p, sync=True)}
            for p in sorted(tmp.iterdir())
        }
        meta = {"format": FORMAT, "step": step, "files": files, "config": config}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        if final.exists():  # e.g. re-written after resuming from an older checkpoint
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:  # interrupted or failed: leave no partial folder behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep > 0:
        for old in list_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-"))


def remove_partial(root: Path) -> None:
    """Delete temporary folders left by a save that was killed mid-way."""
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(TMP_PREFIX):
                shutil.rmtree(p, ignore_errors=True)


def checkpoint_problem(path: Path) -> str | None:
    """Why the checkpoint folder cannot be resumed from, or None when every file checks out."""
    try:
        meta = json.loads((path / "meta.json").read_text())
        files = meta["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"meta.json is missing or unreadable ({type(e).__name__})"
    for name in WEIGHTS + TRAINING_STATE:
        if name not in files:
            return f"{name} is not part of it (a weights-only checkpoint)"
    for name, info in files.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != info["bytes"]:
            return f"{name} is truncated ({file.stat().st_size:,} of {info['bytes']:,} bytes)"
        if _sha256(file) != info["sha256"]:
            return f"{name} fails its checksum"
    return None


def find_resumable(root: Path, warn: Callable[[str], None] = print) -> Path | None:
    """The newest checkpoint that passes :func:`checkpoint_problem`; each one skipped is reported
    in one line through ``warn``."""
    for path in reversed(list_checkpoints(root)):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        warn(f"warning: checkpoint {path} is damaged ({problem}); trying the one before")
    return None


def load_training_state(path: Path) -> dict:
    """Everything :func:`save_checkpoint` wrote: model, ema, optimizer, trainer, step (on the CPU)."""
    try:
        return {
            "step": json.loads((path / "meta.json").read_text())["step"],
            "model": load_file(path / "model.safetensors"),
            "ema": load_file(path / "ema.safetensors"),
            "optimizer": torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True),
            "trainer": torch.load(path / "trainer.pt", map_location="cpu", weights_only=True),
        }
    except Exception as e:  # damaged after it was verified, or written by an incompatible version
        raise ScaleLongError(f"cannot load checkpoint {path} ({type(e).__name__}: {e})") from None


def load_weights(path: Path, module: nn.Module) -> None:
    """Load a safetensors file into ``module``; a missing or corrupt file is a user error."""
    if not path.is_file():
        raise ScaleLongError(f"checkpoint file not found: {path}")
    try:
        state = load_file(path)
    except Exception as e:  # safetensors raises several types for a damaged file
        raise ScaleLongError(f"checkpoint file {path} is corrupt or truncated ({e})") from e
    load_state(module, state, str(path))


def load_state(module: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """``module.load_state_dict(state)`` with a one-line error when the keys do not fit."""
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ScaleLongError(
            f"checkpoint {source} does not fit this model (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}); was it written with another config?"
        )
