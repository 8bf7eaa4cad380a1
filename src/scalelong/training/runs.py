"""The run directory: the one module that knows its layout.

Everything a run produces sits in one folder, so a run can be resumed, compared, plotted and
shared without the command line that made it::

    runs/<name>/
      config.yaml                 the fully resolved config (every default spelled out)
      .lock                       held by the one process that writes the run: pid, host
      metrics.jsonl               one JSON object per logged step
      tb/                         TensorBoard events
      checkpoints/step-000500/    one checkpoint (see scalelong.training.checkpoint)
      samples/step-000500.png     EMA sample grids
      eval/                       results of `scalelong eval`
      eval_final.json             the best step re-scored at the end of training
      report/                     plots of `scalelong analyze`
      summary.json                written last, on every path that ends a run; its status
                                  "complete" marks a finished run

:class:`RunDir` names these paths, creates or resumes a run (:meth:`RunDir.writing` takes the
lock, :meth:`RunDir.prepare` checks the folder) and reads the config, the metrics log (with the
best evaluated step) and the checkpoints back; :func:`load_model` rebuilds the model of a
checkpoint, from the run's config or from the config stored in the checkpoint itself.

What is promised:

* **One writer.** A process that trains a run holds ``.lock``, created with ``O_EXCL`` and
  holding its pid, host and start time; a second one is refused in one line naming the holder.
  A lock whose process is gone (same host: the pid no longer runs, or runs another program)
  is taken over with a warning. A lock from another host is never taken over: this machine
  cannot see that process, so the message says to delete ``.lock`` once it has stopped.
  Readers (``sample``, ``eval``, ``analyze``) take no lock and write nothing into a folder
  another process holds.
* **Nothing the user made is deleted.** No command removes a run directory. ``--overwrite``
  removes only the files scalelong writes (:meth:`RunDir.remove_project_files`) and lists what
  it kept. A run whose checkpoints are all damaged stops and says so; it never restarts.
* **Verified loads.** Every weight file is checked against its checksum before use, and a
  damaged newest checkpoint falls back to the one before with one warning line.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from scalelong.diagnostics import metric_names, robustness
from scalelong.errors import ScaleLongError
from scalelong.metrics.fd_mnist import format_digit_score
from scalelong.runlog.lock import LOCK_NAME, FolderLock, Warn, lock_state, writer_of
from scalelong.runlog.records import CONFIG_FILE, METRICS_FILE, TB_DIR, MetricsLog, write_text_atomic
from scalelong.training.build import build_model
from scalelong.training.checkpoint import (
    DamagedCheckpoint,
    list_checkpoints,
    load_newest,
    load_weights,
    read_meta,
    remove_checkpoint,
    remove_partial,
    step_dir_name,
)
from scalelong.training.config import (
    Config,
    ModelConfig,
    config_from_dict,
    config_to_dict,
    read_yaml,
    save_config,
)

# Dotted config keys (or prefixes) that may differ between a run directory and a resumed run.
RESUME_FREE_KEYS = (
    "name",
    "out_dir",
    "train.steps",
    "train.log_every",
    "train.compile",
    "train.grad_accum",  # the same steps for any value (up to float summation order)
    "optim.implementation",  # the same update from every AdamW kernel (up to float rounding)
    "train.cpu_processes",  # the same steps on any number of processes (up to float summation order)
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


def with_defaults(stored: dict) -> dict:
    """A stored config with every key the current :class:`Config` has filled in with its default;
    ``stored`` itself when it is not a valid config of this version (a removed key, a bad value).

    One key reads otherwise: a run written before ``data.heldout`` trained on all its images, so a
    missing ``data.heldout`` reads 0 (a new folder or array run holds images out by default), and
    the old run resumes on the training set it had (with ``data.heldout=0``), never on a smaller one.
    """
    data = stored.get("data")
    if isinstance(data, dict) and "heldout" not in data:
        stored = {**stored, "data": {**data, "heldout": 0}}
    try:
        return config_to_dict(config_from_dict(stored))
    except ScaleLongError:
        return stored


def config_differences(
    old: dict, new: dict, prefix: str = "", free: tuple[str, ...] = RESUME_FREE_KEYS
) -> list[str]:
    """``key: old -> new`` for every dotted key that differs, except the ``free`` ones (keys, or
    prefixes ending in a dot; by default :data:`RESUME_FREE_KEYS`).

    ``old`` is a stored config: a key added to the config since it was written reads as its default
    (every new key defaults to the behaviour before it), so a run stays resumable and reusable.
    """
    if not prefix:
        old = with_defaults(old)
    out = []
    for key in sorted(set(old) | set(new)):
        dotted = f"{prefix}{key}"
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_differences(a, b, f"{dotted}.", free)
        elif a != b and not any(dotted == k or (k.endswith(".") and dotted.startswith(k)) for k in free):
            out.append(f"{dotted}: {a!r} -> {b!r}")
    return out


# ----------------------------------------------------------------------------- the run directory

# What scalelong writes into a run directory: files, and per folder the names it gives its files.
# --overwrite removes these and nothing else. The report names are those of plots.write_plots.
PROJECT_FILES = ("config.yaml", ".config.yaml.tmp", "metrics.jsonl", ".metrics.jsonl.tmp")
PROJECT_FILES += ("summary.json", ".summary.json.tmp", "eval_final.json", "workers.log")
PROJECT_FOLDERS = {
    "checkpoints": ("step-*", ".tmp-step-*", ".old-step-*"),
    "tb": ("events.out.tfevents.*",),
    "samples": ("step-*.png",),
    "eval": ("*-step-*-n*.json",),
    "report": (
        "loss.png",
        "feature_norm.png",
        "grad_oscillation.png",
        "fd.png",
        "noise_levels.png",
        "magnitude.png",
    )
    + ("coefficients_*.png",),
}
SUMMARY_STATUS = ("complete", "stopped", "interrupted", "failed")


class RunDir(os.PathLike):
    """One run's folder (see the module docstring); usable wherever a path is."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        # the trainer's wording: another writer "trains" the run, and a run is chosen by name=...
        self._lock = FolderLock(self.path, verb="trained", advice="choose another out_dir=... or name=...")

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
        return self.path / CONFIG_FILE

    @property
    def lock_file(self) -> Path:
        return self.path / LOCK_NAME

    @property
    def metrics_file(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def tb_dir(self) -> Path:
        return self.path / TB_DIR

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
        if not self.config_file.is_file() and not self.checkpoints():
            raise ScaleLongError(
                f"{self.path} is not a run directory (no config.yaml); pass the folder `train` wrote"
            )
        return self

    def stored_config(self, warn: Warn = print) -> dict:
        """The run's config as a dict: config.yaml, or, when that file is missing, empty or damaged
        (a kill while it was written by an older version, a slip of an editor), the config the
        newest checkpoint stores, with a warning. Neither is a ScaleLongError."""
        why = "is missing"
        if self.config_file.is_file():
            try:
                data = read_yaml(self.config_file)
                if data:
                    return data
                why = "is empty"
            except ScaleLongError as e:
                why = f"is damaged ({e})"
        for path in reversed(self.checkpoints()):
            try:
                data = read_meta(path)["config"]
            except (DamagedCheckpoint, KeyError):
                continue
            if isinstance(data, dict) and data:
                warn(f"warning: {self.config_file} {why}; using the config stored in {path.name}")
                return data
        raise ScaleLongError(
            f"{self.config_file} {why} and no checkpoint of {self.path} stores the run's config; "
            "pass --overwrite to train the run again (it removes only files scalelong wrote) or choose "
            "another name=..."
        )

    def config(self) -> Config:
        """The run's typed config (see :meth:`stored_config`); one that this version refuses (a
        hand-edited config.yaml, a run of another version) is a ScaleLongError naming its file."""
        data = self.require().stored_config()
        try:
            return config_from_dict(data)
        except ScaleLongError as e:
            error = e
        # Say where: the bare message ("unknown config key 'foo'") reads as a mistake on the command line.
        try:
            in_file = read_yaml(self.config_file) == data
        except ScaleLongError:
            in_file = False  # stored_config fell back to a checkpoint's copy
        if in_file:
            fix = "repair that file (it must hold a config this version of scalelong reads)"
            raise ScaleLongError(f"{self.config_file}: {error}; {fix}")
        raise ScaleLongError(
            f"the config stored in a checkpoint of {self.path} (config.yaml is missing or damaged): {error}; "
            f"restore {self.config_file}"
        )

    @property
    def metrics_log(self) -> MetricsLog:
        return MetricsLog(self.metrics_file, warn=print)  # the command line's warning lines

    def metrics(self) -> list[dict]:
        """The records of ``metrics.jsonl`` in file order (non-finite values as floats)."""
        return self.metrics_log.read()

    def checkpoints(self) -> list[Path]:
        """Complete checkpoint folders, oldest first."""
        return list_checkpoints(self.checkpoints_dir)

    def eval_records(self, metric: str | None = None) -> dict[int, dict]:
        """The Frechet-distance records (``fd``, ``fd_metric``, ...: see scalelong.training.evaluation) of
        this run's own metrics log by step; a later line for a step (after a resume) replaces an earlier."""
        records: dict[int, dict] = {}
        for r in self.metrics():
            fd = r.get(metric_names.FD)
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
        return min(records, key=lambda s: (records[s][metric_names.FD], s))

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

    def load_model(
        self,
        step: int | str | None = None,
        weights: str = "ema",
        device: torch.device | str = "cpu",
        warn: Warn = print,
    ) -> tuple[Config, nn.Module, Path]:
        """The run's config and its model holding the verified weights (``ema`` or ``model``) of the
        checkpoint :meth:`find_checkpoint` picks for ``step``.

        The newest checkpoint (``step`` None or "latest") falls back to the one before when its
        weights are damaged, with one warning line through ``warn``; a step asked for by number or
        as "best" does not: its damage is a ScaleLongError."""
        cfg = self.config()
        if step in (None, "latest"):
            self.find_checkpoint()  # none at all: say so
            checkpoint, model = load_newest(
                self.checkpoints(),
                lambda path: load_model(path, cfg.model, weights, device),
                warn,
                "; restore one from a backup or train the run again",
            )
            return cfg, model, checkpoint
        checkpoint = self.find_checkpoint(step)
        try:
            return cfg, load_model(checkpoint, cfg.model, weights, device), checkpoint
        except DamagedCheckpoint as e:
            have = ", ".join(p.name for p in self.checkpoints() if p != checkpoint)
            raise ScaleLongError(f"{e}; choose another --step (available: {have or 'none'})") from None

    @property
    def summary(self) -> dict | None:
        """summary.json, or None when there is none (or it cannot be read)."""
        try:
            summary = json.loads(self.summary_file.read_text())
        except (OSError, ValueError):
            return None
        return summary if isinstance(summary, dict) else None

    @property
    def finished(self) -> bool:
        """Whether the run trained to its end (summary.json with status "complete")."""
        summary = self.summary
        return summary is not None and summary.get("status", "complete") == "complete"

    # --- writing (hold the lock: see writing())

    def write_summary(self, summary: dict) -> None:
        """Write summary.json (atomically): last, on every path that ends the run; ``status`` is one
        of :data:`SUMMARY_STATUS` ("complete" when missing)."""
        summary = {"status": "complete", **summary}
        if summary["status"] not in SUMMARY_STATUS:
            raise ValueError(f"summary status {summary['status']!r}")
        write_text_atomic(self.summary_file, json.dumps(summary, indent=1, default=str))

    def acquire_lock(self, warn: Warn = print) -> None:
        """Create ``.lock`` (``O_EXCL``) holding this process's pid, host and start time
        (:class:`scalelong.runlog.lock.FolderLock`). Held by a live process (or by one on another host): a
        ScaleLongError naming it. Held by a process of this host that is gone: taken over with a
        warning. The folder must exist."""
        self._lock.acquire(warn)

    @property
    def _locked(self) -> bool:
        return self._lock.held

    @_locked.setter
    def _locked(self, held: bool) -> None:
        self._lock.held = held

    def release_lock(self) -> None:
        """Remove ``.lock`` if this process holds it."""
        self._lock.release()

    def writing(self, warn: Warn = print) -> contextlib.AbstractContextManager[FolderLock]:
        """Hold the run's lock for the ``with`` block: the folder is created when missing (and
        removed again if it is still empty at the end), the lock is released on every way out."""
        return self._lock.holding(warn)

    def project_files(self) -> list[Path]:
        """The files and folders in this run directory that scalelong writes."""
        found = [self.path / name for name in PROJECT_FILES if (self.path / name).exists()]
        for folder, patterns in PROJECT_FOLDERS.items():
            for pattern in patterns:
                found += sorted((self.path / folder).glob(pattern))
        return found

    def remove_project_files(self, warn: Warn = print) -> None:
        """What ``--overwrite`` removes: :meth:`project_files` (checkpoints renamed away first), then
        the folders they leave empty. Anything else stays, and a warning lists it."""
        for path in self.project_files():
            if path.is_dir() and path.parent == self.checkpoints_dir:
                if path.name.startswith("step-"):
                    remove_checkpoint(path)
                else:
                    shutil.rmtree(path, ignore_errors=True)
            elif path.is_file():
                path.unlink(missing_ok=True)
        for folder in PROJECT_FOLDERS:
            with contextlib.suppress(OSError):
                (self.path / folder).rmdir()
        kept = sorted(
            str(p.relative_to(self.path))
            for p in self.path.rglob("*")
            if p.name != LOCK_NAME and not (p.is_dir() and any(p.iterdir()))
        )
        if kept:
            more = f" and {len(kept) - 5} more" if len(kept) > 5 else ""
            warn(
                f"warning: --overwrite kept {len(kept)} file(s) in {self.path} that scalelong did not "
                f"write: {', '.join(kept[:5])}{more}"
            )

    def prepare(
        self, cfg: Config, overwrite: bool = False, resume: bool | None = None, warn: Warn = print
    ) -> list[Path]:
        """Check the folder for training ``cfg`` (holding the lock, see :meth:`writing`); return the
        checkpoints to resume from, oldest first (empty: a start from step 0).

        Empty: a fresh run. ``overwrite``: :meth:`remove_project_files`, then a fresh run (a folder
        that holds no run is refused, ``overwrite`` or not).
        Otherwise the folder must hold a run of the same config (up to :data:`RESUME_FREE_KEYS`);
        a run with no checkpoint yet starts again from step 0 in place, with a warning, deleting
        nothing. ``resume=True`` makes a missing checkpoint an error. The config is written for
        a fresh start; a resumed run writes it once its checkpoint has loaded.
        """
        try:
            return self._prepare(cfg, overwrite, resume, warn)
        except OSError as e:  # a full disk, a folder without write permission
            raise ScaleLongError(f"cannot write in the run directory {self.path} ({e.strerror})") from None

    def _prepare(self, cfg: Config, overwrite: bool, resume: bool | None, warn: Warn) -> list[Path]:
        if overwrite and resume:
            raise ScaleLongError("--overwrite and --resume contradict each other; pass one of them")
        occupied = any(p.name != LOCK_NAME for p in self.path.iterdir())
        if occupied and not self.config_file.is_file() and not self.checkpoints():
            raise ScaleLongError(
                f"{self.path} exists but holds no run (no config.yaml, no checkpoint); choose another "
                "name=... (--overwrite replaces runs only)"
            )
        if overwrite:
            self.remove_project_files(warn)
        elif occupied:
            stored = self.stored_config(warn)
            diff = config_differences(stored, config_to_dict(cfg))
            if diff:
                before = "heldout" not in (stored.get("data") or {})
                hint = (
                    "; it was written before data.heldout and trained on all its images: resume it with "
                    "data.heldout=0"
                    if before and any(d.startswith("data.heldout:") for d in diff)
                    else ""
                )
                raise ScaleLongError(
                    f"run directory {self.path} holds a run with another config ({'; '.join(diff[:3])}"
                    f"{'; ...' if len(diff) > 3 else ''}){hint}; pass --overwrite to replace it or choose "
                    "another name=..."
                )
            remove_partial(self.checkpoints_dir)
            checkpoints = self.checkpoints()
            if checkpoints:
                return checkpoints
            if resume:
                raise ScaleLongError(f"--resume: {self.path} has no checkpoint to resume from")
            warn(f"warning: {self.path} has no checkpoint yet; starting it again from step 0")
        elif resume:
            raise ScaleLongError(f"--resume: {self.path} does not exist or is empty; nothing to resume")
        save_config(cfg, self.config_file)
        return []


def load_model(
    checkpoint: str | Path,
    model_cfg: ModelConfig | None = None,
    weights: str = "ema",
    device: torch.device | str = "cpu",
) -> nn.Module:
    """The model of a checkpoint folder with its verified ``weights`` (``ema`` or ``model``), in
    eval mode; damaged weights raise :class:`~scalelong.training.checkpoint.DamagedCheckpoint`.

    ``model_cfg`` None: built from the config the checkpoint stores in its ``meta.json``. Building
    leaves the global RNG as it was.
    """
    checkpoint = Path(checkpoint)
    if weights not in ("ema", "model"):
        raise ScaleLongError(f"weights={weights!r}: choose ema or model")
    if model_cfg is None:
        meta = read_meta(checkpoint)
        if not isinstance(meta.get("config"), dict):
            raise DamagedCheckpoint(checkpoint, "meta.json stores no config")
        model_cfg = config_from_dict(meta["config"]).model
    with torch.random.fork_rng(devices=[]):  # building initialises weights
        model = build_model(model_cfg)
    load_weights(checkpoint, f"{weights}.safetensors", model)
    return model.to(device).eval()


def checkpoint_robustness(
    checkpoint: str | Path,
    schedule: object,
    x0: torch.Tensor,
    ts: Sequence[float],
    weights: str = "ema",
    **kwargs,
) -> list[dict[str, float]]:
    """:func:`scalelong.diagnostics.robustness` of a checkpoint folder of ``scalelong train``
    (``checkpoints/step-XXXXXX``): its verified ``weights`` (``ema`` or ``model``) are probed; the
    other arguments are those of ``robustness``."""
    return robustness(load_model(checkpoint, weights=weights), schedule, x0, ts, **kwargs)


def score_line(
    r: dict, where: str, digits: dict | None = None, real: dict | None = None, places: int = 4
) -> str:
    """One evaluation record (``fd``, ``fd_metric``, ``fd_samples``, ...) as one line, with the digit
    score beside FD-MNIST and the CLIP score where the record holds one: what ``scalelong eval``
    prints and ``scalelong train`` ends with."""
    how = f"{where}, {r['fd_samples']} samples, {r['fd_sampler']} {r['fd_steps']} steps"
    how += f", {r['fd_precision']}" if r.get("fd_precision") in ("bf16", "fp16") else ""
    line = f"{r['fd_metric']} {r['fd']:.{places}f} ({how})"
    if r.get("clip_score") is not None:  # text-to-image runs scored with --clip: the captions' agreement
        line += f"; CLIP score {r['clip_score']:.2f}"
    if digits is not None:  # beside FD-MNIST, the readable part: recognisable digits and class balance
        line += f"; digits: {format_digit_score(digits, real)}"
    return line


def evaluation_lines(run: RunDir) -> list[str]:
    """What a finished run scored: its last evaluation (FD and, for FD-MNIST, the digit score), and
    the best step's re-score where ``eval.final_num_samples`` asked for one, or else how to score
    more samples; no lines for a run that never evaluated."""
    records = run.eval_records()
    if not records:
        return []
    step = max(records)
    r = records[step]

    def digit_score(record: dict) -> dict | None:  # beside FD-MNIST: whether the samples read as digits
        if not isinstance(record.get(metric_names.DIGITS_CONFIDENT), (int, float)):
            return None
        return {
            "confident": record[metric_names.DIGITS_CONFIDENT],
            "entropy": record.get(metric_names.DIGITS_ENTROPY, float("nan")),
        }

    lines = [score_line(r, f"step {step}", digit_score(r), places=1)]
    try:
        final = json.loads(run.eval_final_file.read_text())
        line = (
            f"best step {final['best_step']} re-scored: {final['fd_metric']} {final['fd']:.1f} "
            f"({final['fd_samples']} samples"
        )
        if reused := final.get("fd_samples_reused"):  # drawn by the evaluation of that step
            line += (
                ", all the evaluation's"
                if reused >= final["fd_samples"]
                else f", {reused} of them the evaluation's"
            )
        line += ")"
        if (digits := digit_score(final)) is not None:
            line += f"; digits: {format_digit_score(digits)}"
        lines.append(line)
    except FileNotFoundError:  # no re-score asked for (eval.final_num_samples: 0)
        if r["fd_samples"] < 1000:  # FD is biased upward on few samples
            lines.append(f"score it on more samples: scalelong eval {run.path} --n 1000")
    except (OSError, ValueError, KeyError, TypeError):
        pass  # an unreadable re-score file: the run's own log above still says what it scored
    return lines


__all__ = [
    "RESUME_FREE_KEYS",
    "checkpoint_robustness",
    "MetricsLog",
    "RunDir",
    "config_differences",
    "evaluation_lines",
    "load_model",
    "lock_state",
    "score_line",
    "writer_of",
]
