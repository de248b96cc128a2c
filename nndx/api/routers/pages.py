"""HTML pages: the list of recent reports and one report with its findings and plots.

Templates are autoescaped; the only markup passed through unescaped is the SVG made by
nndx.api.plots, which escapes every piece of text itself.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader

from nndx.api.auth import get_scope
from nndx.api.deps import get_report, get_store
from nndx.api.models import error_responses
from nndx.api.plots import latest_per_layer, report_charts
from nndx.api.storage import InvalidCursor, ReportStore, StoredReport

router = APIRouter(tags=["pages"])
INDEX_PAGE_SIZE = 50


def format_evidence(value: Any) -> str:
    """Evidence values for people: 4 significant digits, NaN/inf spelled out."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return f"{value:.4g}"
    if isinstance(value, list):
        return "[" + ", ".join(format_evidence(v) for v in value) + "]"
    return str(value)


_environment = Environment(
    loader=FileSystemLoader(Path(__file__).resolve().parent.parent / "templates"), autoescape=True
)
_environment.filters["evidence"] = format_evidence
templates = Jinja2Templates(env=_environment)


@router.get("/", response_class=HTMLResponse, responses=error_responses(401), summary="Recent reports")
def index(
    request: Request,
    cursor: str | None = Query(None),
    scope: str | None = Depends(get_scope),
    store: ReportStore = Depends(get_store),
) -> HTMLResponse:
    try:
        page = store.list(scope=scope, limit=INDEX_PAGE_SIZE, cursor=cursor)
    except InvalidCursor as exc:
        raise HTTPException(
            422, detail=[{"loc": ["query", "cursor"], "msg": str(exc), "type": "value_error"}]
        ) from None
    return templates.TemplateResponse(
        request, "index.html", {"reports": page.items, "next_cursor": page.next_cursor}
    )


@router.get(
    "/reports/{report_id}", response_class=HTMLResponse, responses=error_responses(401, 404), summary="One report"
)
def report_page(request: Request, stored: StoredReport = Depends(get_report)) -> HTMLResponse:
    report = stored.report()
    diagnosis = stored.diagnosis()
    return templates.TemplateResponse(
        request,
        "report.html",
        {
            "stored": stored,
            "report": report,
            "diagnosis": diagnosis,
            "charts": report_charts(report),
            "layers": latest_per_layer(report),
        },
    )
