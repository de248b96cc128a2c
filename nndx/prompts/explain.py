"""``explain``: an LLM's written explanation of a report, or the rule-only one.

How to use::

    explanation = explain(report)                 # settings from NNDX_LLM_* variables
    explanation = explain(report, offline=True)   # never touches the network
    print(explanation.text)
    explanation = await explain_async(report, slots=asyncio.Semaphore(8))  # in a service

The rule engine is the source of truth; the LLM only puts its findings and the
measured evidence into words. With no endpoint configured, ``offline=True``, or an
endpoint that fails (timeout, 5xx, 429, malformed JSON, empty choices), the answer is
the rule-only explanation rendered from the diagnosis, and ``reason`` says why.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from pydantic import BaseModel, Field

from nndx.prompts.llm import LLMUnavailable, complete_async, run_blocking
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
    settings = settings if settings is not None or offline else LLMSettings.from_env()
    return run_blocking(lambda: explain_async(report, diagnosis, offline=offline, settings=settings))


async def _diagnosed(report: DiagnosticReport, diagnosis: Diagnosis | None) -> Diagnosis:
    """The given diagnosis, or the rule engine's, run in a worker thread."""
    if diagnosis is None:
        diagnosis = await asyncio.to_thread(resolve_diagnosis, report, None)
    assert diagnosis is not None
    return diagnosis


async def explain_async(
    report: DiagnosticReport,
    diagnosis: Diagnosis | None = None,
    *,
    offline: bool = False,
    settings: LLMSettings | None = None,
    slots: asyncio.Semaphore | None = None,
    budget: float | None = None,
) -> Explanation:
    """:func:`explain` for an event loop: the LLM call holds no thread while it waits,
    and the prompt is rendered in a worker thread.

    ``slots`` bounds the LLM calls in flight (the service shares one semaphore between
    its requests). Waiting for a slot counts against the deadline: a request that gets
    none in time is answered rule-only, like any other LLM failure. ``budget``: the
    seconds left of the deadline (default ``settings.timeout``; the service passes
    what its request has left).
    """
    if not isinstance(report, DiagnosticReport):
        raise TypeError(f"report must be a DiagnosticReport, not {type(report).__name__}")
    reason = None
    if offline:
        reason = "offline mode was requested"
    else:
        settings = settings if settings is not None else LLMSettings.from_env()
        if not settings.base_url:
            reason = f"no LLM endpoint is configured ({ENV_BASE_URL} is not set)"
        elif not settings.model:
            reason = f"no LLM model is configured ({ENV_MODEL} is not set)"
    if reason is not None:
        return _rule_only(report, await _diagnosed(report, diagnosis), reason)
    assert settings is not None
    got_slot = False
    attempts = 0

    async def ask() -> str:
        """Everything up to the LLM's answer, so that the deadline covers all of it:
        the diagnosis and prompt (in a worker thread), the wait for a slot, the call."""
        nonlocal diagnosis, got_slot, attempts
        diagnosis = await _diagnosed(report, diagnosis)
        prompt = await asyncio.to_thread(render_prompt, report, diagnosis)
        if slots is None:
            text, attempts = await complete_async(prompt, settings)
            return text
        async with slots:
            got_slot = True
            text, attempts = await complete_async(prompt, settings)
            return text

    try:
        text = await asyncio.wait_for(ask(), settings.timeout if budget is None else max(0.0, budget))
    except LLMUnavailable as exc:
        reason, attempts = exc.reason, exc.attempts
    except asyncio.TimeoutError:
        reason = (f"no complete answer within the {settings.timeout:g}s deadline" if got_slot or slots is None else
                  f"the LLM was busy: no call slot came free within the {settings.timeout:g}s deadline")
    if reason is not None:
        # on the loop: the rule-only text is cheap, and a thread hop each for many
        # explains failing together would delay their answers past the deadline
        return _rule_only(report, await _diagnosed(report, diagnosis), reason, attempts)
    return Explanation(text=text, source="llm", model=settings.model, attempts=attempts)
