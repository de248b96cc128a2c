"""Per-layer statistics shared by the hook probe and the Monitor.

How to use::

    recorder = LayerRecorder(model)          # choose modules, hooks not yet attached
    with recorder:                           # attach; detached on exit
        recorder.start_step(step)            # record this step (hooks are idle otherwise)
        loss_fn(model(x), y).backward()
        layer_stats = recorder.finish_step() # one host synchronisation for all layers

Why it is built this way (the measurements behind each choice are in bench/README.md):

- Every statistic is reduced on its device, and all layers of a step are fetched with
  a single ``.tolist()``: on a GPU every ``.item()`` stalls the stream.
- On a CPU a recorded step's cost is the number of ops and passes, not arithmetic. So a
  hook only copies its tensor into a buffer kept for that shape (the copy also keeps
  later in-place ops, such as ``ReLU(inplace=True)`` or a residual ``+=``, out of the
  statistics); tensors of one shape are reduced together, one batch of ops for all of
  them; each kind of parameter norm is one foreach call.
- Hooked: every leaf module that owns parameters and every activation module. A Linear
  followed by a ReLU is hooked twice (its pre-activation and post-activation are
  different evidence: dead units show only after the ReLU).
- Gradients are read with a tensor hook on the module's output (the gradient w.r.t. the
  output), not ``register_full_backward_hook``, which breaks in-place activations.
- Dead units: a unit (a feature of a Linear/sequence output, a channel of a conv
  output) that is exactly zero for every sample of the batch. Zero *elements* are ~50%
  on every healthy ReLU layer and prove nothing.
- Precision: statistics of float64 tensors are computed in float64, of every other
  floating dtype (float32, bfloat16, float16) in float32.
- ``max_elements`` (LayerRecorder, snapshot_parameters, parameter_stats; default None =
  everything): on a CPU the cost of a recorded step is the passes over each tensor, so
  a watcher that records often (the Monitor) computes each layer's activation and
  gradient statistics on the leading samples of the batch that fit in
  ``max_elements`` (at least one sample) and update/weight ratios on an evenly spread
  sample of each parameter's elements (strided blocks of 16). The first samples of a
  shuffled batch stand for it; the costs: a unit that fires on few inputs can look
  dead in few samples (a Linear layer gets max_elements / width samples: 64 for 1024
  units at 65,536), extremes are those of the sample, and a NaN confined to later
  samples is missed there (the loss and the global gradient norm still show it).
  Gradient norms are scaled to the whole batch.

Each statistic has a plain reference implementation beside the batched fast path
(:func:`reference_activation_stats`, :func:`reference_gradient_stats`,
:func:`reference_update_ratio`); a property test checks that they agree.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, NamedTuple, TypeVar

import torch
from torch import nn

from nndx import vocab
from nndx.collector._common import stored_values
from nndx.report import ActivationStats, GradientStats, LayerInfo, LayerStats, ModelSummary, ParameterStats

T = TypeVar("T")


class Pending(Generic[T]):
    """Statistics computed on the device whose values are not fetched yet.
    ``resolve()`` fetches them now (one host synchronisation); the Monitor instead hands
    ``values`` to its :class:`~nndx.collector.watch.base.Deferred`, which fetches every
    pending value of a recorded step together: on a GPU each fetch stalls the stream."""

    def __init__(self, values: torch.Tensor, build: Callable[[list[float]], T]) -> None:
        self.values, self.build = values, build  # values: 1-D float64

    def resolve(self) -> T:
        return self.build(self.values.tolist())


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
    slice for its other threads (bench/README.md has the numbers). A hook's reductions
    are small next to the step's matmuls; one thread does them without those waits.
    Off the CPU it does nothing."""
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


def is_batchnorm(module: nn.Module) -> bool:
    """A torch BatchNorm, or one written by hand (makemore's, d2l's): a module named like one, or
    keeping running mean and variance tensors. Either normalises a batch by its own statistics."""
    if isinstance(module, BATCHNORM_TYPES) or type(module).__name__ in vocab.BATCHNORM_NAMES:
        return True
    return all(isinstance(getattr(module, name, None), torch.Tensor) for name in ("running_mean", "running_var"))


def batch_statistics_only(module: nn.Module) -> bool:
    """A torch BatchNorm built with ``track_running_stats=False`` (Reptile's, MAML's learners): it
    normalises by the batch in eval mode too and keeps nothing for train mode to move, so the mode
    does not change it, and it couples the samples in either."""
    return isinstance(module, BATCHNORM_TYPES) and module.running_mean is None and module.running_var is None


