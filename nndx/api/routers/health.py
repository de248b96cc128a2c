"""Liveness and readiness: answers without a token and reveals no report data."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from nndx.api.deps import get_store
from nndx.api.models import Health, error_responses
from nndx.api.storage import SCHEMA_VERSION, ReportStore

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, responses=error_responses(503), summary="Service and database health")
def healthz(store: ReportStore = Depends(get_store)) -> Response:
    """200 when the store takes a write of about a report's size now; otherwise the
    StorageUnavailable it raised becomes a JSON 503 with Retry-After (nndx.api.app)."""
    store.check_writable()
    return Response(Health(schema_version=SCHEMA_VERSION).model_dump_json(), media_type="application/json")
