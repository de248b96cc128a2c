"""Response models of the HTTP API (the request bodies are nndx.report's models).

They derive from ``nndx.report.Schema`` so that non-finite floats inside a diagnosis
serialise as the strings "NaN"/"Infinity", the same way the reports do.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from nndx.report import Diagnosis, Schema, Severity


class ReportCreated(Schema):
    id: str = Field(description="opaque id of the stored report")
    created_at: datetime
    project: str | None = None
    run_name: str | None = None
    url: str = Field(description="path of the stored report")
    diagnosis: Diagnosis


class ReportSummary(Schema):
    id: str
    created_at: datetime
    project: str | None = None
    run_name: str | None = None
    top_cause: str | None = Field(None, description="cause code of the top-ranked finding")
    cause_codes: list[str] = Field(default_factory=list, description="every cause code in the diagnosis")
    severity_max: Severity | None = None


class ReportList(Schema):
    items: list[ReportSummary]
    next_cursor: str | None = Field(None, description="pass as `cursor` for the next page; null on the last")


class Health(Schema):
    status: Literal["ok"] = "ok"
    database: Literal["ok"] = "ok"
    schema_version: int


class ErrorDetail(Schema):
    detail: str


def error_responses(*codes: int) -> dict[int | str, dict]:
    """OpenAPI entries for the error answers a route can give."""
    meaning = {
        401: "no valid bearer token",
        403: "the report's project is not the token's project",
        404: "no such report (or not visible to this token)",
        408: "the request body did not arrive in time (NNDX_BODY_TIMEOUT)",
        409: "the Idempotency-Key was already used for a different report of this project",
        413: "request body over the limit",
        415: "the body is not sent as application/json",
        503: "the report store is unavailable (down or full); retry after Retry-After seconds",
    }
    # content spelled out: on HTML routes FastAPI would otherwise document errors as text/html
    json_error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorDetail"}}}
    return {code: {"model": ErrorDetail, "description": meaning[code], "content": json_error} for code in codes}
