"""Turn a config into objects: the model, the noise schedule, the dataset."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

from scalelong.adapters.diffusers import build_diffusers_unet2d
from scalelong.config import Config, DataConfig, DiffusionConfig, ModelConfig, resolved_kappa
from scalelong.data import check_batches, load_dataset
from scalelong.diffusion import VPSDE, DiscreteDDPM, Schedule
from scalelong.errors import ScaleLongError
from scalelong.models import UNet, UViT


def build_model(cfg: ModelConfig, device: torch.device | str | None = None) -> nn.Module:
    """The backbone with ScaleLong on its long skips, initialised from the current RNG state.

    ``device="meta"`` builds shapes without weights: enough for parameter counts and the skip table.
    """
    if device is not None:
        with torch.device(device):
            return build_model(cfg)
    s, kappa = cfg.skip, resolved_kappa(cfg)
    if cfg.type == "uvit":
        return UViT(**vars(cfg.uvit), skip_method=s.method, kappa=kappa, ls_reduction=s.ls_reduction)
    if cfg.type == "unet":
        return UNet(**vars(cfg.unet), skip_method=s.method, kappa=kappa, ls_reduction=s.ls_reduction)
    if cfg.type == "diffusers_unet2d":  # diffusers itself is imported only here
        d = dict(vars(cfg.diffusers_unet2d))
        d["out_channels"] = d["in_channels"]
        return build_diffusers_unet2d(d, method=s.method, kappa=kappa, reduction=s.ls_reduction)
    raise ScaleLongError(f"model.type={cfg.type!r} is not supported")


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
    return load_dataset(cfg.name, cfg.path, cfg.split, cfg.resolution, cfg.channels, check)


def model_input_shape(cfg: ModelConfig) -> tuple[int, int, int]:
    """(C, H, W) the model expects."""
    if cfg.type == "unet":
        return (cfg.unet.in_channels, cfg.unet.img_size, cfg.unet.img_size)
    if cfg.type == "diffusers_unet2d":
        d = cfg.diffusers_unet2d
        return (d.in_channels, d.sample_size, d.sample_size)
    u = cfg.uvit
    return (u.in_channels, u.img_size, u.img_size)


def check_data_fits_model(cfg: Config, dataset: Dataset, world_size: int = 1) -> None:
    """A ScaleLongError unless the dataset's images have the model's input shape and the data fills
    one global batch that splits over ``world_size`` processes (checked before a run touches disk)."""
    check_batches(len(dataset), cfg.train.batch_size, world_size)
    image = dataset[0][0]
    expected = model_input_shape(cfg.model)
    if tuple(image.shape) != expected:
        raise ScaleLongError(
            f"data {cfg.data.name!r} gives images of shape {tuple(image.shape)} but the model expects "
            f"{expected}; set the channels / size keys of model.{cfg.model.type} to match"
        )


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
