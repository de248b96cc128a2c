"""The v1 JSON API: store, list, read, diagnose, render and explain reports."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any

from fastapi.concurrency import run_in_threadpool
from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, Response, status
from pydantic import BaseModel

from nndx.api.auth import get_scope
from nndx.api.deps import REPORT_BODY_OPENAPI, Diagnose, get_diagnose, get_report, get_store, report_body
from nndx.api.models import ReportCreated, ReportList, ReportSummary, error_responses
from nndx.api.storage import (
    MAX_LIMIT,
    MAX_PROJECT_CHARS,
    MAX_RUN_NAME_CHARS,
    IdempotencyConflict,
    InvalidCursor,
    ReportStore,
    StoredReport,
    UnstorableReport,
)
from nndx.prompts import Explanation, explain_async, render
from nndx.report import CauseCode, Diagnosis, DiagnosticReport, RunInfo, Severity

logger = logging.getLogger("nndx.api")
router = APIRouter(prefix="/v1", tags=["reports"])

MARKDOWN = {200: {"content": {"text/markdown": {"schema": {"type": "string"}}}, "description": "Markdown"}}


def json_response(model: BaseModel, status_code: int = 200) -> Response:
    """Serialise with pydantic, which writes NaN/Infinity as strings (FastAPI's encoder would not)."""
    return Response(model.model_dump_json(), status_code=status_code, media_type="application/json")


def invalid_input(loc: tuple[str, ...], message: str) -> HTTPException:
    """A 422 in the shape of FastAPI's own, naming the field."""
    return HTTPException(422, detail=[{"loc": list(loc), "msg": message, "type": "value_error"}])


def _diagnosed(diagnose: Diagnose, report: DiagnosticReport) -> Diagnosis:
    """Run the rule engine; a report it cannot process is answered 422, not 500.

    The report passed schema validation, so a failure here is an engine bug triggered by
    unusual values: it is logged with its traceback for the operator, and the client
    gets the exception's type and message (and keeps its report: nothing was stored).
    """
    try:
        return diagnose(report)
    except Exception as exc:
        logger.exception("the rule engine failed on a report")
        raise HTTPException(
            422,
            detail=[{"loc": ["body"], "msg": f"the rule engine could not diagnose this report: "
                     f"{type(exc).__name__}: {str(exc)[:500]}", "type": "diagnosis_failed"}],
        ) from None


def _scoped(report: DiagnosticReport, scope: str | None) -> DiagnosticReport:
    """The report with its project set to the token's, or 403 if it names another."""
    if scope is None:
        return report
    run = report.run or RunInfo()
    if run.project is None:
        return report.model_copy(update={"run": run.model_copy(update={"project": scope})})
    if run.project != scope:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, detail="the report's run.project is not the project of this token"
        )
    return report


@router.post(
    "/reports",
    status_code=201,
    response_model=ReportCreated,
    responses={200: {"model": ReportCreated, "description": "already stored under this Idempotency-Key"}}
    | error_responses(401, 403, 409, 413, 503),
    summary="Store a report and diagnose it",
    openapi_extra=REPORT_BODY_OPENAPI,
)
async def create_report(
    report: DiagnosticReport = Depends(report_body),
    idempotency_key: str | None = Header(
        None, max_length=128, description="client-chosen key; a retry with the same key stores nothing new"
    ),
    scope: str | None = Depends(get_scope),
    store: ReportStore = Depends(get_store),
    diagnose: Diagnose = Depends(get_diagnose),
) -> Response:
    """Validate, diagnose and store the report; answered only after the commit.

    ``async``: the CPU work runs on the event loop, which goes on serving other requests
    while the store's writer thread commits this report with others (group commit).
    """
    report = _scoped(report, scope)
    diagnosis = _diagnosed(diagnose, report)
    try:
        stored, created = await store.add_async(report, diagnosis, idempotency_key=idempotency_key)
    except UnstorableReport as exc:
        raise invalid_input(("body", *exc.loc), exc.message) from None
    except IdempotencyConflict as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from None
    if not created:
        diagnosis = stored.diagnosis()
    body = ReportCreated(
        id=stored.id,
        created_at=stored.created_at,
        project=stored.project,
        run_name=stored.run_name,
        url=f"/v1/reports/{stored.id}",
        diagnosis=diagnosis,
    )
    return json_response(body, status.HTTP_201_CREATED if created else status.HTTP_200_OK)


def text_filter(description: str, max_length: int) -> Any:
    """A text query parameter that no backend chokes on: no NUL, bounded length (422)."""
    return Query(None, description=description, max_length=max_length, pattern=r"^[^\x00]*$")


