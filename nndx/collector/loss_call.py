"""What reached the loss function: one ``LossCall`` per signature, from any path.

How to use::

    calls = LossCallLog()
    calls.add("CrossEntropyLoss", output, target)   # each time the loss is called
    report.loop.loss_calls = calls.records()

The probes call the loss on the model's outputs themselves, and the Monitor sees the
calls of the loss it wraps; both record them here, so the loss-fit rules (softmax
before CrossEntropyLoss, sigmoid before BCEWithLogitsLoss, NLLLoss on probabilities,
shape broadcast) read the same evidence whichever path produced it.

A signature is (loss type, output shape, target shape, output dtype, target dtype).
The first call of a signature is always measured (output range and share of zeros,
whether the rows of a class-axis output sum to one, the targets' mean and std); a later
one only counts, unless ``measure=True`` (the Monitor measures on the steps it
records): the range widens over calls, the rest is the latest measured. Measuring costs
one host synchronisation.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from nndx import vocab
from nndx.collector._common import iter_tensors
from nndx.collector.probes._observe import moved_axis
from nndx.collector.stats import Pending
from nndx.report import LossCall

MAX_SIGNATURES = 16
MAX_SINGLE_VALUES = 16
# rows whose sum is this close to 1 (in float32) are probabilities already
ROWS_SUM_TOLERANCE = 1e-3


def call_evidence(output: torch.Tensor, target: torch.Tensor | None) -> dict[str, float | None]:
    """What one loss call shows, with one host synchronisation: the output's range, the
    largest |row sum - 1| over its class axis (dim 1; None without one), its share of
    exact zeros, the mean, std and range of floating-point targets, and whether the targets all
    hold one value (a batch of one class: data in label order)."""
    return pending_evidence(output, target).resolve()


def pending_evidence(output: torch.Tensor, target: torch.Tensor | None,
                     ignore_index: int | None = None) -> Pending[dict[str, float]]:
    """:func:`call_evidence` with the values not fetched yet (the Monitor fetches them
    with the recorded step's others)."""
    x = output.detach().float()
    lo, hi = torch.aminmax(x)
    values = {"output_min": lo, "output_max": hi, "output_zero_fraction": (x == 0).float().mean()}
    if x.dim() >= 2 and x.shape[1] > 1:
        # probabilities over dim 1 (a classifier's, CrossEntropyLoss's axis) or over the last axis
        # (a sequence model's (batch, time, classes), whichever way the loss then lays it out)
        values["rows_off_one"] = min((x.sum(dim=d) - 1.0).abs().max() for d in {1, x.dim() - 1})
        # log-probabilities over the classes (dim 1) have a logsumexp of 0 there
        values["log_rows_off_zero"] = x.logsumexp(dim=1).abs().max()
    if target is not None and target.is_floating_point() and target.numel() > 1:
        t = target.detach().float()
        values["target_mean"], values["target_std"] = t.mean(), t.std()
        values["target_min"], values["target_max"] = torch.aminmax(t)
    if target is not None and target.numel() > 1 and not target.is_complex():
        flat = target.detach().reshape(-1)
        values["target_single"] = (flat == flat[0]).all().float()
        values["target_first"] = flat[0].float()
        if not target.is_floating_point() and target.dtype != torch.bool:
            # the most common class the loss scores, without a sync of its own: the targets it skips
            # (ignore_index, negatives) are set to -1 first, so a mode of -1 says nothing
            scored = (flat >= 0) & (flat != (-1 if ignore_index is None else ignore_index))
            top = torch.where(scored, flat, torch.full_like(flat, -1)).mode().values
            values["target_top"] = top.float()
            values["target_top_share"] = ((flat == top) & scored).sum() / scored.sum().clamp(min=1)
    names = list(values)
    stacked = torch.stack([v.reshape(()).to(x.device, torch.float64) for v in values.values()])
    return Pending(stacked, lambda fetched: dict(zip(names, fetched)))


def _dtype(t: torch.Tensor | None) -> str | None:
    return None if t is None else str(t.dtype).removeprefix("torch.")


def _class_weight_ratio(weight: Any, output: torch.Tensor) -> float | None:
    """Largest over smallest of ``weight`` when it holds one positive, finite weight per
    class of ``output`` (on its class axis, 1 or last): a loss's ``weight=``. Anything else
    a loss object calls ``weight`` (a scalar factor, a module's parameter) is not read."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or output.dim() < 2 or len(weight) < 2:
        return None
    if len(weight) not in (output.shape[1], output.shape[-1]) or not weight.is_floating_point():
        return None
    with torch.no_grad():
        lo, hi = float(weight.min()), float(weight.max())
    return hi / lo if lo > 0 and math.isfinite(hi) else None


class LossCallLog:
    """Loss calls, aggregated by signature (at most ``max_signatures`` kept)."""

    def __init__(self, max_signatures: int = MAX_SIGNATURES) -> None:
        self.max_signatures = max_signatures
        self._entries: dict[tuple, dict[str, Any]] = {}

    def add(self, loss_type: str, output: Any, target: Any, measure: bool = False,
            defer: Callable[[Pending, Callable[[Any], None]], None] | None = None,
            ignore_index: int | None = None, activation: str | None = None,
            class_weight: Any = None) -> dict[str, Any] | None:
        """Count a call of ``loss_type`` on ``output`` and ``target`` (anything that is not
        a tensor output is not evidence of its kind, and is left out). ``class_weight``: the
        loss's per-class weights (``weight=``), if any. ``defer``: hand the
        evidence's values to this instead of fetching them now (the Monitor's Deferred).
        Returns the signature's entry (None when left out), for what only the caller knows:
        ``entry["applies"]``, what a loss of the user's own applied to the outputs itself."""
        if not isinstance(output, torch.Tensor):
            return None
        target_t = target if isinstance(target, torch.Tensor) else None
        key = (loss_type, tuple(output.shape), None if target_t is None else tuple(target_t.shape),
               _dtype(output), _dtype(target_t))  # fmt: skip
        entry = self._entries.get(key)
        if entry is not None:
            entry["calls"] += 1
            if not measure:
                return entry
        elif len(self._entries) >= self.max_signatures:
            return None
        else:
            entry = self._entries[key] = {
                "loss_type": loss_type,
                "output_shape": list(output.shape),
                "target_shape": None if target_t is None else list(target_t.shape),
                "output_dtype": _dtype(output),
                "target_dtype": _dtype(target_t),
                "calls": 1,
            }
        if activation is not None:
            entry["output_activation"] = activation
        ratio = _class_weight_ratio(class_weight, output)
        if ratio is not None:
            entry["class_weight_ratio"] = max(ratio, entry.get("class_weight_ratio") or ratio)
        if ignore_index is not None and ignore_index >= 0 and target_t is not None and not target_t.is_floating_point():
            _note_ignored(entry, target_t, int(ignore_index))
        if output.is_floating_point() and output.numel() > 0:
            pending = pending_evidence(output, target_t, ignore_index)
            if defer is None:
                self._merge(entry, pending.resolve())
            else:
                defer(pending, lambda seen: self._merge(entry, seen))
        return entry

    @staticmethod
    def _merge(entry: dict[str, Any], seen: dict[str, float]) -> None:
        """Fold one call's evidence into its signature's entry."""
        lo, hi = seen["output_min"], seen["output_max"]
        entry["output_min"] = lo if entry.get("output_min") is None else min(entry["output_min"], lo)
        entry["output_max"] = hi if entry.get("output_max") is None else max(entry["output_max"], hi)
        entry["output_zero_fraction"] = min(max(seen["output_zero_fraction"], 0.0), 1.0)
        if "rows_off_one" in seen:
            looks = lo >= 0.0 and hi <= 1.0 and seen["rows_off_one"] < ROWS_SUM_TOLERANCE
            entry["output_rows_sum_to_one"] = looks and entry.get("output_rows_sum_to_one", True) is not False
        if "log_rows_off_zero" in seen:
            off = seen["log_rows_off_zero"]
            entry["output_log_rows_off_zero"] = max(off, entry.get("output_log_rows_off_zero") or 0.0)
        if "target_mean" in seen:
            entry["target_mean"], entry["target_std"] = seen["target_mean"], seen["target_std"]
            entry["target_min"] = min(entry.get("target_min", math.inf), seen["target_min"])
            entry["target_max"] = max(entry.get("target_max", -math.inf), seen["target_max"])
        if seen.get("target_top", -1.0) >= 0 and seen["target_top_share"] > (entry.get("top_target_fraction") or 0.0):
            entry["top_target"], entry["top_target_fraction"] = int(seen["target_top"]), seen["target_top_share"]
        if "target_single" in seen:
            entry["measured_batches"] = entry.get("measured_batches", 0) + 1
            if seen["target_single"]:
                entry["single_target_batches"] = entry.get("single_target_batches", 0) + 1
                values = entry.setdefault("single_target_values", [])
                if seen["target_first"] not in values and len(values) < MAX_SINGLE_VALUES:
                    values.append(seen["target_first"])

    def records(self) -> list[LossCall]:
        return [LossCall(**entry) for entry in self._entries.values()]

    def __len__(self) -> int:
        return len(self._entries)


