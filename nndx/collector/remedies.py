"""Mechanical remedies: each changes a *copy* of a training setup the way its cause's fix
would change the user's code.

They serve two masters, with one implementation: the intervention probe
(:mod:`nndx.collector.interventions`) applies them to copies to test which cause is real,
and :mod:`nndx.fix` applies the dead-unit one at the user's request.

A :class:`Setup` is what one short training run needs: a model, an optimizer over it,
the inputs and targets, and the loss. A remedy returns a new Setup (it may modify the
copy it was given) or raises :class:`NotApplicable` with the reason it cannot apply.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from nndx import vocab
from nndx.collector._common import LossFn, first_output, forward, loss_name, preserved_rng, set_mode
from nndx.collector.stats import CONV_TYPES, unit_dim


class NotApplicable(Exception):
    """The remedy does not apply to this setup; the message says why."""


@dataclass
class Setup:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    inputs: Any
    targets: Any
    loss_fn: LossFn
    # the k-th activation call of a forward to pass through unchanged (see bypassed_activation)
    bypass_activation: int | None = None


# --------------------------------------------------------------------------- learning rate


def scale_lr(setup: Setup, factor: float) -> Setup:
    for group in setup.optimizer.param_groups:
        lr = group.get("lr")
        if not isinstance(lr, (int, float)) or not lr > 0:
            raise NotApplicable("the optimizer has no positive learning rate to scale")
        group["lr"] = lr * factor
    return setup


# --------------------------------------------------------------------------- the output activation


def _activation_name(func: Callable) -> str | None:
    name = getattr(func, "__name__", "")
    kind = vocab.activation_kind(name)
    return kind.name if kind is not None else None


class ActivationCalls(TorchFunctionMode):
    """Records (or, with ``bypass``, skips) the activation calls of a forward — modules
    (nn.ReLU calls F.relu) and functions (torch.sigmoid in a forward) alike."""

    def __init__(self, bypass: int | None = None) -> None:
        super().__init__()
        self.bypass = bypass
        self.calls: list[tuple[str, torch.Tensor]] = []

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = _activation_name(func)
        if name is None or not args or not isinstance(args[0], torch.Tensor):
            return func(*args, **kwargs)
        index = len(self.calls)
        output = args[0] if index == self.bypass else func(*args, **kwargs)
        self.calls.append((name, output))
        return output


def output_activation(model: nn.Module, inputs: Any) -> tuple[int, str] | None:
    """(call index, activation kind) of the activation whose result *is* the model's output
    (or a view of it), from one forward; None when the output comes from no activation."""
    recorder = ActivationCalls()
    with torch.no_grad(), recorder:
        output = first_output(forward(model, inputs))
    if output is None:
        return None
    for index in range(len(recorder.calls) - 1, -1, -1):
        name, result = recorder.calls[index]
        if result is output or (
            result.numel() == output.numel()
            and result.untyped_storage().data_ptr() == output.untyped_storage().data_ptr()
        ):
            return index, name
    return None


@contextlib.contextmanager
def bypassed_activation(setup: Setup) -> Iterator[None]:
    """Inside, the setup's bypassed activation call returns its input unchanged."""
    if setup.bypass_activation is None:
        yield
        return
    with ActivationCalls(bypass=setup.bypass_activation):
        yield


def output_activation_cause(activation: str, loss: str) -> str | None:
    """The cause code an activation on the output points to, given the loss; None when
    that pairing is correct (log_softmax before NLLLoss, sigmoid before BCELoss)."""
    kind = vocab.loss_kind(loss)
    act = vocab.activation_kind(activation)
    if kind is None or act is None or act.log:
        return None
    if kind.expects == "logits" and (act.over_classes or (activation == "Sigmoid" and kind.binary)):
        return "DOUBLE_SOFTMAX"  # the loss applies its own softmax/sigmoid
    if kind.expects in ("logits", "values"):
        return "WRONG_OUTPUT_ACTIVATION"
    return None


def drop_output_activation(setup: Setup, index: int) -> Setup:
    return replace(setup, bypass_activation=index)


# --------------------------------------------------------------------------- data


def _standardized(x: torch.Tensor) -> torch.Tensor:
    """Per feature (dim 0 statistics), per channel for images [N, C, ...]."""
    dims = (0, *range(2, x.dim())) if x.dim() >= 3 else (0,)
    mean = x.mean(dim=dims, keepdim=True)
    std = x.std(dim=dims, keepdim=True) if x.shape[0] > 1 else torch.ones_like(mean)
    return (x - mean) / (std + 1e-6 * std.abs().max() + torch.finfo(x.dtype).tiny)


def _far_from_standard(x: torch.Tensor) -> bool:
    mean, std = float(x.float().mean()), float(x.float().std()) if x.numel() > 1 else 1.0
    return math.isfinite(mean) and math.isfinite(std) and (abs(mean) > 1.0 or not 0.2 <= std <= 5.0)


