"""The five ways a user attaches nndx to training, each through the public API only.

- ``wrapped``: ``with nndx.Monitor(model, optimizer, loss_fn=...)``, the loop calls
  ``mon.loss_fn``; then ``nndx.probe(..., monitor=mon, data=...)`` and ``nndx.diagnose``.
- ``own_loss``: the same, but the loop calls its own loss (most loops do).
- ``preflight``: ``nndx.probe(model, batch, loss_fn, optimizer=..., data=...)`` before
  training, no Monitor.
- ``lightning``: ``nndx.integrations.lightning.NndxCallback(preflight=True, loss_fn=...)``
  on a Lightning Trainer; the diagnosis of ``callback.report``.
- ``manual``: a loop with hand-written updates and no optimizer object,
  ``nndx.Monitor(model, every=...)`` (no optimizer to give it), then ``nndx.probe``.

What nndx raises is a result (``nndx_error``: the case is a miss, the message says
where); what the user's loop raises because of the bug is recorded as
``training_error`` and the diagnosis goes on, as a user debugging a crash would.
"""

from __future__ import annotations

import tempfile
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import nndx

from . import lit
from .training import Built, build, data_tuple, first_batch, manual_loop, torch_loop

STYLES = ("wrapped", "own_loss", "preflight", "lightning", "manual")
LOOP_KIND = {"wrapped": "torch", "own_loss": "torch", "preflight": "torch", "lightning": "lightning", "manual": "manual"}
MONITOR_EVERY = 10  # as the README's example


@dataclass
class StyleResult:
    report: Any = None  # nndx.DiagnosticReport
    diagnosis: Any = None  # nndx.Diagnosis
    nndx_error: str | None = None
    training_error: str | None = None


class NndxRaised(Exception):
    """An nndx call raised: the case is a miss with this error."""


def _describe(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = next((f"{f.filename.split('/nndx/')[-1]}:{f.lineno}" for f in reversed(frames) if "/nndx/" in f.filename), "")
    return f"{type(exc).__name__}: {str(exc)[:300]}" + (f" (at nndx/{where})" if where else "")


def call_nndx(what: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - nndx raising is the case's result
        raise NndxRaised(f"{what} raised {_describe(exc)}") from exc


def _train(loop: Callable[[], Any]) -> str | None:
    try:
        loop()
    except Exception as exc:  # noqa: BLE001 - the user's loop raising (an in-place op...) is part of the case
        return _describe(exc)
    return None


def _probe_and_diagnose(b: Built, result: StyleResult, **kwargs: Any) -> None:
    result.report = call_nndx("nndx.probe", nndx.probe, b.model, first_batch(b), b.loss_fn, data=data_tuple(b), **kwargs)
    result.diagnosis = call_nndx("nndx.diagnose", nndx.diagnose, result.report)


def _watched(mon: Any, result: StyleResult, loop: Callable[[], Any]) -> None:
    """The loop inside ``with mon:``, as the README writes it (the Monitor then keeps the
    loop's own exception as evidence)."""

    def watched_loop() -> None:
        with mon:
            loop()

    try:
        result.training_error = _train(watched_loop)
    finally:
        call_nndx("Monitor.close", mon.close)


def wrapped(b: Built, result: StyleResult) -> None:
    mon = call_nndx("nndx.Monitor", nndx.Monitor, b.model, b.optimizer, every=MONITOR_EVERY, loss_fn=b.loss_fn)
    _watched(mon, result, lambda: torch_loop(b, mon.loss_fn, mon))
    _probe_and_diagnose(b, result, optimizer=b.optimizer, monitor=mon)


def own_loss(b: Built, result: StyleResult) -> None:
    mon = call_nndx("nndx.Monitor", nndx.Monitor, b.model, b.optimizer, every=MONITOR_EVERY)
    _watched(mon, result, lambda: torch_loop(b, b.loss_fn, mon))
    _probe_and_diagnose(b, result, optimizer=b.optimizer, monitor=mon)


def preflight(b: Built, result: StyleResult) -> None:
    _probe_and_diagnose(b, result, optimizer=b.optimizer)


def manual(b: Built, result: StyleResult) -> None:
    mon = call_nndx("nndx.Monitor", nndx.Monitor, b.model, every=MONITOR_EVERY)  # no optimizer object to give
    _watched(mon, result, lambda: manual_loop(b, b.loss_fn, mon))
    _probe_and_diagnose(b, result, monitor=mon)


def lightning(b: Built, result: StyleResult) -> None:
    from nndx.integrations.lightning import NndxCallback

    with tempfile.TemporaryDirectory() as directory:
        callback = call_nndx("NndxCallback", NndxCallback, every=MONITOR_EVERY, loss_fn=b.loss_fn, preflight=True,
                             save_dir=directory)  # fmt: skip
        result.training_error = lit.fit(b, [callback]).crashed
    if callback.report is None:
        raise NndxRaised("NndxCallback produced no report")
    result.report = callback.report
    result.diagnosis = call_nndx("nndx.diagnose", nndx.diagnose, result.report)


RUNNERS: dict[str, Callable[[Built, StyleResult], None]] = {
    "wrapped": wrapped, "own_loss": own_loss, "preflight": preflight, "lightning": lightning, "manual": manual,
}  # fmt: skip


def run(style: str, spec: Any) -> StyleResult:
    """Run ``spec`` under ``style``; an nndx exception becomes ``nndx_error``."""
    b = build(spec, optimizer=LOOP_KIND[style] == "torch")
    result = StyleResult()
    try:
        RUNNERS[style](b, result)
    except NndxRaised as exc:
        result.nndx_error = str(exc)
    return result
