"""Per-layer statistics shared by the hook probe and the Monitor.

How to use::

    recorder = LayerRecorder(model)          # choose modules, hooks not yet attached
    with recorder:                           # attach; detached on exit
        recorder.start_step(step)            # record this step (hooks are idle otherwise)
        loss_fn(model(x), y).backward()
        layer_stats = recorder.finish_step() # one host synchronisation for all layers

Why it is built this way:

- Every statistic of one tensor is reduced on its device into one small tensor, and all
  layers of a step are stacked and fetched with a single ``.tolist()``: on a GPU every
  ``.item()`` stalls the stream; on a CPU the cost is the number of passes over each
  activation, so each statistic reuses the passes already made.
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
  ``max_elements`` (at least one sample; a view, no copy) and update/weight ratios on
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

from nndx.report import ActivationStats, GradientStats, LayerInfo, LayerStats, ModelSummary, ParameterStats

ACTIVATION_TYPES: tuple[type[nn.Module], ...] = (
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.PReLU,
    nn.ELU,
    nn.SELU,
    nn.CELU,
    nn.GELU,
    nn.SiLU,
    nn.Mish,
    nn.Softplus,
    nn.Sigmoid,
    nn.Tanh,
    nn.Hardtanh,
    nn.Hardsigmoid,
    nn.Hardswish,
    nn.Softmax,
    nn.LogSoftmax,
)
NORMALIZATION_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._BatchNorm,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.modules.instancenorm._InstanceNorm,
)
DROPOUT_TYPES: tuple[type[nn.Module], ...] = (nn.modules.dropout._DropoutNd, nn.AlphaDropout)
CONV_TYPES: tuple[type[nn.Module], ...] = (nn.modules.conv._ConvNd,)

# Output bounds of saturating activations; "saturated" = within SATURATION_MARGIN of one.
SATURATING_BOUNDS: dict[type[nn.Module], tuple[float, float]] = {
    nn.Sigmoid: (0.0, 1.0),
    nn.Tanh: (-1.0, 1.0),
    nn.Hardtanh: (-1.0, 1.0),
    nn.Hardsigmoid: (0.0, 1.0),
}
SATURATION_MARGIN = 1e-3

SAMPLE_BLOCK = 16  # elements per block of a parameter sample: 64 bytes of float32, a cache line
_EXACT_COUNT = 1 << 24  # float32 counts (sums of ones) are exact up to here


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


def _nonfinite_count(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Non-finite elements of ``x``, given its min and max (which NaN and Inf reach).
    On a CPU a host read is free and the counting pass is the cost, so it only runs
    when the extremes say there is something to count; elsewhere it always runs, to
    keep the one synchronisation per step."""
    if _finite_on_cpu(x, lo, hi):
        return torch.zeros((), device=x.device)
    return (~torch.isfinite(x)).sum().float()


