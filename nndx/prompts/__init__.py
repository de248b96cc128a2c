"""Prompts: jinja2 rendering of the debugger prompt and checklist; the LLM client."""
