"""Send reports to an nndx service from a training script, without ever losing one.

    from nndx.client import submit
    result = submit(report, "http://nndx.internal:8000", token="...")
    if result.spooled_to:      # the service was down: the report waits on disk
        ...                    # later: `nndx push --url http://nndx.internal:8000`

``submit`` retries connection failures, timeouts, 5xx, 429 and 408 with exponential
backoff. If the service still has not acknowledged the report, the report is written to
the spool folder (``NNDX_SPOOL_DIR``, default ``~/.cache/nndx/spool``) — atomically:
a temporary file, fsynced, then renamed — and ``submit`` returns instead of raising, so
a flaky service never crashes training. 401/403 spool too (fix the token, then push).
A report the service rejects for good (422 invalid, 413 too large) raises
:class:`SubmitError`: sending it again could never succeed.

Each report carries an ``Idempotency-Key`` (the spool file's name), so a retry after a
lost answer, or a push of a report that did reach the server, stores nothing twice.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from nndx.api.settings import ClientSettings
from nndx.errors import ServiceError
from nndx.report import Diagnosis, DiagnosticReport

RETRY_STATUSES = frozenset({408, 429})
SPOOL_STATUSES = frozenset({401, 403})  # the report is fine; the credentials are not
MAX_BACKOFF_S = 30.0


class SubmitError(ServiceError):
    """The service refused the report for good (it is invalid or too large)."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"nndx service refused the report ({status_code}): {detail}")
        self.status_code = status_code
        self.detail = detail


@dataclass(frozen=True)
class SubmitResult:
    """``report_id``/``diagnosis`` when stored; ``spooled_to`` when it waits on disk."""

    report_id: str | None = None
    diagnosis: Diagnosis | None = None
    spooled_to: Path | None = None
    reason: str | None = None  # why it was spooled

    @property
    def stored(self) -> bool:
        return self.report_id is not None


@dataclass
class PushResult:
    sent: int = 0
    rejected: list[Path] = field(default_factory=list)
    remaining: int = 0
    error: str | None = None


def default_spool_dir() -> Path:
    """``NNDX_SPOOL_DIR``, default ``~/.cache/nndx/spool`` (nndx.api.settings.ClientSettings)."""
    return ClientSettings.from_env().spool_dir


def _endpoint(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"the nndx service URL must start with http:// or https://, got {url!r}")
    return url.rstrip("/") + "/v1/reports"


class _Outcome:
    """What one POST with retries came to: acknowledged, rejected, or still unsent."""

    def __init__(self, response: httpx.Response | None, failure: str | None) -> None:
        self.response = response
        self.failure = failure


def _post(
    client: httpx.Client, endpoint: str, body: bytes, key: str, token: str | None, retries: int, backoff_s: float
) -> _Outcome:
    headers = {"content-type": "application/json", "idempotency-key": key}
    if token:
        headers["authorization"] = f"Bearer {token}"
    failure = "not attempted"
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(min(MAX_BACKOFF_S, backoff_s * 2 ** (attempt - 1)))
        try:
            response = client.post(endpoint, content=body, headers=headers)
        except httpx.TransportError as exc:
            failure = f"{type(exc).__name__}: {exc}"
            continue
        if response.status_code >= 500 or response.status_code in RETRY_STATUSES:
            failure = f"HTTP {response.status_code}"
            continue
        return _Outcome(response, None)
    return _Outcome(None, failure)


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail"))
    except (ValueError, AttributeError):
        return response.text[:500]


def spool(body: bytes, key: str, spool_dir: Path | None = None) -> Path:
    """Write one report's JSON to the spool atomically; returns its path."""
    folder = Path(spool_dir) if spool_dir is not None else default_spool_dir()
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"{key}.json"
    temporary = folder / f".{key}.json.tmp"
    with open(temporary, "wb") as handle:
        handle.write(body)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, final)  # readers see the whole file or none of it
    try:
        directory = os.open(folder, os.O_RDONLY)
    except OSError:
        return final
    try:
        os.fsync(directory)  # make the rename itself durable
    finally:
        os.close(directory)
    return final


def submit(
    report: DiagnosticReport,
    url: str,
    token: str | None = None,
    *,
    spool_dir: Path | str | None = None,
    retries: int = 3,
    timeout_s: float = 10.0,
    backoff_s: float = 0.5,
) -> SubmitResult:
    """POST ``report`` to the service at ``url`` (e.g. ``http://127.0.0.1:8000``).

    Returns the stored id and diagnosis, or — when the service is unreachable or
    failing after ``retries`` — the spool path the report was saved to. Raises
    :class:`SubmitError` only for a report the service can never accept.
    """
    endpoint = _endpoint(url)
    body = report.model_dump_json().encode()
    key = uuid.uuid4().hex
    with httpx.Client(timeout=timeout_s) as client:
        outcome = _post(client, endpoint, body, key, token, retries, backoff_s)
    response = outcome.response
    if response is not None and response.status_code in (200, 201):
        data = response.json()
        return SubmitResult(report_id=data["id"], diagnosis=Diagnosis.model_validate(data["diagnosis"]))
    if response is not None and response.status_code not in SPOOL_STATUSES:
        raise SubmitError(response.status_code, _detail(response))
    reason = outcome.failure if response is None else f"HTTP {response.status_code}: {_detail(response)}"
    path = spool(body, key, Path(spool_dir) if spool_dir is not None else None)
    return SubmitResult(spooled_to=path, reason=reason)


def spooled_files(spool_dir: Path | str | None = None) -> list[Path]:
    """Spooled reports, oldest first (temporary files of an interrupted write excluded)."""
    folder = Path(spool_dir) if spool_dir is not None else default_spool_dir()
    if not folder.is_dir():
        return []
    files = [p for p in folder.glob("*.json") if not p.name.startswith(".")]
    return sorted(files, key=lambda p: (p.stat().st_mtime, p.name))


def push(
    url: str,
    token: str | None = None,
    *,
    spool_dir: Path | str | None = None,
    retries: int = 3,
    timeout_s: float = 10.0,
    backoff_s: float = 0.5,
) -> PushResult:
    """Send every spooled report; delete a file only once the service acknowledged it.

    Stops at the first report the service cannot take now (down, 5xx, bad token) and
    leaves it and the rest in place. A report refused for good stays too, listed in
    ``rejected``, so nothing is ever deleted unacknowledged.
    """
    endpoint = _endpoint(url)
    files = spooled_files(spool_dir)
    result = PushResult()
    with httpx.Client(timeout=timeout_s) as client:
        for index, path in enumerate(files):
            outcome = _post(client, endpoint, path.read_bytes(), path.stem, token, retries, backoff_s)
            response = outcome.response
            if response is not None and response.status_code in (200, 201):
                path.unlink()
                result.sent += 1
            elif response is not None and response.status_code not in SPOOL_STATUSES:
                result.rejected.append(path)
            else:
                result.error = outcome.failure or f"HTTP {response.status_code}: {_detail(response)}"
                result.remaining = len(files) - index
                return result
    result.remaining = len(result.rejected)
    return result
