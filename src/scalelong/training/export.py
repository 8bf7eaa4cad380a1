"""A run's images as PNG files (``scalelong sample``): by class, or by prompt for text-to-image.

Image i of a folder comes from seed ``seed + i`` (and its label or prompt), so a second call
draws only what is missing and no image depends on the batch it was drawn in. A folder records
its settings in ``sampling.json``; a call with other settings (for prompts also the prompt list,
guidance scale and encoders) is refused, naming what differs, instead of mixing two sets of images.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from scalelong.data import to_uint8
from scalelong.errors import ScaleLongError
from scalelong.runlog.lock import Warn
from scalelong.runlog.records import write_text_atomic
from scalelong.sampling import generate, get_sampler
from scalelong.training.build import build_schedule, model_input_shape
from scalelong.training.runs import RunDir, writer_of
from scalelong.training.t2i import (
    decode_latents,
    encode_prompts,
    generate_from_context,
    load_autoencoder,
    load_text_encoder,
)


def sample_to_dir(
    run_dir: str | Path,
    out: str | Path,
    n: int,
    sampler: str | None = None,
    steps: int | None = None,
    seed: int = 0,
    batch_size: int = 64,
    label: int | None = None,
    step: int | str | None = None,
    weights: str = "ema",
    device: torch.device | str = "cpu",
    progress: bool = True,
) -> dict:
    """Draw ``n`` images of a class-conditional or unconditional run into ``out/000000.png ...`` and
    ``out/samples.npz``; image i has label ``label`` or ``i % num_classes``. Resumable."""
    run = RunDir(run_dir)
    cfg, model, ckpt = run.load_model(step, weights, device)
    if getattr(model, "context_embed", None) is not None:
        raise ScaleLongError(f"{run} is a text-to-image run: pass --prompt TEXT or --prompts-file FILE")
    sampler, steps = sampler or cfg.sample.sampler, steps or cfg.sample.steps
    num_classes = getattr(model, "num_classes", 0)
    if label is not None and not 0 <= label < max(num_classes, 1):
        raise ScaleLongError(f"--label {label} is outside the model's {num_classes} classes")
    settings = {"run": str(run_dir), "checkpoint": ckpt.name, "weights": weights, "sampler": sampler}
    out = _start(Path(out), n, batch_size, {**settings, "steps": steps, "seed": seed, "label": label})

    labels = [label if label is not None else i % max(num_classes, 1) for i in range(n)]
    schedule, shape = build_schedule(cfg.diffusion), model_input_shape(cfg.model)

    def draw(idx: list[int]) -> torch.Tensor:
        labels_idx = torch.tensor([labels[i] for i in idx])
        return generate(model, schedule, sampler, steps, [seed + i for i in idx], shape, labels_idx, device)

    drawn = write_missing_pngs(out, n, batch_size, draw, progress)

    from PIL import Image

    arrays = np.stack([np.asarray(Image.open(out / f"{i:06d}.png")) for i in range(n)])
    arrays = arrays[..., None] if arrays.ndim == 3 else arrays  # (N, H, W, C) for grey images too
    np.savez(out / "samples.npz", images=arrays, labels=np.array(labels))
    return {"out": out, "drawn": drawn, "total": n, "checkpoint": ckpt}


def sample_prompts_to_dir(
    run_dir: str | Path,
    out: str | Path,
    prompts: Sequence[str],
    n: int,
    *,
    sampler: str | None = None,
    steps: int | None = None,
    seed: int = 0,
    batch_size: int = 16,
    guidance_scale: float | None = None,
    step: int | str | None = None,
    weights: str = "ema",
    text_encoder: str | None = None,
    autoencoder: str | None = None,
    device: torch.device | str = "cpu",
    progress: bool = True,
) -> dict:
    """Draw ``n`` images of a text-to-image run into ``out/000000.png ...``; image i shows prompt
    ``i % len(prompts)`` (listed in ``out/prompts.txt``), with classifier-free guidance. Resumable."""
    run = RunDir(run_dir)
    cfg, model, ckpt = run.load_model(step, weights, device)
    if getattr(model, "context_embed", None) is None:
        raise ScaleLongError(f"{run} is not a text-to-image run; drop --prompt / --prompts-file")
    t = cfg.t2i
    sampler, steps = sampler or cfg.sample.sampler, steps or cfg.sample.steps
    scale = t.guidance_scale if guidance_scale is None else guidance_scale
    text_encoder, autoencoder = text_encoder or t.text_encoder, autoencoder or t.autoencoder
    settings = {"run": str(run_dir), "checkpoint": ckpt.name, "weights": weights, "sampler": sampler}
    settings.update(steps=steps, seed=seed, prompts=list(prompts), guidance_scale=scale)
    out = _start(
        Path(out), n, batch_size, {**settings, "text_encoder": text_encoder, "autoencoder": autoencoder}
    )
    tokenizer, text_model = load_text_encoder(text_encoder)
    vae = load_autoencoder(autoencoder).to(device)
    text_model.to(device)
    (out / "prompts.txt").write_text("\n".join(prompts[i % len(prompts)] for i in range(n)) + "\n")
    null = encode_prompts([""], tokenizer, text_model, device)[0]
    schedule, shape = build_schedule(cfg.diffusion), model_input_shape(cfg.model)

    def draw(idx: list[int]) -> torch.Tensor:
        context = encode_prompts([prompts[i % len(prompts)] for i in idx], tokenizer, text_model, device)
        latents = generate_from_context(
            model, schedule, sampler, steps, [seed + i for i in idx], context, null, scale, shape, device
        )
        return decode_latents(latents, vae, t.latent_scale)

    drawn = write_missing_pngs(out, n, batch_size, draw, progress)
    return {"out": out, "drawn": drawn, "total": n, "checkpoint": ckpt}


def _start(out: Path, n: int, batch_size: int, settings: dict) -> Path:
    """Check the request and claim ``out`` for ``settings`` (written to ``out/sampling.json``); a
    folder holding images of other settings is refused."""
    if n <= 0 or batch_size <= 0:
        raise ScaleLongError(f"--n and --batch-size must be > 0, got {n}, {batch_size}")
    get_sampler(settings["sampler"])  # an unknown name fails before any image is drawn
    writer = writer_of(out)
    if writer is not None:
        raise ScaleLongError(
            f"--out {out} lies in {writer}, which another process writes; choose another --out"
        )
    for folder in (out, *out.parents):
        if folder.exists():
            if not folder.is_dir():
                raise ScaleLongError(f"--out {out}: {folder} is a file, not a folder; choose another --out")
            break
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ScaleLongError(f"cannot create --out {out} ({e.strerror}); choose another --out") from None
    path = out / "sampling.json"
    if path.is_file():
        try:
            held = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ScaleLongError(f"{path} is unreadable ({e}); choose another --out") from None
        if not isinstance(held, dict):
            raise ScaleLongError(
                f"{path} holds a JSON {type(held).__name__}, not the object of settings this command "
                "writes; choose another --out"
            )
        changed = _differences(held, settings)
        if changed:
            raise ScaleLongError(
                f"{out} holds samples made with other settings ({'; '.join(changed)}); choose another --out"
            )
    else:
        # sampling.json is written before the first image, so numbered PNGs without it are not ours:
        # resuming would pack them into samples.npz as if drawn with these settings.
        foreign = sorted(p.name for p in out.iterdir() if _PNG_NAME.fullmatch(p.name))
        if foreign:
            raise ScaleLongError(
                f"{out} holds {len(foreign)} numbered PNG(s) ({foreign[0]}, ...) but no sampling.json, so "
                "nothing says how they were drawn; choose an empty --out or remove the files"
            )
    write_text_atomic(path, json.dumps(settings, indent=1))  # never half-written by a kill
    return out


def _differences(held: dict, wanted: dict) -> list[str]:
    """``key: held -> wanted`` for each setting that differs, values shortened to fit one line."""

    def short(value: object) -> str:
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."

    keys = [k for k in wanted if k not in held] + list(held)
    changed = [k for k in keys if held.get(k) != wanted.get(k)]
    return [f"{k}: {short(held.get(k))} -> {short(wanted.get(k))}" for k in changed]


_PNG_NAME = re.compile(r"\d{6,}\.png")  # the images' names, f"{i:06d}.png"


def _decodes(path: Path) -> bool:
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.load()  # the whole file: a cut one opens fine and fails only here
        return True
    except Exception:  # PIL raises OSError, ValueError, SyntaxError, ... for a damaged file
        return False


def write_missing_pngs(
    out: Path,
    n: int,
    batch_size: int,
    draw: Callable[[list[int]], torch.Tensor],
    progress: bool = True,
    warn: Warn = print,  # the command line's warning lines, as in scalelong.training.runs
) -> int:
    """Write ``out/000000.png ...`` for the indices in 0..n-1 that have no image yet, ``batch_size``
    at a time; ``draw(indices)`` returns their images in [-1, 1]. Returns how many were drawn.

    A file that does not decode (cut short by a copy, or junk) is drawn again, replacing it, with
    one warning: image i depends on its seed alone, so the new one is the one it should be."""
    from tqdm import tqdm

    paths = [out / f"{i:06d}.png" for i in range(n)]
    todo = [i for i, p in enumerate(paths) if not p.is_file() or not _decodes(p)]
    broken = [i for i in todo if paths[i].is_file()]
    if broken:
        names = ", ".join(paths[i].name for i in broken[:5]) + (", ..." if len(broken) > 5 else "")
        warn(
            f"warning: {out}: {len(broken)} image(s) do not decode as PNG ({names}); drawing them again "
            "from their seeds, replacing the files"
        )
    bar = tqdm(total=n, initial=n - len(todo), disable=not progress, unit="img")
    for start in range(0, len(todo), batch_size):
        idx = todo[start : start + batch_size]
        pixels = to_uint8(draw(idx)).permute(0, 2, 3, 1).cpu().numpy()  # (B, H, W, C)
        for i, array in zip(idx, pixels, strict=True):
            _write_png(array, out / f"{i:06d}.png")
        bar.update(len(idx))
    bar.close()
    return len(todo)


def _write_png(array: np.ndarray, path: Path) -> None:
    from PIL import Image

    tmp = path.with_name(f".{path.name}.tmp")
    Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array).save(tmp, format="PNG")
    tmp.replace(path)  # a killed run never leaves a half-written PNG under the final name


__all__ = ["sample_prompts_to_dir", "sample_to_dir", "write_missing_pngs"]
