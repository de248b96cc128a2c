"""What every watcher shares: the step context the clock hands them, the watcher
interface, bounded histories of named records, and the deferred host fetch.

A watcher owns one measured thing. The Monitor (the clock) calls it at the loop's
events — a forward, the start and end of a backward pass, a gradient reset, the start
and end of an optimizer step — with a :class:`StepContext`, and at ``report()`` asks it
for its part of the report. Watchers keep named records (NamedTuples whose fields are
read by name), never tuples whose meaning is the field order of a report model.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from nndx.collector._common import own_optimizer, torch_optimizer, trainable_tensors
from nndx.collector.stats import Pending
from nndx.report import ErrorRecord

logger = logging.getLogger("nndx")


@dataclass
class Watched:
    """What a Monitor watches, fixed at attach time. ``root`` is the model, or a
    ``ModuleDict`` of the models when there are several (parameter names then start with
    each model's key). ``params``: the trainable parameters, by name."""

    root: nn.Module
    models: dict[str, nn.Module]
    optimizers: list[torch.optim.Optimizer]
    params: list[tuple[str, nn.Parameter]]
    wrappers: list[str] = field(default_factory=list)  # optimizer wrappers whose inner optimizer is watched
    complex_params: list[str] = field(default_factory=list)  # trainable but not watched: no statistic reads them
    own_optimizers: list[str] = field(default_factory=list)  # the user's own optimizer classes: updates by hand
    plain: list[str] = field(default_factory=list)  # tensors watched as parameters: the model registers none

    def named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """The root's parameters, trainable or not, and the plain tensors watched in their place."""
        return list(nn.Module.named_parameters(self.root)) + (list(self.params) if self.plain else [])

    @property
    def manual(self) -> bool:
        """No optimizer: steps are detected from parameter changes, the LR is unknown."""
        return not self.optimizers

    def params_of(self, optimizer: torch.optim.Optimizer | None) -> list[tuple[str, nn.Parameter]]:
        """The trainable parameters a step of ``optimizer`` may move: all of them, but
        those that only another watched optimizer holds (a GAN's other network)."""
        others = {id(p) for o in self.optimizers if o is not optimizer for g in o.param_groups for p in g["params"]}
        if optimizer is None or not others:
            return self.params
        own = {id(p) for group in optimizer.param_groups for p in group["params"]}
        return [(n, p) for n, p in self.params if id(p) in own or id(p) not in others]

    @classmethod
    def of(cls, model: Any, optimizer: Any) -> Watched:
        """What ``Monitor(model, optimizer)`` watches. ``model``: a module, or several as a
        mapping name -> module (or a sequence: names "0", "1", ...), e.g. a GAN's
        ``{"G": generator, "D": discriminator}``. ``optimizer``: an optimizer, a sequence of
        them, or None for a loop that updates the parameters by hand."""
        if isinstance(model, nn.Module):
            models, root = {"": model}, model
        elif isinstance(model, (Mapping, list, tuple)) and model:
            models = dict(model) if isinstance(model, Mapping) else {str(i): m for i, m in enumerate(model)}
            bad = [k for k, m in models.items() if not (isinstance(m, nn.Module) and isinstance(k, str) and k and "." not in k)]
            if bad:
                raise TypeError(f"models must map names (no dots) to torch.nn.Module; check {bad}")
            root = nn.ModuleDict(models)
        else:
            raise TypeError(f"model must be a torch.nn.Module (or a dict of them), got {type(model).__name__}")
        given = list(optimizer) if isinstance(optimizer, (list, tuple)) else [] if optimizer is None else [optimizer]
        if any(opt is None for opt in given):
            raise TypeError("optimizer must be a torch.optim.Optimizer (or a list of them, or None), got a list "
                            "holding None")  # fmt: skip
        own = [opt for opt in given if own_optimizer(opt)]
        given = [opt for opt in given if not any(opt is o for o in own)]
        optimizers = [torch_optimizer(opt) for opt in given]
        wrappers = [type(original).__name__ for opt, original in zip(optimizers, given) if opt is not original]
        # a model that registers no parameter but holds tensors that require grad (d2l's and fastai's models
        # from scratch: self.w = torch.normal(..., requires_grad=True)) trains those: they are watched instead
        trainable = trainable_tensors(root)
        plain = [] if any(isinstance(p, nn.Parameter) for _, p in trainable) else trainable
        # a Fourier layer's complex weights (FNO's SpectralConv1d): norms, update ratios and sampled
        # statistics are real-valued, and the rest of the model is still watched
        return cls(root, models, optimizers, [(n, p) for n, p in trainable if not p.is_complex()], wrappers,
                   [n for n, p in trainable if p.is_complex()], [type(opt).__name__ for opt in own],
                   [n for n, _ in plain])  # fmt: skip


@dataclass
class StepContext:
    """Where the loop is, as the clock tells every watcher.

    ``step``: index (from 0) of the optimizer step in progress; the forwards and
    backward passes before ``optimizer.step()`` belong to it. ``recording``: this step's
    layer and parameter statistics are recorded (every ``every`` steps).
    ``backward_step``: the step the last backward pass belonged to.
    ``backward_since_step``: a backward pass ran since the last step ended.
    ``optimizer``: the optimizer whose ``step()`` is running (None between steps and in
    loops without an optimizer). ``grad_norms``: each parameter's gradient norm at the end
    of the last backward pass, on recorded steps (one pass, shared by the watchers), and
    ``total_grad_norm`` their global norm. ``defer``: queue a record holding 0-d tensors,
    or pending statistics; their values are fetched together, with one host
    synchronisation per recorded step."""

    watched: Watched
    defer: Deferred
    step: int = 0
    recording: bool = True
    backward_step: int = 0
    backward_since_step: bool = False
    optimizer: torch.optim.Optimizer | None = None
    grad_norms: dict[str, torch.Tensor] | None = None
    total_grad_norm: torch.Tensor | None = None


class Watcher:
    """One measured thing. Override the events it needs; each returns nothing, and an
    exception from it is recorded by the Monitor (training goes on)."""

    name = "watcher"

    def on_forward(self, ctx: StepContext, module: nn.Module, args: tuple, kwargs: dict) -> None: ...

    def on_forward_end(self, ctx: StepContext, module: nn.Module, args: tuple, output: Any) -> None: ...

    def on_backward_start(self, ctx: StepContext) -> None: ...

    def on_backward_end(self, ctx: StepContext) -> None: ...

    def on_zero_grad(self, ctx: StepContext, owner: object = None) -> None:
        """``owner.zero_grad()`` ran: an optimizer or a model (None: a reset seen by hand)."""

    def on_step_begin(self, ctx: StepContext) -> None: ...

    def on_step_end(self, ctx: StepContext) -> None: ...

    def on_record_start(self, ctx: StepContext) -> None:
        """A recorded step begins (``ctx.step`` is a multiple of ``every``)."""

    def report(self, window: int | None) -> dict[str, Any]:
        """This watcher's part of the report: keys are ``DiagnosticReport`` fields, and
        ``"loop"`` maps ``LoopStats`` fields. With ``window``: only what the live rules
        read (the newest ``window`` points of each history; see :func:`recorded_steps`)."""
        return {}

    def close(self) -> None:
        """Free what the watcher holds; it sees no more events."""

    def overrides(self, event: str) -> bool:
        return getattr(type(self), event) is not getattr(Watcher, event)


class History:
    """A bounded, deterministic history of records: all of them up to ``capacity``,
    then halving resolution — keep every second point and from then on every 2nd, 4th,
    ... new one — so the kept points stay evenly spread over the run. The newest point
    is always kept, and pinned points (those holding a non-finite value: a NaN is the
    datum that matters) survive decimation, up to an eighth of the capacity.

    Records are small NamedTuples; :meth:`models` turns them into report models. A live
    alert reads the newest points every few steps, and converting them anew each time was
    most of its cost: the models of the last window read are kept for the next one (only
    those: a report model takes several times a record's memory)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(int(capacity), 2)
        self._items: list[tuple[int, Any, bool]] = []  # (arrival index, record, pinned)
        self._stride = 1
        self._count = 0
        self._pinned = 0
        self._last: tuple[int, Any] | None = None
        self._models: dict[int, Any] = {}  # arrival index -> converted record

    def __len__(self) -> int:
        return len(self._items)

    def append(self, item: Any, pinned: bool = False) -> None:
        index = self._count
        self._count += 1
        self._last = (index, item)
        pinned = pinned and self._pinned < self.capacity // 8
        if index % self._stride and not pinned:
            return
        self._items.append((index, item, pinned))
        self._pinned += pinned
        if len(self._items) > self.capacity:
            self._stride *= 2
            self._items = [t for t in self._items if t[0] % self._stride == 0 or t[2]]

    def values(self, newest: int | None = None) -> list[Any]:
        """The kept records, oldest first (only the ``newest`` ones when given)."""
        return [record for _, record in self._indexed(newest)]

    def models(self, convert: Callable[[Any], Any], newest: int | None = None, first: int = 0) -> list[Any]:
        """The kept records converted by ``convert``, oldest first; with ``newest``, a
        window: the ``first`` oldest and the ``newest`` newest only, whose models are
        kept for the next window."""
        indexed = self._indexed(None if newest is None else newest + first)
        if newest is not None and first and len(indexed) > first + newest:
            indexed = self._indexed(None)[:first] + indexed[-newest:]
        models = {index: self._models.get(index) or convert(record) for index, record in indexed}
        if newest is not None:
            self._models = models
        return list(models.values())

    def _indexed(self, newest: int | None) -> list[tuple[int, Any]]:
        items = self._items if newest is None else self._items[-newest:]
        out = [(index, record) for index, record, _ in items]
        if self._last is not None and (not self._items or self._items[-1][0] != self._last[0]):
            out.append(self._last)
        return out


# Live rules compare the first recorded step with the newest ones (a unit dead now but
# alive at the start): a live window keeps the first and this many newest recorded steps.
LIVE_RECORDED_STEPS = 8


def recorded_steps(history: History, convert: Callable[[Any], list[Any]], window: int | None) -> list[Any]:
    """The report models of a history of recorded steps (``convert`` turns one step's
    record into a list), flattened: every kept step, or for a live window (``window``
    set) the first and the newest :data:`LIVE_RECORDED_STEPS` ones."""
    steps = history.models(convert) if window is None else history.models(convert, newest=LIVE_RECORDED_STEPS, first=1)
    return [model for step in steps for model in step]


def nonfinite(values: Any) -> bool:
    """Whether a record holds a non-finite float anywhere (nested tuples included)."""
    for v in values:
        if isinstance(v, float) and not math.isfinite(v):
            return True
        if isinstance(v, (tuple, list)) and nonfinite(v):
            return True
    return False


def fetch(tensors: list[torch.Tensor]) -> list[float]:
    """Values of many 0-d and 1-d tensors, flattened in order, with one host
    synchronisation (on a GPU every ``.item()`` stalls the stream)."""
    if not tensors:
        return []
    device = tensors[0].device
    dtype = torch.float32 if device.type == "mps" else torch.float64
    return torch.cat([t.detach().reshape(-1).to(device=device, dtype=dtype) for t in tensors]).tolist()


class Deferred:
    """Values waiting to be fetched: records of 0-d tensors (appended, resolved, to
    their history) and :class:`~nndx.collector.stats.Pending` statistics (handed, resolved,
    to a callback). :meth:`flush` fetches them all with one synchronisation; the Monitor
    flushes once per recorded step."""

    FLUSH_AT = 1024  # pending records fetched at the latest after this many

    def __init__(self, on_error: Callable[[str, BaseException], None] | None = None) -> None:
        self._pending: list[tuple[History, tuple]] = []
        self._statistics: list[tuple[Pending, Callable[[Any], None]]] = []
        self.on_error = on_error  # (source, exception); None: raise

    def __call__(self, history: History, record: tuple) -> None:
        self._pending.append((history, record))
        if len(self._pending) >= self.FLUSH_AT:
            self.flush()

    def statistics(self, pending: Pending, on_ready: Callable[[Any], None]) -> None:
        """Call ``on_ready`` with ``pending`` resolved, at the next flush."""
        self._statistics.append((pending, on_ready))

    def flush(self) -> None:
        if not (self._pending or self._statistics):
            return
        pending, self._pending = self._pending, []
        statistics, self._statistics = self._statistics, []
        scalars = [v for _, record in pending for v in record if isinstance(v, torch.Tensor)]
        sizes = [s.values.numel() for s, _ in statistics]
        flat = fetch([*scalars, *(s.values for s, _ in statistics)])
        values = iter(flat[:len(scalars)])
        for history, record in pending:
            resolved = record._make(next(values) if isinstance(v, torch.Tensor) else v for v in record)
            history.append(resolved, pinned=nonfinite(resolved))
        start = len(scalars)
        for (s, on_ready), size in zip(statistics, sizes):
            try:
                on_ready(s.build(flat[start:start + size]))
            except Exception as exc:  # one watcher's records failing must not lose the others'
                if self.on_error is None:
                    raise
                self.on_error("flush", exc)
            start += size


class ErrorGuard:
    """The Monitor's one error guard: an exception of a hook or a watcher becomes an
    :class:`~nndx.report.ErrorRecord` (source ``monitor.<where>``; the first ``limit``
    kept, the first logged), never an exception in the user's loop."""

    def __init__(self, limit: int = 20) -> None:
        self.limit = limit
        self.records: list[ErrorRecord] = []

    def record(self, source: str, exc: BaseException) -> None:
        if len(self.records) < self.limit:
            self.records.append(ErrorRecord.of(f"monitor.{source}", exc))
        if len(self.records) == 1:
            first_line = (str(exc).strip().splitlines() or [""])[0][:200]  # torch's dispatcher errors run to 14 kB
            logger.warning("nndx monitor: %s raised %s: %s (recorded; training continues)", source, type(exc).__name__,
                           first_line)

    def record_training(self, exc: BaseException) -> None:
        """The training loop's own exception (source ``training``): kept past the limit,
        which bounds the Monitor's errors, not the one error that ended the run."""
        self.records.append(ErrorRecord.of("training", exc))

    def guard(self, source: str, fn: Callable) -> Callable:
        """``fn`` as a hook that never raises (and returns None, as tensor hooks must), and
        that skips what runs inside a torch.func transform (:func:`in_functorch_transform`)."""

        def hook(*args: Any, **kwargs: Any) -> None:
            if in_functorch_transform():
                return
            try:
                fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - recorded, never raised into the user's loop
                self.record(source, exc)

        return hook


def in_functorch_transform() -> bool:
    """Whether a torch.func transform (``vmap``, ``grad``) is running: per-sample gradients, as
    DP-SGD computes them (Opacus; ``vmap(grad(...))`` over ``functional_call``), run the model's
    forward on batched tensors that must not leave the transform. A hook that kept one for later
    statistics made the user's next step raise; the Monitor watches the ordinary forwards only."""
    return bool(torch._C._are_functorch_transforms_active())
