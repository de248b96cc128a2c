"""The ``nndx`` command. Each subpackage registers its own sub-commands in its
``cli.py`` (``register(subparsers)``). Those modules import nothing heavy at module
level (torch, httpx, jinja2 and fastapi are imported inside the handlers), so
``nndx --help`` and ``nndx rules`` start without them (tested).

Errors: a deliberate error (:mod:`nndx.errors`) is one line on stderr,
``nndx COMMAND: error: MESSAGE``, never a traceback; exit 2 for a usage error (a bad
argument, file, factory, report or missing extra), 1 when a service failed. A command
names its output paths with ``set_defaults(outputs={"dest": "file" | "folder"})`` and they
are checked here before the command starts, so no work is lost to a typo in ``--out``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from nndx import __version__
from nndx.errors import MissingExtraError, NndxError, UsageError

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

    schema = sub.add_parser(
        "schema", help="print the DiagnosticReport JSON Schema",
        description="Print the JSON Schema of the DiagnosticReport (or, with --diagnosis, of the "
        "Diagnosis), for a client in any language to validate against.",
    )  # fmt: skip
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

    demo = sub.add_parser(
        "demo", help="diagnose the lesson's broken networks and a healthy one",
        description="Train four small networks for real — lr=10, dead ReLUs, a missing zero_grad and a "
        "healthy one — watch, probe and diagnose each, and print the top findings. Takes about a minute.",
    )  # fmt: skip
    demo.add_argument("--json", action="store_true", help="print the diagnoses as JSON")
    demo.set_defaults(handler=_demo)

    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def check_output(value: str, kind: str) -> None:
    """Raise UsageError unless ``value`` can be written as a file (its folder exists) or
    created as a folder (its nearest existing ancestor is a writable folder)."""
    path = Path(value)
    if kind == "file":
        if path.is_dir():
            raise UsageError(f"{value} is a folder; give a file name")
        folder = path.parent
        if not folder.is_dir():
            raise UsageError(f"cannot write {value}: the folder {folder} does not exist")
        if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
            raise UsageError(f"cannot write {value}: permission denied")
        return
    if path.exists() and not path.is_dir():
        raise UsageError(f"{value} is a file; give a folder")
    ancestor = path
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UsageError(f"cannot create {value}: {ancestor} is a file")
    if not os.access(ancestor, os.W_OK):
        raise UsageError(f"cannot write in {value}: permission denied")


def _say_error(command: str, error: Exception) -> None:
    message = " ".join(str(error).split())  # one line, whatever the message held
    print(f"nndx {command}: error: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        for dest, kind in getattr(args, "outputs", {}).items():
            if getattr(args, dest, None) is not None:
                check_output(getattr(args, dest), kind)
        return int(args.handler(args) or 0)
    except (UsageError, MissingExtraError) as error:
        _say_error(args.command, error)
        return 2
    except NndxError as error:
        _say_error(args.command, error)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
