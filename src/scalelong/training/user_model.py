"""Your own denoiser in ``scalelong train``, ``compare`` and ``sweep`` (``model.type=python``).

``model.python.builder`` names the function that builds the network, as an importable
``package.module:function`` or a ``path/to/file.py:function`` (relative to the working
directory), and ``model.python.kwargs`` its keyword arguments::

    model:
      type: python
      python: {builder: my_unet.py:build, kwargs: {width: 64}, in_channels: 3, img_size: 32}

The calling convention is the trainer's: ``net(x, t)`` with x (B, C, H, W) the noisy images and
t (B,) float network times (999 t on the VP-SDE, the step on the ddpm chain), returning the
prediction of x's shape, or an object holding it as ``.sample`` (diffusers), or a tuple holding
it first. The method of the run (``model.skip``) goes on through the adapter that knows the
network's type (a diffusers UNet, denoising-diffusion-pytorch's Unet, ...) or else where
:func:`scalelong.find_skips` finds the skips in one forward pass on an example of the config's
input shape. :class:`UserModel` holds the network as ``net`` behind the package's backbone
interface (``forward(x, t)`` returns the tensor; ``skip_shapes`` for ``scalelong info``).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from scalelong.adapters import apply_scalelong
from scalelong.diagnostics import model_output
from scalelong.errors import ScaleLongError, first_line
from scalelong.skips import find_skip_scaling
from scalelong.training.config import BUILDER_FORM, ModelConfig, resolved_kappa


class UserModel(nn.Module):
    """The network of ``model.python.builder``, called as the trainer calls a backbone."""

    num_classes = 0  # unconditional: the trainer passes no labels

    def __init__(self, net: nn.Module, in_channels: int, img_size: int):
        super().__init__()
        self.net, self.in_channels, self.img_size = net, in_channels, img_size
        self._skip_shapes: list[tuple[int, ...]] = []

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return prediction(self.net(x, t))

    def skip_shapes(self, batch_size: int = 1) -> list[tuple[int, ...]]:
        """Shape of every long skip, outermost first (read off one forward pass when it was built)."""
        return [(batch_size, *shape) for shape in self._skip_shapes]


def prediction(out: object) -> torch.Tensor:
    """The tensor in what the network returned (:func:`scalelong.diagnostics.model_output`), with
    the error naming ``model.python``, the config key that chose the network."""
    try:
        return model_output(out)
    except ScaleLongError:
        raise ScaleLongError(
            f"model.python: the network returned a {type(out).__name__}; return the prediction as a "
            "tensor (or an object with it as .sample, or a tuple that holds it first)"
        ) from None


def load_builder(spec: str) -> Callable[..., object]:
    """The function ``spec`` names: ``package.module:function`` or ``path/to/file.py:function``."""
    where, _, function = spec.rpartition(":")
    if where.endswith(".py") or "/" in where or "\\" in where:
        module = _module_from_file(Path(where).expanduser(), spec)
    else:
        try:
            module = importlib.import_module(where)
        except Exception as e:  # ImportError, or whatever the module raises while it loads
            raise ScaleLongError(
                f"model.python.builder={spec!r}: cannot import {where!r} "
                f"({first_line(e, name=True)}); "
                "make it importable (pip install -e, PYTHONPATH) or give its file: path/to/file.py:function"
            ) from None
    builder = getattr(module, function, None)
    if not callable(builder):
        raise ScaleLongError(
            f"model.python.builder={spec!r}: {where} has no function {function!r}; {BUILDER_FORM}"
        )
    return builder


def _module_from_file(path: Path, spec: str) -> object:
    if not path.is_file():
        raise ScaleLongError(f"model.python.builder={spec!r}: no file {path} (relative to {Path.cwd()})")
    resolved = path.resolve()
    # one module per file, under a name of its own, so two files called model.py do not collide
    name = f"scalelong_user_{resolved.stem}_{hashlib.sha256(str(resolved).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, resolved)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise ScaleLongError(
            f"model.python.builder={spec!r}: {path} fails to load ({first_line(e, name=True)})"
        ) from None
    return module


def build_user_model(cfg: ModelConfig) -> UserModel:
    """The network of ``cfg.python`` with the method of ``cfg.skip`` on its long skips."""
    p, s = cfg.python, cfg.skip
    builder = load_builder(p.builder)
    try:
        net = builder(**p.kwargs)
    except Exception as e:
        raise ScaleLongError(
            f"model.python.builder={p.builder!r} raised {first_line(e, name=True)}; check model.python.kwargs"
        ) from None
    if not isinstance(net, nn.Module):
        raise ScaleLongError(
            f"model.python.builder={p.builder!r} returned a {type(net).__name__}, not a torch.nn.Module; "
            "return the network"
        )
    if find_skip_scaling(net) is not None:
        raise ScaleLongError(
            f"model.python.builder={p.builder!r} returned a network that already holds a SkipScaling (a "
            "scalelong backbone, or ScaleLong applied): build it plain, or use model.type=uvit / unet"
        )
    x, t = example_input(net, p.in_channels, p.img_size)
    # the adapter of the network's family where one knows it, else the skips found on (x, t)
    apply_scalelong(net, s.method, resolved_kappa(cfg), reduction=s.ls_reduction, example=(x, t))
    model = UserModel(net, p.in_channels, p.img_size)
    model._skip_shapes = _skip_shapes(model, x, t)
    return model


def example_input(net: nn.Module, channels: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One input of the config's shape on the network's device: x ~ N(0, 1) and t mid-chain."""
    param = next(net.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    x = torch.randn(1, channels, side, side, generator=torch.Generator().manual_seed(0), device="cpu")
    return x.to(device, dtype), torch.full((1,), 500.0, device=device)


@torch.no_grad()
def _skip_shapes(model: UserModel, x: torch.Tensor, t: torch.Tensor) -> list[tuple[int, ...]]:
    """Shapes (without batch) of the skips the installed SkipScaling sees, by index."""
    scaling = find_skip_scaling(model)
    seen: dict[int, tuple[int, ...]] = {}
    previous, scaling.probe = (
        scaling.probe,
        lambda i, skip, coef, out: seen.setdefault(i, tuple(skip.shape[1:])),
    )
    training = [m.training for m in model.modules()]
    model.eval()
    try:
        with torch.random.fork_rng(devices=[]):
            model(x, t)
    finally:
        scaling.probe = previous
        for m, flag in zip(model.modules(), training, strict=True):
            m.training = flag
    return [seen[i] for i in sorted(seen)]
