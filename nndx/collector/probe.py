"""``nndx.probe``: run the active probes on a copy and collect one DiagnosticReport.

How to use::

    report = nndx.probe(model, (x, y), nn.CrossEntropyLoss(), optimizer=optimizer)
    report = nndx.probe(model, loader, loss_fn, device="cuda", amp=torch.bfloat16)
    report = nndx.probe(hf_model, {"input_ids": ids, "attention_mask": mask, "labels": labels}, None)
    report = nndx.probe(model, (x, y), loss_fn, monitor=mon)     # trainability probes from mon's snapshot
    report = nndx.probe(model, (x, y), loss_fn, probes=["grad_check", "nan_origin"],
                        grad_check={"mode": "elementwise"}, overfit_one_batch={"steps": 50})
    nndx.diagnose(report)

What it takes: a batch ``(inputs, targets)``, a dict batch (``x``/``y``,
``inputs``/``targets``, or a Hugging Face batch whose ``labels`` the model uses), or a
DataLoader (its first batch; the report says so). ``loss_fn`` may be None when the
model returns its own loss (``output.loss``); an output with ``.logits`` gives the
logits to ``loss_fn``. ``device`` moves the probes' copy and the batch, ``amp``
(``torch.bfloat16``/``torch.float16``) runs the probes' forwards under autocast. A batch
or a loss nndx cannot use is a :class:`nndx.errors.UsageError` before any probe runs.

Every probe works on a copy of the model, without the user's hooks, with the random
state restored, so the user's model, optimizer, hooks and RNG are exactly as before
(tested). A probe that raises (a dtype or device mismatch, an in-place op that breaks
autograd...) becomes an ``ErrorRecord`` in ``report.errors`` and that probe's result
has status ``error``: the others still run, and the caller's process never crashes
because of nndx.

From which state: the trainability probes (overfit, LR range, gradient check) ask
whether the model *can* learn, which a trained model cannot answer (it "fits one batch
in 0 steps"). They run from the initial state when one is known —
``initial_state=`` a ``state_dict`` saved before training, or the Monitor's snapshot
(``monitor.initial_state()``) — and say ``skipped`` when the Monitor saw training steps
and no initial state is known. The other probes measure the model as it is — unless its
weights are already NaN/Inf: a diverged model cannot say where its first NaN came from,
so the probes that need finite weights run from the initial state too, or say
``skipped`` without one.

Per-probe options go in a keyword argument named after the probe, as a dict of the
probe function's keyword arguments (see ``nndx.collector.probes``, one module per
probe); an unknown one is a TypeError before anything runs.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import types
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np
import torch
from torch import nn

from nndx import vocab
from nndx.collector._common import (
    Batch,
    LossFn,
    compute_loss,
    copy_pair,
    copy_together,
    follow_copies,
    forward,
    forwards_under_autocast,
    infer_task,
    iter_tensors,
    loader_generators,
    loss_name,
    loss_on_copies,
    map_tensors,
    model_deepcopy,
    num_classes,
    optimizer_coverage,
    own_optimizer,
    prediction,
    preserved_rng,
    seed_all,
    set_mode,
    split_batch,
    torch_optimizer,
    trainable_tensors,
    working_copy,
)
from nndx.collector.data import check_data
from nndx.collector.loss_call import InnerLossCalls, LossCallLog, merge_loss_calls
from nndx.collector.merge import merge_monitor
from nndx.collector.probes import ProbeSpec, specs
from nndx.collector.probes._observe import ForwardObserver, IndexColumns, observed_summary
from nndx.collector.progress import progress_bar
from nndx.collector.stats import frozen_at_init, has_batchnorm, has_dropout, summarize_model, tracking_copies
from nndx.errors import UsageError
from nndx.report import (
    MAX_ERROR_MESSAGE,
    DataStats,
    DiagnosticReport,
    ErrorRecord,
    LayerStats,
    LoopStats,
    RunInfo,
    SplitStats,
)

# name -> spec of every probe, cheap first
PROBES: dict[str, ProbeSpec] = {spec.name: spec for spec in specs()}
MAX_WARNINGS = 20
# library housekeeping, not evidence about the user's training
IGNORED_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning, ImportWarning, ResourceWarning)
TORCH_DIR = os.path.dirname(torch.__file__)
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


def probe(
    model: nn.Module,
    batch: Batch,
    loss_fn: LossFn = None,
    *,
    probes: Sequence[str] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    monitor: Any = None,
    data: Sequence[Any] | None = None,
    device: torch.device | str | None = None,
    amp: torch.dtype | str | None = None,
    initial_state: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    **options: dict[str, Any],
) -> DiagnosticReport:
    """Run the selected probes and return the report: by default every batch probe,
    and the data probes (label alignment, label noise) when ``data`` is given. See the
    module's docstring for ``batch``, ``loss_fn``, ``device``, ``amp`` and
    ``initial_state``.

    ``optimizer`` is never stepped: it is checked for parameters it does not hold
    (``report.loop.params_not_in_optimizer``) and copied for the probes whose numbers
    depend on it (update/weight ratio, LR range). ``monitor`` is a
    :class:`nndx.collector.monitor.Monitor` whose ``report()`` is merged in; ``data`` is
    ``(X_train, y_train[, X_val, y_val])`` for :func:`nndx.collector.data.check_data` and
    the data probes (on the training split; labels None: the inputs only, and no label
    probes); without it, the batch's inputs are measured (``report.data.batch``).
    ``progress`` shows a bar on stderr (default: when stderr is a terminal or in a
    notebook; see nndx.collector.progress).
    """
    own = own_optimizer(optimizer)
    inner = None if own else torch_optimizer(optimizer)
    wrapped = (f"{type(optimizer).__name__} is no torch.optim.Optimizer and holds none: the probes trained as for a "
               "loop that updates the parameters by hand" if own
               else None if inner is optimizer
               else f"{type(optimizer).__name__} wraps the optimizer: the probes copy the {type(inner).__name__} "
               "inside it")  # fmt: skip
    optimizer = inner
    model, optimizer, loss_fn, lazy = _initialised(model, optimizer, loss_fn, batch)
    data_error = None
    from_monitor = False  # the initial state is the Monitor's snapshot, not one the caller passed
    if data is not None and (not isinstance(data, (tuple, list)) or len(data) not in (2, 4)):
        data_error = TypeError("data must be (X_train, y_train) or (X_train, y_train, X_val, y_val)")
    # the label probes need labels: data=(X, None) is inputs only (a loader whose items' second part
    # is not the target), checked for scale, duplicates and leaks
    labelled = data is not None and data_error is None and data[1] is not None
    selected = _select(probes, labelled)
    for name, given in options.items():
        if name not in PROBES:
            raise TypeError(f"unknown probe options {name!r}; options are keyed by probe name: {list(PROBES)}")
        PROBES[name].check_options(given)
    steps = progress_bar(selected, desc="nndx probe", progress=progress, unit="probe")
    report = DiagnosticReport(run=_run_info(model, device), errors=[])
    guard = _Guard(report)
    watched: DiagnosticReport | None = None
    if monitor is not None:
        ok, watched = guard.attempt("monitor", monitor.report)
        watched = watched if ok else None
        if initial_state is None:
            ok, snapshot = guard.attempt("monitor", lambda: _monitor_snapshot(monitor, model))
            initial_state = snapshot if ok else None
            from_monitor = initial_state is not None
    stand_in, note = (None, None) if optimizer is not None else _measured_sgd(model, watched)
    setup = _Setup.make(model, batch, loss_fn, optimizer or stand_in, device, amp, initial_state, _peak_lrs(watched),
                        from_monitor)  # fmt: skip
    report.run.notes = setup.notes + [n for n in (wrapped, note, lazy) if n]

    guard.attempt("model", lambda: _describe_model(report, model, optimizer, watched))
    guard.attempt("describe", lambda: _describe_run(report, setup), warn=True, reraise=UsageError)
    trained_steps = watched.loop.steps if watched is not None and watched.loop is not None else 0
    for spec in steps:
        why_not = _why_not(spec, setup, labelled, trained_steps)
        if why_not is not None:
            spec.store_status(report, "skipped", why_not)
            continue
        steps.set_postfix_str(spec.name)
        model_now, optimizer_now = setup.state_for(spec)
        ok, outcome = guard.attempt(spec.name, lambda: setup.run(spec, model_now, optimizer_now, data,
                                                                 options.get(spec.name, {})), warn=True)  # fmt: skip
        if not ok:
            spec.store_status(report, "error", outcome)
            continue
        spec.store(report, outcome)
    if setup.loss_views and report.model is not None:  # the layer statistics' summary replaced the first one
        report.model.moved_axes = (report.model.moved_axes + setup.loss_views)[:8]
    if watched is not None:
        at_start: list = []
        if setup.initial is not None and trained_steps > 0 and any(spec.name == "hooks" for spec in selected):
            ok, measured = guard.attempt("hooks", setup.functional_layers_at_start, warn=True)
            at_start = measured if ok else []
        guard.attempt("monitor", lambda: merge_monitor(report, watched, at_start))
    if data is not None:
        if data_error is not None:
            guard.error("data", data_error)
        else:
            ok, found = guard.attempt("data", lambda: _model_read_columns(setup, data))
            columns = found if ok else ([], [])
            ok, checked = guard.attempt("data", lambda: _check_data(data, report, columns, setup))
            if ok:
                report.data = checked
    else:
        ok, batch_inputs = guard.attempt("data", lambda: _batch_inputs(setup))
        if ok and batch_inputs is not None:
            report.data = DataStats(batch=batch_inputs)
    report.run.finished_at = datetime.now(timezone.utc)
    return report


@dataclass
class _Setup:
    """What the probes run on, prepared once: copies of the model and optimizer without
    the user's hooks, on ``device``, at the current and (when known) the initial state;
    the batch as ``(inputs, targets)`` on that device; autocast."""

    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    initial: nn.Module | None
    initial_optimizer: torch.optim.Optimizer | None
    batch: tuple[Any, Any]
    loss_fn: LossFn
    autocast: tuple[str, torch.dtype] | None
    notes: list[str] = field(default_factory=list)
    diverged: bool = False  # the current weights hold a NaN/Inf
    # the prediction has one logit per input token (an extractive QA model's span starts, a pointer
    # network): class-index targets then point at positions, they are no classes
    position_logits: bool = False
    # why no probe can call the model: its forward raises NotImplementedError (called through other methods)
    no_forward: str | None = None
    # views of the outputs inside the user's loss that interleave axes (NNDX404 reads them beside the forward's)
    loss_views: list[str] = field(default_factory=list)

    @classmethod
    def make(cls, model: nn.Module, batch: Batch, loss_fn: LossFn, optimizer: torch.optim.Optimizer | None,
             device: torch.device | str | None, amp: torch.dtype | str | None,
             initial_state: Mapping[str, Any] | None, peak_lrs: list[float] | None = None,
             from_monitor: bool = False) -> _Setup:  # fmt: skip
        if not isinstance(model, nn.Module):
            raise UsageError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if loss_fn is not None and not callable(loss_fn):
            raise UsageError(f"loss_fn must be callable (or None when the model returns .loss), got {type(loss_fn).__name__}")
        notes: list[str] = []
        try:
            # a discriminator inside the loss: the probes run a copy of it; the model itself there: the probe's copy
            loss_fn = loss_on_copies(loss_fn, model)
        except TypeError as exc:
            notes.append(f"the loss's own modules run as they are: {exc}")
        batch, note = _first_batch(batch)
        if note:
            notes.append(note)
        inputs, targets = _split(batch, loss_fn)
        shared: list[str] = []
        current, opt = copy_pair(model, optimizer, device, shared)
        follow_copies(model, current)
        if shared:
            notes.append(f"the probes' copies share {', '.join(shared)} with the model: deepcopy refused "
                         f"{'it' if len(shared) == 1 else 'them'} (parameters and buffers were copied)")
        initial = initial_opt = None
        diverged = bool(_nonfinite_parameters(current))
        if initial_state is not None:
            initial, initial_opt = copy_pair(model, optimizer, device)
            follow_copies(model, initial)
            try:
                initial.load_state_dict(initial_state)
            except Exception as exc:
                if not from_monitor:
                    raise UsageError(f"initial_state does not fit the model: {exc}") from exc
                # parameters created or replaced after the Monitor attached (a weight-drop wrapper
                # that re-registers its weight on the first forward, a lazy module): no initial state
                first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
                notes.append(f"the Monitor's snapshot of the initial state does not fit the model now ({first}): "
                             "parameters were created or replaced after it attached, so no initial state is known")
                initial_state = initial = initial_opt = None
        if initial_state is not None:
            if initial_opt is not None:
                initial_opt.state.clear()  # the optimizer's state at the start: none
            notes.append("the trainability probes (overfit, LR range, gradient check) ran from the initial state")
            groups = initial_opt.param_groups if initial_opt is not None else []
            if peak_lrs and len(peak_lrs) == len(groups) and any(lr > g["lr"] for lr, g in zip(peak_lrs, groups)):
                # a schedule that decayed to ~0 would leave the probes nothing to train with
                for lr, group in zip(peak_lrs, groups):
                    group["lr"] = max(group["lr"], lr)
                notes.append("they trained at the peak learning rate the Monitor saw, not the one the schedule "
                             "ended at")  # fmt: skip
            if diverged:
                notes.append("the weights are non-finite now: the model was described from the initial state (one "
                             "forward and the loss call), and the NaN origin, eval-mode, sample-independence and "
                             "causality probes ran from it too")  # fmt: skip
        if not model.training:
            notes.append("the model was in eval mode: the trainability probes and the layer statistics ran in train "
                         "mode, as a training loop does")  # fmt: skip
        target_device = (next((p.device for p in nn.Module.parameters(current)), None) if device is None
                         else torch.device(device))
        if target_device is not None:
            inputs, targets = (map_tensors(t, lambda x: x.to(target_device)) for t in (inputs, targets))
        autocast = None
        if amp is not None:
            dtype = AUTOCAST_DTYPES.get(amp, amp) if isinstance(amp, str) else amp
            if dtype not in (torch.bfloat16, torch.float16):
                raise UsageError(f"amp must be torch.bfloat16 or torch.float16 (or 'bf16'/'fp16'), got {amp!r}")
            autocast = ((target_device or torch.device("cpu")).type, dtype)
            notes.append(f"forwards under torch.autocast({autocast[0]!r}, {str(dtype).removeprefix('torch.')})")
        return cls(current, opt, initial, initial_opt, (inputs, targets), loss_fn, autocast, notes, diverged)

    def state_for(self, spec: ProbeSpec) -> tuple[nn.Module, torch.optim.Optimizer | None]:
        """The trainability probes' state is the initial one when known; so is every probe's
        that a diverged model cannot answer (where a NaN came from, eval-mode consistency),
        when the weights are already non-finite."""
        if self.initial is not None and (spec.trains or (spec.needs_finite_parameters and self.diverged)):
            return self.initial, self.initial_optimizer
        return self.model, self.optimizer

    def described(self) -> nn.Module:
        """The state the run is described at (its task, what reaches the loss): the current one,
        unless its weights are non-finite and the initial one is known. NaN outputs say nothing
        of whether the outputs are log-probabilities; the architecture is the same at the start."""
        return self.initial if self.diverged and self.initial is not None else self.model

    def functional_layers_at_start(self) -> list[LayerStats]:
        """The functional activations (``F.relu`` in ``forward``: only the probes see them,
        the Monitor's module hooks do not) at the initial state, on the probe's batch, in the
        mode the layer-statistics probe measures the trained model in: a layer found dead or
        saturated after training is then known to have been so at the start, or not."""
        initial = working_copy(self.initial)
        with (preserved_rng(), self.amp(), torch.no_grad(), _train_mode(initial, True),
              ForwardObserver(initial, layer_stats=True) as seen):  # fmt: skip
            forward(initial, self.batch[0])
        return seen.layer_records()

    def amp(self) -> contextlib.AbstractContextManager:
        return forwards_under_autocast(self.autocast)

    def run(self, spec: ProbeSpec, model: nn.Module, optimizer: torch.optim.Optimizer | None, data: Any,
            options: Mapping[str, Any]) -> Any:  # fmt: skip
        # the user's random streams are put back after every probe, whatever it drew (a dropout
        # forward deciding that a remedy does not apply): one guarantee for every probe
        with preserved_rng(), self.amp(), _train_mode(model, spec.trains or spec.train_mode):
            return spec.call(model, self.batch, self.loss_fn, optimizer, data, options)


@contextlib.contextmanager
def _train_mode(model: nn.Module, trains: bool) -> Iterator[None]:
    """A trainability probe trains in train mode, as a training loop does: a model left in
    eval mode by the user's evaluation would otherwise train with BatchNorm's running
    statistics (at initialisation: none, so raw inputs pass unnormalised) and say nothing
    about the user's training; the layer statistics' gradients would pass through layers
    that round or sample differently in eval mode. Every module's own mode is put back afterwards."""
    modes = [(m, m.training) for m in model.modules()]
    if trains and not model.training:
        set_mode(model, True)
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def _initialised(model: nn.Module, optimizer: torch.optim.Optimizer | None, loss_fn: LossFn,
                 batch: Batch) -> tuple[nn.Module, torch.optim.Optimizer | None, LossFn, str | None]:
    """A model with lazy parameters (``nn.LazyLinear``: d2l's concise models) has no shapes
    until its first forward, which a preflight comes before. The probes then run on a copy
    of the model (and its optimizer; a loss that is a method of the model bound to it) that
    one forward of the batch initialised, under the user's RNG state put back after: the
    user's model still draws its own values at its own first forward. The note says so."""
    if not isinstance(model, nn.Module):
        return model, optimizer, loss_fn, None
    lazy = [name for name, p in model.named_parameters() if nn.parameter.is_lazy(p)]
    if not lazy:
        return model, optimizer, loss_fn, None
    inputs, _ = _split(_first_batch(batch)[0], loss_fn)
    model_copy, optimizer_copy = (copy_together(model, optimizer) if optimizer is not None
                                  else (model_deepcopy(model, model), None))  # fmt: skip
    try:
        with preserved_rng(), torch.no_grad():
            forward(model_copy, inputs)
    except Exception as exc:
        raise UsageError(f"the model has uninitialised lazy parameters ({', '.join(lazy[:3])}), and the forward "
                         f"that would initialise a copy of it raised {type(exc).__name__}: {exc}") from exc
    if isinstance(loss_fn, types.MethodType) and loss_fn.__self__ is model:
        loss_fn = types.MethodType(loss_fn.__func__, model_copy)
    return model_copy, optimizer_copy, loss_fn, (
        f"{len(lazy)} lazy parameter{'s' if len(lazy) != 1 else ''} ({', '.join(lazy[:3])}) had no values yet: the "
        "probes ran on a copy that one forward of the batch initialised, with values of its own")


def _first_batch(batch: Batch) -> tuple[Batch, str | None]:
    """A DataLoader (or any iterable of batches) gives its first batch; reading it draws
    from the global RNG or the loader's own generator (a shuffling sampler): both are put back."""
    if isinstance(batch, (tuple, list, Mapping, torch.Tensor)) or not isinstance(batch, Iterable):
        return batch, None
    with preserved_rng(*loader_generators(batch)):
        try:
            first = next(iter(batch))
        except StopIteration:
            raise UsageError(f"the {type(batch).__name__} yielded no batch") from None
    size = next((int(t.shape[0]) for t in iter_tensors(first) if t.dim() > 0), None)
    what = f"the first batch of the {type(batch).__name__}" + (f" ({size} samples)" if size is not None else "")
    return first, f"ran on {what}: one batch, not the whole dataset"


def _split(batch: Batch, loss_fn: LossFn) -> tuple[Any, Any]:
    """(inputs, targets); a Hugging Face dict batch keeps its labels among the model's
    keyword arguments when the model computes the loss itself (``loss_fn`` None)."""
    inputs, targets = split_batch(batch)
    if loss_fn is None and isinstance(batch, Mapping) and isinstance(inputs, Mapping) and targets is not None:
        inputs = dict(batch)
    return inputs, targets


def _peak_lrs(watched: DiagnosticReport | None) -> list[float] | None:
    """Each param group's highest learning rate in the Monitor's history (every group of
    every optimizer, in order), or None when none was recorded."""
    history = watched.loop.lr_history if watched is not None and watched.loop is not None else []
    if not history or len({len(p.lrs) for p in history}) != 1:
        return None
    return [max(values) for values in zip(*(p.lrs for p in history))]


def _monitor_snapshot(monitor: Any, model: nn.Module) -> Mapping[str, Any] | None:
    """The Monitor's snapshot of the initial parameters and buffers, if it keeps one: of
    ``model`` alone when it is one of several the Monitor watches (a GAN's discriminator
    probed under a Monitor of {"G": ..., "D": ...})."""
    snapshot = getattr(monitor, "initial_state", None)
    if not callable(snapshot):
        return None
    try:
        return snapshot(model)
    except KeyError:  # not one of the watched models: the whole snapshot, keyed as they are
        return snapshot()


def _why_not(spec: ProbeSpec, setup: _Setup, have_data: bool, trained_steps: int) -> str | None:
    """Why the probe cannot say anything useful here, or None."""
    if spec.needs == "data":
        return None if have_data else "needs the training data and its labels: pass data=(X_train, y_train)"
    if setup.no_forward is not None:
        return setup.no_forward
    if spec.trains and setup.initial is None and trained_steps > 0:
        return (f"the Monitor saw {trained_steps} optimizer steps and no initial state is known: on a trained "
                f"model the {spec.title} measures the training already done (overfitting 'in 0 steps'); "
                "probe before training, or pass initial_state= a state_dict saved before training")  # fmt: skip
    model, _ = setup.state_for(spec)
    if spec.trains and not trainable_tensors(model):
        outside = setup.optimizer is not None and optimizer_coverage(model, setup.optimizer)[1]
        return ("the model has no trainable parameters" + (
            f": the optimizer trains {outside} tensors outside it (an input or a latent being optimised, as style "
            "transfer does), which the probes do not train" if outside else ""))
    nonfinite = _nonfinite_parameters(model)
    if nonfinite and spec.needs_finite_parameters:
        return (f"{len(nonfinite)} parameter tensor(s) are already non-finite (first: {nonfinite[0]}); "
                "a diverged model says nothing about why it diverged: probe before training "
                "or from the last finite checkpoint")  # fmt: skip
    return None


def _nonfinite_parameters(model: nn.Module) -> list[str]:
    """Names of the parameter tensors that hold a NaN/Inf."""
    return [n for n, p in nn.Module.named_parameters(model) if not bool(torch.isfinite(p.detach()).all())]


class _Guard:
    """The one place where a probe that raises becomes evidence: an ``ErrorRecord`` in
    ``report.errors`` (and, for a probe, status ``error`` with the same message), never a
    crash of the caller. Warnings torch raises while a probe runs (a loss broadcasting
    mismatched shapes) are recorded the same way, once each, with the warning category
    as ``type``."""

    def __init__(self, report: DiagnosticReport) -> None:
        self.report = report
        self.warned: set[tuple[str, str]] = set()

    def error(self, source: str, exc: Exception) -> str:
        record = ErrorRecord.of(source, exc)
        self.report.errors.append(record)
        return f"{record.type}: {record.message}"

    def attempt(self, source: str, fn: Callable[[], Any], warn: bool = False,
                reraise: type[Exception] | tuple[()] = ()) -> tuple[bool, Any]:  # fmt: skip
        """(True, what ``fn`` returned) or (False, the recorded error as text);
        exceptions of type ``reraise`` (the caller's mistakes) propagate."""
        try:
            if not warn:
                return True, fn()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    return True, fn()
                finally:
                    self._warnings(source, caught)
        except reraise:
            raise
        except Exception as exc:  # noqa: BLE001 - a crash is evidence, never the user's crash
            return False, self.error(source, exc)

    def _warnings(self, source: str, caught: list[warnings.WarningMessage]) -> None:
        """Warnings of other libraries (a Lightning module's ``self.log`` outside a
        Trainer) say nothing about the training and are left out."""
        for w in caught:
            key = (w.category.__name__, str(w.message))
            if (issubclass(w.category, IGNORED_WARNINGS) or not str(w.filename).startswith(TORCH_DIR)
                    or key in self.warned or len(self.warned) >= MAX_WARNINGS):  # fmt: skip
                continue
            self.warned.add(key)
            self.report.errors.append(ErrorRecord(source=source, type=key[0], message=key[1][:MAX_ERROR_MESSAGE]))


def _select(probes: Sequence[str] | str | None, with_data: bool) -> list[ProbeSpec]:
    if probes is None:
        return [spec for spec in PROBES.values() if spec.needs == "batch" or with_data]
    if isinstance(probes, str):
        probes = [probes]
    unknown = [p for p in probes if p not in PROBES]
    if unknown:
        raise ValueError(f"unknown probes {unknown}; choose from {list(PROBES)}")
    return [spec for spec in PROBES.values() if spec.name in probes]  # run in the cheap-first order, once each


def _run_info(model: nn.Module, device: torch.device | str | None) -> RunInfo:
    first = next(nn.Module.parameters(model), None)
    where = str(torch.device(device)) if device is not None else (str(first.device) if first is not None else "cpu")
    return RunInfo(
        started_at=datetime.now(timezone.utc),
        torch_version=torch.__version__,
        device=where,
        dtype=str(first.dtype).removeprefix("torch.") if first is not None else None,
        seed=torch.initial_seed(),
    )


def _measured_sgd(model: nn.Module, watched: DiagnosticReport | None) -> tuple[torch.optim.Optimizer | None, str | None]:
    """For a loop that updates its parameters by hand (no optimizer object): plain SGD at
    the step size the Monitor measured (``loop.effective_lr_history``, the median), so the
    probes train the way the loop does rather than with nndx's default Adam at 1e-3 — which
    on a problem the loop solves at lr 0.1 barely moves and makes any rescaling remedy look
    like a cure. Never stepped: the probes copy it."""
    history = watched.loop.effective_lr_history if watched is not None and watched.loop is not None else []
    sizes = [lr for point in history for lr in point.lrs if math.isfinite(lr) and lr > 0]
    params = [p for _, p in trainable_tensors(model)]
    if not sizes or not params:
        return None, None
    lr = statistics.median(sizes)
    note = f"no optimizer object: the probes train with SGD at the step size the Monitor measured (lr {lr:.3g})"
    return torch.optim.SGD(params, lr=lr), note


def _describe_model(report: DiagnosticReport, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                    watched: DiagnosticReport | None = None) -> None:
    """Static facts: model summary and optimizer coverage. Frozen weights at their init
    are read here only when the Monitor's report (``watched``, merged later, its reading
    kept) has none."""
    report.model = summarize_model(model)
    at_init, checked = frozen_at_init(model) if watched is None or watched.loop is None else ([], 0)
    loop = LoopStats(
        trainable_param_count=sum(p.numel() for p in nn.Module.parameters(model) if p.requires_grad),
        frozen_params=[n for n, p in nn.Module.named_parameters(model) if not p.requires_grad],
        frozen_at_init=at_init if checked else None,
        frozen_checked=checked,
        frozen_tracking=tracking_copies(model),
        has_dropout=has_dropout(model),
        has_batchnorm=has_batchnorm(model),
    )
    if optimizer is not None:
        loop.params_not_in_optimizer, loop.optimizer_params_not_in_model = optimizer_coverage(model, optimizer)
    report.loop = loop


def _describe_run(report: DiagnosticReport, setup: _Setup) -> None:
    """One forward and one loss call on a copy, as any training step makes them: the
    task, the number of classes, what reached the loss (``report.loop.loss_calls``,
    the evidence a Monitor's wrapped loss would give) and the activations that ran,
    functional ones included. A loss nndx cannot compute is a UsageError here, before
    any probe runs."""
    inputs, targets = setup.batch
    report.task = infer_task(setup.loss_fn, targets)
    in_forward = LossCallLog()  # a loss the model computes itself (ELECTRA's, a Hugging Face model's .loss)
    with preserved_rng(), torch.no_grad(), setup.amp():
        model_copy = working_copy(setup.described())
        with ForwardObserver(model_copy) as seen, InnerLossCalls(in_forward, observer=seen):
            try:
                output = forward(model_copy, inputs)
            except NotImplementedError as exc:
                setup.no_forward = (
                    f"the model's forward raises NotImplementedError ({str(exc) or 'no forward of its own'}): the "
                    "loop calls other methods of it (an actor-critic's act and evaluate), and the probes call "
                    "model(inputs); wrap what the loop calls in a module's forward to probe it")  # fmt: skip
                raise
        calls = LossCallLog()
        predicted = prediction(output)
        outer = (calls.add(loss_name(setup.loss_fn), predicted, targets,
                           ignore_index=getattr(setup.loss_fn, "ignore_index", None),
                           class_weight=getattr(setup.loss_fn, "weight", None))
                 if setup.loss_fn is not None else None)  # fmt: skip
        # a loss of the user's own: what reaches torch's loss inside it, and any softmax it applies itself
        own_loss = setup.loss_fn is not None and vocab.loss_kind(loss_name(setup.loss_fn)) is None
        inner = InnerLossCalls(calls, output=predicted, target=targets, observer=seen) if own_loss else None
        with inner or contextlib.nullcontext():
            seed_all(0)
            compute_loss(setup.loss_fn, output, targets)
        if inner is not None and outer is not None:
            outer.update({"applies": inner.applies, "broadcast_shape": inner.broadcast_shape,
                          "broadcast_operands": inner.broadcast_operands,
                          "squashes_again": " -> ".join(inner.squashed) if inner.squashed else None})
        from_output = _targets_from_output(setup.loss_fn, output, targets, inner) if inner is not None else None
    report.num_classes = num_classes(setup.loss_fn, output) if report.task == "classification" else None
    setup.position_logits = _position_logits(inputs, predicted)
    if report.model is not None:
        read = inner.last[1] if inner is not None and inner.last is not None else None
        report.model = observed_summary(report.model, seen, output, read)
    setup.loss_views = inner.moved_axes if inner is not None else []
    report.loop = report.loop or LoopStats()
    report.loop.loss_targets_from_output = from_output
    # the loss the caller gave first: the class count and the uninformed loss are read off it
    report.loop.loss_calls = merge_loss_calls(calls.records(), in_forward.records())


def _targets_from_output(loss_fn: LossFn, output: Any, targets: Any, inner: InnerLossCalls) -> bool | None:
    """Whether a loss function of the user's own compares the output with targets it computes
    from that output (DEC's target distribution, pseudo-labels from the argmax): the loss is
    computed again on the output with its samples reversed, with the same random draws, and
    the target that reaches torch's loss is compared. Targets read from the batch stay as they
    were; targets computed from the output follow it. None when no torch loss was seen or the
    output has no batch axis to reverse."""
    if inner.last is None or not isinstance(inner.last[2], torch.Tensor):
        return None
    first = inner.last[2]
    tensors = [t for t in iter_tensors(output) if t.dim() >= 1]
    size = tensors[0].shape[0] if tensors else 0
    if size < 2 or any(t.shape[0] != size for t in tensors):
        return None
    again = InnerLossCalls()
    try:
        with again:
            seed_all(0)
            compute_loss(loss_fn, map_tensors(output, lambda t: t.flip(0) if t.dim() >= 1 else t), targets)
    except Exception:  # noqa: BLE001 - a loss that cannot take its own output reordered: not checked
        return None
    second = again.last[2] if again.last is not None else None
    if not isinstance(second, torch.Tensor) or second.shape != first.shape:
        return None
    return not torch.equal(first, second)


def _position_logits(inputs: Any, predicted: Any) -> bool:
    """Whether the prediction is one logit per token of an integer (batch, tokens) input
    (any of its tensors: a Hugging Face QA output holds its loss first, then start_logits)."""
    tokens = [t.shape for t in iter_tensors(inputs) if not t.is_floating_point() and t.dtype != torch.bool]
    return any(t.is_floating_point() and t.dim() == 2 and t.shape[1] >= 4 and t.shape in tokens
               for t in iter_tensors(predicted))  # fmt: skip


def _check_data(data: Sequence[Any], report: DiagnosticReport, columns: tuple[list[int], list[int]],
                setup: _Setup) -> Any:  # fmt: skip
    x_val, y_val = (data[2], data[3]) if len(data) == 4 else (None, None)
    return check_data(data[0], data[1], x_test=x_val, y_test=y_val, task=report.task, num_classes=report.num_classes,
                      index_features=columns[0], scaled_features=columns[1],
                      label_positions=setup.position_logits)  # fmt: skip


# what one batch can say of the data: its inputs' scale, not its labels, duplicates or order
_BATCH_FIELDS = ("n_samples", "input_shape", "input_dtype", "input_mean", "input_std", "input_min", "input_max",
                 "feature_means", "feature_stds", "feature_scale_ratio", "constant_features", "raw_range",
                 "index_features", "scaled_features", "input_nan_count", "input_inf_count")


def _batch_inputs(setup: _Setup) -> SplitStats | None:
    """Without ``data=`` (a replay buffer, a stream): the scale of the probes' own batch of
    inputs, read as :func:`check_data` reads training inputs (the columns the model reads as
    ids or scales itself left out), so the input rules work from ``probe`` alone. None when
    the inputs are no array (a dict, text): that measures nothing, it fails nothing."""
    inputs = setup.batch[0]
    # columns of the batch's own shapes: inputs no forward reads as columns give none
    index, scaled = _model_read_columns(setup, (inputs, None)) if not setup.no_forward else ([], [])
    try:
        train = check_data(inputs, None, index_features=index, scaled_features=scaled, progress=False).train
    except (TypeError, ValueError):  # no array check_data can read
        return None
    return SplitStats(**{name: getattr(train, name) for name in _BATCH_FIELDS}) if train is not None else None


_ID_DTYPES = (torch.int64, torch.int32, torch.int16)


def _model_read_columns(setup: _Setup, data: Sequence[Any]) -> tuple[list[int], list[int]]:
    """Columns of the training inputs, laid out as check_data lays them (a multi-input
    model's inputs side by side), that one eval-mode forward (on a copy) reads as embedding
    indices, and those of the inputs it scales itself (see IndexColumns); when the data has
    the batch's shapes. Columns exist in rows of features, not in images.

    A model whose inputs are all integer ids (DKT's skills and responses, a language
    model's tokens) reads no float feature at all: a float matrix given as its data holds
    ids stored as floats (interaction ids, -1 padding), so every column is an index."""
    parts = list(iter_tensors(setup.batch[0]))
    if parts and all(part.dtype in _ID_DTYPES for part in parts):
        x = torch.as_tensor(data[0]) if isinstance(data[0], np.ndarray) else data[0]
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() == 2:
            return list(range(x.shape[1])), []
    given = list(data[0]) if isinstance(data[0], (tuple, list)) and len(parts) > 1 else [data[0]]
    if not parts or len(given) != len(parts) or (len(parts) == 1 and parts[0].dim() != 2):
        return [], []
    for part, x in zip(parts, given):
        shape = getattr(x, "shape", None)
        if part.dim() < 1 or shape is None or tuple(shape[1:]) != tuple(part.shape[1:]):
            return [], []
    with preserved_rng(), torch.no_grad(), IndexColumns(*parts) as reads:
        forward(set_mode(working_copy(setup.model), False), setup.batch[0])
    widths = [math.prod(part.shape[1:]) for part in parts]
    offsets = [sum(widths[:i]) for i in range(len(parts))]
    index = sorted(offsets[part] + column for part, column in reads.columns)
    scaled = sorted(c for part in reads.scaled for c in range(offsets[part], offsets[part] + widths[part]))
    return index, scaled
