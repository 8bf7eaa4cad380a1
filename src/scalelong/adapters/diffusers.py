"""ScaleLong for diffusers UNets, without forking them.

``apply_scalelong(unet, method=..., kappa=...)`` registers one :class:`SkipScaling` as the
submodule ``unet.scalelong`` and a forward pre-hook on every up block that scales the block's
incoming ``res_hidden_states_tuple``. Scaling happens on the consumer side only: on the
producer side the same tensors are also the encoder's main path.

The hook is a plain function that finds its :class:`SkipScaling` through the up block it is
attached to (an unregistered reference in the block's ``__dict__``), never through a closure,
so ``copy.deepcopy`` (an EMA model) gets hooks that use the copy's own parameters, and
``.to()``, ``state_dict`` and optimizers see the parameters once, under ``scalelong.*``.

It also declares the UNet's blocks to the diagnostics (``SkipScaling.watch_blocks``, in forward
order: ``down_blocks.0``, ..., ``mid_block``, ``up_blocks.0``, ...), so ``Diagnostics`` records
them through any module that holds the UNet, :class:`DiffusersUNet2D` included, and in a deep copy
(an EMA model) the copy's own blocks.

Skip indices follow the package convention: 1 = conv-in output (outermost), N = last
down-block output (innermost). diffusers hands each up block the last ``len(block.resnets)``
entries of its skip tuple, so up block k receives the consecutive indices ending at
N - (skips taken by the up blocks before it).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scalelong.errors import ScaleLongError
from scalelong.skips import DEFAULT_KAPPA, SkipScaling

SUPPORTED = ("UNet2DModel", "UNet2DConditionModel")
_REF, _FIRST, _HOOK = "_scalelong_scaling", "_scalelong_first_index", "_scalelong_hook_id"
META_FILE, WEIGHTS_FILE = "scalelong.json", "scalelong.safetensors"


def import_diffusers() -> Any:
    try:
        import diffusers
    except ImportError as e:
        raise ScaleLongError(
            "ScaleLong for diffusers models needs diffusers: pip install scalelong[diffusers]"
        ) from e
    return diffusers


def _unet(model: nn.Module) -> nn.Module:
    """The diffusers UNet itself (unwraps :class:`DiffusersUNet2D`); raise unless supported."""
    if isinstance(model, DiffusersUNet2D):
        model = model.unet
    diffusers = import_diffusers()
    if not isinstance(model, tuple(getattr(diffusers, name) for name in SUPPORTED)):
        raise ScaleLongError(
            f"apply_scalelong supports diffusers {' and '.join(SUPPORTED)}, got {type(model).__name__}; "
            "for the package's own backbones set model.skip.method in the config instead"
        )
    return model


def skip_layout(unet: nn.Module) -> list[tuple[int, int | None, int | None]]:
    """(channels, height, width) of every skip, outermost first; sides are None without sample_size."""
    size = unet.config.sample_size
    h, w = (size, size) if isinstance(size, int) else (tuple(size) if size else (None, None))
    layout = [(unet.conv_in.out_channels, h, w)]
    for block in unet.down_blocks:
        layout += [(r.out_channels, h, w) for r in block.resnets]
        if getattr(block, "downsamplers", None):
            h, w = (None, None) if h is None else ((h + 1) // 2, (w + 1) // 2)
            layout.append((block.downsamplers[0].out_channels, h, w))
    consumed = sum(len(b.resnets) for b in unet.up_blocks)
    if consumed != len(layout):
        raise ScaleLongError(
            f"{type(unet).__name__} produces {len(layout)} skips but its up blocks consume {consumed}; "
            "this block layout is not supported"
        )
    return layout


def unet_blocks(unet: nn.Module) -> dict[str, nn.Module]:
    """The UNet's blocks in forward order, named as in its state dict: ``down_blocks.0``, ...,
    ``mid_block`` (when it has one), ``up_blocks.0``, ... (diffusers registers ``up_blocks``
    before ``mid_block``, so registration order is not forward order)."""
    blocks = {f"down_blocks.{i}": b for i, b in enumerate(unet.down_blocks)}
    if unet.mid_block is not None:
        blocks["mid_block"] = unet.mid_block
    blocks.update((f"up_blocks.{i}", b) for i, b in enumerate(unet.up_blocks))
    return blocks


def _scale_skips_hook(block: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook of an up block: scale its skip tuple, leave everything else alone."""
    scaling: SkipScaling = block.__dict__[_REF]
    first = block.__dict__[_FIRST]
    if "res_hidden_states_tuple" in kwargs:  # UNet2DConditionModel passes it by keyword
        skips = kwargs["res_hidden_states_tuple"]
        kwargs = {**kwargs, "res_hidden_states_tuple": _scaled(scaling, skips, first)}
    else:  # UNet2DModel: upsample_block(sample, res_samples, emb[, skip_sample])
        args = (args[0], _scaled(scaling, args[1], first), *args[2:])
    return args, kwargs


