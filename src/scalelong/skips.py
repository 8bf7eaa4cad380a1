"""ScaleLong: scaling of the long skip connections of UNet-like denoisers.

Every backbone sends each long skip through one :class:`SkipScaling` module right before the
skip is merged with the decoder stream. The backbone never knows which method is active.

Index convention (everywhere: API, logs, plots): skip ``1`` is the outermost skip (output of
the first encoder block, whose partner is the last decoder block); skip ``N`` is the innermost,
next to the middle block. ``cs`` gives skip ``i`` the coefficient ``kappa ** (i - 1)``.

The paper's five methods (Huang et al., "ScaleLong", NeurIPS 2023, Sec. 4):

    =========== ===================================== ==================================
    name        coefficient on skip i                 paper
    =========== ===================================== ==================================
    none        1                                     Org
    sqrt2       2 ** -0.5                             1/sqrt(2)-CS (Imagen-style)
    cs          kappa ** (i - 1)                      Constant Scaling
    ls          zeta(skip_i), one module for all      Learnable Scaling
    ls-nonshare zeta_i(skip_i), one module per skip   Learnable Scaling, not shared
    =========== ===================================== ==================================

Three treatments that are not the paper's, for comparing ScaleLong with what others do:

    =========== ===================================== ==================================
    name        what happens to skip i                source
    =========== ===================================== ==================================
    skip-norm   LayerNorm(skip_i) is merged           U-ViT pull request #31
    merge-norm  merged unscaled; LayerNorm after the  Hunyuan-DiT (arXiv 2405.08748)
                merge layer
    cs-init     merged unscaled; the merge layer's    a control for cs
                skip weights start x kappa ** (i - 1)
    =========== ===================================== ==================================

``skip-norm`` has no coefficient (:meth:`SkipScaling.coefficients` gives None, the diagnostics
log no ``coef_*`` for it); on a convolutional backbone its norm is a GroupNorm over the skip's
channels. ``merge-norm`` and ``cs-init`` have coefficient 1 on the skip itself and need a
backbone that merges each skip through one linear layer of its own (the U-ViT's
``skip_linear``): it calls :meth:`SkipScaling.after_merge` on that layer's output and scales
that layer's skip weights by :meth:`SkipScaling.merge_weight_scales` at initialisation.

Learned gates: on transformer tokens (``num_tokens``) the released :class:`TokenGate`; on
convolutional skips (``skip_channels``) a per-skip :class:`ChannelGate` for ``ls-nonshare`` and
one width-agnostic :class:`SharedChannelGate` for ``ls``.

:func:`find_skip_scaling` finds the module in any model, :func:`describe` lists each skip (where
it is scaled, its shape, its coefficient or gate) and :func:`skip_table` prints that list as
``scalelong info`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, Protocol

import torch
from torch import nn

from scalelong.errors import ScaleLongError

PAPER_METHODS = ("none", "sqrt2", "cs", "ls", "ls-nonshare")  # the five of the paper's code
METHODS = (*PAPER_METHODS, "skip-norm", "merge-norm", "cs-init")
CONSTANT_METHODS = ("none", "sqrt2", "cs", "merge-norm", "cs-init")  # a constant coefficient on the skip
LEARNED_METHODS = ("ls", "ls-nonshare")  # a learned gate computes the coefficient
NORM_METHODS = ("skip-norm", "merge-norm")  # a normalisation per skip (in SkipScaling.norms)
KAPPA_METHODS = ("cs", "cs-init")  # the methods that read kappa
MERGE_LAYER_METHODS = ("merge-norm", "cs-init")  # need a backbone with one merge layer per skip

# The default kappa of ``cs`` per backbone family, the one place an unset kappa is resolved from.
# U-ViT (6-8 skips): the paper's 0.5. Convolutional UNets have 10-16 skips, where 0.5 would scale
# the innermost of 12 by 0.5 ** 11 = 5e-4: 0.9 (benchmarks/unet_kappa_sweep.py; 0.9 ** 11 = 0.31).
DEFAULT_KAPPA = {"uvit": 0.5, "unet": 0.9}

# A probe sees every merge: (index, incoming skip, coefficient, the skip that is merged). The
# coefficient is None under skip-norm, which normalises the skip instead. Diagnostics use it.
SkipProbe = Callable[[int, torch.Tensor, "torch.Tensor | float | None", torch.Tensor], None]


class SkipSite(NamedTuple):
    """Where one long skip is scaled, as an adapter declares it (plain data; see :func:`describe`)."""

    module: str  # dotted path of the submodule whose input carries the skip, in the model that holds
    #              the SkipScaling as ``.scalelong``
    input: str  # which input: ``skip``, ``args[2]``, ``res_hidden_states_tuple[1]``
    channels: slice | None  # the skip's slice of a concatenated input; None: the whole input
    shape: tuple[int | None, ...] | None  # without the batch; None for what is not known


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``11th``, ``23rd``: where a skip comes in the order the encoder makes them
    or the decoder merges them, as messages and plot titles say it."""
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def method_order(method: str) -> tuple[int, str]:
    """Sort key for method names: the order of :data:`METHODS` (``none`` first), others after."""
    return (METHODS.index(method) if method in METHODS else len(METHODS), method)


