"""FastAPI dependencies shared by the routers: the store, the rule engine, a report.

The rule engine and the renderers are looked up here, at request time, so that the
service starts (and lists and serves stored reports) even in a build without them;
the endpoints that need them answer 503 with the reason instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Depends, HTTPException, Request, status

from nndx.api.auth import get_scope
from nndx.api.storage import ReportStore, StoredReport
from nndx.report import Diagnosis, DiagnosticReport

Diagnose = Callable[[DiagnosticReport], Diagnosis]


def get_store(request: Request) -> ReportStore:
    return request.app.state.store


def get_diagnose() -> Diagnose:
    """``nndx.rules.diagnose``; tests may override this dependency."""
    try:
        from nndx.rules import diagnose
    except ImportError as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, detail=f"rule engine unavailable: {exc}") from None
    return diagnose


def get_prompts() -> Any:
    """The ``nndx.prompts`` module (``render`` and ``explain``)."""
    try:
        import nndx.prompts as prompts

        prompts.render, prompts.explain  # noqa: B018 - fail here, not mid-request
    except (ImportError, AttributeError) as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, detail=f"prompt rendering unavailable: {exc}") from None
    return prompts


def get_report(
    report_id: str, scope: str | None = Depends(get_scope), store: ReportStore = Depends(get_store)
) -> StoredReport:
    """The stored report, or 404 — also when it belongs to another project than the token's."""
    stored = store.get(report_id, scope=scope)
    if stored is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail="report not found")
    return stored
