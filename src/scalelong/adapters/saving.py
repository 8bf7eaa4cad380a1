"""Save and load ScaleLong on any model: ``scalelong.json`` + ``scalelong.safetensors``.

:func:`save_scalelong` writes what was applied, as data, beside the gates: the method, kappa and
reduction, where the skips are scaled (the :class:`~scalelong.adapters.SkipInput` declaration with
module paths, or, for a backbone that calls its ``SkipScaling`` itself, where that module sits),
the gate layout, the blocks the diagnostics watch, and the size and sha256 of the weights file.
:func:`load_scalelong` checks the weights against them, replays the declaration on a fresh model
(or rebuilds the backbone's ``SkipScaling``) and loads the gates, so the model computes what the
saved one did. For diffusers models the model's own files are written too (``save_pretrained``,
without the gates, so ``from_pretrained`` loads them with no unexpected key).

``scalelong.json`` (format 1)::

    {"format": 1, "method": "ls", "kappa": 0.9, "reduction": 16, "num_skips": 4, "at": "",
     "declaration": {"skips": [{"module": "up_blocks.1", "arg": "res_hidden_states_tuple",
                                "channels": null, "dim": 1, "item": 0}, ...],
                     "shapes": [[16, 16, 16], ...]},
     "builtin": null, "layout": {"num_tokens": null, "skip_channels": [16, 16, 16, 32]},
     "blocks": {"down_blocks.0": "down_blocks.0", ...},
     "weights": {"bytes": 1234, "sha256": "..."}}

Files written by earlier versions for diffusers UNets (method, kappa, reduction, num_skips and
the weights' checksum only) still load: the UNet's layout is derived again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from torch import nn

from scalelong.adapters import apply_scalelong, declared, remove_scalelong
from scalelong.adapters.declared import SkipInput
from scalelong.errors import ScaleLongError, first_line
from scalelong.skips import SkipScaling

META_FILE, WEIGHTS_FILE = "scalelong.json", "scalelong.safetensors"
FORMAT = 1


def save_scalelong(model: nn.Module, directory: str | Path, save_model: bool | None = None) -> Path:
    """Write ScaleLong as applied to ``model`` into ``directory`` (created if needed); return it.

    Serves every model :func:`~scalelong.adapters.apply_scalelong` serves, the package's backbones
    built with a ``skip_method``, and any module that holds one of them. ``save_model``: also write
    the model's own files with its ``save_pretrained`` (diffusers), without the ScaleLong
    parameters; None (the default) does so whenever the model has ``save_pretrained``.
    """
    from safetensors.torch import save_file

    scaling, path = _scaling(model)
    at = path.rpartition(".")[0]  # the module that holds the SkipScaling
    owner = model.get_submodule(at) if at else model
    record = declared.installed(owner)
    if save_model is None:
        save_model = callable(getattr(model, "save_pretrained", None))
    if save_model and not callable(getattr(model, "save_pretrained", None)):
        raise ScaleLongError(
            f"save_model=True but {type(model).__name__} has no save_pretrained; save its weights yourself"
        )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "format": FORMAT,
        "method": scaling.method,
        "kappa": scaling.kappa,
        "reduction": scaling.reduction,
        "num_skips": scaling.num_skips,
        "at": at,
    }
    if record is not None:  # hooks: the declaration, as data
        meta["declaration"] = {
            "skips": [s.to_dict() for s in record.skips],
            "shapes": [None if s is None else list(s) for s in record.shapes],
        }
        meta["builtin"] = None
        channels = None if record.skip_channels is None else list(record.skip_channels)
        meta["layout"] = {"num_tokens": record.num_tokens, "skip_channels": channels}
    else:  # a backbone that calls its SkipScaling itself: where that module sits
        meta["declaration"] = None
        meta["builtin"] = path.removeprefix(f"{at}.") if at else path
        meta["layout"] = _builtin_layout(owner, scaling)
    meta["blocks"] = _block_paths(owner, scaling)
    if save_model:
        # keep the model's files exactly those of the plain model
        held = owner._modules.pop("scalelong", None)
        try:
            model.save_pretrained(directory)
        finally:
            if held is not None:
                owner._modules["scalelong"] = held
    state = {k: v.detach().cpu().contiguous() for k, v in scaling.state_dict().items()}
    save_file(state, directory / WEIGHTS_FILE)
    data = (directory / WEIGHTS_FILE).read_bytes()
    meta["weights"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (directory / META_FILE).write_text(json.dumps(meta, indent=1))  # last: it vouches for the weights
    return directory


def load_scalelong(model: nn.Module, directory: str | Path) -> nn.Module:
    """Put the ScaleLong saved by :func:`save_scalelong` on ``model`` (a fresh one, without ScaleLong
    applied, or a package backbone whose ``SkipScaling`` is replaced) and load its gates. Returns
    ``model``.

    The weights are checked against the size and sha256 that ``scalelong.json`` records first; a
    damaged or mismatched file, or a declaration that does not fit the model, is one
    :class:`ScaleLongError` line, and the model is left as it was.
    """
    from safetensors.torch import load as load_bytes

    directory = Path(directory)
    meta_path, weights_path = directory / META_FILE, directory / WEIGHTS_FILE
    if not meta_path.is_file() or not weights_path.is_file():
        raise ScaleLongError(f"{directory} holds no ScaleLong files ({META_FILE}, {WEIGHTS_FILE})")
    meta = _read_meta(meta_path)
    data = weights_path.read_bytes()
    expected = meta.get("weights")
    if "format" in meta and not isinstance(expected, dict):
        raise ScaleLongError(f"{meta_path} records no checksum of {WEIGHTS_FILE}; save it again")
    if isinstance(expected, dict) and (
        len(data) != expected.get("bytes") or hashlib.sha256(data).hexdigest() != expected.get("sha256")
    ):
        raise ScaleLongError(
            f"{weights_path} is damaged (its size or sha256 differs from {META_FILE}); save it again"
        )
    try:
        state = load_bytes(data)
    except Exception as e:  # safetensors raises several types for a damaged file
        raise ScaleLongError(f"{weights_path} is damaged ({type(e).__name__}); save it again") from None
    target = _get(model, meta.get("at", ""), directory)
    try:
        if meta.get("builtin"):
            _replace_builtin(target, meta, state, directory)
        else:
            _replay(target, meta, state, directory)
    except ScaleLongError as e:
        raise ScaleLongError(f"{directory}: {e}") from None
    return model


# ----------------------------------------------------------------------------- helpers


def _scaling(model: nn.Module) -> tuple[SkipScaling, str]:
    found = [(path, m) for path, m in model.named_modules() if isinstance(m, SkipScaling)]
    if len(found) != 1:
        raise ScaleLongError(
            "ScaleLong is not applied to this model; call apply_scalelong first"
            if not found
            else f"the model holds {len(found)} SkipScaling modules; save the one model that holds one"
        )
    path, scaling = found[0]
    return scaling, path


def _builtin_layout(owner: nn.Module, scaling: SkipScaling) -> dict[str, Any]:
    """What sizes the gates of a backbone's own SkipScaling: its skips' shapes (``skip_shapes``)."""
    if not scaling.learned:
        return {"num_tokens": None, "skip_channels": None}
    shapes = owner.skip_shapes(1) if callable(getattr(owner, "skip_shapes", None)) else None
    if not shapes:
        raise ScaleLongError(
            f"save_scalelong cannot tell the gate layout of {type(owner).__name__}: give it a "
            "skip_shapes(batch_size) method, as the package's backbones have"
        )
    if len(shapes[0]) == 3:  # (B, L, D) tokens
        return {"num_tokens": int(shapes[0][1]), "skip_channels": None}
    return {"num_tokens": None, "skip_channels": [int(s[1]) for s in shapes]}


def _block_paths(owner: nn.Module, scaling: SkipScaling) -> dict[str, str] | None:
    """The blocks the diagnostics watch, as paths in ``owner`` (None when they are not all in it)."""
    blocks = scaling.watched_blocks
    if not blocks:
        return None
    paths: dict[int, str] = {}
    for path, m in owner.named_modules():
        paths.setdefault(id(m), path)
    if not all(id(b) in paths for b in blocks.values()):
        return None
    return {name: paths[id(b)] for name, b in blocks.items()}


def _read_meta(meta_path: Path) -> dict[str, Any]:
    try:
        meta = json.loads(meta_path.read_text())
        if not isinstance(meta, dict) or not {"method", "kappa"} <= set(meta):  # what every version wrote
            raise TypeError("not a JSON object with method and kappa")
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError) as e:
        raise ScaleLongError(
            f"{meta_path} is not a valid ScaleLong file ({type(e).__name__}: {e}); save it again"
        ) from None
    if meta.get("format", FORMAT) > FORMAT:
        raise ScaleLongError(
            f"{meta_path} was written by a newer scalelong (format {meta['format']}); upgrade it"
        )
    return meta


def _get(model: nn.Module, path: str, directory: Path) -> nn.Module:
    if not path:
        return model
    try:
        return model.get_submodule(path)
    except AttributeError:
        raise ScaleLongError(
            f"{directory} was saved from a model that holds ScaleLong at {path!r}; this "
            f"{type(model).__name__} has no such submodule"
        ) from None


def _replay(target: nn.Module, meta: dict[str, Any], state: dict, directory: Path) -> None:
    """Install the saved declaration on ``target`` and load the gates (all or nothing)."""
    method, kappa, reduction = meta["method"], meta["kappa"], meta.get("reduction", 16)
    decl = meta.get("declaration")
    try:
        if decl is None:  # a file of the diffusers-UNet-only format: derive the layout again
            apply_scalelong(target, method, kappa, reduction=reduction, pretrained=False)
        else:
            skips = [SkipInput.from_dict(s) for s in decl["skips"]]
            blocks, layout = meta.get("blocks") or {}, meta.get("layout") or {}
            declared.install(
                target,
                method,
                kappa,
                skips,
                num_tokens=layout.get("num_tokens"),
                skip_channels=layout.get("skip_channels"),
                reduction=reduction,
                blocks={name: _get(target, p, directory) for name, p in blocks.items()},
                shapes=[None if s is None else tuple(s) for s in decl.get("shapes") or [None] * len(skips)],
            )
    except ScaleLongError:  # a declaration that does not fit this model: the installer's own words
        raise
    except (KeyError, TypeError, ValueError) as e:  # a declaration this version cannot read
        raise ScaleLongError(
            f"{META_FILE} holds a declaration this version cannot read ({e!r}); save it again"
        ) from None
    scaling = target.scalelong
    try:
        if scaling.num_skips != meta.get("num_skips", scaling.num_skips):
            raise ScaleLongError(
                f"saved for {meta['num_skips']} skips but this model has {scaling.num_skips}"
            )
        try:
            scaling.load_state_dict(state)  # copies onto the model's device
        except RuntimeError as e:
            fit = first_line(e, lines=3)
            raise ScaleLongError(f"{WEIGHTS_FILE} does not fit this model: {fit}") from None
    except ScaleLongError:
        remove_scalelong(target)
        raise


def _replace_builtin(target: nn.Module, meta: dict[str, Any], state: dict, directory: Path) -> None:
    """Rebuild the backbone's own SkipScaling with the saved method and load its gates."""
    path = meta["builtin"]
    try:
        current = target.get_submodule(path)
    except AttributeError:
        current = None
    if not isinstance(current, SkipScaling):
        raise ScaleLongError(
            f"saved from a backbone whose SkipScaling sits at {path!r}; this {type(target).__name__} has "
            "none there"
        )
    if current.num_skips != meta["num_skips"]:
        raise ScaleLongError(f"saved for {meta['num_skips']} skips but this model has {current.num_skips}")
    layout = meta.get("layout") or {}
    new = SkipScaling(
        meta["method"],
        meta["num_skips"],
        meta["kappa"],
        num_tokens=layout.get("num_tokens"),
        reduction=meta.get("reduction", 16),
        skip_channels=layout.get("skip_channels"),
    )
    try:
        new.load_state_dict(state)
    except RuntimeError as e:
        raise ScaleLongError(f"{WEIGHTS_FILE} does not fit this model: {first_line(e, lines=3)}") from None
    param = next(current.parameters(), None) or next(target.parameters(), None)
    if param is not None:
        new.to(device=param.device, dtype=param.dtype)
    parent_path, _, name = path.rpartition(".")
    setattr(target.get_submodule(parent_path) if parent_path else target, name, new)