def _moved_by_mode(module: nn.Module) -> bool:
    """A batch-norm that train mode changes: one that keeps running statistics."""
    return is_batchnorm(module) and not batch_statistics_only(module)


def has_batchnorm(model: nn.Module) -> bool:
    """Whether a forward in train mode moves running statistics and mixes the batch."""
    return any(_moved_by_mode(m) for m in model.modules())


def mode_modules(model: nn.Module) -> list[nn.Module]:
    """The modules whose output train mode changes (dropout with ``p > 0``, batch-norm that keeps
    running statistics): the model is in train mode for its output when any of them is, whatever the
    root's own flag (makemore part 3 sets ``layer.training = False`` on each layer and never calls
    ``model.eval()``)."""
    return [m for m in model.modules() if _moved_by_mode(m) or _drops(m)]


def has_dropout(model: nn.Module) -> bool:
    """Whether train mode makes the forward random: a dropout module with ``p > 0``
    (DeepCTR-Torch builds ``nn.Dropout(0)`` by default; it drops nothing in either mode)."""
    return any(map(_drops, model.modules()))


def _drops(module: nn.Module) -> bool:
    return isinstance(module, DROPOUT_TYPES) and getattr(module, "p", 1.0) > 0


def watched_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Leaf modules with their own parameters, and every activation module, in
    registration order. The root is included when it is itself such a leaf."""
    chosen = []
    for name, module in model.named_modules():
        is_leaf = next(module.children(), None) is None
        owns_params = next(nn.Module.parameters(module, recurse=False), None) is not None
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


def statistics_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype statistics of a tensor of ``dtype`` are computed in: float64 for
    float64, float32 for every other dtype (half types have too few bits to sum in)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The L2 norm of each tensor (0-d, float32 — float64 for float64 tensors), one
    foreach call per dtype instead of one op per tensor."""
    out: list[torch.Tensor | None] = [None] * len(tensors)
    by_dtype: dict[torch.dtype, list[int]] = {}
    tensors = [stored_values(t) for t in tensors]  # a sparse embedding's gradient: the rows it stores
    for i, t in enumerate(tensors):
        by_dtype.setdefault(statistics_dtype(t.dtype), []).append(i)
    for dtype, where in by_dtype.items():
        for i, norm in zip(where, torch._foreach_norm([tensors[i] for i in where], 2, dtype=dtype)):
            out[i] = norm
    return out  # type: ignore[return-value]


def _stack_columns(columns: dict[str, torch.Tensor], exact_float32: bool) -> tuple[torch.Tensor, tuple[str, ...]]:
    """One ``(k, columns)`` tensor of the named per-member columns (type promotion makes
    it float32, or float64 where a count could pass float32's exact integers)."""
    parts = list(columns.values())
    if not exact_float32:
        parts = [p.double() for p in parts]
    return torch.stack(parts, dim=1), tuple(columns)


# --------------------------------------------------------------------------- fast path


def activation_stats_rows(
    x: torch.Tensor, unit_axis: int, bounds: tuple[float, float] | None
) -> tuple[torch.Tensor, tuple[str, ...]]:
    """The activation statistics of a batch of ``k`` same-shaped tensors ``x[0..k-1]``:
    a ``(k, columns)`` tensor of raw sums and extremes on their device, and the columns'
    names; :func:`activation_fields` turns a fetched row into the statistics.
    ``unit_axis``: the units' axis of ``x`` (not of one tensor); a unit is dead when it
    is zero at every other index. :func:`reference_activation_stats` is the same, plainly.

    Batched because on a CPU each tensor op costs microseconds whatever its size: layers
    of one shape share every op, and divisions and constants are left to the host."""
    k = x.shape[0]
    x = x.to(statistics_dtype(x.dtype))
    flat = x.reshape(k, -1)
    n = flat.shape[1]
    others = [d for d in range(1, x.dim()) if d != unit_axis]
    # amin + amax, not aminmax(dim=...), which is several times slower on a CPU
    unit_lo, unit_hi = x.amin(dim=others), x.amax(dim=others)
    lo, hi = unit_lo.amin(dim=1), unit_hi.amax(dim=1)
    mean = flat.mean(dim=1)
    columns = {
        "mean": mean,
        # two-pass std (as torch.std), from the norm of the centred values: torch.std over
        # dim=1 is much slower on a CPU
        "centered_norm": torch.linalg.vector_norm(flat - mean[:, None], dim=1),
        "min": lo,
        "max": hi,
        # a unit is live unless zero at every other index: max(hi, -lo) > 0
        "live_units": torch.count_nonzero(torch.maximum(unit_hi, unit_lo.neg()), dim=1),
    }
    if bounds is not None:
        columns["saturated"] = ((flat <= bounds[0] + SATURATION_MARGIN) | (flat >= bounds[1] - SATURATION_MARGIN)).sum(dim=1)
    if _finite(lo, hi):
        # |sign(x)| is 1 where x != 0 and 0 where x == 0: the nonzero count from a float
        # sum, several times cheaper than count_nonzero on a CPU (x is finite here)
        columns["nonzero"] = torch.sign(flat).abs_().sum(dim=1)
    else:
        columns["nonfinite"] = (~torch.isfinite(flat)).sum(dim=1)
        columns["nonzero"] = torch.count_nonzero(flat, dim=1)
    return _stack_columns(columns, n <= _EXACT_COUNT)