def standardize_inputs(setup: Setup) -> Setup:
    """One floating-point input tensor standardised; of several (a score network's ``(x, noise
    level)``), those on a raw scale (mean or std over 5: pixels in 0..255), the rest as they are.
    Targets equal to the one input (an autoencoder's) are scaled with it, both to [0, 1]."""
    x = setup.inputs
    if isinstance(x, (tuple, list)) and x and isinstance(x[0], torch.Tensor):
        size = x[0].shape[0] if x[0].dim() else 0
        raw = [isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() >= 2 and t.shape[0] == size >= 2
               and _raw_scale(t) for t in x]  # fmt: skip
        if not any(raw):
            raise NotApplicable("no input of several samples is on a raw scale (mean or std over 5)")
        return replace(setup, inputs=type(x)(_standardized(t) if r else t for t, r in zip(x, raw)))
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 2 or x.shape[0] < 2:
        raise NotApplicable("the inputs are not one floating-point tensor of several samples")
    if not _far_from_standard(x):
        raise NotApplicable("the inputs are already near mean 0, std 1")
    y = setup.targets
    if isinstance(y, torch.Tensor) and y.shape == x.shape and y.dtype == x.dtype and torch.equal(x, y):
        # a reconstruction (an autoencoder's input is its target): both sides scaled to [0, 1], as ToTensor
        # scales pixels, so that a sigmoid output still reaches its targets
        low, high = x.min(), x.max()
        scaled = (x - low) / (high - low + torch.finfo(x.dtype).tiny)
        return replace(setup, inputs=scaled, targets=scaled.clone())
    return replace(setup, inputs=_standardized(x))


def _raw_scale(x: torch.Tensor) -> bool:
    mean, std = float(x.float().mean()), float(x.float().std())
    return math.isfinite(mean) and math.isfinite(std) and (abs(mean) > 5.0 or std > 5.0)


def standardize_targets(setup: Setup) -> Setup:
    """Regression targets standardised; scaled to [0, 1] when none is negative (a sigmoid output
    cannot reach the negative half of standardised pixels)."""
    y = setup.targets
    if vocab.loss_task(loss_name(setup.loss_fn)) != "regression":
        raise NotApplicable("the loss is not a regression loss")
    if not isinstance(y, torch.Tensor) or not y.is_floating_point() or y.shape[0] < 2:
        raise NotApplicable("the targets are not floating-point values of several samples")
    if not _far_from_standard(y):
        raise NotApplicable("the targets are already near mean 0, std 1")
    if float(y.min()) >= 0:
        # none negative (pixels in 0..255, counts): scaled to [0, 1], which a sigmoid output reaches too
        return replace(setup, targets=y / (y.max() + torch.finfo(y.dtype).tiny))
    mean, std = y.mean(), y.std()
    return replace(setup, targets=(y - mean) / (std + torch.finfo(y.dtype).tiny))


def matching_loss(setup: Setup) -> Setup:
    """Cross-entropy where a regression loss was given class labels."""
    if vocab.loss_task(loss_name(setup.loss_fn)) != "regression":
        raise NotApplicable("the loss is not a regression loss")
    y = setup.targets
    with torch.no_grad():
        out = first_output(forward(setup.model, setup.inputs))
    if not isinstance(y, torch.Tensor) or out is None or out.dim() != 2 or out.shape[1] < 2:
        raise NotApplicable("the output is not one row of scores per sample")
    if y.dim() == 2 and y.shape == out.shape:
        labels = y.argmax(dim=1)  # one-hot rows
    elif y.dim() == 1 and (not y.is_floating_point() or bool((y == y.round()).all())):
        labels = y.long()
    else:
        raise NotApplicable("the targets are not class labels")
    if int(labels.min()) < 0 or int(labels.max()) >= out.shape[1]:
        raise NotApplicable("the labels do not index the output's columns")
    return replace(setup, targets=labels, loss_fn=nn.CrossEntropyLoss())


# --------------------------------------------------------------------------- dead units