def _scaled(scaling: SkipScaling, skips: tuple, first: int) -> tuple:
    return tuple(scaling(s, first + j) for j, s in enumerate(skips))


def is_applied(model: nn.Module) -> bool:
    return isinstance(getattr(_unet(model), "scalelong", None), SkipScaling)


def apply_scalelong(
    model: nn.Module, method: str = "cs", kappa: float = DEFAULT_KAPPA["unet"], *, reduction: int = 16
) -> nn.Module:
    """Scale the long skips of a diffusers ``UNet2DModel`` / ``UNet2DConditionModel`` in place.

    Args:
        model: the diffusers UNet (or a :class:`DiffusersUNet2D` wrapping one).
        method: one of ``scalelong.skips.METHODS``.
        kappa: base of ``cs``; skip i (1 = conv-in output) gets ``kappa ** (i - 1)``; the default
            0.9 is the UNet default measured by ``benchmarks/unet_kappa_sweep.py``.
        reduction: squeeze-excitation reduction of the LS gates.

    New LS parameters live in ``model.scalelong``; create the optimizer after this call.
    Returns ``model``.
    """
    unet = _unet(model)
    if is_applied(unet) or any(_HOOK in b.__dict__ for b in unet.up_blocks):
        raise ScaleLongError("ScaleLong is already applied to this model; call remove_scalelong(model) first")
    layout = skip_layout(unet)
    param = next(unet.parameters())
    scaling = SkipScaling(
        method, len(layout), kappa, reduction=reduction, skip_channels=[c for c, _, _ in layout]
    ).to(device=param.device, dtype=param.dtype)
    unet.scalelong = scaling
    remaining = len(layout)
    for block in unet.up_blocks:
        remaining -= len(block.resnets)
        block.__dict__[_REF] = scaling  # not a submodule: the parameters belong to unet.scalelong
        block.__dict__[_FIRST] = remaining + 1
        handle = block.register_forward_pre_hook(_scale_skips_hook, with_kwargs=True)
        block.__dict__[_HOOK] = handle.id
    scaling.watch_blocks(unet_blocks(unet))  # what the diagnostics record, also through a wrapper
    return model


def remove_scalelong(model: nn.Module) -> nn.Module:
    """Undo :func:`apply_scalelong`: remove the hooks and ``model.scalelong``. Returns ``model``."""
    unet = _unet(model)
    if not is_applied(unet):
        raise ScaleLongError("ScaleLong is not applied to this model; nothing to remove")
    for block in unet.up_blocks:
        hook_id = block.__dict__.pop(_HOOK)
        block._forward_pre_hooks.pop(hook_id, None)
        block._forward_pre_hooks_with_kwargs.pop(hook_id, None)
        block.__dict__.pop(_REF)
        block.__dict__.pop(_FIRST)
    unet.scalelong.watch_blocks({})  # a kept reference to the removed module holds no blocks
    del unet.scalelong
    return model


