"""The layer contracts of pyproject.toml ([tool.importlinter]) hold: the collector
imports no rules, the rules and the service import no torch, nothing imports upward.
import-linter reads every import statement, function-local ones included."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout
