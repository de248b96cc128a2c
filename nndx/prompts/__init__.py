"""Prompts: jinja2 rendering of the debugger prompt and checklist; the LLM client.

    files = nndx.prompts.render(report)          # both Markdown files, from a report
    files = nndx.prompts.render()                # the generic versions
    explanation = nndx.prompts.explain(report)   # LLM if configured, else rule-only
"""

from nndx.prompts.render import OUTPUT_FILES, render, render_explanation, render_prompt

__all__ = ["OUTPUT_FILES", "render", "render_prompt", "render_explanation"]
