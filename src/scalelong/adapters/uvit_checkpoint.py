"""Load released U-ViT checkpoints (``nnet.pth`` and the like) into :class:`~scalelong.models.UViT`.

Our parameter names equal the release's (patch_embed.proj, pos_embed, time_embed, label_emb,
context_embed, in_blocks.N.*, mid_block.*, out_blocks.N.skip_linear, norm, decoder_pred,
final_layer), so those load as they are. The ScaleLong release (sail-sg/ScaleLong,
``libs/uvit.py``) also stores its learned LS gates, which are renamed to ours:

- ``scalelong=3`` (LS, shared; our ``ls``): ``se.layer1.*``, ``se.layer2.*``
  -> ``skip_scaling.gates.0.excite.0.*``, ``skip_scaling.gates.0.excite.2.*``;
- ``scalelong=4`` (LS per skip; our ``ls-nonshare``): ``se.{k}.layer{1,2}.*`` serves the
  k-th out-block, i.e. skip N - k counted from the innermost (k = 0 is our skip N), and goes
  to ``skip_scaling.gates.{N - 1 - k}.*`` (our gate ``i - 1`` serves skip i, 1 = outermost).

Checkpoints written by this library (``skip_scaling.*``) load unchanged. A checkpoint without
gates loaded into a learned method leaves the gates at their initialisation (fine-tuning a
released model with LS). Nothing in the file is dropped silently: a tensor left over is an
error that names it (a warning with ``strict=False``).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from scalelong.errors import ScaleLongError
from scalelong.models.uvit import UViT

OURS = "skip_scaling."
# The release's LS gates: se.layer{1,2}.* (shared) or se.{k}.layer{1,2}.* (k-th out-block).
RELEASE_GATE = re.compile(r"se\.(?:(\d+)\.)?layer([12])\.(weight|bias)")
RELEASE_MODE = {"ls": "scalelong=3, shared LS", "ls-nonshare": "scalelong=4, LS per skip"}


def _listed(names: list[str], limit: int = 8) -> str:
    return f"{len(names)}: " + ", ".join(names[:limit]) + (" ..." if len(names) > limit else "")


def map_release_gates(state: dict[str, torch.Tensor], method: str, num_skips: int) -> dict[str, torch.Tensor]:
    """``state`` with the release's LS gates (``se.*``) renamed to ours (see the module docstring).

    Raises :class:`ScaleLongError` when the gates belong to another method than ``method``.
    Keys under ``se.`` that fit no gate of the model stay as they are (and are reported later).
    """
    gates = {k: RELEASE_GATE.fullmatch(k) for k in state if k.startswith("se.")}
    if not gates:
        return state
    kinds = {"ls" if m.group(1) is None else "ls-nonshare" for m in gates.values() if m is not None}
    if len(kinds) != 1:
        raise ScaleLongError(
            "the checkpoint's LS gates (se.*) follow no layout of the release: "
            + ", ".join(sorted(gates)[:8])
            + "; expected se.layer1.*, se.layer2.* (shared) or se.<k>.layer1.*, se.<k>.layer2.* (per skip)"
        )
    (kind,) = kinds
    if method != kind:
        raise ScaleLongError(
            f"the checkpoint holds the release's LS gates ({RELEASE_MODE[kind]}, se.*) but the skip "
            f"method is {method!r}; build the UViT with skip_method={kind!r}"
        )
    out = {k: v for k, v in state.items() if k not in gates}
    for key, m in gates.items():
        gate = 0 if m is None or m.group(1) is None else num_skips - 1 - int(m.group(1))
        if m is None or gate < 0:
            out[key] = state[key]  # left over: no gate of this model
            continue
        layer = "0" if m.group(2) == "1" else "2"  # excite = Linear, ReLU, Linear, Sigmoid
        out[f"{OURS}gates.{gate}.excite.{layer}.{m.group(3)}"] = state[key]
    return out


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


def load_uvit_checkpoint(
    path: str | Path, model: torch.nn.Module | Mapping[str, Any], strict: bool = True
) -> torch.nn.Module:
    """Load a released checkpoint into a :class:`UViT`; return the model.

    Args:
        path: the checkpoint file (torch state dict or safetensors).
        model: the :class:`~scalelong.models.UViT` to load into, or a dict of ``UViT`` keyword
            arguments to build it from (its ``skip_method``, ``kappa`` and ``ls_reduction``
            included). ``scalelong train``'s model config gives them through
            :func:`scalelong.training.build.uvit_kwargs`.
        strict: reject checkpoint entries the model does not have (an error naming them);
            ``False`` ignores them with a warning that names them.

    Every model parameter must be present with its exact shape, except our LS gates when the
    checkpoint has none; errors list the offending names and shapes.
    """
    if isinstance(model, Mapping):
        try:
            model = UViT(**model)
        except TypeError as e:
            raise ScaleLongError(f"invalid U-ViT arguments: {e}") from e
    elif not isinstance(model, UViT):
        raise ScaleLongError(f"model must be a UViT or a dict of UViT arguments, got {type(model).__name__}")
    state = read_state_dict(path)
    try:
        state = map_release_gates(state, model.skip_scaling.method, model.num_skips)
    except ScaleLongError as e:
        raise ScaleLongError(f"U-ViT checkpoint {path}: {e}") from None

    expected = model.state_dict()
    ours = [k for k in expected if k.startswith(OURS)]
    # Our gates are loaded when the checkpoint has any (then all), else they keep their init.
    required = [k for k in expected if not k.startswith(OURS) or any(o in state for o in ours)]
    missing = [k for k in required if k not in state]
    unexpected = [k for k in state if k not in expected]
    wrong = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    problems = []
    if wrong:
        problems.append("shape mismatch: " + "; ".join(wrong[:8]) + (" ..." if len(wrong) > 8 else ""))
    if missing:
        problems.append("missing " + _listed(missing))
    if unexpected and strict:
        problems.append("unexpected " + _listed(unexpected))
    if problems:
        raise ScaleLongError(
            f"U-ViT checkpoint {path} does not fit the model ({'; '.join(problems)}); check img_size, "
            "patch_size, embed_dim, depth, num_classes, context_dim, mlp_time_embed, conv_out, mlp_conv "
            "(the release has none) and the skip method against the release"
        )
    if unexpected:
        warnings.warn(f"U-ViT checkpoint {path}: ignored {_listed(unexpected, 32)}", stacklevel=2)
    model.load_state_dict({k: state[k] for k in expected if k in state}, strict=False)
    return model