def gradient_stats_rows(g: torch.Tensor) -> tuple[torch.Tensor, tuple[str, ...]]:
    """Sum of |g|, min, max, L2 norm (and the non-finite count, where there are any) of
    each of a batch of ``k`` same-shaped gradients ``g[0..k-1]``, as
    :func:`activation_stats_rows` returns them; :func:`gradient_fields` reads a row."""
    k = g.shape[0]
    flat = g.to(statistics_dtype(g.dtype)).reshape(k, -1)
    lo, hi = flat.amin(dim=1), flat.amax(dim=1)
    columns = {
        "abs_sum": flat.abs().sum(dim=1),  # vector_norm(ord=1) is several times slower on a CPU
        "min": lo,
        "max": hi,
        "norm": torch.linalg.vector_norm(flat, dim=1),
    }
    if not _finite(lo, hi):
        columns["nonfinite"] = (~torch.isfinite(flat)).sum(dim=1)
    return _stack_columns(columns, flat.shape[1] <= _EXACT_COUNT)


class ActivationRecord(NamedTuple):
    """:class:`ActivationStats` as a tuple (a fifth of its memory; the Monitor keeps
    hundreds), whose fields are read by name: see :meth:`model`."""

    mean: float
    std: float
    min: float
    max: float
    zero_fraction: float
    dead_unit_fraction: float
    saturated_fraction: float | None
    nonfinite_count: int
    unit_count: int
    values_per_unit: int

    def model(self) -> ActivationStats:
        return ActivationStats(**self._asdict())


class GradientRecord(NamedTuple):
    """:class:`GradientStats` as a tuple, read by name (see :meth:`model`)."""

    abs_mean: float
    max: float
    norm: float
    nonfinite_count: int

    def model(self) -> GradientStats:
        return GradientStats(**self._asdict())


def activation_fields(values: dict[str, float], n: int, units: int) -> ActivationRecord:
    """The activation statistics of one fetched row of :func:`activation_stats_rows`
    over ``n`` elements and ``units`` units."""
    nonzero, live_units, saturated = values["nonzero"], values["live_units"], values.get("saturated")
    # fractions of a non-finite tensor are still well defined; clamp float noise
    return ActivationRecord(
        mean=values["mean"],
        std=values["centered_norm"] / math.sqrt(n - 1) if n > 1 else 0.0,
        min=values["min"],
        max=values["max"],
        zero_fraction=min(max((n - nonzero) / n, 0.0), 1.0),
        dead_unit_fraction=min(max((units - live_units) / units, 0.0), 1.0),
        saturated_fraction=None if saturated is None else saturated / n,
        nonfinite_count=int(values.get("nonfinite", 0)),
        unit_count=units,
        values_per_unit=n // units if units else 0,
    )


def gradient_fields(values: dict[str, float], n: int, full: int) -> GradientRecord:
    """The gradient statistics of one fetched row of :func:`gradient_stats_rows` over
    ``n`` of the gradient's ``full`` elements; the norm is scaled to all of them."""
    lo, hi = values["min"], values["max"]
    return GradientRecord(
        abs_mean=values["abs_sum"] / max(n, 1),
        max=math.nan if math.isnan(lo) or math.isnan(hi) else max(-lo, hi),
        norm=values["norm"] * (math.sqrt(full / n) if n else 1.0),
        nonfinite_count=int(values.get("nonfinite", 0)),
    )


# --------------------------------------------------------------------------- reference


def reference_activation_stats(x: torch.Tensor, unit_axis: int, bounds: tuple[float, float] | None = None) -> ActivationStats:
    """The activation statistics of one tensor, plainly, in float64: what the fast path
    (:func:`activation_stats_rows`) computes, without its tricks."""
    x = x.detach().double()
    n = x.numel()
    per_unit = x.movedim(unit_axis, 0).reshape(x.shape[unit_axis], -1)
    saturated = None
    if bounds is not None:
        low, high = bounds
        saturated = ((x <= low + SATURATION_MARGIN) | (x >= high - SATURATION_MARGIN)).sum().item() / n
    return ActivationStats(
        mean=x.mean().item(),
        std=x.std().item() if n > 1 else 0.0,
        min=x.min().item(),
        max=x.max().item(),
        zero_fraction=(x == 0).sum().item() / n,
        dead_unit_fraction=(per_unit == 0).all(dim=1).double().mean().item(),
        saturated_fraction=saturated,
        nonfinite_count=(~torch.isfinite(x)).sum().item(),
        unit_count=per_unit.shape[0],
        values_per_unit=per_unit.shape[1],
    )


