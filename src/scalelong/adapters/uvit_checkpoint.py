"""Load released U-ViT checkpoints (``nnet.pth`` and the like) into :class:`~scalelong.models.UViT`.

Our parameter names equal the release's (patch_embed.proj, pos_embed, in_blocks.N.*,
mid_block.*, out_blocks.N.skip_linear, norm, decoder_pred, final_layer, label_emb,
context_embed), so loading is a checked ``load_state_dict``. The release has no ScaleLong
parameters: ours (``skip_scaling.*``, learned methods only) keep their initialisation.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from scalelong.errors import ScaleLongError

OURS = "skip_scaling."


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A tensor dict from a torch ``.pth``/``.pt``/``.ckpt`` (weights only) or ``.safetensors`` file."""
    path = Path(path)
    if not path.is_file():
        raise ScaleLongError(f"U-ViT checkpoint not found: {path}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(path)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # any unreadable file is a user error, not a traceback
        raise ScaleLongError(f"cannot read U-ViT checkpoint {path}: {e}") from e
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ScaleLongError(f"{path} does not hold a state dict of tensors (name -> tensor)")
    return state


def load_uvit_checkpoint(path: str | Path, config: Any, strict: bool = True) -> torch.nn.Module:
    """Build a :class:`UViT` from ``config`` and load a released checkpoint into it.

    Args:
        path: the checkpoint file (torch state dict or safetensors).
        config: a :class:`~scalelong.config.ModelConfig` (its ``uvit`` section and skip method),
            a :class:`~scalelong.config.UViTConfig`, or a dict of ``UViT`` keyword arguments.
        strict: reject checkpoint entries the model does not have.

    Every model parameter except ours (``skip_scaling.*``) must be present with its exact shape;
    errors list the offending names and shapes.
    """
    from scalelong.config import ModelConfig, UViTConfig
    from scalelong.models.uvit import UViT

    if isinstance(config, ModelConfig):
        s = config.skip
        kwargs = {
            **vars(config.uvit),
            "skip_method": s.method,
            "kappa": s.kappa,
            "ls_reduction": s.ls_reduction,
        }
    elif isinstance(config, UViTConfig):
        kwargs = dataclasses.asdict(config)
    elif isinstance(config, dict):
        kwargs = dict(config)
    else:
        raise ScaleLongError(f"config must be a ModelConfig, UViTConfig or dict, got {type(config).__name__}")
    try:
        model = UViT(**kwargs)
    except TypeError as e:
        raise ScaleLongError(f"invalid U-ViT config: {e}") from e
    state = read_state_dict(path)

    expected = {k: v for k, v in model.state_dict().items() if not k.startswith(OURS)}
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected and not k.startswith(OURS)]
    wrong = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    problems = []
    if wrong:
        problems.append("shape mismatch: " + "; ".join(wrong[:8]) + (" ..." if len(wrong) > 8 else ""))
    if missing:
        problems.append(
            f"missing {len(missing)}: " + ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
        )
    if unexpected and strict:
        problems.append(
            f"unexpected {len(unexpected)}: "
            + ", ".join(unexpected[:8])
            + (" ..." if len(unexpected) > 8 else "")
        )
    if problems:
        raise ScaleLongError(
            f"U-ViT checkpoint {path} does not fit the config ({'; '.join(problems)}); check img_size, "
            "patch_size, embed_dim, depth, num_classes, context_dim, mlp_time_embed and conv_out against "
            "the release"
        )
    model.load_state_dict({k: state[k] for k in expected}, strict=False)
    return model
