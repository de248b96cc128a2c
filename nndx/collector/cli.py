"""Sub-commands of the collector; see nndx/cli.py.

- ``nndx probe MODULE:FACTORY [--out report.json] [--probes ...]``
- ``nndx lr-find MODULE:FACTORY [--csv lr.csv] [--png lr.png]``
- ``nndx lr-plot FILE.csv --png out.png``

FACTORY is a function taking no arguments that returns ``(model, batch, loss_fn)`` —
optionally a fourth item, the optimizer — or a dict with keys ``model``, ``batch``,
``loss_fn`` and optionally ``optimizer`` and ``data``. For ``lr-find`` the batch may be a
DataLoader, read pass after pass. MODULE is an importable module
(``mypkg.debug``) or a path to a Python file (``scripts/debug.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nndx.errors import UsageError


def __getattr__(name: str) -> Any:
    """``PROBE_NAMES``: the probes' names, cheap first. Computed on first use: listing
    them imports the probes, and with them torch, which ``nndx --help`` must not wait for."""
    if name == "PROBE_NAMES":
        from nndx.collector.probes import specs

        return tuple(spec.name for spec in specs())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this subpackage's commands to the ``nndx`` parser."""
    factory_help = ("MODULE:FACTORY — FACTORY() returns (model, batch, loss_fn[, optimizer]) or a dict with "
                    "model, batch, loss_fn[, optimizer, data]; MODULE is a module name (found in the current "
                    "folder too) or a .py path")  # fmt: skip

    p = subparsers.add_parser("probe", help="run the active probes on a model and write a report",
                              description="Run nndx's active probes (on a copy of the model) and write the "
                                          "DiagnosticReport as JSON.")  # fmt: skip
    p.add_argument("factory", metavar="MODULE:FACTORY", help=factory_help)
    p.add_argument("--out", default="report.json", help="where to write the report (default: report.json)")
    p.add_argument("--probes", nargs="+", metavar="PROBE",
                   help="probes to run (default: all), named as nndx.probe(probes=...) names them "
                        "(an unknown name lists them)")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress bar and no per-probe summary on stderr")
    p.set_defaults(handler=_run_probe, outputs={"out": "file"})

    lr = subparsers.add_parser("lr-find", help="run the learning-rate range test and print the suggestion",
                               description="Sweep the learning rate on a copy of the model (over the factory's "
                                           "DataLoader, or its one batch); print the suggested LR and the "
                                           "interval of LRs that train well.")  # fmt: skip
    lr.add_argument("factory", metavar="MODULE:FACTORY", help=factory_help)
    lr.add_argument("--csv", help="write the sweep (lr, loss, smoothed) to this CSV file")
    lr.add_argument("--png", help="plot the sweep to this PNG file (needs matplotlib: nndx[plot])")
    lr.add_argument("--start-lr", type=float, default=1e-7, help="first learning rate (default 1e-7)")
    lr.add_argument("--end-lr", type=float, default=10.0, help="last learning rate (default 10)")
    lr.add_argument("--steps", type=int, default=100, help="number of steps of the sweep (default 100)")
    lr.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    lr.set_defaults(handler=_run_lr_find, outputs={"csv": "file", "png": "file"})

    plot = subparsers.add_parser("lr-plot", help="plot a saved LR sweep CSV as PNG",
                                 description="Plot a CSV written by `nndx lr-find --csv` and print its suggestion.")
    plot.add_argument("csv", metavar="FILE.csv", help="CSV with columns lr,loss,smoothed")
    plot.add_argument("--png", required=True, help="output PNG file")
    plot.add_argument("--loss", help="the loss class the sweep trained (MSELoss, ...): the CSV does not record it, "
                      "and a regression loss is read differently from a classification one")
    plot.add_argument("--optimizer", help="the optimizer the sweep trained (SGD, Adam, 'SGD with momentum'), "
                      "for the same reason")
    plot.set_defaults(handler=_run_lr_plot, outputs={"png": "file"})


# --------------------------------------------------------------------------- handlers


def _run_probe(args: argparse.Namespace) -> int:
    from nndx.collector.probe import PROBES, probe

    unknown = [name for name in args.probes or () if name not in PROBES]
    if unknown:
        raise UsageError(f"unknown probe(s) {', '.join(unknown)}; choose from {', '.join(PROBES)}")
    setup = load_factory(args.factory)
    report = probe(setup["model"], setup["batch"], setup["loss_fn"], probes=args.probes,
                   optimizer=setup.get("optimizer"), data=setup.get("data"),
                   progress=False if args.quiet else None)  # fmt: skip
    out = Path(args.out)
    out.write_text(report.model_dump_json(indent=2))
    if not args.quiet:
        probes = report.probes.model_dump(exclude_none=True) if report.probes else {}
        for name, result in probes.items():
            print(f"nndx: {name}: {result['status']}" + (f" — {result['message']}" if result.get("message") else ""),
                  file=sys.stderr)  # fmt: skip
        for error in report.errors:
            print(f"nndx: error in {error.source}: {error.type}: {error.message[:200]}", file=sys.stderr)
    print(out)
    return 0