def reference_gradient_stats(g: torch.Tensor) -> GradientStats:
    """The gradient statistics of one tensor, plainly, in float64."""
    g = g.detach().double()
    return GradientStats(
        abs_mean=g.abs().mean().item(),
        max=g.abs().max().item(),
        norm=g.norm().item(),
        nonfinite_count=(~torch.isfinite(g)).sum().item(),
    )


def reference_update_ratio(before: torch.Tensor, after: torch.Tensor) -> float:
    """‖after − before‖ / ‖after‖: how far one optimizer step moved a parameter."""
    before, after = before.detach().double(), after.detach().double()
    return ((after - before).norm() / after.norm().clamp_min(1e-12)).item()


# --------------------------------------------------------------------------- layer records


class LayerRecord(NamedTuple):
    """One layer's statistics at one recorded step."""

    name: str
    type: str
    step: int | None
    activation: ActivationRecord | None
    gradient: GradientRecord | None

    def model(self) -> LayerStats:
        return LayerStats(
            name=self.name,
            type=self.type,
            step=self.step,
            activation=None if self.activation is None else self.activation.model(),
            gradient=None if self.gradient is None else self.gradient.model(),
        )

    @property
    def nonfinite(self) -> bool:
        return any(r is not None and r.nonfinite_count for r in (self.activation, self.gradient))


