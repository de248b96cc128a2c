"""explain() and the LLM client against a real local HTTP server.

The server counts the requests it saw; deadlines are checked by behaviour (the call
returned the fallback after N attempts), never by timing.
"""

from __future__ import annotations

import logging

import pytest
from fake_llm_server import FakeLLM, Reply, chunk, completion
from pydantic import SecretStr

from nndx.prompts import Explanation, LLMSettings, SettingsError, explain, render_prompt
from nndx.prompts.llm import LLMUnavailable, complete, parse_retry_after, safe_url

KEY = "sk-test-SECRET-0123456789"


@pytest.fixture
def llm():
    with FakeLLM() as server:
        yield server


def settings_for(server: FakeLLM, **overrides) -> LLMSettings:
    # a deadline far above any answer here: a loaded CI machine must not turn a reply into a timeout
    values = {"base_url": server.url, "model": "test-model", "api_key": SecretStr(KEY), "timeout": 60.0,
              "backoff_base": 0.01, "backoff_max": 0.05}  # fmt: skip
    values.update(overrides)
    return LLMSettings(**values)


def test_success_sends_the_rendered_prompt_model_and_key(llm, broken_report, broken_diagnosis):
    llm.script(Reply(body=completion("Root cause: LR_TOO_HIGH")))
    result = explain(broken_report, broken_diagnosis, settings=settings_for(llm))
    assert result == Explanation(text="Root cause: LR_TOO_HIGH", source="llm", reason=None, model="test-model", attempts=1)
    (request,) = llm.received
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.body["model"] == "test-model"
    assert request.body["stream"] is False
    assert request.body["messages"] == [{"role": "user", "content": render_prompt(broken_report, broken_diagnosis)}]


def test_no_key_sends_no_authorization_header(llm, healthy_report, healthy_diagnosis):
    result = explain(healthy_report, healthy_diagnosis, settings=settings_for(llm, api_key=None))
    assert result.source == "llm"
    assert "authorization" not in llm.received[0].headers


def test_offline_never_calls_the_endpoint(llm, broken_report, broken_diagnosis):
    result = explain(broken_report, broken_diagnosis, offline=True, settings=settings_for(llm))
    assert result.source == "rules" and result.reason == "offline mode was requested"
    assert "The LLM was not used: offline mode was requested." in result.text
    assert llm.received == []


def test_no_endpoint_configured_falls_back_with_the_reason(broken_report, broken_diagnosis, monkeypatch):
    for name in ("NNDX_LLM_BASE_URL", "NNDX_LLM_MODEL", "NNDX_LLM_API_KEY", "NNDX_LLM_TIMEOUT", "NNDX_LLM_STREAM"):
        monkeypatch.delenv(name, raising=False)
    result = explain(broken_report, broken_diagnosis)
    assert result.source == "rules" and "NNDX_LLM_BASE_URL is not set" in result.reason
    assert "## Root cause" in result.text and "LR_TOO_HIGH" in result.text
    no_model = explain(broken_report, broken_diagnosis, settings=LLMSettings(base_url="http://127.0.0.1:9/v1"))
    assert "NNDX_LLM_MODEL is not set" in no_model.reason


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (Reply(body=b"this is not json"), "malformed JSON"),
        (Reply(body={"choices": []}), "empty choices"),
        (Reply(body={"object": "chat.completion"}), "no 'choices' list"),
        (Reply(body={"choices": [{"message": {"role": "assistant", "content": ""}}]}), "no message content"),
        (Reply(status=404, body={"error": {"message": "model 'test-model' not found"}}), "HTTP 404"),
    ],
)
def test_bad_answers_fall_back_at_once(llm, broken_report, broken_diagnosis, reply, reason):
    llm.script(reply)
    result = explain(broken_report, broken_diagnosis, settings=settings_for(llm))
    assert result.source == "rules" and reason in result.reason
    assert len(llm.received) == 1  # not retried: a retry cannot fix these
    assert result.text.startswith("# Diagnosis (rule-only)")


def test_5xx_is_retried_then_succeeds(llm, broken_report, broken_diagnosis):
    llm.script(Reply(status=503), Reply(status=500), Reply(body=completion("fixed")))
    result = explain(broken_report, broken_diagnosis, settings=settings_for(llm))
    assert (result.source, result.text, result.attempts) == ("llm", "fixed", 3)
    assert len(llm.received) == 3


