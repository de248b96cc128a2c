"""Sub-commands of the prompts subpackage; see nndx/cli.py.

    nndx render [REPORT.json] --out outputs/   write prompt-nn-debugger.md and skill-debug-checklist.md
    nndx explain REPORT.json [--offline]       print the LLM's (or the rule-only) explanation

Exit status: 0 done, 2 unreadable or invalid report, invalid NNDX_LLM_* settings, or an
output folder that cannot be written (checked before rendering; nndx/cli.py prints the error). ``explain`` exits 0 on the rule-only fallback too:
the fallback is an answer, and its first line says why the LLM was not used.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nndx.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``render`` and ``explain`` to the ``nndx`` parser."""
    render = subparsers.add_parser(
        "render",
        help="write the debugger prompt and checklist (generic without a report)",
        description="Render prompt-nn-debugger.md and skill-debug-checklist.md from a report "
        "(diagnosed by the rule engine), or their generic versions when no report is given.",
    )
    render.add_argument(
        "report", nargs="?", help="a DiagnosticReport JSON file ('-' for stdin); omit for the generic files"
    )
    render.add_argument("--out", default="outputs", help="folder to write the files into (default: outputs/)")
    render.set_defaults(handler=_render, outputs={"out": "folder"})

    explain = subparsers.add_parser(
        "explain",
        help="explain a report with an LLM, or rule-only",
        description="Send the rendered prompt to the OpenAI-compatible endpoint in NNDX_LLM_BASE_URL "
        "(model NNDX_LLM_MODEL, key NNDX_LLM_API_KEY, total deadline NNDX_LLM_TIMEOUT seconds) and print "
        "the answer. Without an endpoint, with --offline, or when the endpoint fails, print the rule-only "
        "explanation, which says why the LLM was not used.",
    )
    explain.add_argument("report", help="a DiagnosticReport JSON file ('-' for stdin)")
    explain.add_argument("--offline", action="store_true", help="never call the LLM: rule-only explanation")
    explain.add_argument(
        "--json", action="store_true", help="print the Explanation as JSON (text, source, reason, model)"
    )
    explain.set_defaults(handler=_explain)


def _render(args: argparse.Namespace) -> int:
    from nndx.prompts.render import render
    from nndx.rules.cli import load_report

    report = load_report(args.report) if args.report is not None else None
    files = render(report)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text, encoding="utf-8", newline="\n")
    except OSError as error:
        raise UsageError(f"cannot write to {out}: {error.strerror or error}") from None
    for name in files:
        print(out / name)
    return 0


def _explain(args: argparse.Namespace) -> int:
    from nndx.prompts.explain import explain
    from nndx.prompts.settings import LLMSettings
    from nndx.rules.cli import load_report

    report = load_report(args.report)
    settings = LLMSettings.from_env()
    if settings.configured and not args.offline:
        print(f"nndx explain: asking {settings.model} (deadline {settings.timeout:g}s)…", file=sys.stderr)
    explanation = explain(report, offline=args.offline, settings=settings)
    print(explanation.model_dump_json(indent=2) if args.json else explanation.text.rstrip("\n"))
    return 0
