"""How the Monitor's clock hears the loop where torch has no hook for it: gradient
resets (a patched ``zero_grad``) and the end of a backward pass (an autograd engine
callback)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch


def patch_zero_grad(owner: object, monitor: Any, callback: Callable[[], None]) -> tuple:
    """Make ``owner.zero_grad(...)`` (an optimizer or a module) call ``callback`` first.
    The wrapper is an instance attribute shadowing the class method; it remembers the
    one it shadowed (``_nndx_previous``: another Monitor's) so that Monitors closed in any
    order unwind cleanly. Returns what :func:`unpatch_zero_grad` needs."""
    previous = owner.__dict__.get("zero_grad")
    original = owner.zero_grad

    @functools.wraps(original)
    def zero_grad(*args: Any, **kwargs: Any) -> Any:
        if not monitor.closed:
            callback()
        return original(*args, **kwargs)

    zero_grad._nndx_monitor = monitor  # type: ignore[attr-defined]
    zero_grad._nndx_previous = previous  # type: ignore[attr-defined]
    owner.__dict__["zero_grad"] = zero_grad
    return owner, previous, zero_grad


def unpatch_zero_grad(owner: object, previous: Any, wrapper: Any) -> None:
    """Undo :func:`patch_zero_grad`: the class method (or the next live Monitor's
    wrapper) is back. A wrapper patched over ours stays; ours then passes through."""
    if owner.__dict__.get("zero_grad") is not wrapper:
        return
    # skip wrappers of Monitors closed meanwhile (closed out of order)
    while getattr(previous, "_nndx_monitor", None) is not None and previous._nndx_monitor.closed:
        previous = previous._nndx_previous
    if previous is None:
        owner.__dict__.pop("zero_grad", None)
    else:
        owner.__dict__["zero_grad"] = previous


class BackwardPasses:
    """Tells the start and the end of each backward pass that reaches the watched
    parameters, from their gradient hooks: the first hook of a pass (by the autograd
    graph task) is its start; a callback queued then runs when the pass ends."""

    def __init__(self, on_start: Callable[[], None], on_end: Callable[[], None]) -> None:
        self.on_start, self.on_end = on_start, on_end
        self._task: int | None = None

    def parameter_hook(self, _grad: torch.Tensor) -> None:
        task = torch._C._current_graph_task_id() if hasattr(torch._C, "_current_graph_task_id") else None
        if self._task is not None and (task is None or task == self._task):
            return
        self._task = task if task is not None else -1
        self.on_start()
        # The engine runs queued callbacks in order when the backward pass ends. Queue
        # from inside a callback so ours runs after every callback queued during the
        # pass (DDP's gradient averaging): we then see the gradients the step will see.
        engine = torch.autograd.Variable._execution_engine
        engine.queue_callback(lambda: engine.queue_callback(self._ended))

    def _ended(self) -> None:
        self._task = None
        self.on_end()
