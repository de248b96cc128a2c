"""Render the debugger prompt, the checklist and the rule-only explanation.

How to use::

    files = render(report)            # {"prompt-nn-debugger.md": ..., "skill-debug-checklist.md": ...}
    files = render()                  # the generic versions, every checklist item open

The templates are ``.md.j2`` package data in ``nndx/prompts/templates``. The jinja2
environment escapes by default: every ``{{ value }}`` is passed through
``markdown.cell`` (numbers through ``views.text.num``) unless it is ``Markup`` built by
this package (tables, fences), so a template cannot forget to escape user text.
Rendering is deterministic: no clock, no randomness, dict order from the report.
"""

from __future__ import annotations

import functools
from typing import Any

from markupsafe import Markup

from nndx.prompts import checklist, evidence
from nndx.prompts.markdown import cell
from nndx.report import SEVERITY_ORDER, Diagnosis, DiagnosticReport, Finding, Probes
from nndx.views.text import MISSING, num

PROMPT_FILE = "prompt-nn-debugger.md"
CHECKLIST_FILE = "skill-debug-checklist.md"
OUTPUT_FILES = (PROMPT_FILE, CHECKLIST_FILE)


def _finalize(value: Any) -> str:
    if isinstance(value, Markup):
        return str(value)
    if value is None:
        return MISSING
    if isinstance(value, (bool, int, float)):
        return num(value)
    return cell(str(value))


@functools.cache
def _env() -> Any:
    """The template environment, built on first render: importing this package (as the
    ``nndx`` command does for its help) must not load jinja2."""
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("nndx.prompts", "templates"),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        finalize=_finalize,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def _safe(markdown: str) -> Markup | str:
    """Mark Markdown built by ``evidence``/``markdown`` (already escaped) as safe."""
    return Markup(markdown) if markdown else ""


def resolve_diagnosis(report: DiagnosticReport | None, diagnosis: Diagnosis | None) -> Diagnosis | None:
    """The given diagnosis, or the rule engine's when only a report is given."""
    if diagnosis is not None or report is None:
        return diagnosis
    from nndx.rules import diagnose  # imported late: nndx.rules may import prompts-free helpers only

    return diagnose(report)


def _check_types(report: object, diagnosis: object) -> None:
    if report is not None and not isinstance(report, DiagnosticReport):
        raise TypeError(f"report must be a DiagnosticReport, not {type(report).__name__}")
    if diagnosis is not None and not isinstance(diagnosis, Diagnosis):
        raise TypeError(f"diagnosis must be a Diagnosis, not {type(diagnosis).__name__}")


def _finding_views(findings: list[Finding]) -> list[dict[str, Any]]:
    return [{"finding": f, "evidence_table": _safe(evidence.evidence_table(f))} for f in findings]


def _missing_evidence(report: DiagnosticReport) -> list[str]:
    """What this report does not hold, named so the reader cannot mistake it for a pass."""
    missing = []
    if not report.loss_history:
        missing.append("loss history")
    elif not any(split != "train" and points for split, points in report.loss_history.items()):
        missing.append("validation loss")
    if not report.layers:
        missing.append("per-layer activation and gradient statistics")
    if not report.parameters:
        missing.append("per-parameter weight and gradient norms")
    if report.loop is None:
        missing.append("training-loop monitoring (zero_grad, optimizer coverage, learning rate)")
    if report.data is None:
        missing.append("data checks")
    if report.interventions is None:
        missing.append("diagnosis by intervention")
    elif report.interventions.status != "done":
        missing.append(f"diagnosis by intervention ({report.interventions.status})")
    for name, result_type in Probes.result_types().items():
        result = getattr(report.probes, name) if report.probes else None
        if result is None:
            missing.append(f"probe: {result_type.title}")
        elif result.status in ("error", "skipped"):
            missing.append(f"probe: {result_type.title} ({result.status})")
    return missing


def _probe_asks() -> Markup:
    """What the generic prompt asks the reader to paste for each probe."""
    return Markup(", ".join(cell(f"{t.title} ({t.ask})" if t.ask else t.title) for t in Probes.result_types().values()))


