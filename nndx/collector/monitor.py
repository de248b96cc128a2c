"""The Monitor: watch the user's own training loop, passively, at a few percent overhead.

The active probes run their own, correct loop; most silent bugs live in the user's loop
instead (a missing ``zero_grad``, an optimizer over another model's parameters, a
forgotten ``model.eval()``, a loss fed probabilities). The Monitor hooks the user's
model, optimizer and (optionally) loss function, counts and measures what happens, and
turns it into the same :class:`~nndx.report.DiagnosticReport` the probes produce.

How to use::

    with nndx.Monitor(model, optimizer, every=10, loss_fn=nn.CrossEntropyLoss()) as mon:
        for x, y in loader:
            optimizer.zero_grad()
            loss = mon.loss_fn(model(x), y)   # the wrapped loss: sees outputs and targets
            loss.backward()
            optimizer.step()
            mon.log(loss)                     # train loss; mon.log(v, split="val", accuracy=a)
    report = mon.report()                     # also callable while training

    mon = nndx.watch(model, optimizer)        # the same, without ``with``; call mon.close()

What is measured, and when:

- Every step (cheap: counters, python floats, one small reduction): optimizer steps,
  backward passes, gradient resets (``zero_grad``), forwards, the learning rate of each
  param group, the norm of each training input batch; every logged loss.
- Every ``every`` steps (the "recorded" steps): the global gradient norm at the end of
  backward and, when the user changed the gradients before ``optimizer.step()``
  (clipping), again at the step; per-layer activation and gradient
  statistics (:class:`~nndx.collector.stats.LayerRecorder`) and per-parameter weight
  norm, gradient norm and update/weight ratio (a snapshot before ``optimizer.step()``,
  compared after it; its memory is reused by the next one). To bound the cost on a
  CPU, each layer's activation and gradient statistics come from the leading samples
  of the batch that fit in ``max_elements`` (65,536 elements by default; gradient norms
  scaled to the whole batch), and update ratios from an evenly spread sample of each
  parameter (strided blocks of 16); weight and gradient norms are exact.
- At ``report()``: trainable parameters in no optimizer group, optimizer parameters
  that are not the model's, trainable parameters whose ``.grad`` stayed None through
  every backward, parameters with ``requires_grad=False``.

Step numbering: step ``k`` is the ``k``-th call (from 0) of ``optimizer.step()``; the
forward and backward passes that precede it belong to it. A train loss is stamped with
the step its backward belonged to, a loss of any other split with the last completed
step; ``mon.log(..., step=n)`` overrides both.

Counting conventions (what the rules read):

- ``loop.backward_calls`` counts each backward pass (``loss.backward()`` or
  ``torch.autograd.grad`` reaching the model's parameters) once.
- ``loop.zero_grad_calls`` counts gradient *resets*: ``optimizer.zero_grad()``,
  ``model.zero_grad()``, or gradients of the model's first parameter cleared by hand
  (``p.grad = None`` / ``p.grad.zero_()``) — at most one between two backward passes, so
  calling both ``optimizer.zero_grad()`` and ``model.zero_grad()`` counts once. Hence
  ``backward_calls / zero_grad_calls`` is the accumulation factor ``k``: 1 for a plain
  loop, ``k`` for deliberate accumulation, and ``zero_grad_calls == 0`` with several
  steps means gradients were never reset.
- ``loop.no_grad_forwards_in_train_mode`` counts forwards of the model run with grad
  disabled (``torch.no_grad`` / ``inference_mode``) while ``model.training`` is True,
  only when the model has dropout or batch-norm (where train mode changes the output).
- ``loop.grad_norm_history[i].after_clip`` is set only on steps where the gradient
  norm changed between the end of backward and ``optimizer.step()`` (clipping that
  bit, or unscaling by a GradScaler).

Memory: python floats only, O(layers + parameter tensors) per recorded step and a few
floats per step; no activation-sized tensor outlives the step that made it. Histories
are bounded: each keeps every point up to ``history_size`` points (``layer_history_size``
recorded steps for layers/parameters); past that it halves its resolution —
keeps every second point and from then on every 2nd, 4th, ... new one — which is
deterministic and keeps the points evenly spread over the run. The newest point is
always kept, and points holding a non-finite value are never dropped by decimation (up
to an eighth of the capacity), because a NaN is the datum that matters.

Distributed (``torch.distributed`` initialised, world size > 1): each rank collects
locally; every ``checksum_every`` steps the ranks compare a checksum of the parameters
(one all-gather of two floats) and record the steps where replicas differ
(``loop.desync_steps``, ``loop.max_desync``). ``report()`` is then a collective: call it
on every rank; rank 0 gets the merged report (see
:func:`nndx.collector.distributed.merge_reports`), the other ranks their local report.

Live alerts: every ``alert_every`` steps (default ``max(every, 10)``; 0 turns them off)
the Monitor runs the rules that need only what a running loop has shown (``LIVE_RULES``:
NaN/Inf loss, dead units, exploding gradients, missing ``zero_grad``, optimizer not
connected, LR collapsed by the schedule) on the newest part of what it saw, and reports
each *new* finding once: a log record on the ``"nndx"`` logger (warning or error),
``on_finding(finding)``, and — with ``stop_on="error"`` (or ``"warning"``) — a
:class:`TrainingFailure` raised out of ``optimizer.step()`` (that step is already
applied). ``finding.step`` is the step it first fired at; ``report().loop.live_findings``
keeps them all (time to detection). ``mon.findings`` lists them; ``mon.check_now()``
evaluates on demand.

The Monitor never changes the model, optimizer, gradients or RNG: training with it is
bit-for-bit training without it. A hook that raises is recorded in ``report().errors``
and training goes on. On a CPU its reductions run on one thread for the moment they
take (see :func:`nndx.collector.stats.single_threaded`); the thread count is restored.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

import torch
from torch import nn

from nndx.errors import NndxError
from nndx.collector import distributed as _dist
from nndx.collector._common import loss_name
from nndx.collector.stats import (
    PENDING_BYTES,
    has_batchnorm,
    has_dropout,
    LayerRecorder,
    parameter_stats_packed,
    single_threaded,
    snapshot_parameters,
    summarize_model,
    unpack_layer,
    unpack_parameter,
)
from nndx.report import (
    DiagnosticReport,
    ErrorRecord,
    Finding,
    GradNormPoint,
    LayerStats,
    LiveFinding,
    LossCall,
    LossPoint,
    LoopStats,
    LRPoint,
    ParameterStats,
    RunInfo,
    ScalarPoint,
    SEVERITY_ORDER,
)

logger = logging.getLogger("nndx")

__all__ = ["Monitor", "TrainingFailure", "watch"]

MAX_ERRORS = 20
# Live alerts: the rules that need only what a running loop has shown so far, and
# cannot be fooled by a run that is merely young — NaN/Inf loss (NNDX101/102), dead
# units (NNDX201/208), exploding gradients (NNDX204), missing zero_grad (NNDX301),
# optimizer not connected (NNDX303), LR collapsed by the schedule (NNDX307).
# The live report leaves out input norms, which none of these reads (NNDX309 would).
LIVE_RULES = ("NNDX101", "NNDX102", "NNDX201", "NNDX204", "NNDX208", "NNDX301", "NNDX303", "NNDX307")
LIVE_WINDOW = 256  # newest points of each history the live rules read
LIVE_RECORDED_STEPS = 8  # newest recorded steps (plus the first) the live rules read
_LOG_LEVEL = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
MAX_LOSS_SIGNATURES = 32
_FLUSH_AT = 1024  # pending scalars fetched at the latest after this many

class TrainingFailure(NndxError):
    """Raised by a Monitor created with ``stop_on=...`` when a live finding of that
    severity (or worse) fires, so a doomed run stops early. ``findings`` holds them."""

    def __init__(self, findings: Sequence[Finding]) -> None:
        self.findings = list(findings)
        summary = "; ".join(f"{f.code.value} at step {f.step}: {f.title}" for f in self.findings)
        super().__init__(f"nndx stopped training: {summary}")

    @property
    def finding(self) -> Finding | None:
        return self.findings[0] if self.findings else None


class _History:
    """A bounded, deterministic history: all points up to ``capacity``, then halving
    resolution (see the module docstring). Pinned points survive decimation."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(int(capacity), 2)
        self._items: list[tuple[int, Any, bool]] = []  # (arrival index, item, pinned)
        self._stride = 1
        self._count = 0
        self._pinned = 0
        self._last: tuple[int, Any] | None = None

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
        """The kept points, oldest first (only the ``newest`` ones when given)."""
        items = self._items if newest is None else self._items[-newest:]
        out = [item for _, item, _ in items]
        if self._last is not None and (not self._items or self._items[-1][0] != self._last[0]):
            out.append(self._last[1])
        return out


