"""Checkpoints: one folder per step, written atomically, verified by checksums on load.

Layout of ``checkpoints/step-000500/``::

    model.safetensors   the trained weights
    ema.safetensors     the EMA weights (what samplers use)
    optimizer.pt        the optimizer's state_dict (torch.save; read back with weights_only=True)
    trainer.pt          lr schedule, precision, grad scaler, RNG states of every process, data position,
                        counters
    meta.json           step, format, the resolved config, size and sha256 of every file above

A checkpoint is written into ``.tmp-step-000500`` and renamed when complete, so a crash never
leaves a half-written folder under the final name; ``meta.json`` is written last. Every load
verifies the bytes it reads against ``meta.json`` (size and sha256) before it uses them
(:func:`read_verified`), and a file that does not check out, or does not load, raises
:class:`DamagedCheckpoint`, so callers can fall back to the checkpoint before
(:func:`load_newest`). Old checkpoints are removed by renaming them to ``.old-step-...`` first,
so a removal cut short never leaves a half-deleted ``step-`` folder. The run directory around
the checkpoints is :mod:`scalelong.training.runs`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import save_file
from torch import nn

from scalelong.errors import ScaleLongError, first_line

T = TypeVar("T")

FORMAT = 1
TMP_PREFIX = ".tmp-"  # a checkpoint being written
OLD_PREFIX = ".old-"  # a checkpoint being removed
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
            remove_checkpoint(final)
        os.replace(tmp, final)
    except BaseException:  # interrupted or failed: leave no partial folder behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep > 0:
        # Only checkpoints up to this step count: newer ones, left from before a resume that fell
        # back to an older checkpoint, stay until this run writes their steps again.
        done = [p for p in list_checkpoints(root) if p.name <= final.name]
        for old in done[:-keep]:
            remove_checkpoint(old)
    return final


def remove_checkpoint(path: Path) -> None:
    """Remove a checkpoint folder: renamed to ``.old-...`` first (atomic), then deleted, so it is
    never seen half-deleted under its ``step-`` name."""
    gone = path.with_name(f"{OLD_PREFIX}{path.name}")
    shutil.rmtree(gone, ignore_errors=True)
    os.replace(path, gone)
    shutil.rmtree(gone, ignore_errors=True)


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-"))


def remove_partial(root: Path) -> None:
    """Delete the folders left by a save or a removal that was killed mid-way."""
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith((TMP_PREFIX, OLD_PREFIX)):
                shutil.rmtree(p, ignore_errors=True)


# ----------------------------------------------------------------------------- verified reading


class DamagedCheckpoint(ScaleLongError):
    """A checkpoint file fails its checksum, is missing or truncated, or does not load.

    ``path`` is the checkpoint folder, ``problem`` says what is wrong in a few words."""

    def __init__(self, path: Path, problem: str):
        super().__init__(f"checkpoint {path} is damaged ({problem})")
        self.path, self.problem = Path(path), problem


def read_meta(path: Path) -> dict:
    """``meta.json`` of a checkpoint folder; missing or unreadable raises :class:`DamagedCheckpoint`."""
    try:
        meta = json.loads((path / "meta.json").read_text())
        if not isinstance(meta, dict) or not isinstance(meta["files"], dict):
            raise TypeError("not a checkpoint's meta.json")
    except FileNotFoundError:
        raise DamagedCheckpoint(path, "meta.json is missing") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DamagedCheckpoint(path, f"meta.json is unreadable, {first_line(e, name=True)}") from None
    return meta


def read_verified(path: Path, name: str, meta: dict | None = None) -> bytes:
    """The bytes of file ``name`` of the checkpoint folder ``path``, after checking their size and
    sha256 against ``meta.json``: what is checked is exactly what is then loaded."""
    info = (meta or read_meta(path))["files"].get(name)
    if not isinstance(info, dict):
        raise DamagedCheckpoint(path, f"{name} is not part of it")
    size, digest = info.get("bytes"), info.get("sha256")
    # An edited meta.json: checked here, so that it is a damaged checkpoint (the one before is tried)
    if not isinstance(size, int) or isinstance(size, bool):
        raise DamagedCheckpoint(path, f"meta.json lists no size for {name}")
    if not isinstance(digest, str):
        raise DamagedCheckpoint(path, f"meta.json lists no checksum for {name}")
    try:
        data = (path / name).read_bytes()
    except FileNotFoundError:
        raise DamagedCheckpoint(path, f"{name} is missing") from None
    except OSError as e:
        raise DamagedCheckpoint(path, f"{name} cannot be read, {first_line(e, name=True)}") from None
    if len(data) != size:
        raise DamagedCheckpoint(path, f"{name} is truncated ({len(data):,} of {size:,} bytes)")
    if hashlib.sha256(data).hexdigest() != digest:
        raise DamagedCheckpoint(path, f"{name} fails its checksum")
    return data


def checkpoint_problem(path: Path) -> str | None:
    """Why the checkpoint folder cannot be resumed from, or None when every file checks out."""
    try:
        meta = read_meta(path)
        for name in WEIGHTS + TRAINING_STATE:
            if name not in meta["files"]:
                return f"{name} is not part of it (a weights-only checkpoint)"
        for name in meta["files"]:
            read_verified(path, name, meta)
    except DamagedCheckpoint as e:
        return e.problem
    return None


def load_newest(
    checkpoints: list[Path],
    load: Callable[[Path], T],
    warn: Callable[[str], None] = print,
    advice: str = "",
) -> tuple[Path, T]:
    """``(path, load(path))`` for the newest of ``checkpoints`` (oldest first, as
    :func:`list_checkpoints` gives them) that loads.

    A :class:`DamagedCheckpoint` moves on to the one before; once one loads, each one skipped is
    reported in one ``warning:`` line through ``warn``. When none loads, one ScaleLongError lists
    them all, followed by ``advice`` (what the user can do)."""
    problems: list[DamagedCheckpoint] = []
    for path in reversed(checkpoints):
        try:
            loaded = load(path)
        except DamagedCheckpoint as e:
            problems.append(e)
            continue
        for e in problems:
            warn(f"warning: {e}; using {path.name}")
        return path, loaded
    if not checkpoints:
        raise ScaleLongError(f"no checkpoint to load{advice}")
    listed = "; ".join(f"{e.path.name}: {e.problem}" for e in problems)
    raise ScaleLongError(f"every checkpoint in {checkpoints[0].parent} is damaged ({listed}){advice}")


def _torch_load(path: Path, name: str, meta: dict) -> Any:
    try:
        return torch.load(io.BytesIO(read_verified(path, name, meta)), map_location="cpu", weights_only=True)
    except DamagedCheckpoint:
        raise
    except Exception as e:  # the checksums match but the file does not load
        raise DamagedCheckpoint(path, f"{name} does not load, {first_line(e, name=True)}") from None


def _safetensors_load(path: Path, name: str, meta: dict) -> dict[str, torch.Tensor]:
    data = read_verified(path, name, meta)
    try:
        return load_safetensors_bytes(data)
    except Exception as e:  # safetensors raises several types for a damaged file
        raise DamagedCheckpoint(path, f"{name} does not load, {first_line(e, name=True)}") from None


def load_training_state(path: Path) -> dict:
    """Everything :func:`save_checkpoint` wrote: model, ema, optimizer, trainer, step (on the CPU),
    each file verified; a damaged or weights-only checkpoint raises :class:`DamagedCheckpoint`."""
    meta = read_meta(path)
    for name in WEIGHTS + TRAINING_STATE:
        if name not in meta["files"]:
            raise DamagedCheckpoint(path, f"{name} is not part of it (a weights-only checkpoint)")
    state = {
        "step": meta.get("step"),
        "model": _safetensors_load(path, "model.safetensors", meta),
        "ema": _safetensors_load(path, "ema.safetensors", meta),
        "optimizer": _torch_load(path, "optimizer.pt", meta),
        "trainer": _torch_load(path, "trainer.pt", meta),
    }
    for name in ("optimizer", "trainer"):
        if not isinstance(state[name], dict):
            raise DamagedCheckpoint(path, f"{name}.pt holds a {type(state[name]).__name__}, not a dict")
    return state


def check_resume_precision(trainer: dict, precision: str, path: Path) -> None:
    """Refuse (one ScaleLongError line) to resume in ``precision`` (``fp32`` | ``bf16`` | ``fp16``)
    from the checkpoint ``path`` whose trainer.pt (``trainer``) was written in another one, or an
    fp16 resume whose checkpoint holds no loss-scaler state: the scale would silently restart.

    A checkpoint from before the precision was recorded names it by its scaler state: fp16 runs
    always have one."""
    scaler = trainer.get("scaler")
    written = trainer.get("precision") or ("fp16" if scaler is not None else None)
    if written is not None and written != precision:
        raise ScaleLongError(
            f"checkpoint {path} was written by a run in {written} and this run computes in {precision}; "
            f"resume it where it ran in {written} (train.mixed_precision, train.device), or pass "
            "--overwrite to train again from step 0"
        )
    if precision == "fp16" and scaler is None:
        raise ScaleLongError(
            f"checkpoint {path} holds no loss-scaler state, which an fp16 run needs to resume; pass "
            "--overwrite to train again from step 0"
        )


def load_weights(path: Path, name: str, module: nn.Module) -> None:
    """Load the verified safetensors file ``name`` of the checkpoint folder ``path`` into ``module``.

    A damaged file raises :class:`DamagedCheckpoint`; weights that do not fit the model a
    ScaleLongError."""
    load_state(module, _safetensors_load(path, name, read_meta(path)), str(path / name))


def load_state(module: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """``module.load_state_dict(state)`` with a one-line error when the keys or shapes do not fit."""
    try:
        missing, unexpected = module.load_state_dict(state, strict=False)
    except RuntimeError as e:  # strict=False still raises, in many lines, on a tensor of another shape
        own = module.state_dict()
        wrong = [k for k, v in state.items() if k in own and own[k].shape != v.shape]
        what = (
            f"{wrong[0]} is {tuple(state[wrong[0]].shape)}, the model's {tuple(own[wrong[0]].shape)}"
            if wrong
            else first_line(e, lines=2)
        )
        raise ScaleLongError(
            f"checkpoint {source} does not fit this model ({what}); was it written with another config?"
        ) from None
    if missing or unexpected:
        raise ScaleLongError(
            f"checkpoint {source} does not fit this model (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}); was it written with another config?"
        )