def _prompt_context(report: DiagnosticReport | None, diagnosis: Diagnosis | None) -> dict[str, Any]:
    if report is None:
        return {"generic": True, "errors": [], "errors_hidden": 0, "findings": [], "missing": [], "parameter_table": "",
                "probe_asks": _probe_asks()}
    diagnosis = diagnosis or Diagnosis()
    return {
        "generic": False,
        "run_table": _safe(evidence.run_table(report)),
        "model_table": _safe(evidence.model_table(report)),
        "model_layers_table": _safe(evidence.model_layers_table(report)),
        "loop_table": _safe(evidence.loop_table(report)),
        "loss_call_table": _safe(evidence.loss_call_table(report)),
        "data_table": _safe(evidence.data_table(report)),
        "loss_table": _safe(evidence.loss_table(report)),
        "layer_table": _safe(evidence.layer_table(report)),
        "parameter_table": _safe(evidence.parameter_table(report)),
        "probe_table": _safe(evidence.probe_table(report)),
        "intervention_summary": evidence.intervention_summary(report),
        "intervention_table": _safe(evidence.intervention_table(report)),
        "errors": [{**entry, "message_block": Markup(entry["message_block"])} for entry in evidence.error_entries(report)],
        "errors_hidden": max(0, len(report.errors) - evidence.MAX_ERRORS),
        "findings": _finding_views(diagnosis.findings),
        "healthy": diagnosis.healthy,
        "rules_run": diagnosis.rules_run,
        "missing": _missing_evidence(report),
    }


def _checklist_context(report: DiagnosticReport | None, diagnosis: Diagnosis | None) -> dict[str, Any]:
    items = checklist.build_checklist(report, diagnosis)
    counts = {
        "passed": sum(i.status == "passed" for i in items),
        "failed": sum(i.status == "failed" for i in items),
        "not_run": sum(i.status == "not run" for i in items),
    }
    return {
        "generic": report is None,
        "items": items,
        "counts": counts,
        "uncovered": checklist.uncovered_findings(diagnosis),
    }


def render(report: DiagnosticReport | None = None, diagnosis: Diagnosis | None = None) -> dict[str, str]:
    """Render ``prompt-nn-debugger.md`` and ``skill-debug-checklist.md``.

    With a report and no diagnosis, the diagnosis is ``nndx.rules.diagnose(report)``.
    With neither, the generic versions (every checklist item "not run"). A diagnosis
    without its report is a ``ValueError``: findings without their evidence would be
    claims without support.
    """
    _check_types(report, diagnosis)
    if report is None and diagnosis is not None:
        raise ValueError("render() got a diagnosis without its report; pass both, or neither for the generic files")
    diagnosis = resolve_diagnosis(report, diagnosis)
    return {
        PROMPT_FILE: _env().get_template(f"{PROMPT_FILE}.j2").render(_prompt_context(report, diagnosis)),
        CHECKLIST_FILE: _env().get_template(f"{CHECKLIST_FILE}.j2").render(_checklist_context(report, diagnosis)),
    }


def render_prompt(report: DiagnosticReport | None = None, diagnosis: Diagnosis | None = None) -> str:
    """Only the debugger prompt (what ``explain`` sends to the LLM)."""
    return render(report, diagnosis)[PROMPT_FILE]


def render_explanation(diagnosis: Diagnosis, reason: str, report: DiagnosticReport | None = None) -> str:
    """The rule-only explanation of a diagnosis, saying why the LLM was not used; with
    the report, it also names the evidence that was not measured."""
    _check_types(report, diagnosis)
    alarms = [f for f in diagnosis.findings if SEVERITY_ORDER[f.severity] >= SEVERITY_ORDER["warning"]]
    root = next((f for f in alarms if f.explained_by is None), alarms[0] if alarms else None)
    explained = [f for f in alarms if root is not None and f is not root and f.explained_by == root.rule_id]
    others = [f for f in alarms if f is not root and f not in explained]
    context = {
        "reason": reason,
        "rules_run": diagnosis.rules_run,
        "root": _finding_views([root])[0] if root else None,
        "explained": explained,
        "others": others,
        "context": [f for f in diagnosis.findings if f not in alarms],
        "missing": _missing_evidence(report) if report is not None else [],
    }
    return _env().get_template("explanation.md.j2").render(context)


__all__ = ["render", "render_prompt", "render_explanation", "resolve_diagnosis", "OUTPUT_FILES"]
