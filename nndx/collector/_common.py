"""Helpers every active probe shares: run on a copy, leave the user's state untouched,
call the model and the loss the same way, and tell classification from regression.

Why copies: a probe trains, perturbs or converts weights (overfit, LR sweep, float64
gradient check) and even a plain forward in train mode moves batch-norm running
statistics. So every probe works on ``working_copy(model)`` inside ``preserved_rng()``,
and the user's model, optimizer and global random state are exactly as before.
"""

from __future__ import annotations

import contextlib
import copy
import random
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from nndx import vocab

Batch = Any  # (inputs, targets); inputs a Tensor, a tuple of positional args or a dict of kwargs
LossFn = Callable[..., torch.Tensor]

# --------------------------------------------------------------------------- state


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Restore torch (CPU and initialised CUDA devices), Python and numpy random state on
    exit, so a probe's dropout masks and random directions never shift the user's stream."""
    py_state = random.getstate()
    np_state = _numpy_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(py_state)
        if np_state is not None:
            import numpy

            numpy.random.set_state(np_state)


def _numpy_state() -> Any:
    try:
        import numpy
    except ImportError:  # numpy is a dependency, but a probe must not need it
        return None
    return numpy.random.get_state()


def working_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` the probe may train and mutate freely."""
    try:
        model_copy = copy.deepcopy(model)
    except Exception as exc:  # a model holding an open file, a lock, a generator...
        raise TypeError(f"cannot deep-copy the model to probe it safely ({type(exc).__name__}: {exc})") from exc
    return detach_watchers(model_copy)


def _is_nndx(fn: object) -> bool:
    owner = getattr(fn, "__self__", None)
    module = getattr(type(owner), "__module__", "") if owner is not None else getattr(fn, "__module__", "")
    return isinstance(module, str) and module.startswith("nndx.")


def detach_watchers(obj: nn.Module | torch.optim.Optimizer) -> nn.Module | torch.optim.Optimizer:
    """Cut a deep copy loose from whatever watched the original.

    ``deepcopy`` copies a module's hook dicts and an object's instance attributes, but
    a function is copied by reference: a Monitor's hooks on the copy would count the
    probe's forwards as the user's, and a method patched onto the instance (the
    Monitor's ``zero_grad``) still calls the *original* object — a probe calling
    ``zero_grad()`` on its copy would clear the user's gradients. So on a copy: nndx's
    own hooks are removed, and instance attributes that shadow a method of the class
    with a plain function are dropped (the class method is the copy's own). The user's
    hooks (e.g. weight-norm pre-hooks) stay: they are part of the model."""
    owners = list(obj.modules()) if isinstance(obj, nn.Module) else [obj]
    for owner in owners:
        for attr, value in list(vars(owner).items()):
            if attr.endswith("hooks") and isinstance(value, dict):
                for key in [k for k, fn in value.items() if _is_nndx(fn)]:
                    del value[key]
                    for flags in ("_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs",
                                  "_forward_hooks_always_called"):  # fmt: skip
                        getattr(owner, flags, {}).pop(key, None)
            elif callable(value) and not hasattr(value, "__self__") and callable(getattr(type(owner), attr, None)):
                del vars(owner)[attr]
    return obj


