"""A small OpenAI-compatible chat-completions client with a hard total deadline.

How to use::

    text, attempts = complete(prompt, LLMSettings.from_env())   # raises LLMUnavailable

It sends ``POST {base_url}/chat/completions`` with the prompt as the one user message,
``Authorization: Bearer <key>`` when a key is set, and reads either a JSON answer or,
with ``stream=True``, server-sent events (``data: {...}`` chunks up to ``data: [DONE]``).
Hosted APIs, vLLM, llama.cpp server and Ollama all speak this.

Why it is built this way:

- The deadline is total. httpx timeouts bound each connect and each read, so a server
  that trickles one byte a second would never time out; the request therefore runs in
  a worker thread and the caller waits at most ``timeout`` seconds for it. On expiry
  the worker is told to stop (it checks between chunks) and the caller moves on.
- Retries only where a retry can help: 429 and 5xx, with exponential backoff, honouring
  a small ``Retry-After``, and never a retry that cannot finish before the deadline.
  Anything else (4xx, connection refused, malformed answer) fails at once.
- The key lives only in the request header. Every reason, log line and exception is
  built from status codes, exception type names and redacted server messages, never
  from the request, so the key cannot leak through them.
"""

from __future__ import annotations

import email.utils
import json
import logging
import threading
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # httpx is imported where a request is made: `nndx --help` and the rules never load it
    import httpx

from nndx.errors import ServiceError
from nndx.prompts.settings import LLMSettings

logger = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 4 * 1024 * 1024
MAX_SERVER_MESSAGE = 200


class LLMUnavailable(ServiceError):
    """The LLM gave no usable answer; ``reason`` says why, in words safe to show."""

    def __init__(self, reason: str, attempts: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.attempts = attempts


class _Retryable(Exception):
    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


def endpoint_url(base_url: str) -> str:
    return base_url.rstrip("/") + "/chat/completions"


def safe_url(url: str) -> str:
    """The URL without user info or query string (either could hold a credential)."""
    import httpx

    parsed = httpx.URL(url)
    return str(parsed.copy_with(username=None, password=None, query=None, fragment=None))


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (seconds or an HTTP date); None if unusable."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        seconds = (when - (now or datetime.now(timezone.utc))).total_seconds()
    return max(0.0, seconds) if seconds == seconds else None  # NaN is unusable


def parse_completion(body: bytes) -> str:
    """The answer text of a non-streamed chat completion; raises LLMUnavailable."""
    try:
        data = json.loads(body)
    except ValueError:
        raise LLMUnavailable("the endpoint answered with malformed JSON") from None
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list):
        raise LLMUnavailable("the endpoint's JSON answer has no 'choices' list")
    if not choices:
        raise LLMUnavailable("the endpoint answered with empty choices")
    first = choices[0] if isinstance(choices[0], dict) else {}
    message = first.get("message") if isinstance(first.get("message"), dict) else {}
    content = message.get("content")
    if not isinstance(content, str) or not content.strip():
        raise LLMUnavailable("the endpoint's first choice has no message content")
    return content


def _delta_text(chunk: Any) -> tuple[str, bool]:
    """(text, finished) from one streamed chunk."""
    if not isinstance(chunk, dict):
        raise LLMUnavailable("the endpoint streamed a chunk that is not a JSON object")
    if "error" in chunk:
        raise LLMUnavailable("the endpoint reported an error in the stream")
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        raise LLMUnavailable("the endpoint streamed a chunk with no 'choices' list")
    if not choices:
        return "", False  # e.g. a final usage-only chunk
    first = choices[0] if isinstance(choices[0], dict) else {}
    delta = first.get("delta") if isinstance(first.get("delta"), dict) else {}
    content = delta.get("content")
    return (content if isinstance(content, str) else ""), first.get("finish_reason") is not None