def check_method(method: str, kappa: float = DEFAULT_KAPPA["uvit"], num_skips: int = 1) -> None:
    """Raise :class:`ScaleLongError` unless ``method``, ``kappa`` and ``num_skips`` are valid."""
    if method not in METHODS:
        raise ScaleLongError(f"unknown skip method {method!r}; choose one of {', '.join(METHODS)}")
    if isinstance(kappa, bool) or not isinstance(kappa, (int, float)) or not 0.0 < kappa <= 1.0:
        raise ScaleLongError(f"kappa must be a number in (0, 1], got {kappa!r}")
    if isinstance(num_skips, bool) or not isinstance(num_skips, int) or num_skips < 1:
        raise ScaleLongError(f"num_skips must be an integer >= 1, got {num_skips!r}")


def skip_coefficients(method: str, num_skips: int, kappa: float = DEFAULT_KAPPA["uvit"]) -> list[float]:
    """Constant coefficients of a method, outermost skip first.

    >>> skip_coefficients("cs", 3, 0.5)
    [1.0, 0.5, 0.25]

    ``merge-norm`` and ``cs-init`` merge the skip unscaled: 1 for every skip. Learned methods and
    ``skip-norm`` have no constant coefficient and raise :class:`ScaleLongError`.
    """
    check_method(method, kappa, num_skips)
    if method in ("none", "merge-norm", "cs-init"):
        return [1.0] * num_skips
    if method == "sqrt2":
        return [2.0**-0.5] * num_skips
    if method == "cs":
        return [float(kappa) ** (i - 1) for i in range(1, num_skips + 1)]
    if method == "skip-norm":
        raise ScaleLongError(
            "method 'skip-norm' normalises the skips instead of scaling them; it has no coefficients"
        )
    raise ScaleLongError(f"method {method!r} learns its coefficients; it has no constant ones")