@router.get(
    "/reports",
    response_model=ReportList,
    responses=error_responses(401, 503),
    summary="List reports, newest first, filtered",
)
def list_reports(
    project: str | None = text_filter("only this project", MAX_PROJECT_CHARS),
    run_name: str | None = text_filter("only runs of exactly this name", MAX_RUN_NAME_CHARS),
    q: str | None = text_filter("only runs whose name contains this text (case-insensitive)", MAX_RUN_NAME_CHARS),
    cause: CauseCode | None = Query(None, description="only reports with a finding of this cause"),
    severity: Severity | None = Query(None, description="only reports whose worst finding is at least this severe"),
    since: datetime | None = Query(None, description="only reports stored at or after this time (ISO 8601)"),
    until: datetime | None = Query(None, description="only reports stored before this time (ISO 8601)"),
    limit: int = Query(50, ge=1, le=MAX_LIMIT),
    cursor: str | None = Query(None, max_length=64, description="next_cursor of the previous page"),
    scope: str | None = Depends(get_scope),
    store: ReportStore = Depends(get_store),
) -> Response:
    try:
        page = store.list(
            scope=scope,
            project=project,
            run_name=run_name,
            search=q,
            cause=cause.value if cause else None,
            severity=severity,
            since=since,
            until=until,
            limit=limit,
            cursor=cursor,
        )
    except InvalidCursor as exc:
        raise invalid_input(("query", "cursor"), str(exc)) from None
    items = [
        ReportSummary(
            id=s.id,
            created_at=s.created_at,
            project=s.project,
            run_name=s.run_name,
            top_cause=s.top_cause,
            cause_codes=list(s.cause_codes),
            severity_max=s.severity_max,  # type: ignore[arg-type]
        )
        for s in page.items
    ]
    return json_response(ReportList(items=items, next_cursor=page.next_cursor))


@router.get(
    "/reports/{report_id}",
    response_model=DiagnosticReport,
    responses=error_responses(401, 404),
    summary="The stored report",
)
def read_report(stored: StoredReport = Depends(get_report)) -> Response:
    return Response(stored.report_json, media_type="application/json")


@router.get(
    "/reports/{report_id}/diagnosis",
    response_model=Diagnosis,
    responses=error_responses(401, 404),
    summary="The diagnosis made when the report was stored",
)
def read_diagnosis(stored: StoredReport = Depends(get_report)) -> Response:
    return Response(stored.diagnosis_json, media_type="application/json")


def _render(stored: StoredReport, name: str) -> Response:
    report = stored.report()
    diagnosis = stored.diagnosis()
    text = render(report=report, diagnosis=diagnosis)[name]
    return Response(text, media_type="text/markdown; charset=utf-8")


@router.get(
    "/reports/{report_id}/prompt",
    response_class=Response,
    responses=MARKDOWN | error_responses(401, 404),
    summary="prompt-nn-debugger.md for this report",
)
def read_prompt(stored: StoredReport = Depends(get_report)) -> Response:
    return _render(stored, "prompt-nn-debugger.md")


@router.get(
    "/reports/{report_id}/checklist",
    response_class=Response,
    responses=MARKDOWN | error_responses(401, 404),
    summary="skill-debug-checklist.md for this report",
)
def read_checklist(stored: StoredReport = Depends(get_report)) -> Response:
    return _render(stored, "skill-debug-checklist.md")


@router.post(
    "/reports/{report_id}/explain",
    response_model=Explanation,
    responses=error_responses(401, 404, 503),
    summary="Explain the report: the configured LLM, or rule-only",
)
async def explain_report(
    request: Request,
    offline: bool = Query(False, description="rule-only explanation, no LLM call"),
    stored: StoredReport = Depends(get_report),
) -> Response:
    """``async``: waiting on the LLM holds no thread, so a slow or hung LLM delays only
    the explains (never past their deadline) and nothing else. The LLM calls in flight
    are bounded (``NNDX_LLM_MAX_IN_FLIGHT``); waiting for a slot counts against the
    deadline, after which the answer is the rule-only explanation."""
    report, diagnosis = await run_in_threadpool(lambda: (stored.report(), stored.diagnosis()))
    settings = request.app.state.llm_settings
    loop = asyncio.get_running_loop()
    # the deadline counts from the request's arrival (nndx.api.limits), not from here
    elapsed = loop.time() - getattr(request.state, "received_at", loop.time())
    explanation = await explain_async(
        report, diagnosis, offline=offline, settings=settings, slots=request.app.state.llm_slots,
        budget=settings.timeout - elapsed,
    )
    return json_response(explanation)


@router.post(
    "/diagnose",
    response_model=Diagnosis,
    responses=error_responses(401, 413),
    dependencies=[Depends(get_scope)],
    summary="Diagnose a report without storing it",
    openapi_extra=REPORT_BODY_OPENAPI,
)
def diagnose_report(
    report: DiagnosticReport = Depends(report_body), diagnose: Diagnose = Depends(get_diagnose)
) -> Response:
    return json_response(_diagnosed(diagnose, report))