class _Call:
    """One ``complete`` call: its retry loop runs in a worker thread."""

    def __init__(self, prompt: str, settings: LLMSettings, transport: httpx.BaseTransport | None) -> None:
        self.settings = settings
        self.url = endpoint_url(settings.base_url or "")
        self.shown_url = safe_url(self.url)
        self.payload = {
            "model": settings.model,
            "messages": [{"role": "user", "content": prompt}],
            "stream": settings.stream,
        }
        self.transport = transport
        self.deadline = 0.0
        self.attempts = 0
        self.cancelled = threading.Event()
        self.result: str | None = None
        self.error: LLMUnavailable | None = None

    # ----------------------------------------------------------------- helpers

    def _redact(self, text: str) -> str:
        key = self.settings.api_key.get_secret_value() if self.settings.api_key else ""
        if key:
            text = text.replace(key, "***")
        return " ".join(text.split())[:MAX_SERVER_MESSAGE]

    def _server_message(self, response: httpx.Response) -> str:
        import httpx

        try:
            body = json.loads(response.read()[:65536])
            message = body.get("error", {}).get("message") if isinstance(body, dict) else None
        except (ValueError, AttributeError, httpx.HTTPError):
            message = None
        return f": {self._redact(message)}" if isinstance(message, str) and message.strip() else ""

    def _check_alive(self) -> None:
        if self.cancelled.is_set() or time.monotonic() > self.deadline:
            raise LLMUnavailable(f"no complete answer within the {self.settings.timeout:g}s deadline")

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream" if self.settings.stream else "application/json"}
        if self.settings.api_key:
            headers["Authorization"] = f"Bearer {self.settings.api_key.get_secret_value()}"
        return headers

    # ----------------------------------------------------------------- reading

    def _read_body(self, response: httpx.Response) -> bytes:
        chunks, size = [], 0
        for chunk in response.iter_bytes():
            self._check_alive()
            size += len(chunk)
            if size > MAX_RESPONSE_BYTES:
                raise LLMUnavailable(f"the endpoint's answer exceeds {MAX_RESPONSE_BYTES} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def _read_stream(self, response: httpx.Response) -> str:
        parts: list[str] = []
        finished = False
        size = 0
        for line in response.iter_lines():
            self._check_alive()
            size += len(line)
            if size > MAX_RESPONSE_BYTES:
                raise LLMUnavailable(f"the endpoint's answer exceeds {MAX_RESPONSE_BYTES} bytes")
            if not line.startswith("data:"):
                continue  # blank separators, comments, event: and id: lines
            data = line[5:].strip()
            if data == "[DONE]":
                finished = True
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                raise LLMUnavailable("the endpoint streamed malformed JSON") from None
            text, done = _delta_text(chunk)
            parts.append(text)
            finished = finished or done
        if not finished:
            raise LLMUnavailable("the stream ended before the answer was complete")
        text = "".join(parts)
        if not text.strip():
            raise LLMUnavailable("the endpoint streamed an empty answer")
        return text

    # ----------------------------------------------------------------- one request

    def _request(self, client: httpx.Client, remaining: float) -> str:
        import httpx

        try:
            with client.stream("POST", self.url, json=self.payload, headers=self._headers(),
                               timeout=httpx.Timeout(remaining)) as response:  # fmt: skip
                status = response.status_code
                if status == 429 or status >= 500:
                    raise _Retryable(f"HTTP {status} from {self.shown_url}",
                                     parse_retry_after(response.headers.get("retry-after")))  # fmt: skip
                if not 200 <= status < 300:
                    raise LLMUnavailable(f"HTTP {status} from {self.shown_url}{self._server_message(response)}")
                content_type = response.headers.get("content-type", "")
                if self.settings.stream and "text/event-stream" in content_type:
                    return self._read_stream(response)
                # A server that ignores stream=true answers with plain JSON: accept it.
                return parse_completion(self._read_body(response))
        except httpx.TimeoutException:
            raise LLMUnavailable(f"no complete answer within the {self.settings.timeout:g}s deadline") from None
        except httpx.HTTPError as exc:
            if self.cancelled.is_set():
                raise LLMUnavailable(f"no complete answer within the {self.settings.timeout:g}s deadline") from None
            raise LLMUnavailable(f"could not talk to {self.shown_url} ({type(exc).__name__})") from None

    # ----------------------------------------------------------------- retry loop

    def _delay(self, attempt: int, retry: _Retryable) -> float:
        """Seconds to wait before the next attempt; raises when no retry can help."""
        s = self.settings
        if retry.retry_after is not None and retry.retry_after > s.max_retry_after:
            raise LLMUnavailable(f"{retry.reason}, Retry-After {retry.retry_after:g}s is too long to wait")
        if retry.retry_after is not None:
            delay = retry.retry_after
        else:
            delay = min(s.backoff_max, s.backoff_base * 2 ** (attempt - 1))
        if time.monotonic() + delay >= self.deadline:
            raise LLMUnavailable(f"{retry.reason}; no time left to retry within the {s.timeout:g}s deadline")
        return delay

    def _attempt_all(self, client: httpx.Client) -> str:
        s = self.settings
        for attempt in range(1, s.max_attempts + 1):
            self._check_alive()
            self.attempts = attempt
            logger.debug("LLM request, attempt %d of %d, to %s", attempt, s.max_attempts, self.shown_url)
            try:
                return self._request(client, self.deadline - time.monotonic())
            except _Retryable as retry:
                if attempt == s.max_attempts:
                    raise LLMUnavailable(f"{retry.reason}; gave up after {attempt} attempts") from None
                delay = self._delay(attempt, retry)
                logger.warning("LLM endpoint: %s; retrying in %.2gs", retry.reason, delay)
                if self.cancelled.wait(delay):
                    self._check_alive()
        raise AssertionError("unreachable")  # the loop returns or raises

    def run(self) -> None:
        import httpx

        try:
            with httpx.Client(transport=self.transport, follow_redirects=False) as client:
                self.result = self._attempt_all(client)
        except LLMUnavailable as exc:
            self.error = exc
        except Exception as exc:  # noqa: BLE001 - a client bug must become a fallback, never a crash
            self.error = LLMUnavailable(f"unexpected {type(exc).__name__} in the LLM client")
        if self.error is not None:
            self.error.attempts = self.attempts


def complete(prompt: str, settings: LLMSettings, *, transport: httpx.BaseTransport | None = None) -> tuple[str, int]:
    """Send ``prompt`` and return ``(answer, attempts)``; never blocks past
    ``settings.timeout`` seconds. Raises ``LLMUnavailable`` with a safe reason."""
    if not settings.configured:
        raise LLMUnavailable("no LLM endpoint configured (set NNDX_LLM_BASE_URL and NNDX_LLM_MODEL)")
    call = _Call(prompt, settings, transport)
    call.deadline = time.monotonic() + settings.timeout
    worker = threading.Thread(target=call.run, name="nndx-llm-request", daemon=True)
    worker.start()
    worker.join(settings.timeout)
    if worker.is_alive():
        call.cancelled.set()  # the worker stops at its next chunk or backoff
        raise LLMUnavailable(f"no complete answer within the {settings.timeout:g}s deadline", call.attempts)
    if call.error is not None:
        raise call.error
    assert call.result is not None
    return call.result, call.attempts
