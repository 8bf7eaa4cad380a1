"""Turn a config into objects: the model, the noise schedule, the dataset.

The models are the package's backbones; for ``model.type=diffusers_unet2d``, a diffusers
``UNet2DModel`` with ScaleLong applied behind the backbones' interface (:class:`DiffusersUNet2D`,
the trainer's wrapper; the library itself serves the raw UNet); and for ``model.type=python``
your own network from its ``module:function`` (:mod:`scalelong.training.user_model`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from scalelong.adapters import apply_scalelong
from scalelong.adapters.diffusers import skip_layout
from scalelong.data import check_batches, load_dataset
from scalelong.diffusion import VPSDE, DiscreteDDPM, Schedule
from scalelong.errors import ScaleLongError
from scalelong.models import UNet, UViT, conditioning
from scalelong.skips import KAPPA_METHODS, PAPER_METHODS, skip_table
from scalelong.training.config import Config, DataConfig, DiffusionConfig, ModelConfig, resolved_kappa
from scalelong.training.user_model import build_user_model

# Per model.type: the backbone's name in messages, and the keys that set the shapes it checks.
_BACKBONE_KEYS = {
    "uvit": ("U-ViT", "img_size, patch_size, embed_dim, num_heads or depth"),
    "unet": ("UNet", "base_channels, channel_mult, norm_groups or img_size"),
    "diffusers_unet2d": (
        "diffusers UNet2DModel",
        "block_out_channels, norm_num_groups, down_block_types, up_block_types or sample_size",
    ),
    "python": ("network of model.python.builder", "kwargs, in_channels or img_size"),
}


def build_model(cfg: ModelConfig, device: torch.device | str | None = None) -> nn.Module:
    """The backbone with ScaleLong on its long skips, initialised from the current RNG state.

    ``device="meta"`` builds shapes without weights: enough for parameter counts and the skip table.
    Anything the backbone's constructor raises (PyTorch's, diffusers' or its own checks) becomes
    one ScaleLongError naming ``model.<type>`` and the keys to change.
    """
    if device is not None:
        with torch.device(device):
            return build_model(cfg)
    if cfg.type not in _BACKBONE_KEYS:
        raise ScaleLongError(f"model.type={cfg.type!r} is not supported")
    if cfg.type == "diffusers_unet2d":
        import_diffusers()  # a missing extra is its own message, not a rejected shape
    if cfg.type == "python":  # its own messages: which part of the builder failed
        return build_user_model(cfg)
    try:
        return _construct(cfg)
    except Exception as e:  # the constructors raise many types; each one means this config
        raise _rejected(cfg, "rejects this config", e) from e


def uvit_kwargs(cfg: ModelConfig) -> dict[str, Any]:
    """The ``UViT`` keyword arguments of a model config (``model.uvit`` and ``model.skip``), e.g.
    for :func:`scalelong.adapters.load_uvit_checkpoint`."""
    s = cfg.skip
    return {
        **vars(cfg.uvit),
        "skip_method": s.method,
        "kappa": resolved_kappa(cfg),
        "ls_reduction": s.ls_reduction,
    }


def _construct(cfg: ModelConfig) -> nn.Module:
    s, kappa = cfg.skip, resolved_kappa(cfg)
    if cfg.type == "uvit":
        return UViT(**uvit_kwargs(cfg))
    if cfg.type == "unet":
        return UNet(**vars(cfg.unet), skip_method=s.method, kappa=kappa, ls_reduction=s.ls_reduction)
    d = dict(vars(cfg.diffusers_unet2d))  # diffusers itself is imported only here
    d["out_channels"] = d["in_channels"]
    return build_diffusers_unet2d(d, method=s.method, kappa=kappa, reduction=s.ls_reduction)


def _rejected(cfg: ModelConfig, what: str, e: BaseException) -> ScaleLongError:
    """The one-line error for a shape the backbone of ``cfg`` rejects: ``model.<type>: the <backbone>
    <what>: <reason>; change <keys>``."""
    name, keys = _BACKBONE_KEYS[cfg.type]
    if isinstance(e, ScaleLongError) and e.__cause__ is not None:  # an adapter's wrapping: say the cause
        e = e.__cause__
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    reason = lines[0].rstrip(".") if lines else type(e).__name__
    advice = f"model.{cfg.type}.{keys}"
    if cfg.type == "uvit" and cfg.skip.method.startswith("ls"):  # the token gates need enough tokens
        advice += ", or model.skip.ls_reduction"
    return ScaleLongError(f"model.{cfg.type}: the {name} {what}: {reason}; change {advice}")


def import_diffusers() -> Any:
    try:
        import diffusers
    except ImportError as e:
        raise ScaleLongError(
            "model.type=diffusers_unet2d needs diffusers: pip install scalelong[diffusers]"
        ) from e
    return diffusers


class DiffusersUNet2D(nn.Module):
    """A diffusers ``UNet2DModel`` behind the package's backbone interface (the trainer's wrapper).

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
    config: dict[str, Any], method: str, kappa: float | None = None, reduction: int = 16
) -> DiffusersUNet2D:
    """A fresh ``UNet2DModel`` from keyword ``config`` with ScaleLong applied, wrapped."""
    diffusers = import_diffusers()
    try:
        unet = diffusers.UNet2DModel(**config)
    except (ValueError, TypeError, KeyError) as e:
        raise ScaleLongError(f"model.diffusers_unet2d: diffusers rejected the config: {e}") from e
    apply_scalelong(unet, method, kappa, reduction=reduction, pretrained=False)
    return DiffusersUNet2D(unet)


