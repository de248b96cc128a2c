"""The service and the rules import and run with torch absent (`pip install
'nndx[server]'` on a machine without torch).

How: a subprocess whose import system refuses ``torch`` (a meta-path hook that raises
ImportError for it and its submodules, exactly what Python does when it is not
installed). Building a fresh virtual environment without torch would test the same
imports but takes minutes of installing; the hook takes a second. The subprocess
starts the app, POSTs a report, and reads its diagnosis, prompt, checklist, rule-only
explanation and pages, then checks that torch never got into ``sys.modules``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = r'''
import sys

class RefuseTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, RefuseTorch())
try:
    import torch  # noqa: F401
    raise SystemExit("the hook did not refuse torch")
except ImportError:
    pass

from fastapi.testclient import TestClient

from nndx.api.app import create_app
from nndx.api.settings import Settings
from nndx.report import ActivationStats, DataStats, DiagnosticReport, LayerStats, RunInfo, SplitStats
from nndx.rules import diagnose

report = DiagnosticReport(
    run=RunInfo(name="no-torch", project="p"),
    data=DataStats(train=SplitStats(n_samples=100, input_nan_count=5)),
    layers=[LayerStats(name="fc", type="Linear", step=0, activation=ActivationStats(
        mean=0.0, std=0.0, min=0.0, max=0.0, zero_fraction=1.0, dead_unit_fraction=1.0))],
)
assert diagnose(report).findings, "the rules found nothing"
client = TestClient(create_app(Settings(database_url=sys.argv[1])))
headers = {"content-type": "application/json"}
created = client.post("/v1/reports", content=report.model_dump_json(), headers=headers)
assert created.status_code == 201, created.text
report_id = created.json()["id"]
assert created.json()["diagnosis"]["findings"][0]["code"] == "NAN_IN_DATA"
for path in ("", "/diagnosis", "/prompt", "/checklist"):
    response = client.get(f"/v1/reports/{report_id}{path}")
    assert response.status_code == 200, (path, response.text)
assert "NAN_IN_DATA" in client.get(f"/v1/reports/{report_id}/prompt").text
explained = client.post(f"/v1/reports/{report_id}/explain", params={"offline": "true"})
assert explained.status_code == 200 and explained.json()["source"] == "rules"
for page in ("/", f"/reports/{report_id}"):
    response = client.get(page)
    assert response.status_code == 200 and "text/html" in response.headers["content-type"], page
assert client.post("/v1/diagnose", content=report.model_dump_json(), headers=headers).status_code == 200
assert client.get("/healthz").status_code == 200
loaded = sorted(name for name in sys.modules if name == "torch" or name.startswith("torch."))
assert not loaded, loaded
print("served without torch")
'''


def test_the_service_and_the_rules_run_without_torch(tmp_path):
    root = Path(__file__).resolve().parents[2]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("NNDX_")}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), environment.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, f"sqlite:///{tmp_path / 'nndx.sqlite3'}"],
        env=environment, capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "served without torch" in result.stdout


LIBRARY_SCRIPT = r'''
import sys

SERVER = ("fastapi", "starlette", "uvicorn", "sqlalchemy", "httptools", "psycopg")

class RefuseServer:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in SERVER:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, RefuseServer())
import nndx
import nndx.client
import nndx.prompts
from nndx.cli import build_parser, main

assert nndx.prompts.render()  # the generic prompt and checklist
args = build_parser().parse_args(["serve", "--port", "1"])
assert args.handler(args) == 2
loaded = sorted(name for name in sys.modules if name.split(".")[0] in SERVER)
assert not loaded, loaded
print("library without the server extra")
'''


def test_the_library_runs_without_the_server_extra(tmp_path):
    """`pip install nndx` (no [server]): the library, its client and its CLI import;
    `nndx serve` says which extra it needs instead of a traceback."""
    root = Path(__file__).resolve().parents[2]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("NNDX_")}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), environment.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", LIBRARY_SCRIPT], env=environment, capture_output=True,
                            text=True, timeout=300, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "library without the server extra" in result.stdout
    assert "pip install 'nndx[server]'" in result.stderr
