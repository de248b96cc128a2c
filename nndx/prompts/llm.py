"""A small OpenAI-compatible chat-completions client with a hard total deadline.

How to use::

    text, attempts = complete(prompt, LLMSettings.from_env())              # raises LLMUnavailable
    text, attempts = await complete_async(prompt, LLMSettings.from_env())  # in an event loop

It sends ``POST {base_url}/chat/completions`` with the prompt as the one user message,
``Authorization: Bearer <key>`` when a key is set, and reads either a JSON answer or,
with ``stream=True``, server-sent events (``data: {...}`` chunks up to ``data: [DONE]``).
Hosted APIs, vLLM, llama.cpp server and Ollama all speak this.

Why it is built this way:

- Asynchronous, so that a service waiting on a slow LLM holds no thread: the nndx
  service awaits :func:`complete_async`; :func:`complete` runs it on an event loop of
  its own for scripts and the CLI.
- The deadline is total. httpx timeouts bound each connect and each read, so a server
  that trickles one byte a second would never time out; the whole call (retries and
  backoff included) is therefore cancelled when ``timeout`` seconds have passed.
- Retries only where a retry can help: 429 and 5xx, with exponential backoff, honouring
  a small ``Retry-After``, and never a retry that cannot finish before the deadline.
  Anything else (4xx, connection refused, malformed answer) fails at once.
- The key lives only in the request header. Every reason, log line and exception is
  built from status codes, exception type names and redacted server messages, never
  from the request, so the key cannot leak through them. A server message that echoes
  the key, whole or in part (a prefix, a suffix, a masked middle), is redacted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import functools
import json
import logging
import re
import ssl
import time
from collections.abc import Callable, Coroutine
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # imported where a request is made: `nndx --help` and the rules never load httpx
    import httpx

from nndx.errors import ServiceError
from nndx.prompts.settings import LLMSettings

logger = logging.getLogger(__name__)

T = TypeVar("T")
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


#: A run of this many characters of the key, anywhere in a server message, is redacted.
MIN_ECHO_CHARS = 4


def redact(text: str, secret: str) -> str:
    """``text`` with every echo of ``secret`` replaced by ``***``: the whole key, and
    any run of at least MIN_ECHO_CHARS of its characters that appears in the text (the
    "sk-...1234" a server prints when it masks a key it refuses)."""
    if not secret:
        return text
    text = text.replace(secret, "***")
    if len(secret) > 512:  # not a key: no search for its pieces
        return text
    length = len(secret)
    pieces = {secret[start:start + size] for size in range(length - 1, MIN_ECHO_CHARS - 1, -1)
              for start in range(length - size + 1)}  # fmt: skip
    pieces = {piece for piece in pieces if piece in text}
    for piece in sorted(pieces, key=len, reverse=True):
        text = text.replace(piece, "***")
    return re.sub(r"(\*\*\*)+", "***", text)


class _Call:
    """One ``complete`` call: its attempts, their count, and what each one read."""

    def __init__(self, prompt: str, settings: LLMSettings) -> None:
        self.settings = settings
        self.url = endpoint_url(settings.base_url or "")
        self.shown_url = safe_url(self.url)
        self.payload = {
            "model": settings.model,
            "messages": [{"role": "user", "content": prompt}],
            "stream": settings.stream,
        }
        self.deadline = time.monotonic() + settings.timeout
        self.attempts = 0

    # ----------------------------------------------------------------- helpers

    def _redact(self, text: str) -> str:
        key = self.settings.api_key.get_secret_value() if self.settings.api_key else ""
        return " ".join(redact(text, key).split())[:MAX_SERVER_MESSAGE]

    async def _server_message(self, response: httpx.Response) -> str:
        import httpx

        try:
            body = json.loads((await response.aread())[:65536])
            message = body.get("error", {}).get("message") if isinstance(body, dict) else None
        except (ValueError, AttributeError, httpx.HTTPError):
            message = None
        return f": {self._redact(message)}" if isinstance(message, str) and message.strip() else ""

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream" if self.settings.stream else "application/json"}
        if self.settings.api_key:
            headers["Authorization"] = f"Bearer {self.settings.api_key.get_secret_value()}"
        return headers

    # ----------------------------------------------------------------- reading

    async def _read_body(self, response: httpx.Response) -> bytes:
        chunks, size = [], 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > MAX_RESPONSE_BYTES:
                raise LLMUnavailable(f"the endpoint's answer exceeds {MAX_RESPONSE_BYTES} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def _read_stream(self, response: httpx.Response) -> str:
        parts: list[str] = []
        finished = False
        size = 0
        async for line in response.aiter_lines():
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

    async def _request(self, client: httpx.AsyncClient) -> str:
        import httpx

        try:
            async with client.stream("POST", self.url, json=self.payload, headers=self._headers()) as response:
                status = response.status_code
                if status == 429 or status >= 500:
                    raise _Retryable(f"HTTP {status} from {self.shown_url}",
                                     parse_retry_after(response.headers.get("retry-after")))  # fmt: skip
                if not 200 <= status < 300:
                    raise LLMUnavailable(f"HTTP {status} from {self.shown_url}{await self._server_message(response)}")
                content_type = response.headers.get("content-type", "")
                if self.settings.stream and "text/event-stream" in content_type:
                    return await self._read_stream(response)
                # A server that ignores stream=true answers with plain JSON: accept it.
                return parse_completion(await self._read_body(response))
        except httpx.TimeoutException:
            raise LLMUnavailable(f"no complete answer within the {self.settings.timeout:g}s deadline") from None
        except httpx.HTTPError as exc:
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

    async def attempt_all(self, transport: httpx.AsyncBaseTransport | None) -> str:
        import httpx

        s = self.settings
        async with httpx.AsyncClient(
            transport=transport, follow_redirects=False, timeout=s.timeout, verify=_ssl_context()
        ) as client:
            for attempt in range(1, s.max_attempts + 1):
                self.attempts = attempt
                logger.debug("LLM request, attempt %d of %d, to %s", attempt, s.max_attempts, self.shown_url)
                try:
                    return await self._request(client)
                except _Retryable as retry:
                    if attempt == s.max_attempts:
                        raise LLMUnavailable(f"{retry.reason}; gave up after {attempt} attempts") from None
                    delay = self._delay(attempt, retry)
                    logger.warning("LLM endpoint: %s; retrying in %.2gs", retry.reason, delay)
                    await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # the loop returns or raises


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One TLS context for every call: building one (certificates loaded) costs more CPU
    than a whole short LLM request, and a client per call would build one each time."""
    import httpx

    return httpx.create_ssl_context()


