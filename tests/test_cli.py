"""The ``nndx`` command as a user meets it: one-line errors with exit 2 and no traceback,
output paths checked before any work, factories found in the current folder, a
description on every ``--help``, and a start that loads no heavy library."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nndx.cli import build_parser, main

HEAVY = ("torch", "httpx", "jinja2", "fastapi")


def write(path: Path, code: str) -> Path:
    path.write_text(textwrap.dedent(code), encoding="utf-8")
    return path


@pytest.fixture
def factories(tmp_path, monkeypatch):
    """A folder of factories; each touches the file in $NNDX_TEST_MARKER when called, so a
    test can tell whether the command got as far as running the user's code."""
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.setenv("NNDX_TEST_MARKER", str(tmp_path / "factory-called"))
    write(folder / "setups.py", """
        import os, pathlib

        def touch():
            pathlib.Path(os.environ["NNDX_TEST_MARKER"]).touch()

        def raises():
            touch()
            raise ValueError("no GPU found")

        def good():
            touch()
            import torch
            from torch import nn
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
            return model, (torch.randn(16, 4), torch.randint(0, 2, (16,))), nn.CrossEntropyLoss()
    """)
    write(folder / "broken_syntax.py", "def setup(:\n")
    write(folder / "raises_on_import.py", "raise RuntimeError('config.yaml not found')\n")
    write(folder / "imports_missing.py", "import nndx_no_such_dependency\n")
    return folder


def one_error_line(capsys, command: str) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"nndx {command}: error: "), lines[0]
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["probe", "no_colon_here"], "expected MODULE:FACTORY"),
        (["probe", "{work}/setups.py:raises"], "the factory {work}/setups.py:raises raised ValueError: no GPU found"),
        (["probe", "{work}/setups.py:missing"], "has no callable 'missing'"),
        (["probe", "{work}/broken_syntax.py:setup"], "importing {work}/broken_syntax.py failed: SyntaxError"),
        (["probe", "{work}/raises_on_import.py:setup"], "RuntimeError: config.yaml not found"),
        (["probe", "{work}/imports_missing.py:setup"], "ModuleNotFoundError: No module named 'nndx_no_such_dependency'"),
        (["probe", "nndx_no_such_module:setup"], "cannot import nndx_no_such_module: no module named"),
        (["lr-find", "{work}/nowhere.py:setup"], "no such file"),
        (["rules", "NOT_A_CODE"], "no rule or cause code 'NOT_A_CODE'"),
        (["diagnose", "{work}/missing.json"], "cannot read"),
        (["lr-plot", "{work}/missing.csv", "--png", "{work}/x.png"], "missing.csv"),
    ],
)
def test_user_errors_are_one_line_with_exit_2(factories, capsys, argv, says):
    argv = [a.format(work=factories) for a in argv]
    assert main(argv) == 2
    assert says.format(work=factories) in one_error_line(capsys, argv[0])


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["probe", "{work}/setups.py:good", "--out", "{work}/missing_dir/report.json"], "the folder {work}/missing_dir does not exist"),
        (["probe", "{work}/setups.py:good", "--out", "{work}"], "is a folder"),
        (["lr-find", "{work}/setups.py:good", "--csv", "{work}/no/lr.csv"], "does not exist"),
        (["lr-find", "{work}/setups.py:good", "--png", "{work}/no/lr.png"], "does not exist"),
        (["render", "--out", "{work}/setups.py"], "is a file; give a folder"),
    ],
)
def test_output_paths_are_checked_before_any_work(factories, tmp_path, capsys, argv, says):
    argv = [a.format(work=factories) for a in argv]
    assert main(argv) == 2
    assert says.format(work=factories) in one_error_line(capsys, argv[0])
    assert not (tmp_path / "factory-called").exists(), "the factory ran before the output path was checked"


def test_invalid_llm_settings_are_one_line(tmp_path, capsys, monkeypatch):
    from nndx.report import DiagnosticReport

    report = tmp_path / "r.json"
    report.write_text(DiagnosticReport().model_dump_json())
    monkeypatch.setenv("NNDX_LLM_BASE_URL", "ftp://example")
    assert main(["explain", str(report)]) == 2
    assert "NNDX_LLM_BASE_URL" in one_error_line(capsys, "explain")


def console_script(tmp_path: Path) -> Path:
    """What pip's ``nndx`` entry point is: a script whose folder, not the current one, is
    first on sys.path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    return write(bin_dir / "nndx", "import sys\nfrom nndx.cli import main\nsys.exit(main())\n")


def test_module_factory_is_imported_from_the_current_folder(factories, tmp_path):
    # the factory raises before any probe (or torch) is needed: its message proves it was found
    done = subprocess.run([sys.executable, str(console_script(tmp_path)), "probe", "setups:raises"],
                          cwd=factories, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr == "nndx probe: error: the factory setups:raises raised ValueError: no GPU found\n"
    assert (tmp_path / "factory-called").exists()


def test_every_command_has_a_description():
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    missing = [name for name, sub in commands.items() if not (sub.description or "").strip()]
    assert not missing, f"no description in --help: {missing}"
    assert {"demo", "diagnose", "check", "schema", "rules", "probe", "lr-find"} <= set(commands)


@pytest.mark.parametrize("argv", [["--help"], ["rules"], ["rules", "NNDX201"]])
def test_help_and_rules_load_no_heavy_library(argv):
    code = (
        "import sys\nfrom nndx.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        f"loaded = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "assert not loaded, f'loaded {loaded}'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
