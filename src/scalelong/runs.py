"""The run directory: the one module that knows its layout.

Everything a run produces sits in one folder, so a run can be resumed, compared, plotted and
shared without the command line that made it::

    runs/<name>/
      config.yaml                 the fully resolved config (every default spelled out)
      metrics.jsonl               one JSON object per logged step
      tb/                         TensorBoard events
      checkpoints/step-000500/    one checkpoint (see scalelong.checkpoint)
      samples/step-000500.png     EMA sample grids
      eval/                       results of `scalelong eval`
      eval_final.json             the best step re-scored at the end of training
      report/                     plots of `scalelong analyze`
      summary.json                written last: its presence marks a finished run

:class:`RunDir` names these paths, creates or resumes a run (:meth:`RunDir.prepare`) and reads
the config, the metrics log (with the best evaluated step) and the checkpoints back;
:func:`load_model` rebuilds the model of a checkpoint, from the run's config or from the
config stored in the checkpoint itself.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import torch
from torch import nn

from scalelong.build import build_model
from scalelong.checkpoint import find_resumable, list_checkpoints, load_weights, remove_partial, step_dir_name
from scalelong.config import (
    Config,
    ModelConfig,
    config_from_dict,
    config_to_dict,
    load_config,
    read_yaml,
    save_config,
)
from scalelong.errors import ScaleLongError

# Dotted config keys (or prefixes) that may differ between a run directory and a resumed run.
RESUME_FREE_KEYS = (
    "name",
    "out_dir",
    "train.steps",
    "train.log_every",
    "train.compile",
    "train.grad_accum",  # the same steps for any value (up to float summation order)
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.tensorboard",
    "train.wandb",
    "train.max_nonfinite_steps",
    "data.path",
    "data.num_workers",
    "sample.",
    "eval.",
)


def config_differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """``key: old -> new`` for every dotted key that differs, except :data:`RESUME_FREE_KEYS`."""
    out = []
    for key in sorted(set(old) | set(new)):
        dotted = f"{prefix}{key}"
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_differences(a, b, f"{dotted}.")
        elif a != b and not any(
            dotted == k or (k.endswith(".") and dotted.startswith(k)) for k in RESUME_FREE_KEYS
        ):
            out.append(f"{dotted}: {a!r} -> {b!r}")
    return out


# ----------------------------------------------------------------------------- the metrics log

_NONFINITE = ("nan", "inf", "-inf")


def _to_json(value: object) -> object:
    # JSON has no NaN or infinity; write them as strings so they stay visible.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _from_json(value: object) -> object:
    return float(value) if isinstance(value, str) and value in _NONFINITE else value


class MetricsLog:
    """``metrics.jsonl``: one JSON object per logged step. Non-finite numbers are written as the
    strings ``"nan"`` / ``"inf"`` / ``"-inf"`` and read back as floats."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def write(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({k: _to_json(v) for k, v in record.items()}) + "\n")

    def read(self) -> list[dict]:
        if not self.path.is_file():
            return []
        lines = self.path.read_text().splitlines()
        return [{k: _from_json(v) for k, v in json.loads(line).items()} for line in lines if line.strip()]

    def truncate_after(self, step: int) -> None:
        """Drop records beyond ``step``: a resumed run rewrites them."""
        if self.path.is_file():
            kept = [r for r in self.read() if r.get("step", 0) <= step]
            self.path.unlink()
            for r in kept:
                self.write(r)


# ----------------------------------------------------------------------------- the run directory


