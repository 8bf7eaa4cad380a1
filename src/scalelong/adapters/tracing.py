"""Find the long skips of a network by itself, from one forward pass.

:func:`find` runs the model once (no gradients, eval mode) on an example input and watches two
things: every module call (forward pre-hooks and hooks: what each module receives and returns)
and every torch function (a :class:`~torch.overrides.TorchFunctionMode`: where each tensor comes
from, and how ``torch.cat`` lays its operands side by side). From that it reads the long skips:

    a tensor S made during the forward (the output of an encoder module, or a tensor the forward
    computes from one) that depends on the image input, whose first consumer (the main path: the
    next encoder block) has finished before a later module M receives S again, together with a
    tensor that was itself computed from S (the decoder stream).

M receives S as one of its inputs, as an item of a tuple input (diffusers' up blocks take
``res_hidden_states_tuple``), or as an operand of a ``torch.cat`` that is one of its inputs (the
concatenation made in the parent's forward: EDM2, denoising-diffusion-pytorch). ``S * c``,
``S.clone()`` and any other one-input op that keeps the shape carries S (EDM2's magnitude-
preserving concat scales both operands before ``torch.cat``). The time embedding and a text
context do not depend on the image and are never skips; a module that sees S once (a residual
branch, q/k/v projections) never pairs with it.

Where M is a block that hands S on to a module inside it, the outermost receiving module is the
skip's input; the skips of one network are the merges made by the children of one call (the
UNet's forward). Skip 1 is the one made first (next to the input); the skips must meet the
decoder in reverse order (LIFO), which is checked. Each skip is described as plain data, a
:class:`~scalelong.adapters.declaration.SkipInput` with the module's dotted path, the input by
position 0 or by name, the tuple item and the channel slice: the very declaration the per-family
layouts give the installer (a diffusers UNet's is its adapter's). :class:`FoundSkips` holds them
with where each is made and its shape; :func:`scalelong.describe` (and ``print``) lists them.

:func:`read` is the trace itself, which :mod:`scalelong.adapters.checking` also reads to check a
declaration made by hand (:class:`Session` watches a real call). Like the per-family layouts of
:mod:`scalelong.adapters`, this module only reads a model; the adapters install what it finds.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from scalelong.adapters.declaration import SkipInput, input_text, locate
from scalelong.errors import ScaleLongError, first_line
from scalelong.skips import SkipRow, SkipScaling, skip_table

_CATS = {torch.cat, torch.concat, torch.concatenate}
_ADVICE = "declare the skips with SkipInput instead (scalelong.SkipInput)"


# ----------------------------------------------------------------------------- what is found


@dataclass(frozen=True)
class TracedSkip:
    """One long skip as :func:`find` saw it in the forward pass.

    Attributes:
        index: 1 = the outermost skip (made first, merged last).
        skip: the :class:`SkipInput` that scales it, its module as a dotted path in the model.
        producer: where the encoder made it: a module path, or ``op(path)`` for a tensor the
            forward computed from that module's output (``add(downs.0.2)``).
        shape: the skip's shape without the batch axis.
    """

    index: int
    skip: SkipInput
    producer: str
    shape: tuple[int, ...]
    input: str = ""  # the input as describe() names it: ``x``, ``res_hidden_states_tuple[1]``


@dataclass(frozen=True)
class FoundSkips(Sequence):
    """The declaration :func:`scalelong.find_skips` read off a model: a sequence of
    :class:`SkipInput` (outermost first, modules as paths), so ``apply_scalelong(model, method,
    skips=found)`` installs it as is; ``scalelong.describe(found)`` and ``print(found)`` list it in
    the table of ``scalelong.skips.skip_table``, with where each skip is made.

    ``blocks`` names the blocks whose features the diagnostics record, in forward order, each by
    its dotted path: plain data like the skips, so the declaration fits the traced model and every
    copy of it (the installer looks each path up in the model it is applied to)."""

    records: tuple[TracedSkip, ...]
    model: str = ""  # the class name of the traced model, for messages
    blocks: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)  # name -> path

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [r.skip for r in self.records[i]]
        return self.records[i].skip

    def __len__(self) -> int:
        return len(self.records)

    @property
    def paths(self) -> list[str]:
        """Dotted path of each skip's module, outermost first."""
        return [r.skip.module for r in self.records]

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """Each skip's shape without the batch axis, outermost first."""
        return [r.shape for r in self.records]

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

    def install_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the installer (``scalelong.adapters.declared.install``) for these skips:
        modules, blocks included, as paths, which the installer resolves in the model it is given."""
        sizes = {"skip_channels": self.skip_channels, "num_tokens": self.num_tokens}
        if sizes["skip_channels"] is not None:
            sizes["num_tokens"] = None
        return {"skips": list(self), **sizes, "shapes": self.shapes, "blocks": dict(self.blocks)}

    def skip_rows(self) -> list[SkipRow]:
        """The rows :func:`scalelong.describe` lists for skips found but not yet applied."""
        return [
            SkipRow(
                r.index,
                r.skip.module,
                r.input,
                r.skip.channels,
                r.shape,
                None,
                None,
                "not applied",
                r.producer,
            )  # fmt: skip
            for r in self.records
        ]

    def __str__(self) -> str:
        return skip_table(self)


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

    __slots__ = ("module", "path", "enter", "exit", "parent", "depth", "inputs", "lengths", "out_bits")

    def __init__(self, module: nn.Module, path: str, enter: int, parent: _Call | None):
        self.module, self.path, self.enter, self.exit, self.parent = module, path, enter, None, parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.inputs: list[tuple[int | str, int | None, _Tensor]] = []  # (position or keyword, item, tensor)
        self.lengths: dict[int | str, int] = {}  # the length of each tuple (or list) input
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

    def inputs(self, args: tuple, kwargs: Mapping) -> None:
        """Mark every tensor of the model's inputs as an input of its own."""
        for n, t in enumerate(tree_leaves((tuple(args), dict(kwargs)))):
            if isinstance(t, torch.Tensor) and self.lookup(t) is None:
                self.input(t, f"input {n}")

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
                    call.lengths[key] = len(value)
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