class _Slots:
    """Persistent storage for one step's copies of same-shaped tensors (a group), reused
    every step, grown by a slot when a step needs one more. float32 (float64 for float64
    tensors): the dtype the statistics are computed in."""

    def __init__(self, shape: torch.Size, device: torch.device, dtype: torch.dtype) -> None:
        self.shape, self.device, self.dtype = shape, device, dtype
        self.data = torch.empty(0, dtype=dtype)
        self.used = 0
        self.touched = False  # used in the current step

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def put(self, sample: torch.Tensor) -> int:
        if self.used == len(self.data):
            with torch.inference_mode(False):  # buffers made during eval must be writable later
                grown = torch.empty((self.used + 1, *self.shape), device=self.device, dtype=self.dtype)
                if self.used:
                    grown[: self.used].copy_(self.data[: self.used])
                self.data = grown
        with single_threaded(self.device):
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
    activations when a forward of one of ``roots`` (default: the model) returns, the
    gradients at ``finish_step`` (and everything pending as soon as it passes
    ``PENDING_BYTES``). The buffers are kept from step to step unless they pass
    ``PENDING_BYTES``."""

    def __init__(
        self,
        model: nn.Module,
        modules: Iterable[tuple[str, nn.Module]] | None = None,
        max_elements: int | None = None,
        roots: Iterable[nn.Module] | None = None,
        guard: Callable[[str, Callable[..., None]], Callable[..., None]] | None = None,
    ) -> None:
        self.model = model
        # guard(source, hook) -> a hook that never raises (the Monitor's error guard);
        # without one a hook's exception reaches the caller (the probes catch it)
        self._guarded = guard or (lambda _source, hook: hook)
        self.max_elements = max_elements
        self.modules = list(modules) if modules is not None else watched_modules(model)
        self.roots = list(roots) if roots is not None else [model]
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
        self._gradient_hooks = {name: self._guarded("layer_gradient", self._gradient_hook(name)) for name, _ in self.modules}

    # -- lifecycle
    def attach(self) -> LayerRecorder:
        """Hook the layers (all or none: a module that refuses a hook, a scripted one,
        leaves nothing attached and raises)."""
        if not self._handles:
            try:
                for name, module in self.modules:
                    self._handles.append(module.register_forward_hook(self._guarded("layer_forward", self._forward_hook(name, module))))
                for root in self.roots:
                    self._handles.append(root.register_forward_hook(self._guarded("layer_reduce", lambda *_: self._reduce())))
            except Exception:
                self.detach()
                raise
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
        return [record.model() for record in self.finish_step_records()]

    def finish_step_records(self) -> list[LayerRecord]:
        """:meth:`finish_step` as :class:`LayerRecord` s, without building the report
        models (the Monitor keeps these: a fifth of the models' memory)."""
        return self.finish_step_pending().resolve()

    def finish_step_pending(self) -> Pending[list[LayerRecord]]:
        """:meth:`finish_step_records` with the values not fetched yet: the Monitor
        fetches them with the step's other values, one synchronisation in all."""
        self._recording = False
        self._reduce()
        # buffers of shapes this step did not have (variable batch or sequence lengths) go
        self._slots = {group: slots for group, slots in self._slots.items() if slots.touched}
        if self.workspace_bytes > PENDING_BYTES:
            self._slots.clear()
        rows, self._rows = self._rows, []
        where, self._where = self._where, {}
        values = torch.cat([r.reshape(-1).to(rows[0][0].device, torch.float64) for r, _ in rows]) if rows else torch.empty(0, dtype=torch.float64)
        starts = [0]
        for r, _ in rows:
            starts.append(starts[-1] + r.numel())
        columns = [c for _, c in rows]
        step, layers = self._step, [(name, self._types[name]) for name in self._order]

        def build(flat: list[float]) -> list[LayerRecord]:
            def fields(kind: str, name: str) -> ActivationRecord | GradientRecord | None:
                at = where.get((kind, name))
                if at is None:
                    return None
                group, row, n, extra = at
                start = starts[group] + row * len(columns[group])
                fetched = dict(zip(columns[group], flat[start:start + len(columns[group])]))
                return (activation_fields if kind == "act" else gradient_fields)(fetched, n, extra)

            return [LayerRecord(name, kind, step, fields("act", name), fields("grad", name)) for name, kind in layers]

        return Pending(values, build)

    def _keep(self, kind: str, name: str, sample: torch.Tensor, group: tuple, n: int, extra: int) -> None:
        """Copy ``sample`` into its group's buffer for the next reduction (a module
        called twice in one step: the last call wins)."""
        nbytes = sample.numel() * (8 if group[-1] == torch.float64 else 4)
        if self._pending_bytes + nbytes > PENDING_BYTES:
            self._reduce()
        slots = self._slots.get(group)
        if slots is None:
            slots = self._slots[group] = _Slots(sample.shape, sample.device, group[-1])
        self._pending[kind, name] = (group, slots.put(sample), n, extra)
        self._pending_bytes += nbytes

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
                batch = slots.data[: slots.used]
                rows = activation_stats_rows(batch, unit_axis + 1, bounds) if kind == "act" else gradient_stats_rows(batch)
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
            group = ("act", unit_axis, bounds, sample.shape, sample.device, statistics_dtype(sample.dtype))
            self._keep("act", name, sample, group, sample.numel(), sample.shape[unit_axis])
            if out.requires_grad:
                out.register_hook(self._gradient_hooks[name])

        return hook

    def _gradient_hook(self, name: str):
        def hook(grad: torch.Tensor | None) -> None:
            # None: an output that got no gradient in this pass (the unused state of a
            # recurrent layer whose graph was retained from an earlier step)
            if grad is not None and (self._recording or ("grad", name) not in self._where):
                sample = leading_samples(grad, self.max_elements)
                group = ("grad", None, None, sample.shape, sample.device, statistics_dtype(sample.dtype))
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


# --------------------------------------------------------------------------- parameters


def trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in nn.Module.named_parameters(model) if p.requires_grad]


