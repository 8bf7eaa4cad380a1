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

For a backbone that calls its ``SkipScaling`` itself (``"builtin": "skip_scaling"``), ``layout``
holds every size the module is built from: ``num_tokens`` or ``skip_channels``, and ``skip_dim``,
``merge_dim`` and ``norm_groups`` (the norms of ``skip-norm`` and ``merge-norm``; ``cs-init``
needs a backbone that merges each skip through a layer of its own).

Files written by earlier versions for diffusers UNets (method, kappa, reduction, num_skips and
the weights' checksum only) still load: the UNet's layout is derived again.

Both functions look through DDP, ``DataParallel`` and ``torch.compile`` wrappers: what is saved
from a wrapped model loads into the plain one, and the other way round.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from torch import nn

from scalelong.adapters import apply_scalelong, declared, remove_scalelong
from scalelong.adapters.declared import SkipInput
from scalelong.diagnostics.overflow import unwrap
from scalelong.errors import ScaleLongError, first_line
from scalelong.skips import MERGE_LAYER_METHODS, SkipScaling

META_FILE, WEIGHTS_FILE = "scalelong.json", "scalelong.safetensors"
FORMAT = 1


def save_scalelong(model: nn.Module, directory: str | Path, save_model: bool | None = None) -> Path:
    """Write ScaleLong as applied to ``model`` into ``directory`` (created if needed); return it.

    Serves every model :func:`~scalelong.adapters.apply_scalelong` serves, the package's backbones
    built with a ``skip_method``, and any module that holds one of them. ``save_model``: also write
    the model's own files with its ``save_pretrained`` (diffusers), without the ScaleLong
    parameters; None (the default) does so whenever the model has ``save_pretrained``. A DDP,
    ``DataParallel`` or ``torch.compile`` wrapper is looked through: the folder is that of the
    model inside, and loads into it unwrapped.
    """
    from safetensors.torch import save_file

    model = unwrap(model)  # paths are recorded in the plain model, without '_orig_mod.' or 'module.'
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
    :class:`ScaleLongError` line, and the model is left as it was. A DDP, ``DataParallel`` or
    ``torch.compile`` wrapper is looked through (ScaleLong goes on the model inside it); the
    wrapper is returned as given.
    """
    from safetensors.torch import load as load_bytes

    given, model = model, unwrap(model)
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
    target = _get(model, _without_wrappers(model, meta.get("at", "")), directory)
    try:
        if meta.get("builtin"):
            _replace_builtin(target, meta, state, directory)
        else:
            _replay(target, meta, state, directory)
    except ScaleLongError as e:
        raise ScaleLongError(f"{directory}: {e}") from None
    return given


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
    """Every size a backbone's own SkipScaling is built from, so that :func:`_replace_builtin` builds
    it again: the skips' layout (``skip_shapes``: ``num_tokens`` or ``skip_channels``, and
    ``skip_dim``, the width of token skips), the norms' sizes read off the module itself
    (``skip-norm``: the LayerNorm width or the GroupNorms' widths and groups; ``merge-norm``: the
    width after the merge layer) and, for ``cs-init``, the merge width that tells a backbone with a
    merge layer per skip (the saved module was built, so the backbone has one)."""
    layout: dict[str, Any] = {
        "num_tokens": None,
        "skip_channels": None,
        "skip_dim": None,
        "merge_dim": None,
        "norm_groups": None,
    }
    shapes = owner.skip_shapes(1) if callable(getattr(owner, "skip_shapes", None)) else None
    if shapes and len(shapes) == scaling.num_skips and len(shapes[0]) == 3:  # (B, L, D) tokens
        layout.update(num_tokens=int(shapes[0][1]), skip_dim=int(shapes[0][2]))
    elif shapes and len(shapes) == scaling.num_skips:  # (B, C, H, W) feature maps
        layout["skip_channels"] = [int(s[1]) for s in shapes]
    if scaling.learned and layout["num_tokens"] is None and layout["skip_channels"] is None:
        raise ScaleLongError(
            f"save_scalelong cannot tell the gate layout of {type(owner).__name__}: give it a "
            "skip_shapes(batch_size) method, as the package's backbones have"
        )
    norms = list(scaling.norms)
    if scaling.method == "skip-norm" and norms:
        if all(isinstance(n, nn.GroupNorm) for n in norms):  # feature maps: the widths are the norms'
            layout["skip_channels"] = [int(n.num_channels) for n in norms]
            # each GroupNorm has min(norm_groups, width) groups: the largest gives them all back
            layout["norm_groups"] = max(int(n.num_groups) for n in norms)
        elif all(isinstance(n, nn.LayerNorm) for n in norms):
            layout["skip_dim"] = int(norms[0].normalized_shape[-1])
    elif scaling.method == "merge-norm" and norms:
        layout["merge_dim"] = int(norms[0].normalized_shape[-1])
    elif scaling.method in MERGE_LAYER_METHODS:  # cs-init: the value only says there is a merge layer
        layout["merge_dim"] = layout["skip_dim"]
    return layout


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


def _without_wrappers(model: nn.Module, path: object) -> object:
    """``at`` without the wrapper prefixes (``module.``, ``_orig_mod.``) that earlier versions recorded
    when saving a wrapped model, where this model has no such submodule."""
    while isinstance(path, str) and path.split(".")[0] in ("module", "_orig_mod"):
        try:
            model.get_submodule(path)
            break
        except AttributeError:
            path = path.partition(".")[2]
    return path


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
    _check_builtin_layout(target, layout)
    sizes = {k: layout[k] for k in ("skip_dim", "merge_dim", "norm_groups") if layout.get(k) is not None}
    try:
        new = SkipScaling(
            meta["method"],
            meta["num_skips"],
            meta["kappa"],
            num_tokens=layout.get("num_tokens"),
            reduction=meta.get("reduction", 16),
            skip_channels=layout.get("skip_channels"),
            **sizes,
        )
    except (TypeError, ValueError) as e:  # a layout this version cannot read
        raise ScaleLongError(
            f"{META_FILE} holds a layout this version cannot read ({e!r}); save it again"
        ) from None
    try:
        new.load_state_dict(state)
    except RuntimeError as e:
        raise ScaleLongError(f"{WEIGHTS_FILE} does not fit this model: {first_line(e, lines=3)}") from None
    # never `a or b` on parameters: bool() of a tensor of more than one value raises
    param = next(current.parameters(), None)
    if param is None:
        param = next(target.parameters(), None)
    if param is not None:
        new.to(device=param.device, dtype=param.dtype)
    parent_path, _, name = path.rpartition(".")
    setattr(target.get_submodule(parent_path) if parent_path else target, name, new)


def _check_builtin_layout(target: nn.Module, layout: dict[str, Any]) -> None:
    """Refuse, in one line, a layout saved from a backbone whose skips are not this one's: token
    skips into a convolutional backbone, other widths or token counts (the norms of ``skip-norm``
    and ``merge-norm`` would load, but serve skips the model does not make). What the file does not
    record (earlier versions recorded the gates' sizes only) is not compared."""
    shapes = target.skip_shapes(1) if callable(getattr(target, "skip_shapes", None)) else None
    if not shapes:
        return
    tokens, width, channels = layout.get("num_tokens"), layout.get("skip_dim"), layout.get("skip_channels")
    if len(shapes[0]) == 3:  # (B, L, D)
        mine = f"token skips of {shapes[0][1]} tokens of width {shapes[0][2]}"
        fits = channels is None and tokens in (None, shapes[0][1]) and width in (None, shapes[0][2])
    else:  # (B, C, H, W)
        mine = f"feature-map skips of {[s[1] for s in shapes]} channels"
        fits = tokens is None and width is None and channels in (None, [s[1] for s in shapes])
    if not fits:
        saved = (
            f"feature-map skips of {list(channels)} channels"
            if channels is not None
            else f"token skips of {tokens} tokens of width {width}"
        )
        raise ScaleLongError(f"saved from a backbone with {saved}; this {type(target).__name__} has {mine}")
