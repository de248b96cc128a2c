"""The Monitor: watch the user's own training loop, passively, at a few percent overhead.

The active probes run their own, correct loop; most silent bugs live in the user's loop
instead (a missing ``zero_grad``, an optimizer over another model's parameters, a
forgotten ``model.eval()``, a loss fed probabilities). The Monitor hooks the user's
model, optimizer and (optionally) loss function, and turns what it sees into the same
:class:`~nndx.report.DiagnosticReport` the probes produce.

How to use (``nndx.Monitor`` is this Monitor with live alerts and exporters wired in,
see :mod:`nndx.integrations.monitor`)::

    with nndx.Monitor(model, optimizer, every=10, loss_fn=nn.CrossEntropyLoss()) as mon:
        for x, y in loader:
            optimizer.zero_grad()
            loss = mon.loss_fn(model(x), y)   # the wrapped loss: sees outputs and targets
            loss.backward()
            optimizer.step()
            mon.log(loss)                     # train loss; mon.log(v, split="val", accuracy=a)
    report = mon.report()                     # also callable while training

The loops people write:

- No optimizer (``p.data.add_(p.grad, alpha=-lr)``, as the PyTorch word-language-model
  example): ``Monitor(model)``. A step is then an update detected after a backward
  pass — at the next forward, gradient reset or backward pass, the parameters' version
  counters or a few sampled values changed — and the learning rate is unknown
  (``loop.optimizers == []``, no LR history; ``loop.limitations`` says so).
- Several models and optimizers (a GAN): one Monitor over all of them,
  ``Monitor({"G": netG, "D": netD}, [optG, optD])``. Parameter and layer names start
  with the model's name ("G.main.0.weight"); each optimizer's ``step()`` is a step of the
  clock, so a GAN iteration is two steps; a step's update ratios cover the parameters
  that optimizer moves. Two Monitors on one model or optimizer also work: their
  ``zero_grad`` wrappers chain and unwind in any order.
- Models returning tuples, dicts or ``ModelOutput`` s, integer token inputs (no input
  norm: ``loop.input_dtype`` says int64), time-major ``[T, B, ...]`` sequences: layer
  statistics come from each layer's first output tensor, and nothing assumes axis 0
  is the batch but the ``max_elements`` sample.
- What cannot be hooked (a scripted model) is a limitation in the report, not an
  exception in the loop.

Arguments: ``model`` — a module, or several as ``{"name": module}`` (or a list);
``optimizer`` — an optimizer, a list of them, or None; ``every`` — record per-layer and
per-parameter statistics every this many steps (1 = every step); ``loss_fn`` — a loss
to wrap, available as ``mon.loss_fn``; ``name``/``project`` — for ``report().run``;
``history_size`` / ``layer_history_size`` — bounds of the histories;
``checksum_every`` — steps between parameter checksums across ranks; ``process_group``
— the group to use (default: the world); ``max_elements`` — layer statistics from the
leading samples of each batch that fit in this many elements, update ratios from this
many sampled elements of each parameter (None: everything, at a cost that grows with
activation size; see :mod:`nndx.collector.stats`); ``initial_state`` — where to keep a
copy of the parameters and buffers as they were at attach time ("cpu"; None: not kept),
for ``mon.initial_state()`` (probes that start from it), up to
``initial_state_max_bytes`` (512 MiB: past it nothing is kept, and
``loop.limitations`` says so); ``observers`` — see below.

The Monitor is a clock and its watchers (:mod:`nndx.collector.watch`). The clock hears
the loop's events — forwards, the start and end of each backward pass, gradient resets,
``optimizer.step()`` — and hands each watcher a :class:`StepContext`; each watcher owns
one measured thing (loop counts, losses, learning rates, the gradient norm, input norms,
layer statistics, parameter updates, loss calls, replica desync, the autograd graph
kept across steps, parameters that never moved, the initial state) and gives its part
of the report. Every step the watchers keep counters and python floats; every ``every``
steps (the recorded steps) the statistics that cost a pass over tensors. Values are
fetched from the device together, once per recorded step.

Step numbering: step ``k`` is the ``k``-th call (from 0) of ``optimizer.step()``; the
forward and backward passes that precede it belong to it. A train loss is stamped with
the step its backward belonged to, a loss of any other split with the last completed
step; ``mon.log(..., step=n)`` overrides both.

Memory: python floats only, O(layers + parameter tensors) per recorded step and a few
floats per step; no activation-sized tensor outlives the step that made it; the
initial-state copy (``initial_state``, bounded; on the CPU by default). Histories
are bounded (``history_size`` points, ``layer_history_size`` recorded steps; see
:class:`~nndx.collector.watch.base.History`).

Distributed (``torch.distributed`` initialised, world size > 1): each rank collects
locally and the ranks compare parameter checksums every ``checksum_every`` steps;
``report()`` is then a collective: rank 0 gets the merged report
(:func:`nndx.collector.merge.merge_ranks`), the other ranks their local report.

Observers (live alerts, exporters) are told each step as it ends (``on_step(monitor,
step, recorded)``), each logged loss (``on_log(monitor, step, split, value,
accuracy)``), and may add a part to the report (``report(window)``) and free things on
``close()``; each method is optional. What an observer's ``on_step`` raises propagates
out of ``optimizer.step()`` — that is how a live alert stops a doomed run — so an
observer that must not stop training catches its own errors.

The Monitor never changes the model, optimizer, gradients or RNG: training with it is
bit-for-bit training without it. A watcher that raises is recorded in
``report().errors`` and training goes on.
"""