def _finite_on_cpu(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> bool:
    """True when ``x`` is on the CPU and its extremes are finite (then so is all of it);
    two host reads, free on a CPU (cheaper than a tensor test). False off the CPU."""
    return x.device.type == "cpu" and math.isfinite(lo.item()) and math.isfinite(hi.item())


def activation_stats_tensor(
    output: torch.Tensor,
    unit_axis: int,
    bounds: tuple[float, float] | None = None,
    max_elements: int | None = None,
) -> tuple[torch.Tensor, int, int]:
    """The activation statistics of ``output``: one float64 tensor of raw sums and
    extremes on its device (in the order activation_stats_from_values unpacks), and the
    elements and units measured;
    :func:`activation_stats_from_values` turns the three into an :class:`ActivationStats`.

    Every statistic is of ``leading_samples(output, max_elements)`` (all of it when
    None): a unit is dead when it is zero for every sample and position there.
    Divisions and constants are left to the host: on a CPU each tensor op costs
    microseconds whatever its size, and a recorded step runs this for every layer."""
    x = output.detach()
    if x.dim() == 0:
        x = x.reshape(1, 1)
        unit_axis = 1
    elif x.dim() == 1:
        x = x.reshape(-1, 1) if unit_axis == 0 else x.reshape(1, -1)
        unit_axis = 1
    x = leading_samples(x, max_elements).float()
    n = x.numel()
    others = [d for d in range(x.dim()) if d != unit_axis]
    # two reductions: on this build aminmax(dim=...) is ~10x slower than amin + amax
    unit_lo, unit_hi = x.amin(dim=others), x.amax(dim=others)
    lo, hi = unit_lo.min(), unit_hi.max()
    mean = x.mean()
    # two-pass std (as torch.std), at a third of its cost on a CPU
    centered_norm = torch.linalg.vector_norm(x - mean)
    if bounds is None:
        saturated = torch.full((), -1.0, device=x.device)
    else:
        saturated = ((x <= bounds[0] + SATURATION_MARGIN) | (x >= bounds[1] - SATURATION_MARGIN)).sum().float()
    if _finite_on_cpu(x, lo, hi) and n <= _EXACT_COUNT:
        nonfinite = torch.zeros((), device=x.device)
        # |sign(x)| is 1 where x != 0 and 0 where x == 0: the nonzero count from a float sum,
        # at a quarter of the cost of (x != 0).sum() (x is finite here)
        nonzero = torch.sign(x).abs_().sum()
    else:
        nonfinite = _nonfinite_count(x, lo, hi)
        nonzero = (x != 0).sum().float()
    # a unit is live unless zero for every sample and position: max(hi, -lo) > 0
    live_units = torch.count_nonzero(torch.maximum(unit_hi, -unit_lo)).float()
    row = torch.stack([mean, centered_norm, lo, hi, nonzero, live_units, saturated, nonfinite]).double()
    return row, n, x.shape[unit_axis]


def gradient_stats_tensor(grad: torch.Tensor, max_elements: int | None = None) -> tuple[torch.Tensor, int, int]:
    """Sum of |g|, min, max, L2 norm and non-finite count of ``grad`` (in that order),
    and the elements measured and in all; :func:`gradient_stats_from_values`
    makes the :class:`GradientStats` of the three.
    With ``max_elements``, of the leading samples, the norm scaled by
    sqrt(batch / samples) to estimate the whole batch's — norms are compared across
    layers whose samples differ in size — and the count of those samples only."""
    g = leading_samples(grad.detach(), max_elements).float()
    lo, hi = torch.aminmax(g)
    row = torch.stack([
        g.abs().sum(),  # a quarter of vector_norm(ord=1)'s cost on a CPU
        lo,
        hi,
        torch.linalg.vector_norm(g),
        _nonfinite_count(g, lo, hi),
    ]).double()
    return row, g.numel(), grad.numel()


def activation_stats_from_values(values: list[float], n: int, units: int) -> ActivationStats:
    """An :class:`ActivationStats` from the fetched ``activation_stats_tensor`` of ``n``
    elements and ``units`` units."""
    mean, centered_norm, lo, hi, nonzero, live_units, saturated, nonfinite = values
    # fractions of a non-finite tensor are still well defined; clamp float noise
    return ActivationStats(
        mean=mean,
        std=centered_norm / math.sqrt(n - 1) if n > 1 else 0.0,
        min=lo,
        max=hi,
        zero_fraction=min(max((n - nonzero) / n, 0.0), 1.0),
        dead_unit_fraction=min(max((units - live_units) / units, 0.0), 1.0),
        saturated_fraction=None if saturated < 0 else saturated / n,
        nonfinite_count=int(nonfinite),
        unit_count=units,
    )


def gradient_stats_from_values(values: list[float], n: int, full: int) -> GradientStats:
    """A :class:`GradientStats` from the fetched ``gradient_stats_tensor`` of ``n`` of the
    gradient's ``full`` elements."""
    abs_sum, lo, hi, norm, nonfinite = values
    return GradientStats(
        abs_mean=abs_sum / max(n, 1),
        max=math.nan if math.isnan(lo) or math.isnan(hi) else max(-lo, hi),
        norm=norm * (math.sqrt(full / n) if n else 1.0),
        nonfinite_count=int(nonfinite),
    )


class LayerRecorder:
    """Forward hooks (activation statistics) and output-tensor hooks (gradient
    statistics) on a model's layers. Idle unless a step is being recorded, so it can
    stay attached for a whole training run. Leaves the model as it found it on
    ``detach()``."""

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
        # name -> (the device-side row, elements measured, units or all elements)
        self._activations: dict[str, tuple[torch.Tensor, int, int]] = {}
        self._gradients: dict[str, tuple[torch.Tensor, int, int]] = {}
        self._order: list[str] = []  # forward order of the recorded step
        self._types = {name: type(module).__name__ for name, module in self.modules}

    # -- lifecycle
    def attach(self) -> LayerRecorder:
        if not self._handles:
            for name, module in self.modules:
                self._handles.append(module.register_forward_hook(self._forward_hook(name, module)))
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._recording = False

    def __enter__(self) -> LayerRecorder:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    # -- recording
    def start_step(self, step: int | None = None) -> None:
        self._recording = True
        self._step = step
        self._activations.clear()
        self._gradients.clear()
        self._order.clear()

    @property
    def recording(self) -> bool:
        return self._recording

    @property
    def forward_order(self) -> list[str]:
        """Names of hooked modules in the order they ran in the recorded step."""
        return list(self._order)

    def finish_step(self) -> list[LayerStats]:
        """Stop recording and return this step's statistics, fetched with one sync."""
        self._recording = False
        names = list(self._order)
        measured = [("act", n, self._activations[n][0]) for n in names if n in self._activations]
        measured += [("grad", n, self._gradients[n][0]) for n in names if n in self._gradients]
        flat = torch.cat([row.to(measured[0][2].device) for *_, row in measured]).tolist() if measured else []
        values: dict[tuple[str, str], list[float]] = {}
        offset = 0
        for kind, n, row in measured:
            values[kind, n] = flat[offset:offset + row.numel()]
            offset += row.numel()
        stats = [
            LayerStats(
                name=n,
                type=self._types[n],
                step=self._step,
                activation=(
                    activation_stats_from_values(values["act", n], *self._activations[n][1:])
                    if n in self._activations else None
                ),
                gradient=(
                    gradient_stats_from_values(values["grad", n], *self._gradients[n][1:])
                    if n in self._gradients else None
                ),
            )
            for n in names
        ]
        self._activations.clear()
        self._gradients.clear()
        return stats

    def _forward_hook(self, name: str, module: nn.Module):
        bounds = SATURATING_BOUNDS.get(type(module))

        def hook(_module: nn.Module, _inputs: object, output: object) -> None:
            if not self._recording:
                return
            out = _first_tensor(output)
            if out is None or not out.is_floating_point() or out.numel() == 0:
                return
            if name not in self._activations:
                self._order.append(name)
            # a module called twice in one step (weight sharing): the last call wins
            with single_threaded(out.device):
                self._activations[name] = activation_stats_tensor(out, unit_dim(module, out), bounds, self.max_elements)
            if out.requires_grad:
                out.register_hook(self._gradient_hook(name))

        return hook

    def _gradient_hook(self, name: str):
        def hook(grad: torch.Tensor) -> None:
            if self._recording or name not in self._gradients:
                with single_threaded(grad.device):
                    self._gradients[name] = gradient_stats_tensor(grad, self.max_elements)

        return hook


def snapshot_parameters(model: nn.Module, max_elements: int | None = None) -> dict[str, torch.Tensor]:
    """Detached copies of trainable parameters (or of an evenly spread sample of
    at most ``max_elements`` of each), to measure an optimizer step's update."""
    with single_threaded(next(model.parameters(), torch.empty(0)).device):
        return {n: flat_sample(p, max_elements).clone() for n, p in model.named_parameters() if p.requires_grad}


def parameter_stats(
    model: nn.Module,
    before: dict[str, torch.Tensor] | None = None,
    step: int | None = None,
    max_elements: int | None = None,
    grad_norms: dict[str, torch.Tensor] | None = None,
) -> list[ParameterStats]:
    """Weight norm, grad norm and (given a snapshot from before the step) the
    update/weight ratio ‖Δw‖/‖w‖ of every parameter, fetched with one sync. Pass the
    ``max_elements`` the snapshot was taken with: the ratio is then measured on the
    same sampled elements. ``grad_norms``: per-parameter gradient norms already
    computed for this step (the Monitor has them from the end of backward), to save a
    pass over the gradients."""
    named = list(model.named_parameters())
    if not named:
        return []
    device = named[0][1].device
    # every measured norm goes into one list, stacked and fetched once; which entries a
    # parameter has (and the ratio's division) is bookkeeping on the host
    norms: list[torch.Tensor] = []
    layout: list[tuple[int, int | None, int | None, int | None]] = []

    def add(norm: torch.Tensor) -> int:
        norms.append(norm if norm.device == device else norm.to(device))
        return len(norms) - 1

    with single_threaded(device):
        for n, p in named:
            w = p.detach()
            weight = add(torch.linalg.vector_norm(w.float()))
            grad = None
            if p.grad is not None:
                known = grad_norms.get(n) if grad_norms is not None else None
                grad = add(known if known is not None else torch.linalg.vector_norm(p.grad.detach().float()))
            diff = scale = None
            if before is not None and n in before:
                now = flat_sample(w, max_elements)
                scale = weight
                if now.numel() != w.numel():
                    now = now.contiguous()  # one gather of the sampled blocks
                    scale = add(torch.linalg.vector_norm(now.float()))
                diff = add(torch.linalg.vector_norm((now - before[n].reshape(now.shape)).float()))
            layout.append((weight, grad, diff, scale))
        values = torch.stack(norms).double().tolist()
    return [
        ParameterStats(
            name=n,
            shape=list(p.shape),
            step=step,
            requires_grad=p.requires_grad,
            weight_norm=values[weight],
            grad_norm=None if grad is None else values[grad],
            update_ratio=None if diff is None else values[diff] / max(values[scale], 1e-12),
        )
        for (n, p), (weight, grad, diff, scale) in zip(named, layout)
    ]


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
    ran = [(n, m) for n, m in leaves if not isinstance(m, DROPOUT_TYPES + (nn.Identity, nn.Flatten))]
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
        has_dropout=any(isinstance(m, DROPOUT_TYPES) for _, m in leaves),
        has_batchnorm=any(isinstance(m, nn.modules.batchnorm._BatchNorm) for _, m in leaves),
    )


def iter_named_leaves(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    for name, module in model.named_modules():
        if next(module.children(), None) is None:
            yield name or type(module).__name__, module
