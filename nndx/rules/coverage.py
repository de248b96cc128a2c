"""Coverage rules (NNDX0xx): what nndx could not measure.

An empty diagnosis must mean "measured, and healthy", never "measured nothing". When the
report holds no evidence — every probe errored or was skipped, no loss was logged, no
statistic recorded — these rules say so, so that ``nndx check`` fails instead of passing.
"""

from __future__ import annotations

from nndx.report import CauseCode as C
from nndx.report import DiagnosticReport, ProbeResult
from nndx.rules.engine import Hit, rule


def _probe_results(report: DiagnosticReport) -> dict[str, ProbeResult]:
    if report.probes is None:
        return {}
    results = {name: getattr(report.probes, name) for name in type(report.probes).model_fields}
    return {name: result for name, result in results.items() if result is not None}


def _measured(report: DiagnosticReport) -> list[str]:
    """The kinds of evidence the report holds."""
    kinds = []
    if any(report.loss_history.values()):
        kinds.append("loss history")
    if report.layers:
        kinds.append("layer statistics")
    if report.parameters:
        kinds.append("parameter statistics")
    if any(result.status in ("passed", "failed") for result in _probe_results(report).values()):
        kinds.append("probes")
    loop = report.loop
    if loop is not None and (loop.steps or loop.backward_calls or loop.loss_calls):
        kinds.append("training loop")
    if report.data is not None and (report.data.train is not None or report.data.test is not None):
        kinds.append("data")
    return kinds


@rule(
    "NNDX001",
    C.NOTHING_MEASURED,
    "warning",
    "Nothing was measured: this report cannot say the run is healthy",
    detects="A report with no loss history, no layer or parameter statistics, no probe that passed or "
    "failed, no training-loop counts and no data statistics.",
    why="An empty diagnosis reads as 'healthy'. When every probe errored or was skipped and nothing "
    "else was recorded, nndx saw nothing, and saying nothing would be a silent pass.",
    fix="Read the recorded errors (report.errors, each probe's message): give probe() a batch it can call "
    "the model with and the model's loss, run the Monitor around the training loop and log the loss "
    "(mon.log(loss)), or pass data=(x, y) for the data checks.",
)
def nothing_measured(report: DiagnosticReport) -> Hit | None:
    if _measured(report):
        return None
    not_run = {name: result.status for name, result in _probe_results(report).items()}
    return Hit(
        symptom="the report holds no measurement",
        evidence={
            "probes_not_run": [f"{name}: {status}" for name, status in sorted(not_run.items())],
            "recorded_errors": len(report.errors),
            "first_error": f"{report.errors[0].source}: {report.errors[0].type}: {report.errors[0].message}"[:300]
            if report.errors
            else None,
        },
        score=1.0,
    )


@rule(
    "NNDX002",
    C.NOTHING_MEASURED,
    "info",
    "Some probes could not run",
    detects="Probes whose status is 'error' while other evidence exists.",
    why="What those probes would have checked is unknown, not healthy: the diagnosis is partial.",
    fix="Read each probe's message; the NNDX7xx rules name the cause of errors they recognise.",
)
def probes_not_run(report: DiagnosticReport) -> Hit | None:
    errored = {name: result for name, result in _probe_results(report).items() if result.status == "error"}
    if not errored or not _measured(report):
        return None
    return Hit(
        symptom=f"{len(errored)} probe{'s' if len(errored) != 1 else ''} could not run: {', '.join(sorted(errored))}",
        evidence={"probes": [f"{name}: {(result.message or '')[:200]}" for name, result in sorted(errored.items())]},
        score=0.5,
    )