def _nonfinite(values: Any) -> bool:
    for v in values:
        if isinstance(v, float) and not math.isfinite(v):
            return True
        if isinstance(v, (tuple, list)) and _nonfinite(v):
            return True
    return False


def _fetch(tensors: list[torch.Tensor]) -> list[float]:
    """Values of many 0-d tensors with one host synchronisation."""
    if not tensors:
        return []
    device = tensors[0].device
    dtype = torch.float32 if device.type == "mps" else torch.float64
    return torch.stack([t.detach().reshape(()).to(device=device, dtype=dtype) for t in tensors]).tolist()


def _first_float_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value
    return None


class Monitor:
    """Watch a training loop: ``Monitor(model, optimizer, every=1, loss_fn=None, ...)``.

    Hooks are attached on construction and removed by :meth:`close` (or leaving the
    ``with`` block), which leaves the model and optimizer exactly as they were.

    Parameters: ``every`` — record per-layer and per-parameter statistics every this
    many steps (1 = every step); ``loss_fn`` — a loss to wrap, available as
    ``mon.loss_fn``; ``name``/``project`` — for ``report().run``; ``history_size`` /
    ``layer_history_size`` — bounds of the histories; ``checksum_every`` — steps
    between parameter checksums across ranks (distributed only); ``process_group`` —
    the group to use (default: the world); ``on_finding`` — called with each new live
    finding; ``stop_on`` — "warning" or "error": raise :class:`TrainingFailure` from
    ``optimizer.step()`` when a live finding of that severity fires; ``alert_every`` —
    steps between live rule evaluations (default: ``max(every, 10)``; 0 disables them);
    ``max_elements`` — layer statistics (activations and gradients) from the leading
    samples of each batch that fit in this many elements, update ratios from this many
    sampled elements of each parameter (None: everything, at a cost that grows with activation size; see
    :mod:`nndx.collector.stats`); ``tensorboard`` (a ``SummaryWriter`` or log
    directory) / ``wandb`` (a W&B run) — write each recorded step and logged loss there
    live, histograms every ``histogram_every`` steps (extras ``nndx[tensorboard]`` /
    ``nndx[wandb]``; see :mod:`nndx.integrations`).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        every: int = 1,
        loss_fn: Callable[..., torch.Tensor] | None = None,
        name: str | None = None,
        project: str | None = None,
        history_size: int = 4096,
        layer_history_size: int = 256,
        checksum_every: int = 50,
        process_group: Any = None,
        on_finding: Callable[[Finding], None] | None = None,
        stop_on: str | None = None,
        alert_every: int | None = None,
        max_elements: int | None = 65536,
        tensorboard: Any = None,
        wandb: Any = None,
        histogram_every: int = 100,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"every must be an integer >= 1, got {every!r}")
        if loss_fn is not None and not callable(loss_fn):
            raise TypeError("loss_fn must be callable (e.g. nn.CrossEntropyLoss())")
        if stop_on not in (None, "warning", "error"):
            raise ValueError(f"stop_on must be None, 'warning' or 'error', got {stop_on!r}")
        if checksum_every < 1:
            raise ValueError(f"checksum_every must be >= 1, got {checksum_every!r}")
        self.model = model
        self.optimizer = optimizer
        self.every = every
        self.name = name
        self.project = project
        self.checksum_every = checksum_every
        self.max_elements = max_elements
        self.on_finding = on_finding
        self.stop_on = stop_on
        self.alert_every = max(every, 10) if alert_every is None else int(alert_every)
        self._group = process_group
        self._world_size = _dist.world_size(process_group)

        # counters
        self.steps = 0
        self.backward_calls = 0
        self.zero_grad_calls = 0
        self.forward_calls = 0
        self.no_grad_forwards_in_train_mode = 0
        self._backward_step = 0
        self._reset_since_backward = False
        self._in_backward_task: int | None = None
        self._backward_since_step = False
        self._grad_norm_recorded = False

        # histories (raw tuples; pydantic models are built in report())
        self._loss: dict[str, _History] = {}
        self._lr = _History(history_size)
        self._grad_norm = _History(history_size)
        self._input_norm = _History(history_size)
        self._recorded = _History(layer_history_size)  # (layer stats, parameter stats)
        self._history_size = history_size
        self._pending: list[tuple[_History, tuple]] = []
        self._loss_calls: dict[tuple, dict[str, Any]] = {}
        self._errors: list[ErrorRecord] = []
        self._exporter: Any = None
        if tensorboard is not None or wandb is not None:
            from nndx.integrations import Exporter, make_sinks  # optional extras, imported only when used

            self._exporter = Exporter(make_sinks(tensorboard=tensorboard, wandb=wandb), histogram_every=histogram_every)
        self._desync_steps: list[int] = []
        self._max_desync: float | None = None
        self._last_checksum_step: int | None = None
        self._findings: dict[str, Finding] = {}
        self._live: list[LiveFinding] = []
        self._live_rules: list[Any] | None = None

        # what the model is made of
        self._params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self._never_grad = dict(self._params)
        self._has_dropout = has_dropout(model)
        self._has_batchnorm = has_batchnorm(model)
        self._forward_order: list[str] | None = None

        # per-step state
        self._grad_norm_at_backward: torch.Tensor | None = None
        self._param_grad_norms: dict[str, torch.Tensor] | None = None
        self._grad_versions: list[tuple[int, int]] = []
        self._reference: torch.Tensor | None = None
        self._reference_grad: tuple[int, int] | None = None
        self._snapshot: dict[str, torch.Tensor] | None = None
        self._spent_snapshot: dict[str, torch.Tensor] | None = None  # memory for the next one

        self.started_at = datetime.now(timezone.utc)
        self.finished_at: datetime | None = None
        self._recorder = LayerRecorder(model, max_elements=max_elements)
        self._handles: list[Any] = []
        self._patched: list[tuple[object, str, Any, Any]] = []
        self.loss_fn = self._wrap_loss(loss_fn) if loss_fn is not None else None
        self._closed = False
        self._attach()

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Remove every hook and wrapper; the model and optimizer are as before. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for owner, attr, previous, wrapper in reversed(self._patched):
            if owner.__dict__.get(attr) is not wrapper:
                continue  # patched again over ours (another monitor): ours now passes through
            # skip wrappers of monitors closed meanwhile (closed out of order)
            while getattr(previous, "_nndx_monitor", None) is not None and previous._nndx_monitor.closed:
                previous = previous._nndx_previous
            if previous is None:
                owner.__dict__.pop(attr, None)
            else:
                owner.__dict__[attr] = previous
        self._patched.clear()
        self._recorder.detach()
        if self._exporter:
            self._exporter.close()
        self._snapshot = self._spent_snapshot = None
        self._flush()
        self.finished_at = datetime.now(timezone.utc)

    def _attach(self) -> None:
        opt, model = self.optimizer, self.model
        self._handles.append(opt.register_step_pre_hook(self._guard("step_pre", self._on_step_pre)))
        self._handles.append(opt.register_step_post_hook(self._on_step_post_guarded))
        self._handles.append(
            model.register_forward_pre_hook(self._guard("forward", self._on_forward), with_kwargs=True)
        )
        on_grad = self._guard("backward", self._on_param_grad)
        for _, p in self._params:
            self._handles.append(p.register_hook(on_grad))
        self._patch_zero_grad(opt)
        self._patch_zero_grad(model)
        self._recorder.attach()
        self._recorder.start_step(0)

    def _patch_zero_grad(self, owner: object) -> None:
        previous = owner.__dict__.get("zero_grad")
        original = owner.zero_grad

        @functools.wraps(original)
        def zero_grad(*args: Any, **kwargs: Any) -> Any:
            if not self._closed:
                self._on_zero_grad()
            return original(*args, **kwargs)

        zero_grad._nndx_monitor = self  # type: ignore[attr-defined]
        zero_grad._nndx_previous = previous  # type: ignore[attr-defined]
        # an instance attribute shadows the class method; close() deletes it again
        owner.__dict__["zero_grad"] = zero_grad
        self._patched.append((owner, "zero_grad", previous, zero_grad))

    def _guard(self, source: str, fn: Callable) -> Callable:
        """A hook that never breaks training: its exceptions become report errors."""

        def hook(*args: Any, **kwargs: Any) -> Any:
            try:
                fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - recorded, never raised into the user's loop
                self._record_error(source, exc)
            return None

        return hook

    def _record_error(self, source: str, exc: BaseException) -> None:
        if len(self._errors) < MAX_ERRORS:
            self._errors.append(ErrorRecord.of(f"monitor.{source}", exc))
        if len(self._errors) == 1:
            logger.warning("nndx monitor: %s hook raised %s: %s (recorded; training continues)",
                           source, type(exc).__name__, exc)

    # ------------------------------------------------------------------ public API

    def log(self, loss: Any, split: str = "train", accuracy: Any = None, *, step: int | None = None) -> None:
        """Record a loss (tensor or number) and optional accuracy for ``split``.

        Tensors are read without a host synchronisation now: their values are fetched
        together, once, every ``every`` steps. Non-finite values are kept as they are.
        """
        if not isinstance(split, str) or not split:
            raise ValueError(f"split must be a non-empty string, got {split!r}")
        value = self._scalar(loss, "loss")
        acc = None if accuracy is None else self._scalar(accuracy, "accuracy")
        if step is None:
            step = self._backward_step if split == "train" else max(self.steps - 1, 0)
        elif not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        history = self._loss.get(split)
        if history is None:
            history = self._loss[split] = _History(self._history_size)
        self._defer(history, (step, value, acc))
        if self._exporter:  # a live chart needs the value now: one host sync per logged loss
            self._exporter.log_loss(step, split, float(value), None if acc is None else float(acc))

    def report(self) -> DiagnosticReport:
        """The report of everything seen so far (callable during and after training).

        Distributed: a collective — call it on every rank; rank 0 returns the merged
        report of all ranks, the others their own."""
        self._flush()
        local = self._local_report()
        if self._world_size > 1 and _dist.is_initialized():
            try:
                self._check_desync()
                local.loop.desync_steps = list(self._desync_steps)
                local.loop.max_desync = self._max_desync
                return _dist.gather_and_merge(local, self._group)
            except Exception as exc:  # noqa: BLE001 - a broken group must not lose the local report
                self._record_error("distributed", exc)
                local.errors = list(self._errors)
        return local

    # ------------------------------------------------------------------ hooks

    def _on_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self.forward_calls += 1
        if not torch.is_grad_enabled():
            if module.training and (self._has_dropout or self._has_batchnorm):
                self.no_grad_forwards_in_train_mode += 1
            return
        x = _first_float_tensor(args, kwargs)
        if x is not None:
            with single_threaded(x.device):
                norm = torch.linalg.vector_norm(x.detach().float())
            self._defer(self._input_norm, (self.steps, norm))

    def _on_param_grad(self, grad: torch.Tensor) -> None:
        """Runs for each trainable parameter's gradient, before it is accumulated; only
        the first of one backward pass does anything."""
        task = torch._C._current_graph_task_id() if hasattr(torch._C, "_current_graph_task_id") else None
        if self._in_backward_task is not None and (task is None or task == self._in_backward_task):
            return
        self._in_backward_task = task if task is not None else -1
        if not self._reset_since_backward and self._gradients_reset_by_hand():
            self.zero_grad_calls += 1
        # The engine runs queued callbacks in order when the backward pass ends. Queue
        # from inside a callback so ours runs after every callback queued during the
        # pass (DDP's gradient averaging): we then see the gradients the step will see.
        engine = torch.autograd.Variable._execution_engine
        engine.queue_callback(lambda: engine.queue_callback(self._guard("backward_end", self._on_backward_end)))

    def _gradients_reset_by_hand(self) -> bool:
        if self._reference_grad is None or self._reference is None:
            return False
        grad = self._reference.grad
        return grad is None or (id(grad), grad._version) != self._reference_grad

    def _on_backward_end(self) -> None:
        self._in_backward_task = None
        self.backward_calls += 1
        self._backward_step = self.steps
        self._backward_since_step = True
        self._reset_since_backward = False
        if self._never_grad:
            for name in [n for n, p in self._never_grad.items() if p.grad is not None]:
                del self._never_grad[name]
        self._param_grad_norms = None
        self._grad_norm_at_backward = None
        # the gradient norms are one pass over every gradient (~1 ms on the bench MLP, 3% of
        # its step), so, like the layer statistics, they are measured on recorded steps only
        named_grads = [(n, p.grad) for n, p in self._params if p.grad is not None] if self._recorder.recording else []
        if named_grads:
            grads = [g for _, g in named_grads]
            with single_threaded(grads[0].device):
                # one pass: per-parameter norms (reused by parameter_stats) and their total
                norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
                self._grad_norm_at_backward = torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms]))
            self._param_grad_norms = {n: norm for (n, _), norm in zip(named_grads, norms)}
            self._grad_versions = [(id(g), g._version) for g in grads]
        self._reference = next((p for _, p in self._params if p.grad is not None), None)
        self._remember_reference_grad()

    def _remember_reference_grad(self) -> None:
        # (identity, version) of one parameter's gradient: if it changes before the next
        # backward without a zero_grad call, the user reset the gradients by hand
        grad = self._reference.grad if self._reference is not None else None
        self._reference_grad = None if grad is None else (id(grad), grad._version)

    def _on_zero_grad(self) -> None:
        if not self._reset_since_backward:
            self.zero_grad_calls += 1
            self._reset_since_backward = True

    def _on_step_pre(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        step = self.steps
        self._defer(self._lr, (step, tuple(float(g["lr"]) for g in optimizer.param_groups)))
        self._grad_norm_recorded = self._backward_since_step and self._grad_norm_at_backward is not None
        if self._grad_norm_recorded:
            grads = [p.grad for _, p in self._params if p.grad is not None]
            after = None
            if [(id(g), g._version) for g in grads] != self._grad_versions:
                self._param_grad_norms = None  # changed since backward: parameter_stats measures anew
                # the user changed the gradients after backward: clipping (or unscaling)
                with single_threaded(grads[0].device if grads else "cpu"):
                    after = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
            self._defer(self._grad_norm, (step, self._grad_norm_at_backward, after))
        if self._recorder.recording:
            self._snapshot = snapshot_parameters(self.model, self.max_elements, into=self._spent_snapshot)

    def _on_step_post_guarded(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        try:
            self._on_step_post()
        except Exception as exc:  # noqa: BLE001
            self._record_error("step_post", exc)
        self._alert()  # may raise TrainingFailure, deliberately

    def _on_step_post(self) -> None:
        step = self.steps
        if not self._grad_norm_recorded and self._backward_since_step and self._grad_norm_at_backward is not None:
            # a closure step (LBFGS, Lightning): backward ran inside optimizer.step()
            self._defer(self._grad_norm, (step, self._grad_norm_at_backward, None))
        self._grad_norm_recorded = False
        if self._recorder.recording:
            layers = self._recorder.finish_step_packed()
            params = []
            if self._snapshot is not None:
                params = parameter_stats_packed(self.model, self._snapshot, step, self.max_elements, self._param_grad_norms)
                # the spent snapshot's memory is reused by the next one, unless it is large
                self._spent_snapshot = self._snapshot if _nbytes(self._snapshot) <= PENDING_BYTES else None
            self._snapshot = None
            if layers or params:
                pinned = any(_layer_nonfinite(s) for s in layers) or any(_parameter_nonfinite(p) for p in params)
                self._recorded.append((tuple(layers), tuple(params)), pinned=pinned)
                if self._forward_order is None and layers:
                    self._forward_order = [s[0] for s in layers]
                if self._exporter:
                    self._export_step(step, [unpack_layer(s) for s in layers], [unpack_parameter(p) for p in params])
        self.steps += 1
        self._backward_since_step = False
        if self._reference_grad is not None:
            self._remember_reference_grad()
        if self.steps % self.every == 0:
            self._recorder.start_step(self.steps)
            self._flush()
        if self._world_size > 1 and self.steps % self.checksum_every == 0:
            self._check_desync()

    def _export_step(self, step: int, layers: list[LayerStats], params: list[ParameterStats]) -> None:
        grad_norm = None
        if self._backward_since_step and self._grad_norm_at_backward is not None:
            grad_norm = float(self._grad_norm_at_backward)
        lrs = [float(g["lr"]) for g in self.optimizer.param_groups]
        self._exporter.log_stats(step, layers=layers, parameters=params, grad_norm=grad_norm, lrs=lrs, model=self.model)

    def _check_desync(self) -> None:
        if self._last_checksum_step == self.steps:
            return
        self._last_checksum_step = self.steps
        relative = _dist.checksum_spread(self.model, self._group)
        if relative > _dist.DESYNC_TOLERANCE:
            self._desync_steps.append(max(self.steps - 1, 0))
            self._max_desync = max(self._max_desync or 0.0, relative)
        elif self._max_desync is None:
            self._max_desync = relative

    # ------------------------------------------------------------------ loss wrapper

    def _wrap_loss(self, loss_fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        loss_type = loss_name(loss_fn)

        @functools.wraps(loss_fn)
        def wrapped(*args: Any, **kwargs: Any) -> torch.Tensor:
            output = args[0] if args else kwargs.get("input")
            target = args[1] if len(args) > 1 else kwargs.get("target")
            try:
                self._on_loss_call(loss_type, output, target)
            except Exception as exc:  # noqa: BLE001
                self._record_error("loss_fn", exc)
            return loss_fn(*args, **kwargs)

        return wrapped

    def _on_loss_call(self, loss_type: str, output: Any, target: Any) -> None:
        if not isinstance(output, torch.Tensor):
            return
        target_t = target if isinstance(target, torch.Tensor) else None
        key = (
            loss_type,
            tuple(output.shape),
            None if target_t is None else tuple(target_t.shape),
            str(output.dtype),
            None if target_t is None else str(target_t.dtype),
        )
        entry = self._loss_calls.get(key)
        if entry is not None:
            entry["calls"] += 1
            if not self._recorder.recording:
                return
        elif len(self._loss_calls) >= MAX_LOSS_SIGNATURES:
            return
        else:
            entry = self._loss_calls[key] = {
                "loss_type": loss_type,
                "output_shape": list(output.shape),
                "target_shape": None if target_t is None else list(target_t.shape),
                "output_dtype": str(output.dtype).removeprefix("torch."),
                "target_dtype": None if target_t is None else str(target_t.dtype).removeprefix("torch."),
                "calls": 1,
            }
        if output.is_floating_point() and output.numel() > 0:
            lo, hi, rows_off_one = _probability_evidence(output.detach())
            entry["output_min"] = lo if entry.get("output_min") is None else min(entry["output_min"], lo)
            entry["output_max"] = hi if entry.get("output_max") is None else max(entry["output_max"], hi)
            if rows_off_one is not None:
                looks = lo >= 0.0 and hi <= 1.0 and rows_off_one < 1e-3
                entry["output_rows_sum_to_one"] = looks and entry.get("output_rows_sum_to_one", True) is not False

    # ------------------------------------------------------------------ live alerts

    def _alert(self) -> None:
        """Every ``alert_every`` steps: evaluate the live rules, report each new finding
        once (logging, ``on_finding``), and raise TrainingFailure when ``stop_on`` says."""
        if not self.alert_every or self.steps % self.alert_every or self._live_rules == []:
            return
        new = self.check_now()
        stopping = []
        for finding in new:
            logger.log(
                _LOG_LEVEL[finding.severity],
                "nndx: %s %s at step %d: %s (%s)",
                finding.severity, finding.code.value, finding.step, finding.title, finding.symptom,
            )
            if self.on_finding is not None:
                try:
                    self.on_finding(finding)
                except TrainingFailure:
                    raise
                except Exception as exc:  # noqa: BLE001 - the user's callback must not kill training
                    self._record_error("on_finding", exc)
            if self.stop_on is not None and SEVERITY_ORDER[finding.severity] >= SEVERITY_ORDER[self.stop_on]:
                stopping.append(finding)
        if stopping:
            raise TrainingFailure(stopping)

    def check_now(self) -> list[Finding]:
        """Evaluate the live rules on what was seen so far; returns the findings that are
        new since the last evaluation, each stamped with the step it first fired at.
        (Called every ``alert_every`` steps; callable by hand, e.g. with alert_every=0.)"""
        rules = self._load_live_rules()
        if not rules:
            return []
        from nndx.rules._series import memoized  # imported with the rules (see _load_live_rules)

        self._flush()
        try:
            partial = self._local_report(window=LIVE_WINDOW)
        except Exception as exc:  # noqa: BLE001
            self._record_error("live_report", exc)
            return []
        step = max(self.steps - 1, 0)
        new = []
        with memoized():  # the rules share the curves they derive, as in diagnose()
            for rule in rules:
                try:
                    findings = rule.run(partial)
                except Exception as exc:  # noqa: BLE001 - a broken rule must not stop training
                    self._record_error(f"rule {rule.id}", exc)
                    continue
                for finding in findings:
                    if finding.rule_id in self._findings:
                        continue
                    finding = finding.model_copy(update={"step": step})
                    self._findings[finding.rule_id] = finding
                    self._live.append(LiveFinding(rule_id=finding.rule_id, code=finding.code.value,
                                                  severity=finding.severity, title=finding.title, step=step))
                    new.append(finding)
        return new

    @property
    def workspace_bytes(self) -> int:
        """Bytes of tensor memory the Monitor keeps between steps: the layer buffers and
        the spent snapshot, reused every recorded step because fresh memory costs a page
        fault per 4 KiB on a CPU (7 MB on the bench MLP; each part at most
        ``stats.PENDING_BYTES``); freed by close()."""
        return self._recorder.workspace_bytes + _nbytes(self._spent_snapshot or {})

    @property
    def findings(self) -> list[Finding]:
        """Every live finding so far, in firing order (``.step``: when it first fired)."""
        return list(self._findings.values())

    def _load_live_rules(self) -> list[Any]:
        if self._live_rules is None:
            try:
                from nndx.rules import REGISTRY
            except Exception as exc:  # noqa: BLE001 - no rules, no alerts; the monitor still works
                self._record_error("live_rules", exc)
                self._live_rules = []
            else:
                self._live_rules = [REGISTRY[rule_id] for rule_id in LIVE_RULES if rule_id in REGISTRY]
        return self._live_rules

    # ------------------------------------------------------------------ report

    def _defer(self, history: _History, item: tuple) -> None:
        self._pending.append((history, item))
        if len(self._pending) >= _FLUSH_AT:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        tensors = [v for _, item in pending for v in item if isinstance(v, torch.Tensor)]
        values = iter(_fetch(tensors))
        for history, item in pending:
            resolved = tuple(next(values) if isinstance(v, torch.Tensor) else v for v in item)
            history.append(resolved, pinned=_nonfinite(resolved))

    @staticmethod
    def _scalar(value: Any, what: str) -> torch.Tensor | float:
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"log a scalar {what}; got a tensor of shape {list(value.shape)}")
            return value.detach()
        if isinstance(value, bool):
            raise TypeError(f"{what} must be a number or a tensor, got a bool")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise TypeError(f"{what} must be a number or a one-element tensor, got {type(value).__name__}") from None

    def _loop_stats(self, window: int | None = None) -> LoopStats:
        model_params = list(self.model.named_parameters())
        trainable = [(n, p) for n, p in model_params if p.requires_grad]
        optimizer_ids = {id(p) for g in self.optimizer.param_groups for p in g["params"]}
        model_ids = {id(p) for _, p in model_params}
        return LoopStats(
            steps=self.steps,
            backward_calls=self.backward_calls,
            zero_grad_calls=self.zero_grad_calls,
            forward_calls=self.forward_calls,
            trainable_param_count=sum(p.numel() for _, p in trainable),
            params_not_in_optimizer=[n for n, p in trainable if id(p) not in optimizer_ids],
            optimizer_params_not_in_model=len(optimizer_ids - model_ids),
            params_grad_none=(
                [n for n, p in self._never_grad.items() if p.requires_grad] if self.backward_calls else []
            ),
            frozen_params=[n for n, p in model_params if not p.requires_grad],
            no_grad_forwards_in_train_mode=self.no_grad_forwards_in_train_mode,
            has_dropout=self._has_dropout,
            has_batchnorm=self._has_batchnorm,
            lr_history=[LRPoint(step=s, lrs=list(lrs)) for s, lrs in self._lr.values(window)],
            grad_norm_history=[
                GradNormPoint(step=s, before_clip=b, after_clip=None if _same_norm(a, b) else a)
                for s, b, a in self._grad_norm.values(window)
            ],
            # no live rule reads input norms: the live report (window set) leaves them out
            input_norm_history=(
                [] if window is not None else [ScalarPoint(step=s, value=v) for s, v in self._input_norm.values()]
            ),
            loss_calls=[LossCall(**entry) for entry in self._loss_calls.values()],
            world_size=self._world_size,
            desync_steps=list(self._desync_steps),
            max_desync=self._max_desync,
            live_findings=list(self._live),
        )

    def _local_report(self, window: int | None = None) -> DiagnosticReport:
        """This rank's report; with ``window``, only the newest ``window`` points of each
        history and the first and newest recorded steps (what live alerts read)."""
        first = next(self.model.parameters(), None)
        recorded = self._recorded.values()
        if window is not None and len(recorded) > LIVE_RECORDED_STEPS + 1:
            recorded = recorded[:1] + recorded[-LIVE_RECORDED_STEPS:]
        layers = [unpack_layer(s) for step_layers, _ in recorded for s in step_layers]
        params = [unpack_parameter(p) for _, step_params in recorded for p in step_params]
        return DiagnosticReport(
            run=RunInfo(
                name=self.name,
                project=self.project,
                started_at=self.started_at,
                finished_at=self.finished_at,
                torch_version=torch.__version__,
                device=str(first.device) if first is not None else None,
                dtype=str(first.dtype).removeprefix("torch.") if first is not None else None,
            ),
            model=summarize_model(self.model, self._forward_order),
            loss_history={
                split: [LossPoint(step=s, value=v, accuracy=a) for s, v, a in history.values(window)]
                for split, history in self._loss.items()
            },
            layers=layers,
            parameters=params,
            loop=self._loop_stats(window),
            errors=[*self._errors, *(self._exporter.errors if self._exporter is not None else [])],
        )


def _nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _same_norm(after: float | None, before: float) -> bool:
    # clip_grad_norm_ rescales in place even when under its threshold (by 1.0): a
    # changed gradient whose norm did not change was not clipped
    return after is None or after == before or abs(after - before) <= 1e-6 * abs(before)


# Recorded steps are kept as the tuples stats.py packs (a few hundred bytes a layer, a
# fifth of the pydantic model) and turned into report models by report().
def _layer_nonfinite(packed: tuple) -> bool:
    _, _, _, act, grad = packed
    return bool((act and act[-2]) or (grad and grad[-1]))


def _parameter_nonfinite(packed: tuple) -> bool:
    weight_norm, grad_norm = packed[4], packed[5]
    return not math.isfinite(weight_norm) or (grad_norm is not None and not math.isfinite(grad_norm))


def _probability_evidence(output: torch.Tensor) -> tuple[float, float, float | None]:
    """min, max and the largest |row sum - 1| over the class axis (dim 1), one sync.
    The last is None when there is no class axis to sum over."""
    x = output.float()
    lo, hi = torch.aminmax(x)
    if x.dim() >= 2 and x.shape[1] > 1:
        off = (x.sum(dim=1) - 1.0).abs().max()
        values = torch.stack([lo, hi, off]).tolist()
        return values[0], values[1], values[2]
    values = torch.stack([lo, hi]).tolist()
    return values[0], values[1], None


def watch(model: nn.Module, optimizer: torch.optim.Optimizer, **options: Any) -> Monitor:
    """Start watching a training loop, the function form of :class:`Monitor`
    (same options); call ``.close()`` when training ends, ``.report()`` any time."""
    return Monitor(model, optimizer, **options)