def test_persistent_5xx_gives_up_after_max_attempts(llm, broken_report, broken_diagnosis):
    llm.script(Reply(status=502))
    result = explain(broken_report, broken_diagnosis, settings=settings_for(llm, max_attempts=3))
    assert result.source == "rules" and "HTTP 502" in result.reason and "gave up after 3 attempts" in result.reason
    assert len(llm.received) == 3 and result.attempts == 3


def test_429_honours_a_small_retry_after(llm, broken_report, broken_diagnosis):
    llm.script(Reply(status=429, headers={"Retry-After": "0"}), Reply(body=completion("after the wait")))
    result = explain(broken_report, broken_diagnosis, settings=settings_for(llm, backoff_base=60.0, backoff_max=60.0))
    # backoff_base alone (60 s) would not fit the 5 s deadline: Retry-After: 0 was used
    assert (result.source, result.text) == ("llm", "after the wait")
    assert len(llm.received) == 2


def test_429_with_a_long_retry_after_stops_at_once(llm, broken_report, broken_diagnosis):
    llm.script(Reply(status=429, headers={"Retry-After": "3600"}))
    result = explain(broken_report, broken_diagnosis, settings=settings_for(llm))
    assert result.source == "rules" and "HTTP 429" in result.reason and "Retry-After 3600s" in result.reason
    assert len(llm.received) == 1


def test_no_retry_is_started_that_cannot_finish_before_the_deadline(llm, broken_report, broken_diagnosis):
    llm.script(Reply(status=503))
    result = explain(broken_report, broken_diagnosis, settings=settings_for(llm, timeout=10.0, backoff_base=60.0, backoff_max=60.0))
    assert result.source == "rules" and "no time left to retry" in result.reason
    assert len(llm.received) == 1


@pytest.mark.parametrize("reply", [Reply(hang=True), Reply(trickle=True)], ids=["silent", "trickling"])
def test_deadline_is_total_even_for_a_trickling_server(llm, broken_report, broken_diagnosis, reply):
    # A trickling server resets every per-read timeout; only a total deadline ends it.
    llm.script(reply)
    result = explain(broken_report, broken_diagnosis, settings=settings_for(llm, timeout=2.0))
    assert result.source == "rules" and "2s deadline" in result.reason
    assert len(llm.received) <= 1  # no retry (on a loaded machine the deadline may pass before the request lands)


def test_connection_refused_falls_back(broken_report, broken_diagnosis):
    with FakeLLM() as server:
        url = server.url
    result = explain(broken_report, broken_diagnosis, settings=LLMSettings(base_url=url, model="m", timeout=2.0))
    assert result.source == "rules" and "could not talk to" in result.reason and "ConnectError" in result.reason


def test_streaming_joins_the_deltas(llm, broken_report, broken_diagnosis):
    llm.script(Reply(sse=[chunk("Root "), chunk("cause: "), chunk("LR_TOO_HIGH", finish="stop"), "[DONE]"]))
    result = explain(broken_report, broken_diagnosis, settings=settings_for(llm, stream=True))
    assert (result.source, result.text) == ("llm", "Root cause: LR_TOO_HIGH")
    assert llm.received[0].body["stream"] is True
    assert llm.received[0].headers["accept"] == "text/event-stream"


@pytest.mark.parametrize(
    ("events", "reason"),
    [
        ([chunk("Root "), chunk("cau")], "stream ended before the answer was complete"),
        ([chunk("Root "), "{not json", "[DONE]"], "streamed malformed JSON"),
        ([chunk(""), "[DONE]"], "streamed an empty answer"),
        (['{"error": {"message": "overloaded"}}'], "error in the stream"),
    ],
)
def test_broken_streams_fall_back(llm, broken_report, broken_diagnosis, events, reason):
    llm.script(Reply(sse=events))
    result = explain(broken_report, broken_diagnosis, settings=settings_for(llm, stream=True))
    assert result.source == "rules" and reason in result.reason