# Up to this many parameters the check builds and runs the model on the CPU for real: torch's
# meta kernels import sympy and ~900 other modules on their first use (about 1.5 s of start-up in
# every process), while building and running the demo's U-ViT takes 0.06 s; initialising the
# weights grows with their number and reaches the meta kernels' cost at about 40M parameters.
CHECK_ON_CPU_PARAMETERS = 20_000_000


def check_model(cfg: ModelConfig) -> nn.Module:
    """Build the model and pass one input through it; return that model.

    A model of up to ``CHECK_ON_CPU_PARAMETERS`` is built and run on the CPU at batch 1, with the
    RNG state given back afterwards, so a run's initialisation is unchanged; a larger one (the
    131M-parameter ImageNet 64 U-ViT) on the meta device, where no weight is made and nothing
    computed. Either takes well under a second. Every shape the backbone rejects, in its
    constructor or in its forward pass (a decoder whose upsampled side misses its skip's),
    becomes one ScaleLongError that names ``model.<type>`` and the keys to change, before any
    data is read or any file written. The command line calls it once per distinct model config
    before it starts anything (``train``, ``info``, ``--dry-run``, and every run of ``compare``
    and ``sweep`` through :func:`check_models`); :func:`build_model` alone catches only the
    constructor's errors.
    """
    model = build_model(cfg, device="meta")
    device = "cpu" if count_parameters(model) <= CHECK_ON_CPU_PARAMETERS else "meta"
    shape = model_input_shape(cfg)
    with torch.random.fork_rng(devices=[]), torch.device(device):  # what it draws is given back
        if device == "cpu":
            model = build_model(cfg)  # not meta.to_empty(): that, too, goes through the meta kernels
        x, t = torch.zeros(1, *shape), torch.full((1,), 0.5)
        if getattr(model, "context_embed", None) is not None:  # text-conditional: one caption's tokens
            labels = torch.zeros(1, cfg.uvit.context_tokens, cfg.uvit.context_dim)
        else:
            labels = torch.zeros(1, dtype=torch.long)
        try:
            with torch.no_grad():
                model(x, t, **conditioning(model, labels))
        except Exception as e:
            raise _rejected(cfg, f"fails on a {'x'.join(map(str, shape))} input", e) from e
    return model