async def complete_async(
    prompt: str, settings: LLMSettings, *, transport: httpx.AsyncBaseTransport | None = None
) -> tuple[str, int]:
    """Send ``prompt`` and return ``(answer, attempts)``; never takes longer than
    ``settings.timeout`` seconds. Raises ``LLMUnavailable`` with a safe reason."""
    if not settings.configured:
        raise LLMUnavailable("no LLM endpoint configured (set NNDX_LLM_BASE_URL and NNDX_LLM_MODEL)")
    call = _Call(prompt, settings)
    try:
        return await asyncio.wait_for(call.attempt_all(transport), settings.timeout), call.attempts
    except asyncio.TimeoutError:
        raise LLMUnavailable(f"no complete answer within the {settings.timeout:g}s deadline", call.attempts) from None
    except LLMUnavailable as exc:
        exc.attempts = call.attempts
        raise
    except Exception as exc:  # noqa: BLE001 - a client bug must become a fallback, never a crash
        raise LLMUnavailable(f"unexpected {type(exc).__name__} in the LLM client", call.attempts) from None


def run_blocking(make_coroutine: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from code without an event loop (scripts, the CLI).
    Called where a loop already runs (a notebook), it runs on a loop of its own in a
    worker thread, since that loop cannot be re-entered."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make_coroutine())
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nndx-llm") as pool:
        return pool.submit(lambda: asyncio.run(make_coroutine())).result()


def complete(
    prompt: str, settings: LLMSettings, *, transport: httpx.AsyncBaseTransport | None = None
) -> tuple[str, int]:
    """:func:`complete_async`, blocking (see :func:`run_blocking`)."""
    return run_blocking(lambda: complete_async(prompt, settings, transport=transport))
