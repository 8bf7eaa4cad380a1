"""Find the long skips of a network by itself, from one forward pass.

``find_skips`` runs the model once (no gradients) on an example input and watches two things:
every module call (forward pre-hooks and hooks: what each module receives and returns) and every
torch function (a :class:`~torch.overrides.TorchFunctionMode`: where each tensor comes from, and
how ``torch.cat`` lays its operands side by side). From that it reads the long skips:

    a tensor S made during the forward (the output of an encoder module, or a tensor the forward
    computes from one) that depends on the image input, whose first consumer (the main path: the
    next encoder block) has finished before a later module M receives S again, together with a
    tensor that was itself computed from S (the decoder stream).

M receives S as one of its inputs, as an item of a tuple input (diffusers' up blocks), or as an
operand of a ``torch.cat`` that is one of its inputs (the concatenation made in the parent's
forward: EDM2, denoising-diffusion-pytorch). ``S * c``, ``S.clone()`` and any other one-input op
that keeps the shape carries S (EDM2's magnitude-preserving concat scales both operands before
``torch.cat``). The time embedding and a text context do not depend on the image and are never
skips; a module that sees S once (a residual branch, q/k/v projections) never pairs with it.

Where M is a block that hands S on to a module inside it, the outermost receiving module is
the skip's input; the skips of one network are the merges made by the children of one call
(the UNet's forward). Skip 1 is the one made first (next to the input); the skips must meet the
decoder in reverse order (LIFO), which is checked. What is found is returned as a
:class:`FoundSkips`: the :class:`~scalelong.adapters.declared.SkipInput` list that
``apply_scalelong(model, method, skips=...)`` installs, with each skip's module path, producer
and shape beside it, and :func:`skip_report` prints it as one table.

Like the per-family layouts, this module only reads a model: :mod:`scalelong.adapters` hands it
the ``SkipInput`` type to describe each skip with (``scalelong.adapters.find_skips``) and installs
the result, so the adapter modules never import one another.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from scalelong.errors import ScaleLongError
from scalelong.skips import SkipScaling

_CATS = {torch.cat, torch.concat, torch.concatenate}
_ADVICE = "declare the skips with SkipInput instead (scalelong.SkipInput)"


# ----------------------------------------------------------------------------- what is found


@dataclass(frozen=True)
class TracedSkip:
    """One long skip as ``find_skips`` saw it in the forward pass.

    Attributes:
        index: 1 = the outermost skip (made first, merged last).
        skip: the :class:`SkipInput` that scales it.
        path: dotted path of ``skip.module`` in the model (``dec.16x16_block1``).
        producer: where the encoder made it: a module path, or ``op(path)`` for a tensor the
            forward computed from that module's output (``add(downs.0.2)``).
        shape: the skip's shape without the batch axis.
        tuple_input: ``(path, input, item)`` when the decoder block receives the skip as item
            ``item`` of a tuple input (diffusers' ``res_hidden_states_tuple``); ``skip`` then
            names the module inside that block which concatenates it. None otherwise.
    """

    index: int
    skip: Any  # a SkipInput
    path: str
    producer: str
    shape: tuple[int, ...]
    tuple_input: tuple[str, int | str, int] | None = None


@dataclass(frozen=True)
class FoundSkips(Sequence):
    """The declaration ``find_skips`` read off a model: a sequence of :class:`SkipInput`
    (outermost first), so ``apply_scalelong(model, method, skips=found)`` takes it as is, with
    what :func:`skip_report` prints beside it."""

    records: tuple[TracedSkip, ...]
    blocks: Mapping[str, nn.Module] = field(default_factory=dict, compare=False, repr=False)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [r.skip for r in self.records[i]]
        return self.records[i].skip

    def __len__(self) -> int:
        return len(self.records)

    @property
    def paths(self) -> list[str]:
        """Dotted path of each skip's module, outermost first: the declaration as data."""
        return [r.path for r in self.records]

    @property
    def skip_channels(self) -> list[int] | None:
        """Channels of each skip when all are (B, C, H, W) feature maps (sizes the LS gates), else None."""
        if all(len(r.shape) == 3 for r in self.records):
            return [r.shape[0] for r in self.records]
        return None

    @property
    def num_tokens(self) -> int | None:
        """Token count L when all skips are (B, L, D) tokens of one length, else None."""
        lengths = {r.shape[0] for r in self.records if len(r.shape) == 2}
        if len(lengths) == 1 and all(len(r.shape) == 2 for r in self.records):
            return lengths.pop()
        return None

    def install_kwargs(self) -> dict:
        """Keyword arguments of :func:`scalelong.adapters.declared.install` for these skips."""
        sizes = {"skip_channels": self.skip_channels, "num_tokens": self.num_tokens}
        return {
            "skips": list(self),
            **{k: v for k, v in sizes.items() if v is not None},
            "blocks": self.blocks,
        }

    def __str__(self) -> str:
        return skip_report(self)


def skip_report(found: FoundSkips) -> str:
    """One table of what ``find_skips`` found: index, where the skip is made, the module and
    input it enters, the channel slice, and its shape."""
    rows = [("skip", "made by", "enters", "input", "slice", "shape")]
    for r in found.records:
        s = r.skip
        where = (
            "whole"
            if s.channels is None
            else f"[{_fmt(s.channels.start)}:{_fmt(s.channels.stop)}] dim {s.dim}"
        )
        rows.append(
            (
                str(r.index),
                r.producer,
                r.path,
                _input_name(s.module, s.arg),
                where,
                "x".join(map(str, r.shape)),
            )
        )
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    lines = [
        "  ".join(
            c.rjust(w) if k == 0 else c.ljust(w) for k, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines = [line.rstrip() for line in lines]
    for r in found.records:
        if r.tuple_input is not None:
            path, key, item = r.tuple_input
            lines.append(
                f"skip {r.index} reaches {path} as item {item} of its input {_input_name(None, key)}"
            )
    lines.append("(skip 1 is the outermost: made next to the input, merged next to the output)")
    return "\n".join(lines)


def _fmt(v: int | None) -> str:
    return "" if v is None else str(v)


def _input_name(module: nn.Module | None, arg: int | str) -> str:
    """``0 (x)`` for a position whose parameter has a name, the keyword itself otherwise."""
    name = arg if module is None else _param_name(module, arg)
    return str(arg) if name == arg else f"{arg} ({name})"


def _param_name(module: nn.Module, arg: int | str) -> int | str:
    """The name of positional input ``arg`` of ``module.forward`` where it has one, else ``arg``."""
    if isinstance(arg, str):
        return arg
    try:
        params = [
            p
            for p in inspect.signature(module.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        return arg
    return params[arg].name if arg < len(params) else arg


# ----------------------------------------------------------------------------- the trace


class _Tensor:
    """What the trace knows of one tensor. ``root`` is the tensor this one carries (itself, or the
    input of a chain of one-input, shape-keeping ops); ``bits`` marks every root it depends on."""

    __slots__ = (
        "ref",
        "born",
        "shape",
        "bits",
        "bit",
        "root",
        "producer",
        "module_output",
        "cat",
        "is_input",
    )

    def __init__(self, t: torch.Tensor, born: int, producer: str):
        self.ref = weakref.ref(t)
        self.born, self.shape, self.producer = born, tuple(t.shape), producer
        self.bits, self.bit, self.root = 0, None, self
        self.module_output = self.is_input = False
        self.cat: tuple[int, list[tuple[_Tensor, int, int]]] | None = None  # (dim, [(operand, start, size)])


class _Call:
    """One module call: when it began and ended, who called it, and what it received."""

    __slots__ = ("module", "path", "enter", "exit", "parent", "depth", "inputs", "out_bits")

    def __init__(self, module: nn.Module, path: str, enter: int, parent: _Call | None):
        self.module, self.path, self.enter, self.exit, self.parent = module, path, enter, None, parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.inputs: list[
            tuple[int | str, int | None, _Tensor]
        ] = []  # (position or keyword, tuple item, tensor)
        self.out_bits = 0  # what its outputs depend on

    def within(self, other: _Call) -> bool:
        """Whether this call runs inside ``other`` (a strict descendant)."""
        call = self.parent
        while call is not None:
            if call is other:
                return True
            call = call.parent
        return False


class _Tracer(TorchFunctionMode):
    def __init__(self, paths: Mapping[int, str]):
        super().__init__()
        self.paths = paths
        self.clock = 0
        self.known: dict[int, _Tensor] = {}
        self.calls: list[_Call] = []
        self.stack: list[_Call] = []
        self.bits = 0
        self.busy = False  # inside a hook: its own tensor reads are not the model's ops

    # -- tensors

    def lookup(self, t: torch.Tensor) -> _Tensor | None:
        info = self.known.get(id(t))
        return info if info is not None and info.ref() is t else None

    def new(self, t: torch.Tensor, producer: str, bits: int = 0) -> _Tensor:
        info = _Tensor(t, self.clock, producer)
        info.bits = bits
        self.known[id(t)] = info
        return info

    def make_root(self, info: _Tensor) -> None:
        info.root = info
        if info.bit is None:
            info.bit = 1 << self.bits
            self.bits += 1
            info.bits |= info.bit

    def input(self, t: torch.Tensor, name: str) -> _Tensor:
        info = self.new(t, name)
        info.is_input = True
        self.make_root(info)
        return info

    # -- torch functions

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.busy:
            self.busy = True
            try:
                self.record(func, args, kwargs, out)
            finally:
                self.busy = False
        return out

    def record(self, func, args, kwargs, out) -> None:
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        infos = [self.lookup(t) for t in ins]
        bits = 0
        for info in infos:
            if info is not None:
                bits |= info.bits
        if not outs:  # x[...] = y and the like change their first argument
            if ins and infos[0] is not None and getattr(func, "__name__", "") == "__setitem__":
                infos[0].bits |= bits
            return
        self.clock += 1
        name = getattr(func, "__name__", "op").strip("_")
        for o in outs:
            known = self.lookup(o)
            if known is not None:  # an in-place op, or one that returns its input
                known.bits |= bits
                continue
            source = infos[0] if len(ins) == 1 and len(outs) == 1 else None
            if source is not None and tuple(o.shape) == source.shape:  # S * c, S.clone(), S.to(...)
                info = self.new(o, source.producer, bits)
                info.root = source.root
            else:
                first = next((i for i in infos if i is not None), None)
                info = self.new(o, f"{name}({first.root.producer})" if first is not None else name, bits)
                self.make_root(info)
        if func in _CATS and len(outs) == 1:
            self.record_cat(args, kwargs, outs[0])

    def record_cat(self, args, kwargs, out: torch.Tensor) -> None:
        tensors = args[0] if args else kwargs.get("tensors")
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        if not isinstance(tensors, (list, tuple)) or not isinstance(dim, int):
            return
        dim %= out.ndim
        operands, start = [], 0
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.ndim != out.ndim:
                return  # the legacy empty 1-D operand and the like: not a layout to read
            size = t.shape[dim]
            info = self.lookup(t)
            if info is not None:
                operands.append((info, start, size))
            start += size
        self.lookup(out).cat = (dim, operands)

    # -- module calls

    def pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self.busy = True
        try:
            self.clock += 1
            call = _Call(module, self.paths.get(id(module), type(module).__name__), self.clock,
                         self.stack[-1] if self.stack else None)  # fmt: skip
            for key, value in [*enumerate(args), *kwargs.items()]:
                if isinstance(value, torch.Tensor):
                    self.note(call, key, None, value)
                elif isinstance(value, (tuple, list)):
                    for item, v in enumerate(value):
                        if isinstance(v, torch.Tensor):
                            self.note(call, key, item, v)
            self.calls.append(call)
            self.stack.append(call)
        finally:
            self.busy = False

    def note(self, call: _Call, key: int | str, item: int | None, t: torch.Tensor) -> None:
        info = self.lookup(t)
        if info is not None:
            call.inputs.append((key, item, info))

    def post_hook(self, module: nn.Module, args: tuple, output: object) -> None:
        self.busy = True
        try:
            self.clock += 1
            call = self.stack.pop()
            call.exit = self.clock
            outs = [o for o in tree_leaves(output) if isinstance(o, torch.Tensor)]
            for o in outs:
                info = self.lookup(o) or self.new(o, call.path)
                call.out_bits |= info.bits
                if info.born < call.enter:  # handed through (nn.Identity): made before this call
                    continue
                if not info.module_output:  # a module's output is a root of its own
                    info.module_output = True
                    self.make_root(info)
                if len(outs) == 1:  # named after the outermost module that makes and returns it alone
                    info.producer = call.path
        finally:
            self.busy = False

    def scaling_hook(self, module: nn.Module, args: tuple, output: object) -> None:
        """A SkipScaling's output is its input skip, scaled: the same skip for the trace."""
        self.busy = True
        try:
            source = self.lookup(args[0]) if args and isinstance(args[0], torch.Tensor) else None
            out = self.lookup(output) if isinstance(output, torch.Tensor) else None
            if source is not None and out is not None and out is not source:
                out.root, out.producer = source.root, source.producer
        finally:
            self.busy = False


# ----------------------------------------------------------------------------- reading the skips


@dataclass
class _Merge:
    """Root ``root`` reaches ``call`` at ``key`` (tuple item ``item``; a cat slice ``part``)."""

    root: _Tensor
    call: _Call
    key: int | str
    item: int | None
    part: tuple[int, int, int, int] | None  # (dim, start, size, width of the whole input) of a cat operand
    merge: bool  # whether the call also receives a tensor computed from the root


def _receptions(calls: Sequence[_Call]) -> dict[int, list[_Merge]]:
    """Every time a call receives a root (directly, as a tuple item or a cat operand), by root."""
    found: dict[int, list[_Merge]] = {}
    for call in calls:
        for n, (key, item, info) in enumerate(call.inputs):
            others = [o for m, (_, _, o) in enumerate(call.inputs) if m != n]
            parts = [(info, None, others)]
            if info.cat is not None:
                dim, operands = info.cat
                for k, (operand, start, size) in enumerate(operands):
                    rest = [o for j, (o, _, _) in enumerate(operands) if j != k]
                    parts.append((operand, (dim, start, size, info.shape[dim]), others + rest))
            for tensor, part, rest in parts:
                root = tensor.root
                merge = any(o.bits & root.bit and o.root is not root for o in rest)
                found.setdefault(id(root), []).append(_Merge(root, call, key, item, part, merge))
    return found


def _skip_merges(receptions: Mapping[int, list[_Merge]], x_bit: int) -> list[tuple[_Merge, list[_Merge]]]:
    """Per long skip: its outermost merge and every merge of it (to look inside a block)."""
    out = []
    for seen in receptions.values():
        root = seen[0].root
        if root.is_input or not root.bits & x_bit or root.bit is None:
            continue  # an input, or conditioning that does not depend on the image
        merges = [
            m
            for m in seen
            if m.merge and any(e.call.exit is not None and e.call.exit < m.call.enter for e in seen)
        ]
        outer = [m for m in merges if not any(m.call.within(o.call) for o in merges if o.call is not m.call)]
        out += [(m, merges) for m in outer]
    return out


def _choose_level(
    candidates: list[tuple[_Merge, list[_Merge]]], name: str
) -> list[tuple[_Merge, list[_Merge]]]:
    """The merges made by the children of one call, the shallowest (the UNet's own forward)."""
    depth = min(m.call.depth for m, _ in candidates)
    parents = {id(m.call.parent): m.call.parent for m, _ in candidates if m.call.depth == depth}
    if len(parents) > 1:
        where = " and ".join(sorted(f"'{p.path or name}'" for p in parents.values() if p is not None))
        raise ScaleLongError(
            f"find_skips: {name} merges long skips in more than one call ({where}); run find_skips on the "
            f"network that holds the skips, or {_ADVICE}"
        )
    chosen = [(m, ms) for m, ms in candidates if m.call.depth == depth]
    by_root: dict[int, list[_Merge]] = {}
    for m, _ in chosen:
        by_root.setdefault(id(m.root), []).append(m)
    for merges in by_root.values():
        if len(merges) > 1:
            places = ", ".join(f"'{m.call.path}'" for m in merges)
            raise ScaleLongError(
                f"find_skips: the output of '{merges[0].root.producer}' reaches {len(merges)} decoder "
                f"modules ({places}), so which one it is a skip of is ambiguous; {_ADVICE}"
            )
    return chosen


def _declared_input(outer: _Merge, merges: list[_Merge], index: int, name: str) -> _Merge:
    """The merge that a SkipInput can declare: the outer one, or for a tuple item the module inside
    the block that receives the skip alone or in a cat."""
    if outer.item is None:
        return outer
    inside = [m for m in merges if m.item is None and m.root is outer.root and m.call.within(outer.call)]
    if not inside:
        key = _param_name(outer.call.module, outer.key)
        raise ScaleLongError(
            f"find_skips: skip {index} of {name} (made by '{outer.root.producer}') reaches "
            f"'{outer.call.path}' as item {outer.item} of its input {key!r}, "
            f"and no module inside it receives it alone or in a torch.cat; {_ADVICE}"
        )
    return min(inside, key=lambda m: (m.call.depth, m.call.enter))


def _skip_input(m: _Merge, declare: Callable[..., Any]) -> Any:
    """``declare(module, arg, channels, dim)`` for the input of merge ``m``."""
    if m.part is None:
        return declare(m.call.module, m.key, None, 1)
    dim, start, size, whole = m.part
    ndim = len(m.root.shape) + 1  # with the batch axis
    channels = slice(-size, None) if start + size == whole else slice(start, start + size)
    return declare(m.call.module, m.key, channels, 1 if dim == 1 else (-1 if dim == ndim - 1 else dim))


def _shape(m: _Merge) -> tuple[int, ...]:
    return m.root.shape[1:]


def trace_skips(model: nn.Module, args: tuple, kwargs: Mapping, declare: Callable[..., Any]) -> FoundSkips:
    """The long skips of ``model`` read off ``model(*args, **kwargs)``, each described by
    ``declare(module, arg, channels, dim)``: what :func:`scalelong.adapters.find_skips` returns."""
    name = type(model).__name__
    leaves = [t for t in tree_leaves((tuple(args), dict(kwargs))) if isinstance(t, torch.Tensor)]
    if not leaves:
        raise ScaleLongError("find_skips needs an example input: find_skips(model, x, t) with x a tensor")
    tracer = _Tracer({id(m): path for path, m in model.named_modules()})
    calls = _trace(model, tracer, tuple(args), dict(kwargs))
    x_bit = tracer.lookup(leaves[0]).bit
    candidates = _skip_merges(_receptions(calls), x_bit)
    if not candidates:
        raise ScaleLongError(
            f"find_skips found no long skip in {name}: no tensor the encoder makes reaches a later module "
            f"beside the main path; if it has skips, {_ADVICE}"
        )
    chosen = sorted(_choose_level(candidates, name), key=lambda c: c[0].root.born)
    records, used = [], []
    for index, (outer, merges) in enumerate(chosen, start=1):
        m = _declared_input(outer, merges, index, name)
        used.append(m)
        key = _param_name(outer.call.module, outer.key)
        tuple_input = None if outer.item is None else (outer.call.path, key, outer.item)
        records.append(
            TracedSkip(
                index, _skip_input(m, declare), m.call.path, outer.root.producer, _shape(m), tuple_input
            )
        )
    _check_lifo(records, used, name)
    _check_called_once(calls, used, name)
    return FoundSkips(tuple(records), _blocks(calls, chosen[0][0].call.parent, x_bit))


def _trace(model: nn.Module, tracer: _Tracer, args: tuple, kwargs: dict) -> list[_Call]:
    scaling = {id(m) for s in model.modules() if isinstance(s, SkipScaling) for m in s.modules()}
    handles, flags = [], {m: m.training for m in model.modules()}
    for m in model.modules():
        if isinstance(m, SkipScaling):
            handles.append(m.register_forward_hook(tracer.scaling_hook))
        elif id(m) not in scaling:
            handles.append(m.register_forward_pre_hook(tracer.pre_hook, with_kwargs=True))
            handles.append(m.register_forward_hook(tracer.post_hook))
    devices = sorted({t.device.index or 0 for t in tree_leaves((args, kwargs))
                      if isinstance(t, torch.Tensor) and t.device.type == "cuda"})  # fmt: skip
    try:
        model.eval()
        with torch.random.fork_rng(devices=devices), torch.no_grad(), tracer:
            for n, t in enumerate(tree_leaves((args, kwargs))):
                if isinstance(t, torch.Tensor) and tracer.lookup(t) is None:
                    tracer.input(t, f"input {n}")
            model(*args, **kwargs)
    except ScaleLongError:
        raise
    except Exception as e:
        raise ScaleLongError(
            f"find_skips: {type(model).__name__} failed on the example input ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); pass the inputs it is called with, e.g. (x, t)"
        ) from e
    finally:
        for h in handles:
            h.remove()
        for m, training in flags.items():
            m.training = training
    return tracer.calls


def _check_lifo(records: list[TracedSkip], used: list[_Merge], name: str) -> None:
    """Skips made later must be merged earlier: the stack pairing every UNet uses."""
    for k in range(1, len(records)):
        (a, ma), (b, mb) = (records[k - 1], used[k - 1]), (records[k], used[k])
        if mb.call.enter > ma.call.enter:
            raise ScaleLongError(
                f"find_skips: in {name} the skip made by '{b.producer}' (after '{a.producer}') is merged by "
                f"'{b.path}', after '{a.path}' merges the earlier one: the skips are not merged in reverse "
                f"order, so which is the outermost is ambiguous; {_ADVICE}"
            )


def _check_called_once(calls: list[_Call], used: list[_Merge], name: str) -> None:
    counts: dict[int, int] = {}
    for call in calls:
        counts[id(call.module)] = counts.get(id(call.module), 0) + 1
    for m in used:
        if counts[id(m.call.module)] > 1:
            raise ScaleLongError(
                f"find_skips: '{m.call.path}' of {name} runs {counts[id(m.call.module)]} times in one "
                f"forward pass, and a SkipInput names a module, not one of its calls; {_ADVICE}"
            )


def _blocks(calls: list[_Call], parent: _Call | None, x_bit: int) -> dict[str, nn.Module]:
    """The children of the call that merges the skips, in forward order, whose output depends on
    the image: the blocks whose features the diagnostics record."""
    blocks: dict[str, nn.Module] = {}
    for call in calls:
        if call.parent is parent and call.out_bits & x_bit and call.path not in blocks:
            blocks[call.path] = call.module
    return blocks
