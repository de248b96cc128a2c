"""`nndx serve` as a real process, and its refusal of a bad configuration."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.api.conftest import free_socket, make_report


def nndx(*args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("NNDX_")} | (env or {})
    return subprocess.Popen([sys.executable, "-m", "nndx.cli", *args], env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


@pytest.mark.slow
def test_serve_creates_the_database_serves_and_stops_cleanly(tmp_path):
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    database = tmp_path / "new" / "nndx.sqlite3"
    process = nndx("serve", "--port", str(port), "--database-url", f"sqlite:///{database}",
                   env={"NNDX_TOKENS": "tok:proj"})
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, "nndx serve did not start"
            time.sleep(0.1)
        assert database.exists()
        assert httpx.get(f"{url}/v1/reports").status_code == 401  # tokens came from the environment
        created = httpx.post(f"{url}/v1/reports", content=make_report(project=None).model_dump_json(),
                             headers={"authorization": "Bearer tok", "content-type": "application/json"})
        assert created.status_code == 201 and created.json()["project"] == "proj"
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises SIGTERM so the exit status tells why
    assert process.returncode in (0, -signal.SIGTERM), stderr
    assert "token auth" in stderr and "Traceback" not in stderr


@pytest.mark.parametrize(
    "variable, value",
    [("NNDX_MAX_BODY_BYTES", "lots"), ("NNDX_TOKENS", "no-project"), ("NNDX_DATABASE_URL", "nonsense://"),
     ("NNDX_LLM_TIMEOUT", "soon")],
)
def test_serve_refuses_a_bad_setting_with_a_message(monkeypatch, capsys, variable, value):
    from nndx.cli import build_parser

    monkeypatch.setenv(variable, value)
    args = build_parser().parse_args(["serve", "--port", "1"])
    assert args.handler(args) == 2  # before uvicorn starts
    err = capsys.readouterr().err
    assert err.startswith("nndx serve: ") and "Traceback" not in err
