"""``explain``: an LLM's written explanation of a report, or the rule-only one.

How to use::

    explanation = explain(report)                 # settings from NNDX_LLM_* variables
    explanation = explain(report, offline=True)   # never touches the network
    print(explanation.text)

The rule engine is the source of truth; the LLM only puts its findings and the
measured evidence into words. With no endpoint configured, ``offline=True``, or an
endpoint that fails (timeout, 5xx, 429, malformed JSON, empty choices), the answer is
the rule-only explanation rendered from the diagnosis, and ``reason`` says why.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from nndx.prompts.llm import LLMUnavailable, complete
from nndx.prompts.render import render_explanation, render_prompt, resolve_diagnosis
from nndx.prompts.settings import ENV_BASE_URL, ENV_MODEL, LLMSettings
from nndx.report import Diagnosis, DiagnosticReport


class Explanation(BaseModel):
    """What ``explain`` returns: the text and where it came from."""

    text: str = Field(description="Markdown")
    source: Literal["llm", "rules"]
    reason: str | None = Field(None, description="why the LLM was not used; None when it was")
    model: str | None = Field(None, description="the LLM model that wrote the text")
    attempts: int = Field(0, ge=0, description="HTTP requests made to the LLM endpoint")


def _rule_only(report: DiagnosticReport, diagnosis: Diagnosis, reason: str, attempts: int = 0) -> Explanation:
    text = render_explanation(diagnosis, reason, report)
    return Explanation(text=text, source="rules", reason=reason, attempts=attempts)


def explain(
    report: DiagnosticReport,
    diagnosis: Diagnosis | None = None,
    *,
    offline: bool = False,
    settings: LLMSettings | None = None,
) -> Explanation:
    """Explain ``report`` (diagnosed with ``nndx.rules.diagnose`` unless ``diagnosis``
    is given). Never raises for an LLM failure; raises ``SettingsError`` for invalid
    ``NNDX_LLM_*`` variables and ``TypeError`` for a report of the wrong type."""
    if not isinstance(report, DiagnosticReport):
        raise TypeError(f"report must be a DiagnosticReport, not {type(report).__name__}")
    diagnosis = resolve_diagnosis(report, diagnosis)
    assert diagnosis is not None
    if offline:
        return _rule_only(report, diagnosis, "offline mode was requested")
    settings = settings if settings is not None else LLMSettings.from_env()
    if not settings.base_url:
        return _rule_only(report, diagnosis, f"no LLM endpoint is configured ({ENV_BASE_URL} is not set)")
    if not settings.model:
        return _rule_only(report, diagnosis, f"no LLM model is configured ({ENV_MODEL} is not set)")
    try:
        text, attempts = complete(render_prompt(report, diagnosis), settings)
    except LLMUnavailable as exc:
        return _rule_only(report, diagnosis, exc.reason, exc.attempts)
    return Explanation(text=text, source="llm", model=settings.model, attempts=attempts)