def check_models(cfgs: Iterable[Config]) -> None:
    """:func:`check_model` for every run of a study before any of them starts, once per distinct
    model config (the seeds of a method share one); a rejected one is named by its run."""
    seen: set[str] = set()
    for cfg in cfgs:
        key = repr(cfg.model)  # a dataclass's repr spells out every field
        if key in seen:
            continue
        seen.add(key)
        try:
            check_model(cfg.model)
        except ScaleLongError as e:
            raise ScaleLongError(f"run {cfg.name}: {e}") from None


def build_schedule(cfg: DiffusionConfig) -> Schedule:
    if cfg.schedule == "vpsde":
        return VPSDE(
            cfg.beta_min,
            cfg.beta_max,
            prediction=cfg.prediction,
            time_sampling=cfg.time_sampling,
            logsnr_mean=cfg.logsnr_mean,
            logsnr_std=cfg.logsnr_std,
            loss_weighting=cfg.loss_weighting,
            min_snr_gamma=cfg.min_snr_gamma,
        )
    return DiscreteDDPM(
        cfg.num_steps,
        cfg.beta_schedule,
        cfg.beta_start,
        cfg.beta_end,
        prediction=cfg.prediction,
        loss_weighting=cfg.loss_weighting,
        min_snr_gamma=cfg.min_snr_gamma,
    )


def build_dataset(cfg: DataConfig, check: bool = True) -> Dataset:
    """The dataset the config names; a wrong path or a damaged file is a one-line ScaleLongError
    (``check``: every image file is decoded first, see :func:`scalelong.data.load_dataset`)."""
    heldout = cfg.heldout or 0  # resolved by validation; None only in a config never validated
    return load_dataset(
        cfg.name, cfg.path, cfg.split, cfg.resolution, cfg.channels, check, heldout, cfg.heldout_seed
    )


def model_input_shape(cfg: ModelConfig) -> tuple[int, int, int]:
    """(C, H, W) the model expects."""
    if cfg.type == "unet":
        return (cfg.unet.in_channels, cfg.unet.img_size, cfg.unet.img_size)
    if cfg.type == "diffusers_unet2d":
        d = cfg.diffusers_unet2d
        return (d.in_channels, d.sample_size, d.sample_size)
    if cfg.type == "python":
        return (cfg.python.in_channels, cfg.python.img_size, cfg.python.img_size)
    u = cfg.uvit
    return (u.in_channels, u.img_size, u.img_size)


def check_data_fits_model(cfg: Config, dataset: Dataset, world_size: int = 1) -> None:
    """A ScaleLongError unless the dataset's images have the model's input shape and the data fills
    one global batch that splits over ``world_size`` processes (checked before a run touches disk)."""
    check_batches(len(dataset), cfg.train.batch_size, world_size)
    image = dataset[0][0]
    expected = model_input_shape(cfg.model)
    (h, w), side = image.shape[1:], expected[1]
    if h < side or w < side:  # never enlarged silently: the model would learn the blur
        resize = " (or data.resolution to crop and resize them)" if cfg.data.name == "folder" else ""
        raise ScaleLongError(
            f"data {cfg.data.name!r} gives {h}x{w} images, smaller than the {side}x{side} input of the "
            f"model; use images of at least that size{resize}, or set the size keys of "
            f"model.{cfg.model.type} to match"
        )
    if tuple(image.shape) != expected:
        raise ScaleLongError(
            f"data {cfg.data.name!r} gives images of shape {tuple(image.shape)} but the model expects "
            f"{expected}; set the channels / size keys of model.{cfg.model.type} to match"
        )


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def model_summary(cfg: ModelConfig, model: nn.Module) -> str:
    """What ``scalelong info`` says of a config's model: its type and parameter count, the skip
    method (with kappa where the method reads it) and the skip table of
    :func:`scalelong.skips.skip_table`."""
    method = cfg.skip.method
    skips = (
        f"skips: {method}"
        + (f", kappa={cfg.skip.kappa:g}" if method in KAPPA_METHODS else "")
        + ("" if method in PAPER_METHODS else " (not one of the paper's methods; docs/method.md)")
    )
    return "\n".join([f"model: {cfg.type}, {count_parameters(model):,} parameters", skips, skip_table(model)])