def _watch(model: nn.Module, tracer: _Tracer, with_model: bool = True) -> list:
    """Put the tracer's hooks on every module of ``model`` (its own ahead of any other pre-hook, so
    it sees each module's inputs as the caller passed them, before ScaleLong's hooks scale them)."""
    scaling = {id(m) for s in model.modules() if isinstance(s, SkipScaling) for m in s.modules()}
    handles = []
    for m in model.modules():
        if isinstance(m, SkipScaling):
            handles.append(m.register_forward_hook(tracer.scaling_hook))
        elif id(m) not in scaling and (with_model or m is not model):
            handles.append(m.register_forward_pre_hook(tracer.pre_hook, with_kwargs=True, prepend=True))
            handles.append(m.register_forward_hook(tracer.post_hook))
    return handles


def _trace(model: nn.Module, tracer: _Tracer, args: tuple, kwargs: dict) -> list[_Call]:
    """Run ``model(*args, **kwargs)`` once under the tracer: eval mode, no gradients, the random
    number generator and the training flags restored after."""
    handles, flags = _watch(model, tracer), {m: m.training for m in model.modules()}
    devices = sorted({t.device.index or 0 for t in tree_leaves((args, kwargs))
                      if isinstance(t, torch.Tensor) and t.device.type == "cuda"})  # fmt: skip
    try:
        model.eval()
        with torch.random.fork_rng(devices=devices), torch.no_grad(), tracer:
            tracer.inputs(args, kwargs)
            model(*args, **kwargs)
    except ScaleLongError:
        raise
    except Exception as e:
        raise ScaleLongError(
            f"find_skips: {type(model).__name__} failed on the example input "
            f"({first_line(e, name=True)}); pass the inputs it is called with, e.g. (x, t)"
        ) from e
    finally:
        for h in handles:
            h.remove()
        for m, training in flags.items():
            m.training = training
    return tracer.calls


class Session:
    """A trace of one real call of ``model``, begun in its forward pre-hook (made there) and ended in
    its forward hook (:meth:`end`): the forward runs as it would, its gradients included, only watched."""

    def __init__(self, model: nn.Module, args: tuple, kwargs: dict):
        self.model, self.tracer = model, _Tracer({id(m): path for path, m in model.named_modules()})
        self.handles = _watch(model, self.tracer, with_model=False)
        self.tracer.__enter__()
        self.tracer.inputs(args, kwargs)
        self.leaf = next((t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)), None)
        self.tracer.pre_hook(model, args, kwargs)

    def end(self, args: tuple, output: object) -> Reading | None:
        """Stop watching; the reading of the call, or None where it raised (``output`` None)."""
        try:
            if output is not None:
                self.tracer.post_hook(self.model, args, output)
        finally:
            self.tracer.__exit__(None, None, None)
            for h in self.handles:
                h.remove()
        if output is None or self.leaf is None:
            return None
        return _reading(self.model, self.tracer, self.leaf)


