"""Per-layer statistics shared by the hook probe and the Monitor.

How to use::

    recorder = LayerRecorder(model)          # choose modules, hooks not yet attached
    with recorder:                           # attach; detached on exit
        recorder.start_step(step)            # record this step (hooks are idle otherwise)
        loss_fn(model(x), y).backward()
        layer_stats = recorder.finish_step() # one host synchronisation for all layers

Why it is built this way:

- Every statistic is reduced on its device, and all layers of a step are fetched with
  a single ``.tolist()``: on a GPU every ``.item()`` stalls the stream.
- On a CPU a recorded step's cost is ops, passes and fresh pages, not arithmetic: a
  tensor op run between a step's matmuls costs 10-30 us whatever its size (measured in
  bench/overhead.py's MLP step), and a new temporary over glibc's mmap threshold
  (128 KiB at first) costs a page fault per 4 KiB. So a hook only copies its tensor
  into a buffer kept for that shape; tensors of one shape are reduced together, one
  batch of ops for all of them, with a kept scratch buffer for the temporaries; each
  kind of parameter norm is one foreach call.
- Hooked: every leaf module that owns parameters and every activation module. A Linear
  followed by a ReLU is hooked twice (its pre-activation and post-activation are
  different evidence: dead units show only after the ReLU).
- Gradients are read with a tensor hook on the module's output (the gradient w.r.t. the
  output), not ``register_full_backward_hook``, which breaks in-place activations.
- Dead units: a unit (a feature of a Linear/sequence output, a channel of a conv
  output) that is exactly zero for every sample of the batch. Zero *elements* are ~50%
  on every healthy ReLU layer and prove nothing.
- ``max_elements`` (LayerRecorder, snapshot_parameters, parameter_stats; default None =
  everything): on a CPU the cost of a recorded step is the passes over each tensor, so
  a watcher that records often (the Monitor) computes each layer's activation and
  gradient statistics on the leading samples of the batch that fit in
  ``max_elements`` (at least one sample) and update/weight ratios on
  an evenly spread sample of each parameter's elements (strided blocks of 16). The first samples of a
  shuffled batch stand for it; the costs: a unit that fires on few inputs can look
  dead in few samples (a Linear layer gets max_elements / width samples: 64 for 1024
  units at 65,536), extremes are those of the sample, and a NaN confined to later
  samples is missed there (the loss and the global gradient norm still show it).
  Gradient norms are scaled to the whole batch.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from nndx import vocab
from nndx.report import ActivationStats, GradientStats, LayerInfo, LayerStats, ModelSummary, ParameterStats

# torch classes of the kinds in nndx.vocab (the names there are the ones reports carry)
ACTIVATION_TYPES: tuple[type[nn.Module], ...] = tuple(
    getattr(nn, kind.name) for kind in vocab.ACTIVATIONS if hasattr(nn, kind.name)
)
NORMALIZATION_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._BatchNorm,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.modules.instancenorm._InstanceNorm,
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
)
BATCHNORM_TYPES: tuple[type[nn.Module], ...] = (nn.modules.batchnorm._BatchNorm,)
DROPOUT_TYPES: tuple[type[nn.Module], ...] = (nn.modules.dropout._DropoutNd, nn.AlphaDropout)
CONV_TYPES: tuple[type[nn.Module], ...] = (nn.modules.conv._ConvNd,)

# Output bounds of saturating activations; "saturated" = within SATURATION_MARGIN of one.
SATURATING_BOUNDS: dict[type[nn.Module], tuple[float, float]] = {
    getattr(nn, kind.name): kind.bounds
    for kind in vocab.ACTIVATIONS
    if kind.bounds is not None and not kind.over_classes and hasattr(nn, kind.name)
}
SATURATION_MARGIN = 1e-3

SAMPLE_BLOCK = 16  # elements per block of a parameter sample: 64 bytes of float32, a cache line
_EXACT_COUNT = 1 << 24  # float32 counts (sums of ones) are exact up to here
PENDING_BYTES = 64 << 20  # a LayerRecorder's copies are reduced, and its buffers not kept, past this


@contextlib.contextmanager
def single_threaded(device: torch.device | str = "cpu") -> Iterator[None]:
    """Run the statistics of a hook on one CPU thread, then restore the thread count.

    Why: each reduction over more than torch's grain size (32k elements) opens an
    OpenMP parallel region, and on a loaded machine every region waits a scheduler
    slice for its second thread — measured 20 ms per op on this 2-core machine under
    load against 25 us single-threaded. A hook's reductions are small next to the
    step's matmuls; one thread does them without those waits. Off the CPU it does
    nothing."""
    threads = torch.get_num_threads()
    if torch.device(device).type != "cpu" or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def is_activation(module: nn.Module) -> bool:
    return isinstance(module, ACTIVATION_TYPES)


def has_batchnorm(model: nn.Module) -> bool:
    """Whether a forward in train mode moves running statistics and mixes the batch."""
    return any(isinstance(m, BATCHNORM_TYPES) for m in model.modules())


def has_dropout(model: nn.Module) -> bool:
    """Whether train mode makes the forward random."""
    return any(isinstance(m, DROPOUT_TYPES) for m in model.modules())


def watched_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Leaf modules with their own parameters, and every activation module, in
    registration order. The root is included when it is itself such a leaf."""
    chosen = []
    for name, module in model.named_modules():
        is_leaf = next(module.children(), None) is None
        owns_params = next(module.parameters(recurse=False), None) is not None
        if is_activation(module) or (is_leaf and owns_params):
            chosen.append((name or type(module).__name__, module))
    return chosen