class TokenGate(nn.Module):
    """The released LS calibration on U-ViT tokens: a squeeze-excitation over the token axis.

    skip (B, L, D) -> mean over D -> Linear(L, L // r) -> ReLU -> Linear(L // r, L) -> sigmoid
    -> coefficient (B, L, 1), broadcast over channels. PyTorch's default Linear init is kept,
    so every coefficient starts near 0.5.
    """

    def __init__(self, num_tokens: int, reduction: int = 16):
        super().__init__()
        if num_tokens < reduction:
            raise ScaleLongError(
                f"LS needs at least reduction={reduction} tokens, got num_tokens={num_tokens}"
            )
        self.num_tokens = num_tokens
        self.excite = nn.Sequential(
            nn.Linear(num_tokens, num_tokens // reduction),
            nn.ReLU(),
            nn.Linear(num_tokens // reduction, num_tokens),
            nn.Sigmoid(),
        )

    def forward(self, skip: torch.Tensor) -> torch.Tensor:
        if skip.ndim != 3 or skip.shape[1] != self.num_tokens:
            raise ScaleLongError(
                f"the LS token gate was built for {self.num_tokens} tokens but got a skip of "
                f"shape {tuple(skip.shape)}; rebuild the model for this resolution"
            )
        return self.excite(skip.mean(dim=2)).unsqueeze(-1)  # (B, L, 1)


class ChannelGate(nn.Module):
    """LS for one convolutional skip (``ls-nonshare``): a channel squeeze-excitation.

    skip (B, C, H, W) -> mean over H, W -> Linear(C, C // r) -> ReLU -> Linear(C // r, C)
    -> sigmoid -> coefficient (B, C, 1, 1). Default Linear init, so coefficients start near 0.5.
    """

    def __init__(self, channels: int, reduction: int = 16):
        super().__init__()
        self.channels = channels
        hidden = max(1, channels // reduction)  # tiny test widths still get a bottleneck of 1
        self.excite = nn.Sequential(
            nn.Linear(channels, hidden), nn.ReLU(), nn.Linear(hidden, channels), nn.Sigmoid()
        )

    def forward(self, skip: torch.Tensor) -> torch.Tensor:
        if skip.ndim != 4 or skip.shape[1] != self.channels:
            raise ScaleLongError(
                f"the LS channel gate was built for {self.channels} channels but got a skip of "
                f"shape {tuple(skip.shape)}"
            )
        return self.excite(skip.mean(dim=(2, 3)))[:, :, None, None]  # (B, C, 1, 1)


class SharedChannelGate(nn.Module):
    """LS shared by convolutional skips of mixed widths (``ls`` on a conv backbone).

    The released token gate mixes all positions through Linear layers sized by the token
    count, so it cannot serve skips of different widths. Here the shared core sees each
    channel through width-free statistics and mixes channels only through their average
    (a DeepSets-style context), so one core serves every width:

        per channel c: f_c = [mean_c, rms_c, mean over channels of mean, of rms]   (B, C, 4)
        logit_c = core(f_c) + bias_w[c]                          core: 4 -> hidden -> 1
        coefficient = sigmoid(logit)                             (B, C, 1, 1)

    ``bias_w`` is a thin per-width adapter (one zero-initialised vector per distinct width),
    shared by all skips of that width. Cost: 4 * hidden + 2 * hidden + 1 + sum of widths.
    """

    def __init__(self, widths: Sequence[int], hidden: int = 16):
        super().__init__()
        self.core = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.adapters = nn.ParameterDict({str(w): nn.Parameter(torch.zeros(w)) for w in sorted(set(widths))})

    def forward(self, skip: torch.Tensor) -> torch.Tensor:
        if skip.ndim != 4 or str(skip.shape[1]) not in self.adapters:
            widths = ", ".join(sorted(self.adapters, key=int))
            raise ScaleLongError(
                f"the shared LS gate serves widths {widths} but got a skip of shape {tuple(skip.shape)}"
            )
        x = skip.to(torch.promote_types(skip.dtype, torch.float32))  # statistics in >= fp32
        mean, rms = x.mean(dim=(2, 3)), x.square().mean(dim=(2, 3)).add(1e-8).sqrt()  # (B, C) each
        ctx = torch.stack([mean.mean(1), rms.mean(1)], dim=-1)  # (B, 2)
        feats = torch.cat([torch.stack([mean, rms], dim=-1), ctx[:, None].expand(-1, mean.shape[1], -1)], -1)
        feats = feats.to(self.core[0].weight.dtype)
        logit = self.core(feats).squeeze(-1) + self.adapters[str(skip.shape[1])]  # (B, C)
        return torch.sigmoid(logit).to(skip.dtype)[:, :, None, None]  # (B, C, 1, 1)


class SkipScaling(nn.Module):
    """The single choke point every long skip passes through.

    Args:
        method: one of :data:`METHODS`.
        num_skips: number of long skips N of the backbone.
        kappa: base of ``cs`` (and ``cs-init``): skip i gets ``kappa ** (i - 1)``; must lie in (0, 1].
        num_tokens: token count L of a transformer backbone; builds the LS token gate.
        reduction: squeeze-excitation reduction ratio r of the LS gates, an integer >= 1 (checked
            for every method).
        skip_channels: channels of each skip (outermost first) of a convolutional backbone;
            builds :class:`ChannelGate` per skip (``ls-nonshare``) or one
            :class:`SharedChannelGate` (``ls``), and the GroupNorms of ``skip-norm``. Give either
            this or ``num_tokens`` / ``skip_dim``.
        skip_dim: width D of (B, L, D) token skips; builds the LayerNorms of ``skip-norm``.
        merge_dim: width of the output of the layer that merges each skip, given by a backbone
            that has one such linear layer per skip (the U-ViT's ``skip_linear``), passes its
            output through :meth:`after_merge` and scales its skip weights at initialisation by
            :meth:`merge_weight_scales`. None: no such layer; ``merge-norm`` and ``cs-init`` are
            refused.
        norm_groups: groups of the ``skip-norm`` GroupNorm on feature maps (capped at the width).

    ``forward(skip, index)`` returns the tensor the decoder merges in place of ``skip``.
    With ``none`` it returns ``skip`` itself, and ``after_merge(h, index)`` returns ``h`` itself for
    every method but ``merge-norm``, so the backbone is bit-identical to one with no scaling at all.
    The normalisations of ``skip-norm`` and ``merge-norm`` (``norms[i - 1]`` serves skip i) start
    at the identity affine map (weight 1, bias 0), as PyTorch initialises them.
    """

    def __init__(
        self,
        method: str = "none",
        num_skips: int = 1,
        kappa: float = DEFAULT_KAPPA["uvit"],
        *,
        num_tokens: int | None = None,
        reduction: int = 16,
        skip_channels: Sequence[int] | None = None,
        skip_dim: int | None = None,
        merge_dim: int | None = None,
        norm_groups: int = 32,
    ):
        super().__init__()
        check_method(method, kappa, num_skips)
        if isinstance(reduction, bool) or not isinstance(reduction, int) or reduction < 1:
            raise ScaleLongError(
                f"the LS reduction (ls_reduction) must be an integer >= 1, got {reduction!r}; "
                "the release uses 16"
            )
        self.method = method
        self.num_skips = num_skips
        self.kappa = float(kappa)
        self.reduction = reduction
        self.probe: SkipProbe | None = None
        self._constants: list[float] | None = None
        self.gates = nn.ModuleList()
        self.norms = nn.ModuleList()
        if skip_channels is not None:
            skip_channels = [int(c) for c in skip_channels]
            if len(skip_channels) != num_skips:
                raise ScaleLongError(
                    f"skip_channels lists {len(skip_channels)} widths but the backbone has {num_skips} skips"
                )
        if method in MERGE_LAYER_METHODS and merge_dim is None:
            raise ScaleLongError(
                f"method {method!r} needs a backbone that merges each skip through one linear layer of its "
                "own (the U-ViT's skip_linear); this one has none: use "
                + ("skip-norm" if method == "merge-norm" else "cs")
            )
        if method in CONSTANT_METHODS:
            self._constants = skip_coefficients(method, num_skips, kappa)
            if method == "merge-norm":
                self.norms.extend(nn.LayerNorm(merge_dim) for _ in range(num_skips))
        elif method == "skip-norm":
            if skip_channels is not None:
                self.norms.extend(nn.GroupNorm(_groups(c, norm_groups), c, eps=1e-6) for c in skip_channels)
            elif skip_dim is not None:
                self.norms.extend(nn.LayerNorm(skip_dim) for _ in range(num_skips))
            else:
                raise ScaleLongError(
                    "method 'skip-norm' needs the skip layout: pass skip_dim for (B, L, D) token skips or "
                    "skip_channels for (B, C, H, W) feature maps"
                )
        elif skip_channels is not None:
            if method == "ls":
                self.gates.append(SharedChannelGate(skip_channels))
            else:
                self.gates.extend(ChannelGate(c, reduction) for c in skip_channels)
        else:
            if num_tokens is None:
                raise ScaleLongError(
                    f"method {method!r} needs the skip layout: pass num_tokens for a transformer backbone "
                    "or skip_channels for a convolutional one"
                )
            count = 1 if method == "ls" else num_skips
            self.gates.extend(TokenGate(num_tokens, reduction) for _ in range(count))

    @property
    def learned(self) -> bool:
        """Whether a learned gate computes the coefficients (``ls``, ``ls-nonshare``)."""
        return self.method in LEARNED_METHODS

    def watch_blocks(self, blocks: Mapping[str, nn.Module]) -> None:
        """Declare the model's blocks, in forward order, whose hidden features the diagnostics record.

        Adapters call this when they install the scaling on a third-party model, whose block
        layout only they know. The blocks are kept as plain references, not submodules: their
        parameters stay where the model has them, and ``copy.deepcopy`` of the whole model (an
        EMA copy) points the copy's scaling at the copy's blocks.
        """
        self.__dict__["_watched_blocks"] = dict(blocks)

    @property
    def watched_blocks(self) -> dict[str, nn.Module] | None:
        """The blocks declared by :meth:`watch_blocks`, or None when none were."""
        return self.__dict__.get("_watched_blocks")

    @property
    def has_coefficients(self) -> bool:
        """Whether the skip is multiplied by a coefficient (every method but ``skip-norm``)."""
        return self.method != "skip-norm"

    def declare_sites(self, sites: Sequence[SkipSite]) -> None:
        """Record where each skip (outermost first) is scaled, for :func:`describe`: adapters call it
        when they hook a third-party model; a backbone that calls this module itself needs none."""
        if len(sites) != self.num_skips:
            raise ValueError(f"{len(sites)} sites for {self.num_skips} skips")
        self.__dict__["_sites"] = list(sites)

    @property
    def sites(self) -> list[SkipSite] | None:
        """The sites declared by :meth:`declare_sites`, or None (the scaling is built into the backbone)."""
        return self.__dict__.get("_sites")

    def coefficients(self) -> list[float | None]:
        """Constant coefficient of each skip (outermost first); ``None`` where it is learned, and
        for ``skip-norm``, which normalises the skip instead of scaling it."""
        if self._constants is None:
            return [None] * self.num_skips
        return list(self._constants)

    def merge_weight_scales(self) -> list[float] | None:
        """``cs-init``: what a backbone with one merge layer per skip multiplies that layer's skip
        weights by at initialisation, outermost skip first (cs's ``kappa ** (i - 1)``); None for
        every other method."""
        if self.method != "cs-init":
            return None
        return skip_coefficients("cs", self.num_skips, self.kappa)

    def gate_for(self, index: int) -> nn.Module:
        """The calibration module that serves skip ``index`` (learned methods only)."""
        return self.gates[0 if len(self.gates) == 1 else index - 1]

    def forward(self, skip: torch.Tensor, index: int) -> torch.Tensor:
        if not 1 <= index <= self.num_skips:
            raise IndexError(f"skip index {index} outside 1..{self.num_skips}")
        coef: torch.Tensor | float | None
        if self._constants is not None:
            coef = self._constants[index - 1]
            out = skip if coef == 1.0 else skip * coef
        elif self.method == "skip-norm":
            coef, out = None, self.norms[index - 1](skip)
        else:
            coef = self.gate_for(index)(skip)
            out = skip * coef
        if self.probe is not None:
            self.probe(index, skip, coef, out)
        return out

    def after_merge(self, merged: torch.Tensor, index: int) -> torch.Tensor:
        """What the decoder continues with after the layer that merged skip ``index``: under
        ``merge-norm`` its LayerNorm of ``merged``, under every other method ``merged`` itself."""
        if self.method != "merge-norm":
            return merged
        if not 1 <= index <= self.num_skips:
            raise IndexError(f"skip index {index} outside 1..{self.num_skips}")
        return self.norms[index - 1](merged)

    def gate_name(self, index: int) -> str:
        """Which gate serves skip ``index``: ``TokenGate (shared)``, ``ChannelGate 3`` (learned methods)."""
        kind = type(self.gate_for(index)).__name__
        return f"{kind} (shared)" if len(self.gates) == 1 else f"{kind} {index}"

    def describe(self, index: int) -> str:
        """What happens to skip ``index``, as the coefficient column of :func:`skip_table` shows it."""
        if self.method == "skip-norm":
            norm = self.norms[index - 1]
            kind = f"GroupNorm({norm.num_groups})" if isinstance(norm, nn.GroupNorm) else "LayerNorm"
            return f"skip-norm: {kind} on the skip"
        if self.learned:
            return f"{self.method}: {self.gate_name(index)}"
        text = f"{self.coefficients()[index - 1]:.6g}"
        if self.method == "merge-norm":
            return f"{text}, LayerNorm after the merge"
        if self.method == "cs-init":
            return f"{text}, merge weights x{self.merge_weight_scales()[index - 1]:.6g} at init"
        return text

    def extra_repr(self) -> str:
        kappa = f", kappa={self.kappa:g}" if self.method in KAPPA_METHODS else ""
        return f"method={self.method!r}, num_skips={self.num_skips}{kappa}"


def _groups(channels: int, groups: int) -> int:
    """GroupNorm groups for a skip of ``channels``: ``groups``, capped at the width; one error line
    when they do not divide it."""
    groups = min(groups, channels)
    if channels % groups:
        raise ScaleLongError(
            f"skip-norm's GroupNorm: {groups} groups do not divide a skip of {channels} channels"
        )
    return groups


# ----------------------------------------------------------------------------- finding and showing skips


def find_skip_scaling(model: nn.Module) -> SkipScaling | None:
    """The model's single :class:`SkipScaling` (also inside DDP / torch.compile wrappers), or None."""
    found = [m for m in model.modules() if isinstance(m, SkipScaling)]
    if len(found) > 1:
        raise ScaleLongError(f"the model holds {len(found)} SkipScaling modules; expected one")
    return found[0] if found else None


class SkipRow(NamedTuple):
    """One long skip as :func:`describe` lists it."""

    index: int  # 1 = the outermost
    module: str  # dotted path (in the model given) of the submodule whose input is scaled; for a
    #              backbone that calls its SkipScaling itself, the path of that SkipScaling
    input: str  # which input of it (``skip``, ``res_hidden_states_tuple[1]``); ``built in`` for a backbone
    channels: slice | None  # the skip's slice of a concatenated input; None: the whole input
    shape: tuple[int | None, ...] | None  # without the batch (None for an unknown side); None if unknown
    coefficient: float | None  # the constant coefficient; None where a gate learns it or skip-norm normalises
    gate: str | None  # the gate that learns it: ``TokenGate (shared)``, ``ChannelGate 3``; None if none
    treatment: str  # the whole treatment in words: ``0.5``, ``ls: TokenGate (shared)``, ``skip-norm: ...``
    made_by: str | None = None  # where the encoder makes it, for skips ``find_skips`` found; else None


def _scaling_path(model: nn.Module) -> tuple[SkipScaling, str]:
    found = [(path, m) for path, m in model.named_modules() if isinstance(m, SkipScaling)]
    if not found:
        raise ScaleLongError(
            f"{type(model).__name__} has no skip scaling: apply_scalelong(model, method) first, or build the "
            "package's backbone with a skip_method"
        )
    if len(found) > 1:
        raise ScaleLongError(f"the model holds {len(found)} SkipScaling modules; expected one")
    path, scaling = found[0]
    return scaling, path


class Described(Protocol):
    """Skips listed but not applied: what ``scalelong.find_skips`` returns."""

    def skip_rows(self) -> list[SkipRow]: ...


def describe(model: nn.Module | Described) -> list[SkipRow]:
    """Every long skip of ``model``, outermost (index 1) first: where it is scaled, which input, the
    channel slice, its shape and its coefficient or gate.

    It reads what was applied, so it also lists what ``apply_scalelong`` hooked (the modules of the
    rows). Works on the package's backbones, on every model ``apply_scalelong`` serves, and through
    any module that holds one; and on what ``scalelong.find_skips`` returns, before it is applied
    (each row then says where the skip is made, ``made_by``, and ``not applied``).
    """
    if not isinstance(model, nn.Module):
        rows = getattr(model, "skip_rows", None)
        if not callable(rows):
            raise ScaleLongError(
                f"describe takes a model (or what find_skips returns), got a {type(model).__name__}"
            )
        return list(rows())
    scaling, path = _scaling_path(model)
    owner_path = path.rpartition(".")[0]  # the module that holds the SkipScaling
    prefix = f"{owner_path}." if owner_path else ""
    sites = scaling.sites
    if sites is None:  # the backbone calls scaling(skip, index) at each merge itself
        owner = model.get_submodule(owner_path) if owner_path else model
        shapes = owner.skip_shapes(1) if callable(getattr(owner, "skip_shapes", None)) else None
        sites = [
            SkipSite(path, "built in", None, None if shapes is None else tuple(shapes[i][1:]))
            for i in range(scaling.num_skips)
        ]
        prefix = ""
    rows = []
    for i, (site, coef) in enumerate(zip(sites, scaling.coefficients(), strict=True), start=1):
        gate = scaling.gate_name(i) if scaling.learned else None
        module = f"{prefix}{site.module}" if site.module else owner_path
        rows.append(
            SkipRow(i, module, site.input, site.channels, site.shape, coef, gate, scaling.describe(i))
        )
    return rows


def _where(row: SkipRow) -> str:
    """``up_blocks.0(res_hidden_states_tuple[1])``, ``dec0(input)[-4:]`` or ``built-in``: one word."""
    if row.input == "built in":
        return "built-in"
    c = row.channels
    cut = "" if c is None else f"[{'' if c.start is None else c.start}:{'' if c.stop is None else c.stop}]"
    return f"{row.module or '<model>'}({row.input}){cut}"


def skip_table(model: nn.Module | Described) -> str:
    """The table ``scalelong info`` prints, built on :func:`describe`: index, shape, where the skip
    is scaled and its coefficient (or the gate that learns it) for every skip; for the skips
    ``find_skips`` found, also where each is made."""
    rows = describe(model)
    shapes = [
        "?" if r.shape is None else "x".join("?" if d is None else str(d) for d in r.shape) for r in rows
    ]
    wheres = [_where(r) for r in rows]
    sw, ww = max(18, *map(len, shapes)), max(8, *map(len, wheres))
    made = [r.made_by or "" for r in rows] if any(r.made_by for r in rows) else None
    mw = max(7, *map(len, made)) if made else 0
    head = f"  {'made by':<{mw}}" if made else ""
    lines = [f"{'skip':>4}  {'shape':<{sw}}  {'scaled at':<{ww}}{head}  coefficient"]
    lines.append(f"{'-' * 4}  {'-' * sw}  {'-' * ww}" + (f"  {'-' * mw}" if made else "") + f"  {'-' * 11}")
    for k, (r, shape, where) in enumerate(zip(rows, shapes, wheres, strict=True)):
        by = f"  {made[k]:<{mw}}" if made else ""
        lines.append(f"{r.index:>4}  {shape:<{sw}}  {where:<{ww}}{by}  {r.treatment}")
    lines.append("(skip 1 is the outermost, next to the input and output)")
    return "\n".join(lines)