def save_scalelong(model: nn.Module, directory: str | Path, save_model: bool = True) -> Path:
    """Save method, kappa and LS weights as ``scalelong.json`` + ``scalelong.safetensors``.

    With ``save_model`` the diffusers weights and config are written too (``save_pretrained``),
    without the ScaleLong parameters, so ``from_pretrained`` loads them cleanly.
    """
    from safetensors.torch import save_file

    unet = _unet(model)
    if not is_applied(unet):
        raise ScaleLongError("ScaleLong is not applied to this model; call apply_scalelong first")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    scaling: SkipScaling = unet.scalelong
    if save_model:
        del unet._modules["scalelong"]  # keep diffusers' files exactly those of the plain model
        try:
            unet.save_pretrained(directory)
        finally:
            unet.scalelong = scaling
    state = {k: v.detach().cpu().contiguous() for k, v in scaling.state_dict().items()}
    save_file(state, directory / WEIGHTS_FILE)
    data = (directory / WEIGHTS_FILE).read_bytes()
    meta = {
        "method": scaling.method,
        "kappa": scaling.kappa,
        "reduction": scaling.reduction,
        "num_skips": scaling.num_skips,
        "weights": {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()},
    }
    (directory / META_FILE).write_text(json.dumps(meta, indent=1))  # last: it vouches for the weights
    return directory


def load_scalelong(model: nn.Module, directory: str | Path) -> nn.Module:
    """Apply the method saved by :func:`save_scalelong` to ``model`` and load its LS weights, after
    checking them against the size and sha256 that ``scalelong.json`` records (files saved before
    it recorded them are loaded unchecked)."""
    from safetensors.torch import load as load_bytes

    directory = Path(directory)
    meta_path, weights_path = directory / META_FILE, directory / WEIGHTS_FILE
    if not meta_path.is_file() or not weights_path.is_file():
        raise ScaleLongError(f"{directory} holds no ScaleLong files ({META_FILE}, {WEIGHTS_FILE})")
    try:
        meta = json.loads(meta_path.read_text())
        method, kappa, reduction = meta["method"], meta["kappa"], meta.get("reduction", 16)
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ScaleLongError(f"{meta_path} is not a valid ScaleLong file: {e}") from e
    data = weights_path.read_bytes()
    expected = meta.get("weights")
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
    apply_scalelong(model, method=method, kappa=kappa, reduction=reduction)
    scaling = _unet(model).scalelong
    if scaling.num_skips != meta.get("num_skips", scaling.num_skips):
        remove_scalelong(model)
        raise ScaleLongError(
            f"{directory} was saved for {meta['num_skips']} skips but this model has {scaling.num_skips}"
        )
    try:
        scaling.load_state_dict(state)  # copies onto the model's device
    except RuntimeError as e:
        remove_scalelong(model)
        raise ScaleLongError(f"{weights_path} does not fit this model: {e}") from e
    return model


class DiffusersUNet2D(nn.Module):
    """A diffusers ``UNet2DModel`` behind the package's backbone interface.

    ``forward(x, t, y=None)`` returns the tensor (not diffusers' output object), so the trainer
    and samplers use it like :class:`~scalelong.models.UViT`; the diffusers model stays the
    submodule ``unet`` (with ScaleLong inside it as ``unet.scalelong``).
    """

    def __init__(self, unet: nn.Module):
        super().__init__()
        self.unet = unet
        size = unet.config.sample_size
        self.img_size = size if isinstance(size, int) else size[0]
        self.in_channels = unet.config.in_channels
        self.num_classes = unet.config.num_class_embeds or 0

    def skip_shapes(self, batch_size: int = 1) -> list[tuple[int, ...]]:
        """Shape of every long skip, outermost first."""
        return [(batch_size, c, h, w) for c, h, w in skip_layout(self.unet)]

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        return self.unet(x, t, class_labels=y, return_dict=False)[0]


def build_diffusers_unet2d(
    config: dict[str, Any], method: str = "none", kappa: float = DEFAULT_KAPPA["unet"], reduction: int = 16
) -> DiffusersUNet2D:
    """A fresh ``UNet2DModel`` from keyword ``config`` with ScaleLong applied, wrapped."""
    diffusers = import_diffusers()
    try:
        unet = diffusers.UNet2DModel(**config)
    except (ValueError, TypeError, KeyError) as e:
        raise ScaleLongError(f"model.diffusers_unet2d: diffusers rejected the config: {e}") from e
    apply_scalelong(unet, method=method, kappa=kappa, reduction=reduction)
    return DiffusersUNet2D(unet)