def unit_dim(module: nn.Module, output: torch.Tensor) -> int:
    """The axis whose entries are 'units': channels for conv-shaped outputs, else features."""
    if isinstance(module, CONV_TYPES) or output.dim() >= 4:
        return 1
    return output.dim() - 1


def _first_tensor(output: object) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


def leading_samples(x: torch.Tensor, max_elements: int | None) -> torch.Tensor:
    """The first samples (axis 0) of a batch that fit in ``max_elements``, at least one;
    ``x`` itself when it fits or ``max_elements`` is None. A view, never a copy."""
    if max_elements is None or x.dim() < 2 or x.numel() <= max_elements or x.shape[0] < 2:
        return x
    per_sample = max(x[0].numel(), 1)
    return x[: max(1, max_elements // per_sample)]


def flat_sample(t: torch.Tensor, max_elements: int | None) -> torch.Tensor:
    """An evenly spread sample of at most ``max_elements`` of ``t``'s elements: evenly
    strided blocks of ``SAMPLE_BLOCK`` consecutive elements (a view, flat when it is
    all of ``t``); the same elements for every tensor of that shape. All of ``t`` when
    None. Blocks, not single elements: a stride of 16 floats or less touches every
    cache line of ``t``, so single strided elements cost a pass over all of it."""
    flat = t.detach().reshape(-1)
    n = flat.numel()
    if max_elements is None or n <= max_elements:
        return flat
    block = max(min(SAMPLE_BLOCK, max_elements), 1)
    blocks = max(max_elements // block, 1)
    stride = (n // blocks) // block * block  # >= block, since n > blocks * block
    return flat[: blocks * stride].view(blocks, stride)[:, :block]


def _finite(lo: torch.Tensor, hi: torch.Tensor) -> bool:
    """True when ``lo`` and ``hi`` (the extremes of a batch of tensors, which NaN and Inf
    reach) are on the CPU and all finite: then so is every element, and the counting
    pass can be skipped. One host read, free on a CPU; False elsewhere, where the count
    always runs to keep the one synchronisation per step."""
    return lo.device.type == "cpu" and all(map(math.isfinite, torch.cat([lo, hi]).tolist()))


def _stack_columns(columns: dict[str, torch.Tensor], exact_float32: bool) -> tuple[torch.Tensor, tuple[str, ...]]:
    """One ``(k, columns)`` tensor of the named per-member columns (type promotion makes
    it float32, or float64 where a count could pass float32's exact integers)."""
    parts = list(columns.values())
    if not exact_float32:
        parts = [p.double() for p in parts]
    return torch.stack(parts, dim=1), tuple(columns)


def activation_stats_rows(
    x: torch.Tensor,
    unit_axis: int,
    bounds: tuple[float, float] | None,
    scratch: torch.Tensor,
) -> tuple[torch.Tensor, tuple[str, ...]]:
    """The activation statistics of a batch of ``k`` same-shaped tensors ``x[0..k-1]``:
    a ``(k, columns)`` tensor of raw sums and extremes on their device, and the columns'
    names; :func:`activation_fields` turns a fetched row into the statistics.
    ``unit_axis``: the units' axis of ``x`` (not of one tensor); a unit is dead when it
    is zero at every other index. ``scratch``: a float32 tensor of ``x``'s size for the
    element-wise temporaries.

    Why batched, and why scratch: on a CPU each tensor op costs microseconds whatever
    its size, and a fresh temporary of more than glibc's mmap threshold costs a page
    fault per 4 KiB — more than the arithmetic. Layers of one shape share every op, the
    temporaries reuse one buffer, and divisions and constants are left to the host."""
    k = x.shape[0]
    x = x.float()
    flat = x.reshape(k, -1)
    n = flat.shape[1]
    temp = scratch.view(k, n)
    others = [d for d in range(1, x.dim()) if d != unit_axis]
    # two reductions: on this build aminmax(dim=...) is ~10x slower than amin + amax
    unit_lo, unit_hi = x.amin(dim=others), x.amax(dim=others)
    lo, hi = unit_lo.amin(dim=1), unit_hi.amax(dim=1)
    mean = flat.mean(dim=1)
    columns = {
        "mean": mean,
        # two-pass std (as torch.std), at a third of its cost on a CPU
        "centered_norm": torch.linalg.vector_norm(torch.sub(flat, mean[:, None], out=temp), dim=1),
        "min": lo,
        "max": hi,
        # a unit is live unless zero at every other index: max(hi, -lo) > 0
        "live_units": torch.count_nonzero(torch.maximum(unit_hi, unit_lo.neg()), dim=1),
    }
    if bounds is not None:
        columns["saturated"] = ((flat <= bounds[0] + SATURATION_MARGIN) | (flat >= bounds[1] - SATURATION_MARGIN)).sum(dim=1)
    if _finite(lo, hi):
        # |sign(x)| is 1 where x != 0 and 0 where x == 0: the nonzero count from a float sum,
        # at a quarter of the cost of count_nonzero on a CPU (x is finite here)
        columns["nonzero"] = torch.sign(flat, out=temp).abs_().sum(dim=1)
    else:
        columns["nonfinite"] = (~torch.isfinite(flat)).sum(dim=1)
        columns["nonzero"] = torch.count_nonzero(flat, dim=1)
    return _stack_columns(columns, n <= _EXACT_COUNT)


def gradient_stats_rows(g: torch.Tensor, scratch: torch.Tensor) -> tuple[torch.Tensor, tuple[str, ...]]:
    """Sum of |g|, min, max, L2 norm (and the non-finite count, where there are any) of
    each of a batch of ``k`` same-shaped gradients ``g[0..k-1]``, as
    :func:`activation_stats_rows` returns them; :func:`gradient_fields` reads a row.
    ``scratch`` as there."""
    k = g.shape[0]
    flat = g.float().reshape(k, -1)
    temp = scratch.view(flat.shape)
    lo, hi = flat.amin(dim=1), flat.amax(dim=1)
    columns = {
        "abs_sum": torch.abs(flat, out=temp).sum(dim=1),  # a quarter of vector_norm(ord=1)'s cost on a CPU
        "min": lo,
        "max": hi,
        "norm": torch.linalg.vector_norm(flat, dim=1),
    }
    if not _finite(lo, hi):
        columns["nonfinite"] = (~torch.isfinite(flat)).sum(dim=1)
    return _stack_columns(columns, flat.shape[1] <= _EXACT_COUNT)


ACTIVATION_FIELDS = tuple(ActivationStats.model_fields)
GRADIENT_FIELDS = tuple(GradientStats.model_fields)


def activation_fields(values: dict[str, float], n: int, units: int) -> tuple:
    """The :class:`ActivationStats` fields (in ``ACTIVATION_FIELDS`` order) of one
    fetched row of :func:`activation_stats_rows` over ``n`` elements and ``units`` units."""
    nonzero, live_units, saturated = values["nonzero"], values["live_units"], values.get("saturated")
    # fractions of a non-finite tensor are still well defined; clamp float noise
    return (
        values["mean"],
        values["centered_norm"] / math.sqrt(n - 1) if n > 1 else 0.0,
        values["min"],
        values["max"],
        min(max((n - nonzero) / n, 0.0), 1.0),
        min(max((units - live_units) / units, 0.0), 1.0),
        None if saturated is None else saturated / n,
        int(values.get("nonfinite", 0)),
        units,
    )


def gradient_fields(values: dict[str, float], n: int, full: int) -> tuple:
    """The :class:`GradientStats` fields (in ``GRADIENT_FIELDS`` order) of one fetched row
    of :func:`gradient_stats_rows` over ``n`` of the gradient's ``full`` elements; the
    norm is scaled to all of them."""
    lo, hi = values["min"], values["max"]
    return (
        values["abs_sum"] / max(n, 1),
        math.nan if math.isnan(lo) or math.isnan(hi) else max(-lo, hi),
        values["norm"] * (math.sqrt(full / n) if n else 1.0),
        int(values.get("nonfinite", 0)),
    )


def unpack_layer(packed: tuple) -> LayerStats:
    """The :class:`LayerStats` of a ``(name, type, step, activation fields, gradient
    fields)`` tuple, as :meth:`LayerRecorder.finish_step_packed` returns them (and the
    Monitor keeps them: a fifth of the model's memory)."""
    name, type_, step, act, grad = packed
    return LayerStats(
        name=name,
        type=type_,
        step=step,
        activation=None if act is None else ActivationStats(**dict(zip(ACTIVATION_FIELDS, act))),
        gradient=None if grad is None else GradientStats(**dict(zip(GRADIENT_FIELDS, grad))),
    )


class _Slots:
    """Persistent float32 storage for one step's copies of same-shaped tensors (a group),
    and a scratch of the same size for the statistics' temporaries; reused every step,
    grown by a slot when a step needs one more."""

    def __init__(self, shape: torch.Size, device: torch.device) -> None:
        self.shape, self.device = shape, device
        self.data = self.scratch = torch.empty(0)
        self.used = 0
        self.touched = False  # used in the current step

    @property
    def nbytes(self) -> int:
        return (self.data.numel() + self.scratch.numel()) * 4

    def put(self, sample: torch.Tensor) -> int:
        if self.used == len(self.data):
            with torch.inference_mode(False):  # buffers made during eval must be writable later
                grown = torch.empty((self.used + 1, *self.shape), device=self.device)
                if self.used:
                    grown[: self.used].copy_(self.data[: self.used])
                self.data, self.scratch = grown, torch.empty(grown.numel(), device=self.device)
        with single_threaded(self.device):  # a 256 KiB copy on two threads waits ~60 us for the second
            self.data[self.used].copy_(sample.detach())
        self.used += 1
        self.touched = True
        return self.used - 1


class LayerRecorder:
    """Forward hooks (activation statistics) and output-tensor hooks (gradient
    statistics) on a model's layers. Idle unless a step is being recorded, so it can
    stay attached for a whole training run. Leaves the model as it found it on
    ``detach()``.

    How it stays cheap: a hook only copies its tensor (the leading samples that fit in
    ``max_elements``) into a buffer kept for tensors of that shape; the copy keeps later
    in-place ops, such as ``ReLU(inplace=True)`` or a residual ``+=``, out of the
    statistics. The copies are reduced together, one batch of ops per shape: the
    activations when the model's forward returns, the gradients at ``finish_step`` (and
    everything pending as soon as it passes ``PENDING_BYTES``). The buffers are kept
    from step to step unless they pass ``PENDING_BYTES``. On a CPU a statistic costs per
    op and per freshly mapped page far more than per element."""

    def __init__(
        self,
        model: nn.Module,
        modules: Iterable[tuple[str, nn.Module]] | None = None,
        max_elements: int | None = None,
    ) -> None:
        self.model = model
        self.max_elements = max_elements
        self.modules = list(modules) if modules is not None else watched_modules(model)
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._recording = False
        self._step: int | None = None
        self._slots: dict[tuple, _Slots] = {}  # group key -> its buffer
        # (kind, name) -> (group key, slot, elements measured, units or all elements)
        self._pending: dict[tuple[str, str], tuple[tuple, int, int, int]] = {}
        self._pending_bytes = 0
        self._rows: list[tuple[torch.Tensor, tuple[str, ...]]] = []  # reduced groups: (members x columns, names)
        # (kind, name) -> (index into _rows, row, elements measured, units or all elements)
        self._where: dict[tuple[str, str], tuple[int, int, int, int]] = {}
        self._order: list[str] = []  # forward order of the recorded step
        self._types = {name: type(module).__name__ for name, module in self.modules}
        self._gradient_hooks = {name: self._gradient_hook(name) for name, _ in self.modules}

    # -- lifecycle
    def attach(self) -> LayerRecorder:
        if not self._handles:
            for name, module in self.modules:
                self._handles.append(module.register_forward_hook(self._forward_hook(name, module)))
            self._handles.append(self.model.register_forward_hook(lambda *_: self._reduce()))
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._recording = False
        self._pending.clear()
        self._slots.clear()

    def __enter__(self) -> LayerRecorder:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    # -- recording
    def start_step(self, step: int | None = None) -> None:
        self._recording = True
        self._step = step
        self._pending.clear()
        self._pending_bytes = 0
        for slots in self._slots.values():
            slots.used, slots.touched = 0, False
        self._rows.clear()
        self._where.clear()
        self._order.clear()

    @property
    def recording(self) -> bool:
        return self._recording

    @property
    def workspace_bytes(self) -> int:
        """Bytes of the buffers kept between recorded steps (reused, never grown past
        ``PENDING_BYTES``; freed on ``detach()``)."""
        return sum(slots.nbytes for slots in self._slots.values())

    @property
    def forward_order(self) -> list[str]:
        """Names of hooked modules in the order they ran in the recorded step."""
        return list(self._order)

    def finish_step(self) -> list[LayerStats]:
        """Stop recording and return this step's statistics, fetched with one sync."""
        return [unpack_layer(packed) for packed in self.finish_step_packed()]

    def finish_step_packed(self) -> list[tuple]:
        """:meth:`finish_step` as plain tuples (see :func:`unpack_layer`), without
        building the report models."""
        self._recording = False
        self._reduce()
        # buffers of shapes this step did not have (variable batch or sequence lengths) go
        self._slots = {group: slots for group, slots in self._slots.items() if slots.touched}
        if self.workspace_bytes > PENDING_BYTES:
            self._slots.clear()
        flat = torch.cat([rows.reshape(-1).to(self._rows[0][0].device) for rows, _ in self._rows]).tolist() if self._rows else []
        starts = [0]
        for rows, _ in self._rows:
            starts.append(starts[-1] + rows.numel())

        def values(kind: str, name: str) -> tuple | None:
            where = self._where.get((kind, name))
            if where is None:
                return None
            group, row, n, extra = where
            columns = self._rows[group][1]
            start = starts[group] + row * len(columns)
            fetched = dict(zip(columns, flat[start:start + len(columns)]))
            return (activation_fields if kind == "act" else gradient_fields)(fetched, n, extra)

        packed = [(name, self._types[name], self._step, values("act", name), values("grad", name)) for name in self._order]
        self._rows.clear()
        self._where.clear()
        return packed

    def _keep(self, kind: str, name: str, sample: torch.Tensor, group: tuple, n: int, extra: int) -> None:
        """Copy ``sample`` into its group's buffer for the next reduction (a module
        called twice in one step: the last call wins)."""
        if self._pending_bytes + 4 * sample.numel() > PENDING_BYTES:
            self._reduce()
        slots = self._slots.get(group)
        if slots is None:
            slots = self._slots[group] = _Slots(sample.shape, sample.device)
        self._pending[kind, name] = (group, slots.put(sample), n, extra)
        self._pending_bytes += 4 * sample.numel()

    def _reduce(self) -> None:
        """Reduce every pending copy, one batch of ops per group of same-shaped tensors."""
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        self._pending_bytes = 0
        reduced: dict[tuple, int] = {}
        with single_threaded(next(iter(self._slots.values())).device):
            for group, slots in self._slots.items():
                if not slots.used:
                    continue
                kind, unit_axis, bounds = group[:3]
                batch, scratch = slots.data[: slots.used], slots.scratch[: slots.used * math.prod(slots.shape)]
                if kind == "act":
                    rows = activation_stats_rows(batch, unit_axis + 1, bounds, scratch)
                else:
                    rows = gradient_stats_rows(batch, scratch)
                reduced[group] = len(self._rows)
                self._rows.append(rows)
                slots.used = 0
        for key, (group, slot, n, extra) in pending.items():
            self._where[key] = (reduced[group], slot, n, extra)

    def _forward_hook(self, name: str, module: nn.Module):
        bounds = SATURATING_BOUNDS.get(type(module))

        def hook(_module: nn.Module, _inputs: object, output: object) -> None:
            if not self._recording:
                return
            out = _first_tensor(output)
            if out is None or not out.is_floating_point() or out.numel() == 0:
                return
            if name not in self._order:
                self._order.append(name)
            x, unit_axis = _with_units(out, unit_dim(module, out))
            sample = leading_samples(x, self.max_elements)
            group = ("act", unit_axis, bounds, sample.shape, sample.device)
            self._keep("act", name, sample, group, sample.numel(), sample.shape[unit_axis])
            if out.requires_grad:
                out.register_hook(self._gradient_hooks[name])

        return hook

    def _gradient_hook(self, name: str):
        def hook(grad: torch.Tensor) -> None:
            if self._recording or ("grad", name) not in self._where:
                sample = leading_samples(grad, self.max_elements)
                group = ("grad", None, None, sample.shape, sample.device)
                self._keep("grad", name, sample, group, sample.numel(), grad.numel())

        return hook


def _with_units(x: torch.Tensor, unit_axis: int) -> tuple[torch.Tensor, int]:
    """``x`` as at least 2-D, and its units' axis: a scalar is one unit; a vector is a
    batch of scalars (unit axis 0) or one sample's features."""
    if x.dim() == 0:
        return x.reshape(1, 1), 1
    if x.dim() == 1:
        return (x.reshape(-1, 1), 1) if unit_axis == 0 else (x.reshape(1, -1), 1)
    return x, unit_axis


def snapshot_parameters(
    model: nn.Module, max_elements: int | None = None, into: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """Detached copies of trainable parameters (or of an evenly spread sample of
    at most ``max_elements`` of each), to measure an optimizer step's update.
    ``into``: an earlier snapshot to overwrite when it still fits (the Monitor takes
    one every recorded step; new memory would cost a page fault per 4 KiB)."""
    samples = {n: flat_sample(p, max_elements) for n, p in model.named_parameters() if p.requires_grad}
    if not samples:
        return {}
    with single_threaded(next(iter(samples.values())).device):
        fits = into is not None and list(into) == list(samples) and all(
            into[n].shape == s.shape and into[n].dtype == s.dtype and into[n].device == s.device
            for n, s in samples.items()
        )
        if not fits:
            return {n: s.clone() for n, s in samples.items()}
        torch._foreach_copy_(list(into.values()), list(samples.values()))
        return into


def parameter_stats(
    model: nn.Module,
    before: dict[str, torch.Tensor] | None = None,
    step: int | None = None,
    max_elements: int | None = None,
    grad_norms: dict[str, torch.Tensor] | None = None,
) -> list[ParameterStats]:
    """Weight norm, grad norm and (given a snapshot from before the step) the
    update/weight ratio ‖Δw‖/‖w‖ of every parameter (‖w‖ after the step), fetched with
    one sync. Pass the ``max_elements`` the snapshot was taken with: the ratio is then
    measured on the same sampled elements (over their norm before the step); the
    snapshot is spent (overwritten with the update).
    ``grad_norms``: per-parameter gradient norms already computed for this step (the
    Monitor has them from the end of backward), to save a pass over the gradients."""
    return [unpack_parameter(p) for p in parameter_stats_packed(model, before, step, max_elements, grad_norms)]


def parameter_stats_packed(
    model: nn.Module,
    before: dict[str, torch.Tensor] | None = None,
    step: int | None = None,
    max_elements: int | None = None,
    grad_norms: dict[str, torch.Tensor] | None = None,
) -> list[tuple]:
    """:func:`parameter_stats` as plain tuples (see :func:`unpack_parameter`). Each kind
    of norm is one foreach call over all parameters, not an op per parameter."""
    named = list(model.named_parameters())
    if not named:
        return []
    device = named[0][1].device
    weights = [p.detach() for _, p in named]
    # every norm goes into one list, stacked and fetched once; which entries a parameter
    # has (and the ratio's division) is bookkeeping on the host
    with single_threaded(device):
        norms = list(torch._foreach_norm(weights, 2, dtype=torch.float32))
        grad_at: dict[int, int] = {}
        measure = []
        for i, (n, p) in enumerate(named):
            known = grad_norms.get(n) if grad_norms is not None and p.grad is not None else None
            if known is not None:
                grad_at[i] = len(norms)
                norms.append(known)
            elif p.grad is not None:
                measure.append(i)
        if measure:
            for i, norm in zip(measure, torch._foreach_norm([named[i][1].grad.detach() for i in measure], 2, dtype=torch.float32)):
                grad_at[i] = len(norms)
                norms.append(norm)
        ratio_at: dict[int, tuple[int, int]] = {}  # parameter -> (update norm, weight norm of the same elements)
        compared = [i for i, (n, _) in enumerate(named) if before is not None and n in before]
        if compared:
            nows = [flat_sample(weights[i], max_elements) for i in compared]
            spent = [before[named[i][0]].view(now.shape) for i, now in zip(compared, nows)]
            sampled = [j for j, i in enumerate(compared) if nows[j].numel() != weights[i].numel()]
            # a sampled ratio's denominator is the norm of the same elements before the step,
            # read from the contiguous snapshot: a pass over the strided sample of the live
            # weights costs 5x. (Before or after differ by at most the update itself.)
            sample_norms = torch._foreach_norm([spent[j] for j in sampled], 2, dtype=torch.float32) if sampled else []
            torch._foreach_sub_(spent, nows)  # before - after: the update, negated
            updates = torch._foreach_norm(spent, 2, dtype=torch.float32)
            scale_at = dict(zip(sampled, range(len(norms) + len(updates), len(norms) + len(updates) + len(sampled))))
            for j, (i, update) in enumerate(zip(compared, updates)):
                ratio_at[i] = (len(norms) + j, scale_at.get(j, i))
            norms += [*updates, *sample_norms]
        values = torch.stack([n if n.device == device else n.to(device) for n in norms]).tolist()
    packed = []
    for i, (n, p) in enumerate(named):
        ratio = ratio_at.get(i)
        packed.append((
            n,
            tuple(p.shape),
            step,
            p.requires_grad,
            values[i],
            values[grad_at[i]] if i in grad_at else None,
            None if ratio is None else values[ratio[0]] / max(values[ratio[1]], 1e-12),
        ))
    return packed


def unpack_parameter(packed: tuple) -> ParameterStats:
    """The :class:`ParameterStats` of a tuple from :func:`parameter_stats_packed`."""
    name, shape, step, requires_grad, weight_norm, grad_norm, update_ratio = packed
    return ParameterStats(name=name, shape=list(shape), step=step, requires_grad=requires_grad,
                          weight_norm=weight_norm, grad_norm=grad_norm, update_ratio=update_ratio)


def summarize_model(model: nn.Module, forward_order: list[str] | None = None) -> ModelSummary:
    """Static facts about ``model``. ``forward_order`` (names from a recorded forward)
    orders the layer list and decides which module produced the output; without it,
    registration order is used, which is usually but not always forward order."""
    leaves = list(iter_named_leaves(model))
    if forward_order:
        rank = {n: i for i, n in enumerate(forward_order)}
        leaves.sort(key=lambda item: rank.get(item[0], len(rank)))
    layers = [
        LayerInfo(
            name=n,
            type=type(m).__name__,
            param_count=sum(p.numel() for p in m.parameters(recurse=False)),
            trainable_param_count=sum(p.numel() for p in m.parameters(recurse=False) if p.requires_grad),
        )
        for n, m in leaves
    ]
    # modules that do nothing to values at inference do not decide the output's nature
    ran = [(n, m) for n, m in leaves if type(m).__name__ not in vocab.PASSTHROUGH_NAMES and not isinstance(m, DROPOUT_TYPES)]
    if forward_order:
        ran = [(n, m) for n, m in ran if n in set(forward_order)] or ran
    last = ran[-1][1] if ran else None
    return ModelSummary(
        param_count=sum(p.numel() for p in model.parameters()),
        trainable_param_count=sum(p.numel() for p in model.parameters() if p.requires_grad),
        layers=layers,
        activations=[type(m).__name__ for _, m in leaves if is_activation(m)],
        last_layer=type(last).__name__ if last is not None else None,
        output_activation=type(last).__name__ if last is not None and is_activation(last) else None,
        normalization_layers=[type(m).__name__ for _, m in leaves if isinstance(m, NORMALIZATION_TYPES)],
        has_dropout=has_dropout(model),
        has_batchnorm=has_batchnorm(model),
    )


def iter_named_leaves(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    for name, module in model.named_modules():
        if next(module.children(), None) is None:
            yield name or type(module).__name__, module