def trainable_names(model: nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


def optimizer_coverage(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[list[str], int]:
    """(trainable model parameters the optimizer does not hold, optimizer parameters that
    are not the model's). Both non-empty is the classic 'optimizer built over another
    model' bug; it is measured, never fixed and never stepped."""
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    model_ids = {id(p) for p in model.parameters()}
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in held]
    foreign = sum(1 for group in optimizer.param_groups for p in group["params"] if id(p) not in model_ids)
    return missing, foreign


def copy_with_optimizer(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    default: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
) -> tuple[nn.Module, torch.optim.Optimizer, str]:
    """A copy of the model and an optimizer over the copy's parameters, plus a note on
    which optimizer it is.

    When the user's optimizer holds every trainable parameter, model and optimizer are
    deep-copied together (one memo), so the copy keeps the user's optimizer type, groups,
    hyper-parameters and state. Otherwise the user's optimizer could not train the copy,
    so a fresh one of the same type and defaults is built over it; failing that, ``default``.
    """
    if optimizer is not None:
        missing, _ = optimizer_coverage(model, optimizer)
        if not missing:
            try:
                model_copy, optimizer_copy = copy.deepcopy((model, optimizer))
                detach_watchers(model_copy)
                detach_watchers(optimizer_copy)
                return model_copy, optimizer_copy, f"a copy of the user's {type(optimizer).__name__}"
            except Exception:  # noqa: BLE001 - fall through to a fresh optimizer
                pass
    model_copy = working_copy(model)
    params = [p for p in model_copy.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters (all requires_grad=False)")
    if optimizer is not None:
        try:
            return model_copy, type(optimizer)(params, **optimizer.defaults), (
                f"a fresh {type(optimizer).__name__} with the user's defaults "
                "(the user's optimizer does not hold all the model's parameters)"
            )
        except Exception:  # noqa: BLE001 - exotic optimizer constructors
            pass
    opt = default(params)
    return model_copy, opt, f"nndx's own {type(opt).__name__}"


# --------------------------------------------------------------------------- calling the model


def split_batch(batch: Batch) -> tuple[Any, Any]:
    """``(inputs, targets)`` from a batch, with a clear error for anything else."""
    if isinstance(batch, dict) and {"inputs", "targets"} <= batch.keys():
        return batch["inputs"], batch["targets"]
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise TypeError(
        "batch must be (inputs, targets) — a 2-tuple or a dict with 'inputs' and 'targets'; "
        f"got {type(batch).__name__}" + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
    )


def forward(model: nn.Module, inputs: Any) -> Any:
    """Call the model: a tensor as one argument, a tuple/list as positional arguments, a
    dict as keyword arguments."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def compute_loss(loss_fn: LossFn, output: Any, targets: Any) -> torch.Tensor:
    loss = loss_fn(output, targets)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(f"loss_fn must return a scalar tensor; got {shape} (use reduction='mean')")
    return loss.reshape(())


def iter_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a nested tuple/list/dict (model outputs, inputs)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from iter_tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from iter_tensors(item)


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(map_tensors(o, fn) for o in obj)
    if isinstance(obj, list):
        return [map_tensors(o, fn) for o in obj]
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    return obj


def nonfinite_count(obj: Any) -> int:
    """Non-finite elements over every floating tensor in ``obj``."""
    return sum(int((~torch.isfinite(t)).sum()) for t in iter_tensors(obj) if t.is_floating_point() or t.is_complex())


def first_output(output: Any) -> torch.Tensor | None:
    return next(iter_tensors(output), None)


# --------------------------------------------------------------------------- task


def loss_name(loss_fn: LossFn) -> str:
    """The name reports use for a loss: ``CrossEntropyLoss`` for the module, for
    ``F.cross_entropy`` and for a ``functools.partial`` of either (see :mod:`nndx.vocab`)."""
    fn = getattr(loss_fn, "func", loss_fn)  # functools.partial
    if isinstance(fn, nn.Module):
        return type(fn).__name__
    return vocab.loss_name(getattr(fn, "__name__", type(fn).__name__))


def infer_task(loss_fn: LossFn, targets: Any) -> str | None:
    """'classification' for a classification loss or integer targets, 'regression' for
    floating targets under any other loss, None when there is no telling."""
    if vocab.loss_task(loss_name(loss_fn)) == "classification":
        return "classification"
    target = first_output(targets)
    if target is None:
        return None
    if not target.is_floating_point() and not target.is_complex():
        return "classification"
    return "regression"


def num_classes(loss_fn: LossFn, output: Any) -> int | None:
    """Classes the output can express: its class axis for (log-)softmax losses, 2 for a
    single-logit binary loss."""
    out = first_output(output)
    if out is None or out.dim() == 0:
        return None
    kind = vocab.loss_kind(loss_name(loss_fn))
    if kind is None:
        return None
    if kind.class_axis:
        return int(out.shape[1]) if out.dim() >= 2 else int(out.shape[0])
    if kind.binary:
        return 2 if out.dim() == 1 or out.shape[-1] == 1 else None
    return None


def accuracy(loss_fn: LossFn, output: Any, targets: Any) -> float | None:
    """Share of correct predictions on the batch, or None when the loss does not say how
    to read predictions off the output."""
    out, target = first_output(output), first_output(targets)
    if out is None or target is None:
        return None
    out = out.detach()
    target = target.detach()
    kind = vocab.loss_kind(loss_name(loss_fn))
    if kind is None:
        return None
    if kind.class_axis and out.dim() >= 2:
        predicted = out.argmax(dim=1)
        if target.is_floating_point() and target.shape == out.shape:  # class probabilities as targets
            target = target.argmax(dim=1)
        if predicted.shape != target.shape:
            return None
        return float((predicted == target).float().mean())
    if kind.binary:
        threshold = 0.5 if kind.expects == "probabilities" else 0.0
        if out.numel() != target.numel():
            return None
        predicted = (out > threshold).reshape(-1)
        return float((predicted == (target.reshape(-1) > 0.5)).float().mean())
    return None