def _note_ignored(entry: dict[str, Any], target: torch.Tensor, ignore_index: int) -> None:
    """A loss told to ignore a class index (``ignore_index`` >= 0): the share of targets it
    skips and how many classes it still scores, over the calls seen."""
    with torch.no_grad():
        ignored = target == ignore_index
        scored = torch.unique(target[~ignored & (target >= 0)]).numel()
    entry["ignore_index"] = ignore_index
    entry["ignored_target_fraction"] = max(entry.get("ignored_target_fraction", 0.0), float(ignored.float().mean()))
    entry["scored_classes"] = max(entry.get("scored_classes", 0), int(scored))


# what squashes its input into (0, 1), or its log: applied again to a probability, a second squash
_SQUASHES = frozenset({"sigmoid", "log_sigmoid", "softmax", "log_softmax"})

# where a tensor inside a loss came from (InnerLossCalls), as bits: the model's output, the targets
FROM_OUTPUT, FROM_TARGET = 1, 2


class InnerLossCalls(TorchFunctionMode):
    """Inside ``with InnerLossCalls(log):``, every call of one of torch's own losses
    (``F.mse_loss``, ``F.cross_entropy``...) is recorded in ``log``, with what it was
    given. A loss function of the user's own (``def my_loss(out, y): return
    F.mse_loss(out, y.float())``) hides what reaches torch's loss behind its name; this
    is how the loss-fit rules still see it. Without a log only ``last`` is kept (the
    overfit probe reads accuracy off it at every step and needs no statistics).

    Given the model's ``output`` (and ``target``), it also notes a softmax or log_softmax
    the loss applies over that output's last axis (or dim 1) itself (``applies``): a
    label-smoothing cross-entropy written by hand expects logits as much as
    ``CrossEntropyLoss`` does; and an elementwise op that broadcasts an output-shaped and a
    target-shaped tensor to a larger shape (``broadcast_shape``: ``torch.mean((u - u_pred)
    ** 2)`` with [N] against [N, 1] compares every output with every target). Given the
    ``observer`` of the forward, a sigmoid or softmax the loss applies to what an activation
    bounded to [0, 1] made (``squashed``: CORAL's log-sigmoid cost given the probabilities
    instead of the logits) is noted as (that activation, the op)."""

    def __init__(self, log: LossCallLog | None = None, output: torch.Tensor | None = None,
                 target: Any = None, observer: Any = None) -> None:  # fmt: skip
        super().__init__()
        self.log = log
        # a ForwardObserver around the same forward: it tells which activation made a loss's input
        self.observer = observer
        # the last call as (loss type, output, target): what accuracy reads off a loss of the user's own
        self.last: tuple[str, Any, Any] | None = None
        self.output_shape = tuple(output.shape) if isinstance(output, torch.Tensor) else None
        self.target_shape = tuple(target.shape) if isinstance(target, torch.Tensor) else None
        self.applies: str | None = None
        self.squashed: tuple[str, str] | None = None
        self.broadcast_shape: list[int] | None = None
        self.broadcast_operands: list[list[int]] | None = None
        self.moved_axes: list[str] = []  # views of the outputs that interleave axes (classes viewed last)
        # what each tensor inside the loss was computed from: the output, the targets or both (by id,
        # with a weak reference that tells a reused id apart)
        self._origin: dict[int, tuple[weakref.ref, int]] = {}
        for flag, given in ((FROM_OUTPUT, output), (FROM_TARGET, target)):
            for t in iter_tensors(given):
                self._mark(t, flag)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", None)
        if name in ("softmax", "log_softmax") and self.output_shape and self.applies is None:
            x = args[0] if args else kwargs.get("input")
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            rank = len(self.output_shape)
            over_classes = dim in (1, -1, rank - 1)
            # the output itself, or laid out anew first (CTC's time-major transpose(0, 1))
            if (rank >= 2 and over_classes and isinstance(x, torch.Tensor)
                    and sorted(x.shape) == sorted(self.output_shape)):  # fmt: skip
                self.applies = name
        if name in _SQUASHES and self.observer is not None and self.squashed is None:
            x = args[0] if args else kwargs.get("input")
            known, made = self.observer.output_activation(x) if isinstance(x, torch.Tensor) else (False, None)
            kind = vocab.activation_kind(made) if known and made else None
            if kind is not None and kind.bounds == (0.0, 1.0):
                self.squashed = (made, name)
        if name in ("view", "reshape") and self.output_shape and not self.moved_axes and args:
            self._note_view(name, args[0], args[1:] or kwargs.get("shape", ()))
        kind = vocab.loss_kind(name)
        if kind is not None:
            output = args[0] if args else kwargs.get("input")
            target = args[1] if len(args) > 1 else kwargs.get("target")
            if self.log is not None:
                known, made = self.observer.output_activation(output) if self.observer is not None else (False, None)
                weight = kwargs.get("weight", args[2] if len(args) > 2 else None)
                self.log.add(kind.name, output, target, ignore_index=kwargs.get("ignore_index"),
                             activation=made if known else None, class_weight=weight)  # fmt: skip
            self.last = (kind.name, output, target)
        result = func(*args, **kwargs)
        if self._origin:
            flags = 0
            for t in iter_tensors((args, kwargs)):
                flags |= self._from(t)
            if flags:
                for t in iter_tensors(result):
                    self._mark(t, flags)
        if name in _ELEMENTWISE and self.broadcast_shape is None:
            operands = [a for a in args if isinstance(a, torch.Tensor)]
            if len(operands) >= 2:
                self._note_broadcast(operands, result)
        return result

    def _mark(self, t: torch.Tensor, flags: int) -> None:
        self._origin[id(t)] = (weakref.ref(t), self._from(t) | flags)

    def _from(self, t: torch.Tensor) -> int:
        ref, flags = self._origin.get(id(t), (None, 0))
        return flags if ref is not None and ref() is t else 0

    def _note_view(self, op: str, x: Any, shape: Any) -> None:
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != self.output_shape:
            return
        sizes = list(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else list(shape)
        if not all(isinstance(d, int) for d in sizes) or sizes.count(-1) > 1:
            return
        if -1 in sizes:
            known = math.prod(d for d in sizes if d != -1)
            sizes[sizes.index(-1)] = x.numel() // known if known else 0
        if moved_axis(list(x.shape), sizes):
            self.moved_axes.append(f"loss: {op} {list(x.shape)} -> {sizes}")

    def _note_broadcast(self, operands: list[torch.Tensor], result: Any) -> None:
        """An op over several tensors (``u - u_pred``, ``torch.where(y == 1, 1 - p, p)``) whose
        result is larger than every operand, from an output-shaped and a target-shaped one."""
        out, target = self.output_shape, self.target_shape
        if out is None or not isinstance(result, torch.Tensor) or result.numel() <= max(t.numel() for t in operands):
            return
        exact = target is not None and out != target and {tuple(t.shape) for t in operands} == {out, target}
        # or a tensor computed from the output against one computed from the targets alone, whose
        # batch axes broadcast against each other: a DQN's gathered [N, 1] Q-values minus its [N]
        # TD targets, a quantile loss's [N, 7] slice minus [N, 1, 7] targets
        origins = [self._from(t) for t in operands]
        batch = out[0] if out else None
        crossed = (FROM_TARGET in origins and any(o & FROM_OUTPUT for o in origins) and batch is not None and batch > 1
                   and list(result.shape).count(batch) > max(list(t.shape).count(batch) for t in operands))
        if exact:  # the output's side first
            a = next(t for t in operands if tuple(t.shape) == out)
            b = next(t for t in operands if tuple(t.shape) == target)
        elif crossed:
            a = next(t for t, o in zip(operands, origins) if o & FROM_OUTPUT)
            b = next(t for t, o in zip(operands, origins) if o == FROM_TARGET)
        else:
            return
        self.broadcast_shape = list(result.shape)
        self.broadcast_operands = [list(a.shape), list(b.shape)]


# elementwise ops whose operands broadcast: how a loss written by hand compares outputs with targets
# (arithmetic, a where() that picks by the label, a comparison, a hinge's maximum)
_ELEMENTWISE = frozenset({
    "sub", "add", "mul", "div", "true_divide", "__sub__", "__rsub__", "__add__", "__radd__", "__mul__", "__rmul__",
    "__truediv__", "__rtruediv__", "where", "maximum", "minimum", "pow", "__pow__", "__rpow__", "eq", "ne", "lt",
    "le", "gt", "ge", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "xlogy", "atan2", "hypot",
})  # fmt: skip


# what only the probes see: they call a loss of the user's own themselves, inside InnerLossCalls
_PROBE_ONLY = ("applies", "broadcast_shape", "broadcast_operands", "squashes_again")


def merge_loss_calls(first: list[LossCall], second: list[LossCall]) -> list[LossCall]:
    """``first``, then the calls of ``second`` whose signature ``first`` lacks (a report
    merging the Monitor's calls with the probes' keeps the training loop's counts); a call
    of both keeps what only the probes' call saw inside the loss (``applies``,
    ``broadcast_shape``)."""

    def signature(call: LossCall) -> tuple:
        shape = None if call.target_shape is None else tuple(call.target_shape)
        return call.loss_type, tuple(call.output_shape), shape, call.output_dtype, call.target_dtype

    probes = {signature(c): c for c in second}
    merged = []
    for call in first:
        other = probes.pop(signature(call), None)
        found = {k: getattr(other, k) for k in _PROBE_ONLY if other is not None and getattr(call, k) is None}
        merged.append(call.model_copy(update={k: v for k, v in found.items() if v is not None}))
    return [*merged, *probes.values()]


__all__ = ["InnerLossCalls", "LossCallLog", "call_evidence", "merge_loss_calls"]
