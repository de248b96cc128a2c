"""Liveness and readiness: answers without a token and reveals no report data."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from nndx.api.deps import get_store
from nndx.api.models import Health, error_responses
from nndx.api.storage import SCHEMA_VERSION, ReportStore

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, responses=error_responses(503), summary="Service and database health")
def healthz(store: ReportStore = Depends(get_store)) -> Response:
    try:
        store.ping()
    except Exception as exc:  # any database failure means "not ready", never a crash
        return Response(
            f'{{"detail": "database unavailable: {type(exc).__name__}"}}',
            status_code=503,
            media_type="application/json",
        )
    return Response(Health(schema_version=SCHEMA_VERSION).model_dump_json(), media_type="application/json")
