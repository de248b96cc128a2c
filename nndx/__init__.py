"""nndx: diagnose the silent failures of neural-network training.

Public API (imported lazily, so ``import nndx`` and ``nndx.diagnose`` never load torch)::

    report = nndx.probe(model, (x, y), loss_fn)          # active probes on a copy
    found = nndx.lr_find(model, optimizer, loss_fn, loader)  # found.suggestion, .interval, .plot()
    with nndx.Monitor(model, optimizer) as mon: ...      # passive, in your own loop
    data = nndx.check_data(x, y, x_test=xt, y_test=yt)   # data checks
    diagnosis = nndx.diagnose(report)                    # rules: ranked findings
    files = nndx.render(report, diagnosis)               # prompt + checklist (Markdown)
    text = nndx.explain(report)                          # LLM or rule-only explanation
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "DiagnosticReport": "nndx.report",
    "Diagnosis": "nndx.report",
    "Finding": "nndx.report",
    "CauseCode": "nndx.report",
    "NndxError": "nndx.errors",
    "probe": "nndx.collector.probe",
    "lr_find": "nndx.collector.lr_find",
    "Monitor": "nndx.integrations.monitor",
    "watch": "nndx.integrations.monitor",
    "TrainingFailure": "nndx.rules.live",
    "check_data": "nndx.collector.data",
    "diagnose": "nndx.rules",
    "render": "nndx.prompts",
    "explain": "nndx.prompts",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'nndx' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