def test_a_server_that_ignores_stream_true_still_works(llm, broken_report, broken_diagnosis):
    llm.script(Reply(body=completion("plain JSON")))
    result = explain(broken_report, broken_diagnosis, settings=settings_for(llm, stream=True))
    assert (result.source, result.text) == ("llm", "plain JSON")


def test_the_key_never_appears_in_reasons_logs_or_reprs(llm, broken_report, broken_diagnosis, caplog):
    caplog.set_level(logging.DEBUG)
    settings = settings_for(llm, max_attempts=2)
    llm.script(Reply(status=401, body={"error": {"message": f"Incorrect API key provided: {KEY}"}}))
    unauthorized = explain(broken_report, broken_diagnosis, settings=settings)
    llm.script(Reply(status=503))
    unavailable = explain(broken_report, broken_diagnosis, settings=settings)
    with pytest.raises(LLMUnavailable) as raised:
        complete("prompt", settings)
    assert "HTTP 401" in unauthorized.reason and "***" in unauthorized.reason  # the server's echo, redacted
    shown = [unauthorized.model_dump_json(), unavailable.model_dump_json(), str(raised.value), repr(raised.value),
             repr(settings), str(settings), settings.model_dump_json(), caplog.text]  # fmt: skip
    assert caplog.text  # the retries were logged
    assert [text for text in shown if KEY in text] == []


@pytest.mark.parametrize("echo", [
    f"Incorrect API key provided: {KEY[:8]}***************{KEY[-4:]}",  # the masked form hosted APIs print
    f"key ending in {KEY[-6:]} is revoked", f"unknown key prefix {KEY[:10]}", f"bad key {KEY[3:-3]}",
])
def test_partial_echoes_of_the_key_are_redacted(llm, broken_report, broken_diagnosis, echo):
    llm.script(Reply(status=401, body={"error": {"message": echo}}))
    result = explain(broken_report, broken_diagnosis, settings=settings_for(llm))
    assert "HTTP 401" in result.reason and "***" in result.reason
    # the fake server's URL is in the reason, and its port may hold four of the key's digits
    echoed = result.reason.replace(llm.url, "<url>")
    assert "<url>" in echoed
    for start in range(len(KEY) - 3):
        assert KEY[start:start + 4] not in echoed


def test_settings_from_the_environment():
    env = {"NNDX_LLM_BASE_URL": "http://localhost:11434/v1/", "NNDX_LLM_MODEL": "llama3", "NNDX_LLM_API_KEY": KEY,
           "NNDX_LLM_TIMEOUT": "12.5", "NNDX_LLM_STREAM": "true"}  # fmt: skip
    settings = LLMSettings.from_env(env)
    assert (settings.base_url, settings.model, settings.timeout, settings.stream) == ("http://localhost:11434/v1/", "llama3", 12.5, True)
    assert settings.api_key.get_secret_value() == KEY and settings.configured
    assert not LLMSettings.from_env({}).configured


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("NNDX_LLM_TIMEOUT", "soon", "NNDX_LLM_TIMEOUT: input should be a valid number"),
        ("NNDX_LLM_TIMEOUT", "-1", "NNDX_LLM_TIMEOUT: input should be greater than 0"),
        ("NNDX_LLM_TIMEOUT", "nan", "NNDX_LLM_TIMEOUT: input should be a finite number"),
        ("NNDX_LLM_TIMEOUT", "1e300", "NNDX_LLM_TIMEOUT: input should be less than or equal to 86400"),
        ("NNDX_LLM_BASE_URL", "localhost:8000", "must start with http"),
        ("NNDX_LLM_STREAM", "maybe", "NNDX_LLM_STREAM"),
    ],
)
def test_bad_settings_are_clear_errors(name, value, message):
    with pytest.raises(SettingsError, match=message):
        LLMSettings.from_env({name: value})


def test_a_bad_key_setting_is_never_echoed():
    with pytest.raises(SettingsError) as info:
        LLMSettings.from_env({"NNDX_LLM_API_KEY": KEY, "NNDX_LLM_TIMEOUT": "soon"})
    assert KEY not in str(info.value)


def test_retry_after_parsing():
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past: no wait
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


def test_safe_url_drops_credentials():
    assert safe_url("https://user:pw@example.com/v1/chat/completions?key=abc") == "https://example.com/v1/chat/completions"
