"""Prompts: jinja2 rendering of the debugger prompt and checklist; the LLM client.

    files = nndx.prompts.render(report)          # both Markdown files, from a report
    files = nndx.prompts.render()                # the generic versions
    explanation = nndx.prompts.explain(report)   # LLM if configured, else rule-only

LLM settings come from NNDX_LLM_BASE_URL, NNDX_LLM_MODEL, NNDX_LLM_API_KEY,
NNDX_LLM_TIMEOUT and NNDX_LLM_STREAM (see ``nndx.prompts.settings``).
"""

from nndx.prompts.explain import Explanation, explain, explain_async
from nndx.prompts.llm import LLMUnavailable
from nndx.prompts.render import OUTPUT_FILES, render, render_explanation, render_prompt
from nndx.prompts.settings import LLMSettings, SettingsError

__all__ = [
    "OUTPUT_FILES",
    "Explanation",
    "LLMSettings",
    "LLMUnavailable",
    "SettingsError",
    "explain",
    "explain_async",
    "render",
    "render_explanation",
    "render_prompt",
]
