"""The active probes: one module per probe, each exporting one ``SPEC``.

How to use::

    from nndx.collector.probes import specs
    [spec.name for spec in specs()]          # cheap first: 'hooks', 'nan_origin', ...
    nndx.probe(model, batch, loss_fn)         # runs them all (nndx.collector.probe)

Each probe reads like torch-lr-finder: one file, one public function taking
``(model, batch, loss_fn, *, options...)`` (a data probe: ``(x, y, *, options...)``),
one result model, no global state, and the user's model, optimizer and RNG untouched
(it works on a copy inside ``preserved_rng``).

How to add a probe: write ``nndx/collector/probes/NAME.py`` with its function and
``SPEC = ProbeSpec(...)``; add its result model to ``nndx/report.py`` as a field of
``Probes`` (the model's ``title``, ``checklist`` item and ``summary`` are what the prompt
and the checklist show); write its rule in ``nndx/rules/probes.py`` and its test. The
runner, the CLI, the prompt, the checklist and the error rules find it from there:
the modules of this package are discovered, not listed.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from nndx.report import DiagnosticReport, ProbeResult, Probes

# keyword arguments the runner passes itself; never a user option
INJECTED = frozenset({"optimizer"})


@dataclass(frozen=True)
class ProbeSpec:
    """What the runner needs to know about a probe.

    ``name``: the field of ``report.probes`` the result goes to (and the key of the
    probe's options in ``nndx.probe(..., name={...})``). ``function``: the probe itself;
    its keyword-only arguments are its options. ``result``: its result model, or None
    when ``record`` puts the outcome elsewhere in the report. ``order``: cheap probes
    first. ``needs``: ``"batch"`` (model, batch, loss) or ``"data"`` (the training split
    given as ``data=``). ``needs_finite_parameters``: meaningless on a model whose weights
    are already NaN/Inf (skipped there). ``trains``: a trainability probe, run from the
    initial state when one is known and skipped on a model that has already trained.
    ``train_mode``: measures a training step (the layer statistics' gradients), so it runs
    in train mode, as the user's loop does, even on a model left in eval mode; a
    trainability probe always does.
    ``record``: puts the outcome somewhere other than ``report.probes`` and returns the
    status to show; ``record_status``: where such a probe says that it was skipped or
    failed (``report`` and the ``status`` and ``message``).
    """

    name: str
    title: str
    function: Callable[..., Any]
    result: type[ProbeResult] | None = None
    order: int = 100
    needs: Literal["batch", "data"] = "batch"
    needs_finite_parameters: bool = False
    trains: bool = False
    train_mode: bool = False
    record: Callable[[DiagnosticReport, Any], str] | None = None
    record_status: Callable[[DiagnosticReport, Literal["error", "skipped"], str], None] | None = None

    @property
    def options(self) -> dict[str, Any]:
        """The probe's options and their defaults."""
        return {p.name: p.default for p in inspect.signature(self.function).parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in INJECTED}  # fmt: skip

    def check_options(self, given: object) -> None:
        """A TypeError naming what is wrong, before anything runs: a misspelt option must
        not become a probe 'error'."""
        if not isinstance(given, Mapping):
            raise TypeError(f"options for {self.name} must be a dict of keyword arguments, got {type(given).__name__}")
        wrong = sorted(set(given) - set(self.options))
        if wrong:
            raise TypeError(f"{self.name} has no option(s) {wrong}; it takes {list(self.options)}")

    def call(self, model: Any, batch: Any, loss_fn: Any, optimizer: Any, data: Any, options: Mapping[str, Any]) -> Any:
        """Run the probe with what it takes of the runner's inputs."""
        if self.needs == "data":
            return self.function(data[0], data[1], **options)
        parameters = inspect.signature(self.function).parameters
        args = (model, batch, loss_fn) if "loss_fn" in parameters else (model, batch)
        extra = {"optimizer": optimizer} if "optimizer" in parameters else {}
        return self.function(*args, **options, **extra)

    def store(self, report: DiagnosticReport, outcome: Any) -> str:
        """Put the outcome into the report; returns the status to show."""
        if self.record is not None:
            return self.record(report, outcome)
        report.probes = _with(report, self.name, outcome)
        return outcome.status

    def store_status(self, report: DiagnosticReport, status: Literal["error", "skipped"], message: str) -> None:
        """Record that the probe did not run to its end (a probe without a result model
        has nowhere to say so but ``report.errors``, which the runner fills)."""
        if self.result is not None:
            report.probes = _with(report, self.name, self.result(status=status, message=message))
        elif self.record_status is not None:
            self.record_status(report, status, message)


def _with(report: DiagnosticReport, name: str, result: ProbeResult) -> Probes:
    return (report.probes or Probes()).model_copy(update={name: result})


@functools.cache
def specs() -> tuple[ProbeSpec, ...]:
    """Every probe of this package, cheap first (by ``order``, then name)."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        spec = getattr(importlib.import_module(f"{__name__}.{info.name}"), "SPEC", None)
        if not isinstance(spec, ProbeSpec):
            raise TypeError(f"{__name__}.{info.name} exports no SPEC (a ProbeSpec)")
        found.append(spec)
    return tuple(sorted(found, key=lambda s: (s.order, s.name)))


__all__ = ["ProbeSpec", "specs"]