from __future__ import annotations

from functools import partial
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from nndx.collector import distributed
from nndx.collector.watch import (
    ClipAfterStep, Deferred, Desync, EffectiveLearningRate, ErrorGuard, FedInputs, GradientNorm, GraphSize, InitialState,
    InputNorms, LayerStatistics, LearningRate, LossCalls, LossHistory, LoopCounts, MaskedGradients, ParameterUpdates,
    RecurrentAxes, RunFacts, StepContext, UnchangedParameters, Watched, Watcher,
)
from nndx.collector.watch.base import in_functorch_transform
from nndx.collector.watch.events import BackwardPasses, Hooks, UpdateDetector
from nndx.report import DiagnosticReport

__all__ = ["Monitor"]

MAX_ERRORS = 20
_SOURCES = {"on_forward": "forward", "on_forward_end": "forward", "on_backward_start": "backward",
            "on_backward_end": "backward_end", "on_zero_grad": "zero_grad", "on_step_begin": "step_pre",
            "on_step_end": "step_post", "on_record_start": "step_post"}  # fmt: skip


class Monitor:
    """Watch a training loop: ``Monitor(model, optimizer, every=1, loss_fn=None, ...)``;
    attached on construction, removed by :meth:`close` (or leaving the ``with`` block).
    The arguments are described in the module docstring."""

    def __init__(
        self,
        model: nn.Module | Mapping[str, nn.Module] | Sequence[nn.Module],
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
        *,
        every: int = 1,
        loss_fn: Callable[..., torch.Tensor] | None = None,
        name: str | None = None,
        project: str | None = None,
        history_size: int = 4096,
        layer_history_size: int = 256,
        checksum_every: int = 50,
        process_group: Any = None,
        max_elements: int | None = 65536,
        initial_state: str | torch.device | None = "cpu",
        initial_state_max_bytes: int = 512 << 20,
        observers: Sequence[Any] = (),
    ) -> None:
        _check_options(every, loss_fn, checksum_every)
        self.watched = Watched.of(model, optimizer)
        self.model, self.optimizer, self.every = model, optimizer, every
        self.errors = ErrorGuard(MAX_ERRORS)
        self._guard, self.record_error = self.errors.guard, self.errors.record
        self._deferred = Deferred(on_error=self.record_error)
        self.ctx = StepContext(self.watched, self._deferred)
        self.losses = LossHistory(history_size)
        self.layers = LayerStatistics(self.watched, max_elements, layer_history_size, self._guard)
        self.parameters = ParameterUpdates(self.watched, max_elements, layer_history_size)
        self.loss_calls = LossCalls()
        self.facts = RunFacts(self.watched, name, project, lambda: self.layers.forward_order)
        self.initial = InitialState(self.watched, initial_state, initial_state_max_bytes)
        self.grad_norm = GradientNorm(self.watched, history_size)
        self.loop = LoopCounts(self.watched)
        self.recurrent = RecurrentAxes(self.watched, self._guard)
        self.watchers: list[Watcher] = [
            self.facts, self.loop, self.losses, LearningRate(self.watched, history_size),
            self.grad_norm,  # before ParameterUpdates: it shares ctx.grad_norms
            MaskedGradients(self.watched, history_size),
            ClipAfterStep(self.watched, history_size),
            InputNorms(history_size), self.layers, self.parameters, self.loss_calls, GraphSize(layer_history_size),
            self.initial, UnchangedParameters(self.watched), self.recurrent, FedInputs(self.watched),
        ]  # fmt: skip
        if self.watched.manual:  # the LR is in the user's code: measure the step size instead
            self.watchers.insert(self.watchers.index(self.parameters) + 1,
                                 EffectiveLearningRate(self.parameters, history_size))  # fmt: skip
        self._updates = UpdateDetector(self.watched.params, self.errors) if self.watched.manual else None
        self._world_size = distributed.world_size(process_group)
        self._desync = Desync(self.watched, checksum_every, process_group, self._world_size) if self._world_size > 1 else None
        self.watchers += [self._desync] if self._desync else []
        self.observers = list(observers)
        self._events = {event: [w for w in self.watchers if w.overrides(event)] for event in _SOURCES}
        self.loss_fn = self.loss_calls.wrap(loss_fn, self.ctx, self._guard) if loss_fn is not None else None
        self._closed = False
        self._backward = BackwardPasses(self._event("on_backward_start"), self._guard("backward_end", self._on_backward_end))
        self.hooks = Hooks()
        self._stepping: torch.optim.Optimizer | None = None  # the optimizer whose step is under way
        self._attach()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        # the training loop's own exception is evidence (an in-place op autograd needed, a
        # graph used twice): kept in the report as source "training"; it still propagates
        if isinstance(exc, Exception):
            self.errors.record_training(exc)
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def steps(self) -> int:
        """Optimizer steps completed so far."""
        return self.ctx.step

    def _attach(self) -> None:
        hooks, watched = self.hooks, self.watched
        layer_forward = self._guard("forward", self.loop.layer_forward)
        for name, m in watched.models.items():
            hooks.add(f"model {name!r}", lambda m=m: [m.register_forward_pre_hook(self._event("on_forward"), with_kwargs=True),
                                                      m.register_forward_hook(partial(self._dispatch, "on_forward_end"))])
            # model.forward(...) called directly skips the hooks above; its layers' still run
            hooks.add(f"layers of model {name!r}", lambda m=m: [
                c.register_forward_pre_hook(lambda _c, _args, m=m: layer_forward(m)) for c in m.children()])
        for i, o in enumerate(watched.optimizers):
            step_pre = self._guard("step_pre", partial(self._step_pre, o))
            for stepped in (o, *_inner_optimizers(o)):
                hooks.add(f"optimizer {i}" + (f" ({type(stepped).__name__} inside it)" if stepped is not o else ""),
                          lambda s=stepped, pre=step_pre: [s.register_step_pre_hook(pre),
                                                           s.register_step_post_hook(self._step_post)])  # fmt: skip
        for owner in [*watched.optimizers, *watched.models.values()]:
            hooks.add(f"{type(owner).__name__}.zero_grad", lambda o=owner: hooks.patch_zero_grad(o, self, partial(self._event("on_zero_grad"), o)) or [])
        if watched.manual:  # clipping between backward and a gradient reset is otherwise unseen
            hooks.add("clip_grad_norm_", lambda: hooks.patch_clip_grad_norm(
                self, self._guard("clip_grad_norm", self.grad_norm.clipped)) or [])  # fmt: skip
        parameter_hook = self._guard("backward", self._backward.parameter_hook)
        ready = [p for _, p in watched.params if not nn.parameter.is_lazy(p)]
        hooks.add("parameters", lambda: [p.register_hook(parameter_hook) for p in ready])
        if len(ready) < len(watched.params):
            hooks.add("lazy parameters", lambda: self._hook_when_initialised(parameter_hook))
        hooks.add("layer statistics", self.layers.attach)
        hooks.add("recurrent layers", self.recurrent.attach)
        self._dispatch("on_record_start")

    def _hook_when_initialised(self, parameter_hook: Callable[[torch.Tensor], Any]) -> list[Any]:
        """Lazy parameters (``nn.LazyLinear``) take no hook until their model's first forward
        gives them values: hook them at the end of the first forward after which none is
        lazy (the backward comes after it)."""
        lazy = [p for _, p in self.watched.params if nn.parameter.is_lazy(p)]
        handles: list[Any] = []

        def initialised(*_: Any) -> None:
            if handles and not any(nn.parameter.is_lazy(p) for p in lazy):
                for handle in handles:
                    handle.remove()
                handles.clear()
                self.hooks.handles.extend(p.register_hook(parameter_hook) for p in lazy)

        handles.extend(m.register_forward_hook(self._guard("lazy parameters", initialised))
                       for m in self.watched.models.values())  # fmt: skip
        return list(handles)

    def close(self) -> None:
        """Remove every hook and wrapper; the model and optimizer are as before. Idempotent."""
        if self._closed:
            return
        self._step_if_updated(notify=False)
        self._closed = True
        self.hooks.remove()
        for part in [*self.watchers, *self.observers]:
            getattr(part, "close", lambda: None)()
        self._deferred.flush()

    def _dispatch(self, event: str, *args: Any) -> None:
        """Tell every watcher that handles ``event``; one that raises is recorded. A forward
        inside a torch.func transform is not the loop's (:func:`in_functorch_transform`)."""
        if in_functorch_transform():
            return
        for watcher in self._events[event]:
            try:
                getattr(watcher, event)(self.ctx, *args)
            except Exception as exc:  # noqa: BLE001 - one watcher failing must not stop the others
                self.record_error(_SOURCES[event], exc)

    def _event(self, event: str) -> Callable[..., None]:
        """The hook of a loop event; in a loop without an optimizer, the first such event
        after a backward pass whose parameters then changed ends the step."""

        def hook(*args: Any) -> None:
            self._step_if_updated()
            self._dispatch(event, *args)

        return hook

    def _step_if_updated(self, notify: bool = True) -> None:
        if self._updates is not None and self.ctx.backward_since_step and self._updates.updated():
            self._on_step_begin(None)
            self._on_step_end(notify=notify)

    def _on_backward_end(self) -> None:
        self.ctx.backward_step, self.ctx.backward_since_step = self.ctx.step, True
        self._dispatch("on_backward_end")
        if self._updates is not None:
            self._updates.arm()

    def _step_pre(self, watched: torch.optim.Optimizer, stepped: torch.optim.Optimizer, *_: Any) -> None:
        """A step begins at the outermost optimizer stepped: a wrapper's own step (SAM's, with a
        closure) or, when the loop steps the inner one itself (SAM's first_step/second_step
        around ``base_optimizer.step()``), the inner one's. Either counts once. A watched optimizer's
        own step always begins one: no watched optimizer steps inside another, and a step that raised
        before its end (a user's step that threw) leaves nothing that would swallow the next ones."""
        outer = any(stepped is o for o in self.watched.optimizers)
        if self._stepping is not None and self._stepping is not stepped and not outer:
            return
        self._stepping = stepped
        self._on_step_begin(watched)

    def _step_post(self, stepped: torch.optim.Optimizer, *_: Any) -> None:
        if self._stepping is not stepped:
            return
        self._stepping = None
        self._on_step_end()

    def _on_step_begin(self, optimizer: torch.optim.Optimizer | None, *_: Any) -> None:
        self.ctx.optimizer = optimizer
        self._dispatch("on_step_begin")

    def _on_step_end(self, *_: Any, notify: bool = True) -> None:
        ctx = self.ctx
        self._dispatch("on_step_end")
        step, recorded = ctx.step, ctx.recording
        if recorded:  # the one host synchronisation of a recorded step, for everything deferred since the last
            self._deferred.flush()
        ctx.step, ctx.optimizer, ctx.backward_since_step, ctx.recording = step + 1, None, False, False
        if ctx.step % self.every == 0:
            ctx.recording = True
            self._dispatch("on_record_start")
        for observer in self.observers if notify else ():  # unguarded: raising is how an observer stops training
            if hasattr(observer, "on_step"):
                observer.on_step(self, step, recorded)

    # ------------------------------------------------------------------ public API

    def log(self, loss: Any, split: str = "train", accuracy: Any = None, *, step: int | None = None) -> None:
        """Record a loss (tensor or number) and optional accuracy for ``split``; a
        tensor's value is fetched later, with the step's others (no synchronisation now)."""
        record = self.losses.log(self.ctx, loss, split, accuracy, step)
        self._guard("log", self.loop.check_logged_loss)(loss)  # a graph walk: an error is evidence, not a crash
        self.loop.note_logged_split(split)
        for observer in self.observers:
            if hasattr(observer, "on_log"):  # a live chart needs the value now: one host sync
                acc = None if record.accuracy is None else float(record.accuracy)
                observer.on_log(self, record.step, split, float(record.value), acc)

    def initial_state(self, model: nn.Module | str | None = None) -> dict[str, torch.Tensor] | None:
        """The parameters and buffers when the Monitor attached, keyed as ``state_dict``
        (see :class:`~nndx.collector.watch.initial.InitialState`; several models: pass
        one, or its name); None when not kept (``report().loop.limitations`` says why)."""
        return self.initial.of(model)

    @property
    def workspace_bytes(self) -> int:
        """Tensor bytes kept between steps (layer buffers, the spent parameter snapshot:
        reused every recorded step, each at most ``stats.PENDING_BYTES``); 0 after close()."""
        return self.layers.workspace_bytes + self.parameters.workspace_bytes

    def report(self) -> DiagnosticReport:
        """The report of everything seen so far (callable during and after training).

        Distributed: a collective — call it on every rank; rank 0 returns the merged
        report of all ranks, the others their own."""
        self._step_if_updated(notify=False)
        if self._desync is not None and distributed.is_initialized():
            try:
                self._desync.check(self.ctx.step)
                return distributed.gather_and_merge(self.local_report(), self._desync.group)
            except Exception as exc:  # noqa: BLE001 - a broken group must not lose the local report
                self.record_error("distributed", exc)
        return self.local_report()

    def local_report(self, window: int | None = None) -> DiagnosticReport:
        """This rank's report. With ``window``: what live rules read, cheaply — the
        newest ``window`` points of each history, the first and newest recorded steps,
        no input norms (see :func:`nndx.collector.watch.base.recorded_steps`)."""
        self._deferred.flush()
        limitations = [*_limitations(self.watched), *self.hooks.limitations]
        fields = _assemble([*self.watchers, *self.observers], window, self.record_error)
        fields["loop"] = {"steps": self.ctx.step, **fields["loop"], "limitations": limitations + fields["loop"].get("limitations", []),
                          "live_window": window}  # fmt: skip
        return DiagnosticReport(**{**fields, "errors": [*self.errors.records, *fields.get("errors", [])]})