class RunDir(os.PathLike):
    """One run's folder (see the module docstring); usable wherever a path is."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def name(self) -> str:
        return self.path.name

    # --- paths

    @property
    def config_file(self) -> Path:
        return self.path / "config.yaml"

    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def tb_dir(self) -> Path:
        return self.path / "tb"

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / "checkpoints"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints_dir / step_dir_name(step)

    def sample_grid(self, step: int) -> Path:
        return self.path / "samples" / f"{step_dir_name(step)}.png"

    @property
    def eval_dir(self) -> Path:
        return self.path / "eval"

    @property
    def eval_final_file(self) -> Path:
        return self.path / "eval_final.json"

    @property
    def report_dir(self) -> Path:
        return self.path / "report"

    @property
    def summary_file(self) -> Path:
        return self.path / "summary.json"

    # --- reading

    def require(self) -> RunDir:
        """This run directory, or a ScaleLongError when the folder holds no run."""
        if not self.config_file.is_file():
            raise ScaleLongError(
                f"{self.path} is not a run directory (no config.yaml); pass the folder `train` wrote"
            )
        return self

    def config(self) -> Config:
        return load_config(self.require().config_file)

    @property
    def metrics_log(self) -> MetricsLog:
        return MetricsLog(self.metrics_file)

    def metrics(self) -> list[dict]:
        """The records of ``metrics.jsonl`` in file order (non-finite values as floats)."""
        return self.metrics_log.read()

    def checkpoints(self) -> list[Path]:
        """Complete checkpoint folders, oldest first."""
        return list_checkpoints(self.checkpoints_dir)

    def eval_records(self, metric: str | None = None) -> dict[int, dict]:
        """The Frechet-distance records (``fd``, ``fd_metric``, ...: see scalelong.evaluation) of this
        run's own metrics log by step; a later line for a step (after a resume) replaces an earlier."""
        records: dict[int, dict] = {}
        for r in self.metrics():
            fd = r.get("fd")
            if "step" not in r or not isinstance(fd, (int, float)) or not math.isfinite(fd):
                continue
            if metric is None or r.get("fd_metric") == metric:
                records[int(r["step"])] = r
        return records

    def best_step(self, metric: str | None = None, require_checkpoint: bool = True) -> int | None:
        """The step with the lowest Frechet distance in this run's records (None if there are none).

        Unlike the release, which appended every run's evaluations to one log and never cleared it
        (so stale lines could name the "best" checkpoint), only this run's own records count, and
        with ``require_checkpoint`` only steps whose checkpoint exists, so the answer can always be
        re-evaluated; ties go to the earlier step.
        """
        records = self.eval_records(metric)
        if require_checkpoint:
            records = {s: r for s, r in records.items() if self.checkpoint(s).is_dir()}
        if not records:
            return None
        return min(records, key=lambda s: (records[s]["fd"], s))

    def find_checkpoint(self, step: int | str | None = None) -> Path:
        """The checkpoint of ``step``: a number, None or "latest" (the newest), or "best"
        (:meth:`best_step` by the run's eval.metric); a missing one is a ScaleLongError."""
        checkpoints = self.checkpoints()
        if not checkpoints:
            raise ScaleLongError(f"{self.path} has no checkpoint yet; train it first (scalelong train)")
        if step in (None, "latest"):
            return checkpoints[-1]
        if step == "best":
            step = self.best_step(self.config().eval.metric)
            if step is None:
                raise ScaleLongError(f"{self.path} has no evaluation records to pick a best step from")
        path = self.checkpoint(int(step))
        if not path.is_dir():
            have = ", ".join(p.name for p in checkpoints)
            raise ScaleLongError(f"no checkpoint for step {step} in {self.path}; available: {have}")
        return path

    @property
    def finished(self) -> bool:
        return self.summary_file.is_file()

    def write_summary(self, summary: dict) -> None:
        """Write summary.json; call it last: its presence marks a finished run."""
        self.summary_file.write_text(json.dumps(summary, indent=1))

    def load_model(
        self, step: int | str | None = None, weights: str = "ema", device: torch.device | str = "cpu"
    ) -> tuple[Config, nn.Module, Path]:
        """The run's config and its model holding the weights (``ema`` or ``model``) of the checkpoint
        :meth:`find_checkpoint` picks for ``step``."""
        cfg = self.config()
        checkpoint = self.find_checkpoint(step)
        return cfg, load_model(checkpoint, cfg.model, weights, device), checkpoint

    # --- writing

    def prepare(self, cfg: Config, overwrite: bool = False, resume: bool | None = None) -> Path | None:
        """Create or check the folder for training ``cfg``; return the checkpoint to resume from
        (None: a fresh start).

        Empty or missing: fresh run. ``overwrite``: delete and start fresh. Otherwise the folder
        must hold a run of the same config (up to :data:`RESUME_FREE_KEYS`); it then continues from
        its newest intact checkpoint, or restarts in place when it has none. ``resume=True`` makes a
        missing checkpoint an error.
        """
        if overwrite and resume:
            raise ScaleLongError("--overwrite and --resume contradict each other; pass one of them")
        exists = self.path.is_dir() and any(self.path.iterdir())
        if exists and not overwrite:
            if not self.config_file.is_file():
                raise ScaleLongError(
                    f"{self.path} exists but holds no run (no config.yaml); choose another name=... or "
                    "--overwrite"
                )
            diff = config_differences(read_yaml(self.config_file), config_to_dict(cfg))
            if diff:
                raise ScaleLongError(
                    f"run directory {self.path} holds a run with another config ({'; '.join(diff[:3])}"
                    f"{'; ...' if len(diff) > 3 else ''}); pass --overwrite to replace it or choose another "
                    "name=..."
                )
            remove_partial(self.checkpoints_dir)
            checkpoint = find_resumable(self.checkpoints_dir)
            if checkpoint is not None:
                save_config(cfg, self.config_file)  # the run-length / logging keys may have changed
                return checkpoint
            if resume:
                raise ScaleLongError(f"--resume: {self.path} has no intact checkpoint to resume from")
            print(f"{self.path} has no checkpoint yet; starting it again from step 0")
        elif resume:
            raise ScaleLongError(f"--resume: {self.path} does not exist or is empty; nothing to resume")
        if self.path.exists():
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True)
        save_config(cfg, self.config_file)
        return None


def load_model(
    checkpoint: str | Path,
    model_cfg: ModelConfig | None = None,
    weights: str = "ema",
    device: torch.device | str = "cpu",
) -> nn.Module:
    """The model of a checkpoint folder with its ``weights`` (``ema`` or ``model``), in eval mode.

    ``model_cfg`` None: built from the config the checkpoint stores in its ``meta.json``. Building
    leaves the global RNG as it was.
    """
    checkpoint = Path(checkpoint)
    if weights not in ("ema", "model"):
        raise ScaleLongError(f"weights={weights!r}: choose ema or model")
    if model_cfg is None:
        meta = checkpoint / "meta.json"
        if not meta.is_file():
            raise ScaleLongError(f"{checkpoint} is not a checkpoint folder (no meta.json)")
        model_cfg = config_from_dict(json.loads(meta.read_text())["config"]).model
    with torch.random.fork_rng(devices=[]):  # building initialises weights
        model = build_model(model_cfg)
    load_weights(checkpoint / f"{weights}.safetensors", model)
    return model.to(device).eval()


__all__ = ["RESUME_FREE_KEYS", "MetricsLog", "RunDir", "config_differences", "load_model"]