def snapshot_parameters(
    model: nn.Module | list[tuple[str, torch.Tensor]],
    max_elements: int | None = None,
    into: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Detached copies of trainable parameters (a model's, or the given named ones), or
    of an evenly spread sample of at most ``max_elements`` of each, to measure an
    optimizer step's update. Copies of half-precision parameters are float32, so the
    update (a small difference of two close values) is not rounded to their few bits.
    ``into``: an earlier snapshot to overwrite when it still fits (the Monitor takes one
    every recorded step, and reuses the memory)."""
    named = trainable(model) if isinstance(model, nn.Module) else model
    samples = {n: flat_sample(p, max_elements) for n, p in named}
    if not samples:
        return {}
    with single_threaded(next(iter(samples.values())).device):
        fits = into is not None and list(into) == list(samples) and all(
            into[n].shape == s.shape and into[n].dtype == statistics_dtype(s.dtype) and into[n].device == s.device
            for n, s in samples.items()
        )
        if not fits:
            return {n: s.to(statistics_dtype(s.dtype), copy=True) for n, s in samples.items()}
        torch._foreach_copy_(list(into.values()), list(samples.values()))
        return into


class ParameterRecord(NamedTuple):
    """One parameter's norms at one recorded step (see :class:`ParameterStats`)."""

    name: str
    shape: tuple[int, ...]
    step: int | None
    requires_grad: bool
    weight_norm: float
    grad_norm: float | None
    update_ratio: float | None
    descent: float | None = None

    def model(self) -> ParameterStats:
        return ParameterStats(name=self.name, shape=list(self.shape), step=self.step, requires_grad=self.requires_grad,
                              weight_norm=self.weight_norm, grad_norm=self.grad_norm, update_ratio=self.update_ratio,
                              descent=self.descent)

    @property
    def nonfinite(self) -> bool:
        return not math.isfinite(self.weight_norm) or (self.grad_norm is not None and not math.isfinite(self.grad_norm))


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
    named = list(nn.Module.named_parameters(model))
    return [r.model() for r in parameter_records(named, before, step, max_elements, grad_norms).resolve()]


def parameter_records(
    named: list[tuple[str, torch.Tensor]],
    before: dict[str, torch.Tensor] | None = None,
    step: int | None = None,
    max_elements: int | None = None,
    grad_norms: dict[str, torch.Tensor] | None = None,
    grads_before: dict[str, torch.Tensor] | None = None,
) -> Pending[list[ParameterRecord]]:
    """:func:`parameter_stats` over the given named parameters, as records. Each kind of
    norm is one foreach call over all parameters, not an op per parameter;
    :func:`reference_update_ratio` is the ratio, plainly. ``grads_before``: samples of the
    gradients the update was made from (the same elements as ``before``), for each record's
    ``descent``. Complex parameters (a Fourier layer's weights) are left out: every statistic here is real."""
    named = [(n, p) for n, p in named if not p.is_complex()]
    if not named:
        return Pending(torch.empty(0, dtype=torch.float64), lambda _: [])
    device = named[0][1].device
    weights = [p.detach() for _, p in named]
    # every norm goes into one list, stacked and fetched once; which entries a parameter
    # has (and the ratio's division) is bookkeeping on the host
    with single_threaded(device):
        all_norms = norms(weights)
        grad_at: dict[int, int] = {}
        measure = []
        for i, (n, p) in enumerate(named):
            known = grad_norms.get(n) if grad_norms is not None and p.grad is not None else None
            if known is not None:
                grad_at[i] = len(all_norms)
                all_norms.append(known)
            elif p.grad is not None:
                measure.append(i)
        for i, norm in zip(measure, norms([named[i][1].grad.detach() for i in measure])):
            grad_at[i] = len(all_norms)
            all_norms.append(norm)
        ratio_at: dict[int, tuple[int, int]] = {}  # parameter -> (update norm, weight norm of the same elements)
        descent_at: dict[int, int] = {}
        compared = [i for i, (n, _) in enumerate(named) if before is not None and n in before]
        if compared:
            nows = [flat_sample(weights[i], max_elements) for i in compared]
            spent = [before[named[i][0]].view(now.shape) for i, now in zip(compared, nows)]
            sampled = [j for j, i in enumerate(compared) if nows[j].numel() != weights[i].numel()]
            # a sampled ratio's denominator is the norm of the same elements before the step,
            # read from the contiguous snapshot: a pass over the strided sample of the live
            # weights costs several times more (before or after differ by at most the update)
            sample_norms = norms([spent[j] for j in sampled]) if sampled else []
            torch._foreach_sub_(spent, [now.to(s.dtype) for now, s in zip(nows, spent)])  # before - after
            updates = norms(spent)
            scale_at = dict(zip(sampled, range(len(all_norms) + len(updates), len(all_norms) + len(updates) + len(sampled))))
            for j, (i, update) in enumerate(zip(compared, updates)):
                ratio_at[i] = (len(all_norms) + j, scale_at.get(j, i))
            all_norms += [*updates, *sample_norms]
            for j, i in enumerate(compared):
                grad = (grads_before or {}).get(named[i][0])
                if grad is not None:  # (before - after) . g / (|before - after| |g|)
                    grad = grad.view(spent[j].shape).to(spent[j].dtype)
                    descent_at[i] = len(all_norms)
                    scale = (updates[j] * torch.linalg.vector_norm(grad)).clamp_min(1e-30)
                    all_norms += [(spent[j] * grad).sum() / scale]
        values = torch.stack([v.to(device, torch.float64) for v in all_norms])
    shapes = [(n, tuple(p.shape), p.requires_grad) for n, p in named]

    def build(values: list[float]) -> list[ParameterRecord]:
        records = []
        for i, (n, shape, requires_grad) in enumerate(shapes):
            ratio = ratio_at.get(i)
            records.append(ParameterRecord(
                n,
                shape,
                step,
                requires_grad,
                values[i],
                values[grad_at[i]] if i in grad_at else None,
                None if ratio is None else values[ratio[0]] / max(values[ratio[1]], 1e-12),
                values[descent_at[i]] if i in descent_at else None,
            ))
        return records

    return Pending(values, build)


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
            param_count=sum(p.numel() for p in nn.Module.parameters(m, recurse=False)),
            trainable_param_count=sum(p.numel() for p in nn.Module.parameters(m, recurse=False) if p.requires_grad),
            padding_idx=m.padding_idx if isinstance(m, nn.Embedding) else None,
        )
        for n, m in leaves
    ]
    # modules that do nothing to values at inference do not decide the output's nature
    ran = [(n, m) for n, m in leaves if type(m).__name__ not in vocab.PASSTHROUGH_NAMES and not isinstance(m, DROPOUT_TYPES)]
    if forward_order:
        ran = [(n, m) for n, m in ran if n in set(forward_order)] or ran
    last = ran[-1][1] if ran else None
    return ModelSummary(
        param_count=sum(p.numel() for p in nn.Module.parameters(model)),
        trainable_param_count=sum(p.numel() for p in nn.Module.parameters(model) if p.requires_grad),
        layers=layers,
        activations=[type(m).__name__ for _, m in leaves if is_activation(m)],
        last_layer=type(last).__name__ if last is not None else None,
        output_activation=type(last).__name__ if last is not None and is_activation(last) else None,
        normalization_layers=[type(m).__name__ for _, m in leaves
                              if isinstance(m, NORMALIZATION_TYPES) or is_batchnorm(m)],  # fmt: skip
        has_dropout=has_dropout(model),
        has_batchnorm=has_batchnorm(model),
    )