def _assemble(parts: list[Any], window: int | None, record_error: Callable[[str, BaseException], None]) -> dict[str, Any]:
    """The report's fields from each part's contribution: ``loop`` fields, ``errors`` and
    ``limitations`` gathered from all, every other field from the part that gives it."""
    fields: dict[str, Any] = {"loop": {"limitations": []}, "errors": []}
    for part in parts:
        try:
            contribution = dict(part.report(window)) if hasattr(part, "report") else {}
        except Exception as exc:  # noqa: BLE001 - one part failing must not lose the report
            record_error(f"report.{getattr(part, 'name', type(part).__name__)}", exc)
            continue
        loop = dict(contribution.pop("loop", {}))
        fields["loop"]["limitations"] += loop.pop("limitations", [])
        fields["loop"].update(loop)
        fields["errors"] += contribution.pop("errors", [])
        fields.update(contribution)
    return fields


def _limitations(watched: Watched) -> list[str]:
    out = []
    if watched.manual:
        out.append("no optimizer: steps are the parameter updates detected after each backward pass; "
                   "the learning rate is unknown")  # fmt: skip
    if not watched.params:
        out.append("no trainable parameters: backward passes and updates cannot be seen")
    if watched.plain:
        names = ", ".join(watched.plain[:5]) + (", ..." if len(watched.plain) > 5 else "")
        out.append(f"the model registers no parameter: the {len(watched.plain)} tensors it holds that require grad "
                   f"({names}) are watched in their place")
    if watched.complex_params:
        names = ", ".join(watched.complex_params[:3]) + (", ..." if len(watched.complex_params) > 3 else "")
        out.append(f"{len(watched.complex_params)} complex parameter tensors not watched ({names}): their updates, "
                   "gradient norms and statistics are not in the report")
    for own in watched.own_optimizers:
        out.append(f"{own} is no torch.optim.Optimizer and holds none: its updates are watched as updates by hand")
    for wrapper in watched.wrappers:
        out.append(f"{wrapper} wraps the optimizer watched: the learning rate recorded is the inner optimizer's, "
                   "which the wrapper may scale per parameter (LARC's trust ratio)")
    return out


def _check_options(every: Any, loss_fn: Any, checksum_every: int) -> None:
    """Wrong arguments are clear errors, raised before anything is attached."""
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ValueError(f"every must be an integer >= 1, got {every!r}")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError("loss_fn must be callable (e.g. nn.CrossEntropyLoss())")
    if checksum_every < 1:
        raise ValueError(f"checksum_every must be >= 1, got {checksum_every!r}")


def _inner_optimizers(optimizer: torch.optim.Optimizer) -> list[torch.optim.Optimizer]:
    """Optimizers a wrapper holds as attributes (SAM's ``base_optimizer``, Lookahead's
    ``optimizer``): a loop may step those directly and never the wrapper."""
    return [v for v in vars(optimizer).values() if isinstance(v, torch.optim.Optimizer) and v is not optimizer]