def _run_lr_find(args: argparse.Namespace) -> int:
    setup = load_factory(args.factory)  # before torch loads: a bad factory fails fast
    from nndx.collector.lr_find import lr_find

    try:
        found = lr_find(setup["model"], setup.get("optimizer"), setup["loss_fn"], setup["batch"],
                        start_lr=args.start_lr, end_lr=args.end_lr, steps=args.steps,
                        progress=False if args.quiet else None)  # fmt: skip
    except UsageError:
        raise
    except Exception as exc:  # the user's model, loss or data raised: one line, no traceback
        raise UsageError(f"the sweep stopped: {type(exc).__name__}: {exc} (`nndx probe` records where and why)") from exc
    return _write_sweep(found.record, args.csv, args.png)


def _run_lr_plot(args: argparse.Namespace) -> int:
    from nndx.collector.probes.lr_range import from_csv

    try:
        result = from_csv(args.csv, loss=args.loss, optimizer=args.optimizer)
    except OSError as exc:
        raise UsageError(f"cannot read {args.csv}: {exc.strerror or exc}") from None
    except ValueError as exc:  # not a sweep CSV: the message names the line
        raise UsageError(str(exc)) from None
    return _write_sweep(result, None, args.png)


def _write_sweep(result: Any, csv_path: str | None, png_path: str | None) -> int:
    from nndx.collector.lr_find import save_png
    from nndx.collector.probes.lr_range import to_csv

    if csv_path:
        print(f"nndx: wrote {to_csv(result, csv_path)}", file=sys.stderr)
    if png_path:
        print(f"nndx: wrote {save_png(result, png_path)}", file=sys.stderr)
    if result.suggested_lr is None:
        # an interval without a trusted point is still a result; no interval is a failed sweep
        print(f"no suggestion: {result.message}")
        return 0 if result.interval_low_lr is not None else 1
    print(f"suggested lr: {result.suggested_lr:.3g} (trains well from {result.interval_low_lr:.3g} "
          f"to {result.interval_high_lr:.3g})")  # fmt: skip
    return 0


# --------------------------------------------------------------------------- factories


def load_factory(spec: str) -> dict[str, Any]:
    """Import ``MODULE:FACTORY``, call it, and return its parts as a dict.

    MODULE is a module name, found in the current folder first (as ``python -m`` would),
    or a .py path, whose folder is put on the path (as ``python path.py`` would) so that it
    can import its neighbours.

    Every way this can fail because of the user's code (no such module, an import that
    raises, a factory that raises or returns the wrong thing) is a UsageError naming the
    module or factory, so the CLI prints one line instead of a traceback."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"expected MODULE:FACTORY, got {spec!r}")
    is_file = module_name.endswith(".py") or "/" in module_name or "\\" in module_name
    # the factory may import its neighbours when called, not only when its module loads
    with _on_path(str(Path(module_name).resolve().parent) if is_file else os.getcwd()):
        module = _import_file(module_name) if is_file else _run_user_code(module_name, importlib.import_module)
        factory = getattr(module, attr, None)
        if not callable(factory):
            raise UsageError(f"{module_name} has no callable {attr!r}")
        try:
            made = factory()
        except Exception as exc:  # the user's factory: say which one, no traceback
            raise UsageError(f"the factory {spec} raised {type(exc).__name__}: {exc}") from exc
    if isinstance(made, dict):
        setup = dict(made)
    elif isinstance(made, (tuple, list)) and len(made) in (3, 4):
        setup = dict(zip(("model", "batch", "loss_fn", "optimizer"), made))
    else:
        raise UsageError(f"{spec}() must return (model, batch, loss_fn[, optimizer]) or a dict; "
                         f"got {type(made).__name__}")  # fmt: skip
    missing = [k for k in ("model", "batch", "loss_fn") if k not in setup]
    if missing:
        raise UsageError(f"{spec}() returned no {', '.join(missing)}")
    return setup


def _import_file(name: str) -> Any:
    path = Path(name)
    if not path.is_file():
        raise UsageError(f"no such file: {path}")
    spec = importlib.util.spec_from_file_location(f"_nndx_factory_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would: dataclasses and pickle look it up
    try:
        _run_user_code(name, lambda _: spec.loader.exec_module(module))
    except UsageError:
        del sys.modules[spec.name]
        raise
    return module


def _run_user_code(name: str, run: Any) -> Any:
    """Import the user's module (by calling ``run(name)``); what goes wrong is a UsageError."""
    try:
        return run(name)
    except ModuleNotFoundError as exc:
        if exc.name and (exc.name == name or name.startswith(exc.name + ".")):
            raise UsageError(f"cannot import {name}: no module named {exc.name!r} (in the current folder or on "
                             "the Python path)") from exc  # fmt: skip
        raise UsageError(f"importing {name} failed: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:  # the user's module raised while importing
        raise UsageError(f"importing {name} failed: {type(exc).__name__}: {exc}") from exc


@contextlib.contextmanager
def _on_path(folder: str) -> Iterator[None]:
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        yield
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)