def iter_named_leaves(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    for name, module in model.named_modules():
        if next(module.children(), None) is None:
            yield name or type(module).__name__, module


# PyTorch's default initialisation draws these layers' weights from U(-b, b): b = 1/sqrt(fan_in) for
# Linear and convolutions (kaiming_uniform_ with a=sqrt(5)), b = 1/sqrt(hidden_size) for RNN/LSTM/GRU
_DEFAULT_UNIFORM = (nn.Linear, nn.modules.conv._ConvNd, nn.RNNBase)
# a tensor of n draws of U(-b, b) has rms b/sqrt(3) within 0.45/sqrt(n) (one sd, relative); 4 sd,
# over at least this many elements, leave a trained tensor no room to pass by chance
_MIN_UNIFORM_ELEMENTS = 64
# the normal inits (He/Kaiming, Xavier/Glorot, LeCun) have no bound to test against, only their rms
# and a normal's kurtosis of 3: both read within 4 sd over at least this many elements
_MIN_NORMAL_ELEMENTS = 1024


def _normal_stds(param: torch.Tensor) -> list[float]:
    """The std of each standard normal init of a Linear/conv weight: variance 1 or 2 (ReLU
    gain) over fan_in, fan_out, or their mean (Xavier)."""
    fan_in, fan_out = nn.init._calculate_fan_in_and_fan_out(param)
    return [math.sqrt(gain / fan) for gain in (1.0, 2.0) for fan in (fan_in, fan_out, (fan_in + fan_out) / 2)]


def _fits_init(kind: str, reading: list[float], n: int, scale: list[float]) -> bool:
    largest, rms, mean, kurtosis, spread = reading
    if kind == "norm":  # a norm layer's scale starts at ones (zeros for a zero-init residual)
        return spread == 0.0 and mean in (0.0, 1.0)
    if kind == "uniform":
        (bound,) = scale
        return largest <= bound and abs(rms / (bound / math.sqrt(3.0)) - 1) <= 4 * 0.45 / math.sqrt(n)
    if n < _MIN_NORMAL_ELEMENTS or abs(mean) > 4 * rms / math.sqrt(n) or abs(kurtosis - 3) > 4 * 4.9 / math.sqrt(n):
        return False
    return any(abs(rms / std - 1) <= 4 * 0.71 / math.sqrt(n) for std in scale)


def frozen_fingerprints(model: nn.Module) -> dict[str, tuple[float, float]]:
    """(sum, norm) of each frozen parameter, in float64: read again later, a change says
    something other than the optimizer moves them (see :func:`tracking_copies`)."""
    with torch.no_grad():
        return {n: (float(p.sum(dtype=torch.float64)), float(torch.linalg.vector_norm(p, dtype=torch.float64)))
                for n, p in nn.Module.named_parameters(model)
                if not p.requires_grad and p.is_floating_point() and not p.is_sparse}  # fmt: skip


def tracking_copies(model: nn.Module, before: dict[str, tuple[float, float]] | None = None) -> list[str]:
    """Frozen parameters that follow trained ones — MoCo's key encoder, BYOL's target, a DQN
    target network, a mean teacher — rather than frozen by mistake: every frozen parameter
    of a top-level submodule most of whose frozen weight matrices equal a trainable one of
    the same shape (the copy such a loop makes at the start), and, with ``before`` (the
    :func:`frozen_fingerprints` taken when the Monitor attached), every frozen parameter
    that changed since with no gradient (a momentum or EMA update)."""
    named = list(nn.Module.named_parameters(model))
    trained: dict[tuple, list[torch.Tensor]] = {}
    for _, p in named:
        if p.requires_grad and p.dim() >= 2:
            trained.setdefault((tuple(p.shape), p.dtype, p.device), []).append(p)
    frozen = [(n, n.split(".")[0], p) for n, p in named if not p.requires_grad]
    moved: set[str] = set()
    if before:
        moved = {n for n, mark in frozen_fingerprints(model).items() if n in before and mark != before[n]}
    votes: dict[str, list[bool]] = {}
    with torch.no_grad():
        for _, top, p in frozen:
            if p.dim() >= 2 and p.numel() >= 16 and not p.is_sparse:
                same = any(torch.equal(q, p) for q in trained.get((tuple(p.shape), p.dtype, p.device), []))
                votes.setdefault(top, []).append(same)
    copies = {top for top, seen in votes.items() if 2 * sum(seen) > len(seen)}
    return [n for n, top, _ in frozen if n in moved or top in copies]


def frozen_at_init(model: nn.Module) -> tuple[list[str], int]:
    """Frozen weight tensors whose values still fit a standard initialisation, and how
    many frozen weight tensors could be checked.

    Why: freezing a backbone is a recipe for *pretrained* weights. A frozen body that
    was never trained or loaded (``pretrained=False``, a checkpoint not loaded) is random
    features under a trainable head: the loss still falls a little, so nothing looks
    broken. Recognised: PyTorch's default (inside its uniform bound, with that uniform's
    rms; Linear, convolutions, RNN/LSTM/GRU), the He/Xavier/LeCun normal inits (their rms
    and a normal's kurtosis; torchvision's ResNet and VGG convolutions use one), and a
    norm layer's scale still all ones. Any training moves a tensor off these: 20 Adam
    steps at lr 1e-3 do. Checked: frozen weights of at least 64 elements (1,024 for the
    normal inits). A trained network can hold a layer that barely moved; a body that was
    never trained or loaded holds them all.
    """
    checks: list[tuple[str, int, list[tuple[str, list[float]]]]] = []  # name, elements, (init, scale)
    readings = []
    for prefix, module in model.named_modules():
        for name, param in nn.Module.named_parameters(module, recurse=False):
            if param.requires_grad or "weight" not in name or param.is_sparse or not param.is_floating_point():
                continue
            if isinstance(module, NORMALIZATION_TYPES) and param.numel() >= 8:
                inits = [("norm", [])]
            elif isinstance(module, nn.RNNBase) and param.numel() >= _MIN_UNIFORM_ELEMENTS:
                inits = [("uniform", [1.0 / math.sqrt(module.hidden_size)])]
            elif isinstance(module, _DEFAULT_UNIFORM) and param.dim() >= 2 and param.numel() >= _MIN_UNIFORM_ELEMENTS:
                fan_in = nn.init._calculate_fan_in_and_fan_out(param)[0]
                inits = [("uniform", [1.0 / math.sqrt(fan_in)]), ("normal", _normal_stds(param))]
            else:
                continue
            with torch.no_grad():
                values = param.detach().to(statistics_dtype(param.dtype)).flatten()
                centred = values - values.mean()
                variance = centred.square().mean()
                kurtosis = centred.pow(4).mean() / variance.square().clamp_min(torch.finfo(values.dtype).tiny)
                readings.append(torch.stack([values.abs().max(), values.square().mean().sqrt(), values.mean(),
                                             kurtosis, values.max() - values.min()]).float())  # fmt: skip
            # a low-precision weight rounds a draw near the bound past it by up to its eps
            slack = 1 + 2 * torch.finfo(param.dtype).eps
            inits = [(kind, [v * slack for v in scale] if kind == "uniform" else scale) for kind, scale in inits]
            checks.append((f"{prefix}.{name}" if prefix else name, param.numel(), inits))
    if not checks:
        return [], 0
    device = readings[0].device
    values = torch.stack([r.to(device) for r in readings]).tolist()  # one host transfer for every tensor
    at_init = [name for (name, n, inits), reading in zip(checks, values)
               if any(_fits_init(kind, reading, n, scale) for kind, scale in inits)]  # fmt: skip
    return at_init, len(checks)
