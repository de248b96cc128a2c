"""The ``nndx`` command. Each subpackage registers its own sub-commands in its
``cli.py`` (``register(subparsers)``); heavy imports (torch, fastapi) happen inside
the handlers, so ``nndx --help`` and ``nndx rules`` start fast."""

from __future__ import annotations

import argparse
import importlib
import sys

from nndx import __version__

COMMAND_MODULES = (
    "nndx.collector.cli",
    "nndx.rules.cli",
    "nndx.prompts.cli",
    "nndx.api.cli",
)


def _schema(args: argparse.Namespace) -> int:
    import json

    from nndx.report import Diagnosis, DiagnosticReport

    model = Diagnosis if args.diagnosis else DiagnosticReport
    print(json.dumps(model.model_json_schema(), indent=2))
    return 0


def _plot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from nndx.errors import MissingExtraError
    from nndx.rules.cli import ReportError, load_report
    from nndx.views.plots import report_figures, write_html

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"nndx plot: {out} is a file, not a folder", file=sys.stderr)
        return 2
    try:
        report = load_report(args.report)
    except ReportError as error:
        print(f"nndx plot: {error}", file=sys.stderr)
        return 2
    figures = report_figures(report)
    if not figures:
        print("nndx plot: the report has no loss history, training series, LR sweep, layer or data "
              "statistics to plot", file=sys.stderr)  # fmt: skip
        return 1
    title = f"nndx — {report.run.name}" if report.run and report.run.name else "nndx report"
    try:
        index = write_html(figures, out, title=title)
    except MissingExtraError as error:
        print(f"nndx plot: {error}", file=sys.stderr)
        return 2
    print(index)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from nndx import demo

    return demo.main(as_json=args.json)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nndx", description="Diagnose the silent failures of neural-network training."
    )
    parser.add_argument("--version", action="version", version=f"nndx {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    schema = sub.add_parser("schema", help="print the DiagnosticReport JSON Schema")
    schema.add_argument("--diagnosis", action="store_true", help="print the Diagnosis schema instead")
    schema.set_defaults(handler=_schema)

    plot = sub.add_parser(
        "plot", help="draw a report's figures (loss, gradient norm, LR, layers, LR sweep) as interactive HTML",
        description="Write OUT/index.html with every figure the report has data for — the figures the "
        "service's pages show: zoom, hover, log/linear switch — and plotly.min.js beside it, so the "
        "folder opens offline. Needs plotly (pip install 'nndx[plot]'). No PNG: plotly's image export "
        "needs a browser; the mode bar's camera button saves any figure as PNG.",
    )
    plot.add_argument("report", help="report.json ('-' for standard input)")
    plot.add_argument("--out", default="plots", help="output folder (default ./plots)")
    plot.set_defaults(handler=_plot)

    demo = sub.add_parser("demo", help="diagnose the lesson's broken networks and a healthy one")
    demo.add_argument("--json", action="store_true", help="print the diagnoses as JSON")
    demo.set_defaults(handler=_demo)

    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
