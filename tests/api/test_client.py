"""nndx.client against a live uvicorn: submit, spool when down, push when up, no loss."""

from __future__ import annotations

import json
import os

import httpx
import pytest

from nndx.api.cli import _push
from nndx.client import SubmitError, push, spool, spooled_files, submit
from tests.api.conftest import free_socket, make_report

FAST = {"retries": 1, "backoff_s": 0.01, "timeout_s": 5.0}


def stored_count(url: str, token: str | None = None) -> int:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return len(httpx.get(f"{url}/v1/reports", params={"limit": 200}, headers=headers).json()["items"])


def test_submit_stores_and_returns_the_diagnosis(live_server, tmp_path):
    server = live_server()
    result = submit(make_report(name="dead_relu"), server.url, spool_dir=tmp_path / "spool", **FAST)
    assert result.stored and result.spooled_to is None
    assert result.diagnosis.top().code.value == "DEAD_RELU"
    body = httpx.get(f"{server.url}/v1/reports/{result.report_id}").json()
    assert body["run"]["name"] == "dead_relu"
    assert not (tmp_path / "spool").exists()


def test_server_down_then_up_loses_no_report(make_app, live_server, tmp_path):
    sock = free_socket()  # bound, not listening: connections are refused
    url = "http://127.0.0.1:%d" % sock.getsockname()[1]
    spool_dir = tmp_path / "spool"
    reports = [make_report(name=f"run-{i}", nan_at=i) for i in range(3)]
    results = [submit(r, url, spool_dir=spool_dir, **FAST) for r in reports]
    assert all(not r.stored and r.spooled_to.exists() for r in results)
    assert "Connect" in results[0].reason
    assert len(spooled_files(spool_dir)) == 3
    assert not list(spool_dir.glob(".*.tmp"))  # atomic writes leave no temporaries
    # still down: push keeps everything
    down = push(url, spool_dir=spool_dir, **FAST)
    assert (down.sent, down.remaining) == (0, 3) and down.error
    assert len(spooled_files(spool_dir)) == 3

    server = live_server(make_app(), sock)
    up = push(server.url, spool_dir=spool_dir, **FAST)
    assert (up.sent, up.remaining, up.error) == (3, 0, None)
    assert spooled_files(spool_dir) == []
    listed = httpx.get(f"{server.url}/v1/reports").json()["items"]
    assert sorted(r["run_name"] for r in listed) == ["run-0", "run-1", "run-2"]
    for item in listed:  # content, not just count: NaN survived the spool
        body = httpx.get(f"{server.url}/v1/reports/{item['id']}").json()
        index = int(item["run_name"].split("-")[1])
        assert body["loss_history"]["train"][index]["value"] == "NaN"


def test_push_of_an_already_stored_report_does_not_duplicate_it(live_server, tmp_path):
    server = live_server()
    report = make_report()
    key = "0f" * 16
    first = httpx.post(f"{server.url}/v1/reports", content=report.model_dump_json(),
                       headers={"content-type": "application/json", "idempotency-key": key})
    assert first.status_code == 201
    # the answer was "lost": the client spooled the same report under the same key
    spool(report.model_dump_json().encode(), key, tmp_path)
    result = push(server.url, spool_dir=tmp_path, **FAST)
    assert result.sent == 1 and spooled_files(tmp_path) == []
    assert stored_count(server.url) == 1


def test_invalid_report_raises_and_push_keeps_rejected_files(live_server, tmp_path):
    server = live_server()
    report = make_report()
    report.layers[0].activation.dead_unit_fraction = 7.0  # assignment is not validated
    with pytest.raises(SubmitError, match="422") as info:
        submit(report, server.url, spool_dir=tmp_path / "never", **FAST)
    assert "dead_unit_fraction" in info.value.detail
    assert not (tmp_path / "never").exists()  # nothing to retry: not spooled
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"run": {"name": 1}}))
    spool(make_report(name="good").model_dump_json().encode(), "good", tmp_path)
    os.utime(bad, (1, 1))  # oldest first: the rejected file does not block the good one
    result = push(server.url, spool_dir=tmp_path, **FAST)
    assert result.sent == 1 and result.rejected == [bad] and bad.exists()
    assert stored_count(server.url) == 1


def test_wrong_token_spools_then_push_with_the_right_token(make_app, live_server, tmp_path):
    server = live_server(make_app(tokens={"secret": "alpha"}))
    result = submit(make_report(project=None), server.url, token="wrong", spool_dir=tmp_path, **FAST)
    assert not result.stored and "401" in result.reason
    assert push(server.url, "wrong", spool_dir=tmp_path, **FAST).remaining == 1
    assert push(server.url, "secret", spool_dir=tmp_path, **FAST).sent == 1
    assert stored_count(server.url, "secret") == 1


def test_push_command_exit_codes(live_server, tmp_path, capsys):
    import argparse

    args = argparse.Namespace(url="http://127.0.0.1:9", token=None, spool_dir=str(tmp_path))
    assert _push(args) == 0  # empty spool
    spool(make_report().model_dump_json().encode(), "k", tmp_path)
    server = live_server()
    assert _push(argparse.Namespace(url=server.url, token=None, spool_dir=str(tmp_path))) == 0
    assert "sent 1" in capsys.readouterr().err
    assert stored_count(server.url) == 1


def test_bad_url_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="http://"):
        submit(make_report(), "localhost:8000", spool_dir=tmp_path)


def test_spool_defaults_to_the_environment_and_ignores_partial_writes(tmp_path, monkeypatch):
    from nndx.client import default_spool_dir

    monkeypatch.setenv("NNDX_SPOOL_DIR", str(tmp_path / "env-spool"))
    assert default_spool_dir() == tmp_path / "env-spool"
    path = spool(b"{}", "abc")
    assert path == tmp_path / "env-spool" / "abc.json" and path.read_bytes() == b"{}"
    (tmp_path / "env-spool" / ".half.json.tmp").write_bytes(b'{"run": ')  # a write cut short
    assert spooled_files() == [path]
