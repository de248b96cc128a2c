"""How the Monitor's clock hears the loop where torch has no hook for it: gradient
resets (a patched ``zero_grad``), the end of a backward pass (an autograd engine
callback) and, in loops without an optimizer, parameter updates made by hand."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from nndx.collector.stats import flat_sample


class Hooks:
    """Every hook and wrapper a Monitor attached, removed together; what could not be
    attached (a scripted model, say) is kept as a limitation, never raised."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.patched: list[tuple[object, Any, Any]] = []
        self.limitations: list[str] = []

    def add(self, what: str, attach: Callable[[], list[Any]]) -> None:
        try:
            self.handles.extend(attach())
        except Exception as exc:  # noqa: BLE001 - a limitation of this run, not the user's crash
            self.limitations.append(f"{what}: not watched ({type(exc).__name__}: {exc})")

    def patch_zero_grad(self, owner: object, monitor: Any, callback: Callable[[], None]) -> None:
        """Make ``owner.zero_grad(...)`` (an optimizer or a module) call ``callback``
        first. The wrapper is an instance attribute shadowing the class method; it
        remembers the one it shadowed (``_nndx_previous``: another Monitor's) so that
        Monitors closed in any order unwind cleanly."""
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
        self.patched.append((owner, previous, zero_grad))

    def patch_clip_grad_norm(self, monitor: Any, callback: Callable[[Any, Any], None]) -> None:
        """Make ``torch.nn.utils.clip_grad_norm_`` tell ``callback(total_norm, max_norm)``
        after it clipped. For loops without an optimizer only: there nothing else marks the
        moment between clipping and the gradients' reset (``p.grad = None``). A module
        attribute, so a name imported before the Monitor started is not seen; restored by
        :meth:`remove` (a wrapper of a closed Monitor passes through)."""
        module = torch.nn.utils
        original = module.clip_grad_norm_

        @functools.wraps(original)
        def clip_grad_norm_(parameters: Any, max_norm: Any, *args: Any, **kwargs: Any) -> Any:
            total = original(parameters, max_norm, *args, **kwargs)
            if not monitor.closed:
                callback(total, max_norm)
            return total

        clip_grad_norm_._nndx_monitor = monitor  # type: ignore[attr-defined]
        clip_grad_norm_._nndx_previous = original  # type: ignore[attr-defined]
        module.clip_grad_norm_ = clip_grad_norm_
        self.handles.append(_Restore(module, "clip_grad_norm_", clip_grad_norm_, original))

    def remove(self) -> None:
        """Remove every hook and unwrap ``zero_grad``: the class method (or the next
        live Monitor's wrapper) is back. A wrapper patched over ours stays; ours then
        passes through."""
        for handle in self.handles:
            handle.remove()
        for owner, previous, wrapper in reversed(self.patched):
            if owner.__dict__.get("zero_grad") is not wrapper:
                continue
            previous = _live(previous)
            if previous is None:
                owner.__dict__.pop("zero_grad", None)
            else:
                owner.__dict__["zero_grad"] = previous
        self.handles.clear()
        self.patched.clear()


class _Restore:
    """A handle that puts ``module.name`` back to what ``wrapper`` wrapped, if ``wrapper`` is
    still there, skipping the wrappers of Monitors closed meanwhile (closed out of order)."""

    def __init__(self, module: Any, name: str, wrapper: Any, original: Any) -> None:
        self.module, self.name, self.wrapper, self.original = module, name, wrapper, original

    def remove(self) -> None:
        if getattr(self.module, self.name) is self.wrapper:
            setattr(self.module, self.name, _live(self.original))


def _live(previous: Any) -> Any:
    """``previous`` past the wrappers of Monitors closed meanwhile (closed out of order)."""
    while getattr(previous, "_nndx_monitor", None) is not None and previous._nndx_monitor.closed:
        previous = previous._nndx_previous
    return previous


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


class UpdateDetector:
    """For loops without an optimizer: were the parameters updated since the last
    backward pass? An update made under ``torch.no_grad()`` moves the parameters'
    version counters; one made through ``p.data`` (as the PyTorch word-language-model
    example does) does not, so a few elements of each parameter (``SAMPLE`` spread
    blocks) are compared as well. :meth:`arm` at the end of each backward pass,
    :meth:`updated` at the next boundary (a forward, a gradient reset, a backward pass);
    one host read per step in such loops."""

    SAMPLE = 64

    def __init__(self, params: list[tuple[str, torch.Tensor]], errors: Any) -> None:
        self.params = [p for _, p in params]
        self.errors = errors  # an ErrorGuard: a failing check is recorded, and says "no update"
        self._versions: list[int] = []
        self._sample: torch.Tensor | None = None

    def _take(self) -> torch.Tensor | None:
        if not self.params:
            return None
        with torch.no_grad():
            return torch.cat([flat_sample(p, self.SAMPLE).reshape(-1).double() for p in self.params])

    def arm(self) -> None:
        self._versions = [p._version for p in self.params]
        self._sample = self._take()

    def updated(self) -> bool:
        try:
            return self._updated()
        except Exception as exc:  # noqa: BLE001
            self.errors.record("update_check", exc)
            return False

    def _updated(self) -> bool:
        if self._sample is None:
            return False
        if [p._version for p in self.params] != self._versions:
            return True
        now, before = self._take(), self._sample
        differs = (now != before) & ~(now.isnan() & before.isnan())  # a NaN that stays NaN is no update
        return bool(differs.any())