# ----------------------------------------------------------------------------- reading the skips


@dataclass
class Merge:
    """Root ``root`` reaches ``call`` at ``key`` (tuple item ``item``; a cat slice ``part``)."""

    root: _Tensor
    call: _Call
    key: int | str
    item: int | None
    part: tuple[int, int, int, int] | None  # (dim, start, size, width of the whole input) of a cat operand
    merge: bool  # whether the call also receives a tensor computed from the root


@dataclass
class Reading:
    """One traced forward pass: every module call, in the order they began, and every long-skip
    candidate (its outermost merges), before the pairing is checked."""

    name: str  # the model's class name, for messages
    calls: list[_Call]
    candidates: list[tuple[Merge, list[Merge]]]
    x_bit: int  # the trace's mark of the image input

    def first_call(self, module: nn.Module) -> _Call | None:
        return next((c for c in self.calls if c.module is module), None)

    def skip_roots(self) -> dict[int, Merge]:
        """id(root) -> its first outer merge, for every tensor that is a long skip somewhere."""
        roots: dict[int, Merge] = {}
        for m, _ in self.candidates:
            roots.setdefault(id(m.root), m)
        return roots


def _receptions(calls: Sequence[_Call]) -> dict[int, list[Merge]]:
    """Every time a call receives a root (directly, as a tuple item or a cat operand), by root."""
    found: dict[int, list[Merge]] = {}
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
                found.setdefault(id(root), []).append(Merge(root, call, key, item, part, merge))
    return found


def _skip_merges(receptions: Mapping[int, list[Merge]], x_bit: int) -> list[tuple[Merge, list[Merge]]]:
    """Per long skip: its outermost merges, each with every merge of that skip."""
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


def read(model: nn.Module, args: tuple, kwargs: Mapping) -> Reading:
    """Trace ``model(*args, **kwargs)`` once and collect the long-skip candidates."""
    leaves = [t for t in tree_leaves((tuple(args), dict(kwargs))) if isinstance(t, torch.Tensor)]
    if not leaves:
        raise ScaleLongError("find_skips needs an example input: find_skips(model, x, t) with x a tensor")
    tracer = _Tracer({id(m): path for path, m in model.named_modules()})
    _trace(model, tracer, tuple(args), dict(kwargs))
    return _reading(model, tracer, leaves[0])


def _reading(model: nn.Module, tracer: _Tracer, x: torch.Tensor) -> Reading:
    """What the trace saw, the first tensor input ``x`` taken as the image."""
    x_bit = tracer.lookup(x).bit
    calls = tracer.calls
    return Reading(type(model).__name__, calls, _skip_merges(_receptions(calls), x_bit), x_bit)


def pair(reading: Reading) -> list[Merge]:
    """The outer merge of every long skip, outermost first: the children of one call (the UNet's
    forward), each skip merged once, in reverse order of making (LIFO), by modules that run once.
    Raises one :class:`ScaleLongError` where there is none or the pairing is ambiguous."""
    name, candidates = reading.name, reading.candidates
    if not candidates:
        raise ScaleLongError(
            f"find_skips found no long skip in {name}: no tensor the encoder makes reaches a later module "
            f"beside the main path; if it has skips, {_ADVICE}"
        )
    depth = min(m.call.depth for m, _ in candidates)
    parents = {id(m.call.parent): m.call.parent for m, _ in candidates if m.call.depth == depth}
    if len(parents) > 1:
        where = " and ".join(sorted(f"'{p.path or name}'" for p in parents.values() if p is not None))
        raise ScaleLongError(
            f"find_skips: {name} merges long skips in more than one call ({where}); run find_skips on the "
            f"network that holds the skips, or {_ADVICE}"
        )
    chosen = [m for m, _ in candidates if m.call.depth == depth]
    by_root: dict[int, list[Merge]] = {}
    for m in chosen:
        by_root.setdefault(id(m.root), []).append(m)
    for merges in by_root.values():
        if len(merges) > 1:
            places = ", ".join(f"'{m.call.path}'" for m in merges)
            raise ScaleLongError(
                f"find_skips: the output of '{merges[0].root.producer}' reaches {len(merges)} decoder "
                f"modules ({places}), so which one it is a skip of is ambiguous; {_ADVICE}"
            )
    chosen.sort(key=lambda m: m.root.born)
    _check_lifo(chosen, name)
    _check_called_once(reading.calls, chosen, name)
    return chosen


