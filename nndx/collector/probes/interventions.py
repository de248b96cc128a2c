"""Diagnosis by intervention as a probe: ``nndx.probe`` runs it last, within a time budget.

How to use::

    report = nndx.probe(model, (x, y), loss_fn, optimizer=optimizer)      # runs it by default
    report.interventions                                                  # Interventions
    nndx.probe(..., interventions={"budget_seconds": 60, "steps": 200})   # its options
    nndx.probe(..., interventions={"budget_seconds": 0})                  # turned off: nothing runs
    nndx.probe(..., probes=[n for n in nndx.collector.probe.PROBES if n != "interventions"])  # left out

The baseline (a copy of the user's setup trained ``steps`` steps on the batch with a
copy of the user's optimizer) is all a healthy setup costs: remedies run only when it
fails to learn. See :mod:`nndx.collector.interventions` for the remedies and how each
is judged. It is a trainability probe: it runs from the initial state when one is known
(``initial_state=``, the Monitor's snapshot) and is skipped on a model the Monitor saw
trained without one, where "which remedy lets it learn" would measure training already
done. Candidates are chosen from the model, the loss and the batch alone, not from the
other probes' results, so it says the same whichever probes ran before it.

The outcome goes to ``report.interventions`` (not ``report.probes``): the rules weigh
every finding by it (``nndx.rules.engine.confirm``) and name a confirmed cause no other
rule saw (NNDX801-808).
"""

from __future__ import annotations

from nndx.collector.interventions import DEFAULT_BUDGET_SECONDS, interventions
from nndx.collector.probes import ProbeSpec
from nndx.report import DiagnosticReport, Interventions


def _record(report: DiagnosticReport, outcome: Interventions) -> str:
    report.interventions = outcome
    confirmed = [r.cause for r in outcome.results if r.status == "confirmed"]
    if confirmed:
        return "confirmed: " + ", ".join(confirmed)
    return "no remedy confirmed" if outcome.results else "no remedy run"


def _record_status(report: DiagnosticReport, status: str, message: str) -> None:
    report.interventions = Interventions(status=status, message=message, budget_seconds=None)


SPEC = ProbeSpec(name="interventions", title="diagnosis by intervention", function=interventions, order=1000,
                 needs_finite_parameters=True, trains=True, record=_record, record_status=_record_status)  # fmt: skip

__all__ = ["DEFAULT_BUDGET_SECONDS", "SPEC"]