def dead_relu_units(model: nn.Module, inputs: Any) -> list[tuple[str, str | None, nn.Module | None, torch.Tensor]]:
    """For each ReLU module in forward order: its name, the Linear/Conv that produced its
    input (or None), that producer, and the boolean mask of its units that are zero for
    every sample of ``inputs`` (one forward in eval mode; the model's modes restored)."""

    def is_producer(module: nn.Module) -> bool:
        # a transposed conv stores its weight as (in, out, ...): its rows are not its units
        return isinstance(module, nn.Linear) or (isinstance(module, CONV_TYPES) and not module.transposed)

    names = {module: name for name, module in model.named_modules()}
    # keeps each output alive during the forward, so that no id() is reused
    produced_by: dict[int, tuple[torch.Tensor, nn.Module]] = {}
    traced: list[tuple[str, str | None, nn.Module | None, torch.Tensor]] = []
    seen: set[str] = set()

    def record_output(module: nn.Module, _inputs: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor):
            produced_by[id(output)] = (output, module)

    def check_relu(module: nn.Module, relu_inputs: Any, output: Any) -> None:
        name = names.get(module, type(module).__name__)
        if name in seen or not isinstance(output, torch.Tensor):
            return  # a ReLU module reused in one forward: judge its first use only
        seen.add(name)
        # in-place ReLU returns its input tensor: the producer recorded that same object
        source = relu_inputs[0] if relu_inputs else None
        entry = produced_by.get(id(source))
        producer = entry[1] if entry is not None and entry[0] is source else None
        axis = unit_dim(producer, output) if producer is not None else (1 if output.dim() >= 4 else output.dim() - 1)
        units = output.shape[axis] if output.dim() else 1
        values = (output == 0).movedim(axis, -1).reshape(-1, units)
        dead = values.all(dim=0)
        if values.shape[0] < vocab.MIN_VALUES_PER_UNIT and not dead.all():
            dead = torch.zeros_like(dead)  # zero on one sample is what half of a live layer is
        traced.append((name, names.get(producer) if producer is not None else None, producer, dead))

    handles = []
    training = {module: module.training for module in model.modules()}
    try:
        for module in model.modules():
            if is_producer(module):
                handles.append(module.register_forward_hook(record_output))
            elif isinstance(module, (nn.ReLU, nn.ReLU6)):
                handles.append(module.register_forward_hook(check_relu))
        set_mode(model, False)
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            forward(model, inputs)
    finally:
        for handle in handles:
            handle.remove()
        for module, flag in training.items():
            module.training = flag
    return traced


def reinitialize_units(producer: nn.Module, indices: list[int], generator: torch.Generator) -> None:
    """Kaiming-normal rows (std sqrt(2 / fan_in)) for the given output units of a
    Linear/Conv and zero biases; every other unit stays bit-identical."""
    with torch.no_grad():
        weight = producer.weight
        fan_in = weight[0].numel()
        fresh = torch.randn((len(indices), *weight.shape[1:]), generator=generator) * math.sqrt(2.0 / fan_in)
        weight[indices] = fresh.to(dtype=weight.dtype, device=weight.device)
        if producer.bias is not None:
            producer.bias[indices] = 0


# --------------------------------------------------------------------------- the initialisation

_INIT_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
               nn.ConvTranspose3d, nn.RNNBase)  # fmt: skip


def _gain(weight: torch.Tensor) -> float:
    """How much a layer scales its input's std: weight rms x sqrt(fan_in)."""
    w = weight.detach().double()
    return float(w.square().mean().sqrt()) * math.sqrt(w[0].numel())


def default_init(setup: Setup) -> Setup:
    """PyTorch's own initialisation for the layers no standard init would give: a weight
    whose gain is over vocab.MAX_INIT_GAIN (N(0, 1) on a wide layer), all zero before
    the last layer (whose zeros are a common, harmless choice), or one non-zero value in
    every entry (a constant fill: every unit computes the same thing and gets the same
    gradient, whatever the gain). Layers within the range keep their weights, so a
    deliberate init (GPT's N(0, 0.02), He) is never undone."""
    layers = [m for m in setup.model.modules() if isinstance(m, _INIT_TYPES)]
    off = []
    for index, layer in enumerate(layers):
        weights = [p for name, p in nn.Module.named_parameters(layer, recurse=False)
                   if "weight" in name and p.dim() >= 2]
        gains = [_gain(w) for w in weights]
        zero = index < len(layers) - 1 and any(not w.detach().any() for w in weights)
        constant = any(w.shape[0] >= 2 and w.detach().any() and bool((w == w.detach().flatten()[0]).all())
                       for w in weights)  # fmt: skip
        if zero or constant or any(g > vocab.MAX_INIT_GAIN for g in gains if math.isfinite(g)):
            off.append(layer)
    if not off:
        raise NotApplicable(f"every layer's weight gain is within {vocab.MAX_INIT_GAIN:g}, none before the last "
                            "is all zero and none holds one value throughout: nothing to restore")  # fmt: skip
    with preserved_rng(), torch.no_grad():
        torch.manual_seed(0)
        for layer in off:
            layer.reset_parameters()
    return setup


def reinit_dead_units(setup: Setup, min_fraction: float = 0.3) -> Setup:
    traced = dead_relu_units(setup.model, setup.inputs)
    dead = [(producer, mask) for _, _, producer, mask in traced if producer is not None and mask.any()]
    total = sum(int(mask.numel()) for _, _, producer, mask in traced if producer is not None)
    count = sum(int(mask.sum()) for _, mask in dead)
    if not total or count < min_fraction * total:
        raise NotApplicable(f"{count} of {total} ReLU units are dead on this batch: too few to matter")
    generator = torch.Generator().manual_seed(0)
    for producer, mask in dead:
        reinitialize_units(producer, mask.nonzero().flatten().tolist(), generator)
    return setup