def find(model: nn.Module, args: tuple, kwargs: Mapping) -> FoundSkips:
    """The long skips of ``model`` read off ``model(*args, **kwargs)``: what
    :func:`scalelong.find_skips` returns."""
    reading = read(model, args, kwargs)
    chosen = pair(reading)
    records = []
    for index, m in enumerate(chosen, start=1):
        skip = skip_input(m)
        shape = m.root.shape[1:]
        name = input_text(*locate(m.call.module, skip, index), skip.item)
        records.append(TracedSkip(index, skip, m.root.producer, shape, name))
    return FoundSkips(tuple(records), reading.name, _blocks(reading, chosen[0].call.parent))


def skip_input(m: Merge) -> SkipInput:
    """The :class:`SkipInput` of merge ``m``: the module's path, its input (position 0, else by
    name), the tuple item and the skip's channel slice of a concatenation."""
    arg = argument(m.call.module, m.key)
    if m.part is None:
        return SkipInput(m.call.path, arg, None, 1, m.item)
    dim, start, size, whole = m.part
    return SkipInput(
        m.call.path, arg, cat_slice(start, size, whole), dim_text(dim, len(m.root.shape)), m.item
    )


def cat_slice(start: int, size: int, whole: int) -> slice:
    """The slice of ``size`` channels at ``start`` of ``whole``: ``slice(-size, None)`` for the tail,
    which stays right whatever the width of what is concatenated before it."""
    return slice(-size, None) if start + size == whole else slice(start, start + size)


def dim_text(dim: int, ndim: int) -> int:
    """The concatenation axis as a declaration spells it: 1 for (B, C, ...) maps, -1 for the last."""
    return 1 if dim == 1 else (-1 if dim == ndim - 1 else dim)


def argument(module: nn.Module, key: int | str) -> int | str:
    """How a SkipInput names an input: position 0 (the module's main input) by position, any other
    by its parameter name where ``forward`` has one (``skip``, ``res_hidden_states_tuple``)."""
    if isinstance(key, str) or key == 0:
        return key
    try:
        params = [
            p
            for p in inspect.signature(module.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        return key
    if key < len(params) and params[key].kind is not inspect.Parameter.POSITIONAL_ONLY:
        return params[key].name
    return key


def _check_lifo(chosen: list[Merge], name: str) -> None:
    """Skips made later must be merged earlier: the stack pairing every UNet uses."""
    for a, b in zip(chosen, chosen[1:], strict=False):
        if b.call.enter > a.call.enter:
            raise ScaleLongError(
                f"find_skips: in {name} the skip made by '{b.root.producer}' (after '{a.root.producer}') is "
                f"merged by '{b.call.path}', after '{a.call.path}' merges the earlier one: the skips are not "
                f"merged in reverse order, so which is the outermost is ambiguous; {_ADVICE}"
            )


def _check_called_once(calls: list[_Call], chosen: list[Merge], name: str) -> None:
    counts: dict[int, int] = {}
    for call in calls:
        counts[id(call.module)] = counts.get(id(call.module), 0) + 1
    for m in chosen:
        if counts[id(m.call.module)] > 1:
            raise ScaleLongError(
                f"find_skips: '{m.call.path}' of {name} runs {counts[id(m.call.module)]} times in one "
                f"forward pass, and a SkipInput names a module, not one of its calls; {_ADVICE}"
            )


def _blocks(reading: Reading, parent: _Call | None) -> dict[str, str]:
    """The children of the call that merges the skips, in forward order, whose output depends on
    the image (not the time embedding): the blocks whose features the diagnostics record, each
    named by its path (the path, not the module: the found skips also serve copies of the model)."""
    blocks: dict[str, str] = {}
    for call in reading.calls:
        if call.parent is parent and call.out_bits & reading.x_bit and call.path not in blocks:
            blocks[call.path] = call.path
    return blocks
