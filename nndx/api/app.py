"""The FastAPI application: ``create_app(settings)`` wires settings, storage and routers.

Run it with ``nndx serve`` (uvicorn), or with any ASGI server as the factory
``nndx.api.app:create_app``. The store is opened (and its schema migrated) when the
app is created, so a misconfigured database fails at start-up, not on the first POST.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from nndx import __version__
from nndx.api.auth import bearer_project
from nndx.api.limits import RequestGuard, SecurityHeaders
from nndx.api.routers import health, pages, reports
from nndx.api.settings import Settings
from nndx.api.storage import ReportStore, StorageUnavailable
from nndx.prompts import LLMSettings

logger = logging.getLogger("nndx.api")

#: Allocations between generation-0 collections while the service runs (CPython: 700).
GC_THRESHOLD = 10_000


async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 naming each offending field (``loc``), without echoing the input back: the
    input may be megabytes, may hold secrets, and may hold NaN that JSON cannot carry."""
    errors = [
        {"loc": [str(part) for part in error.get("loc", ())], "msg": str(error.get("msg", "")), "type": str(error.get("type", ""))}
        for error in exc.errors()
    ]
    return JSONResponse({"detail": errors}, status_code=422)


#: Seconds a client is asked to wait before retrying when the store cannot answer.
RETRY_AFTER_S = 5


async def _storage_unavailable(_request: Request, exc: StorageUnavailable) -> JSONResponse:
    """503 with Retry-After, as a normal answer: the connection stays open for the retry.
    The reason names the exception type only; the database's own message is logged."""
    logger.warning("%s", exc)
    cause = type(exc.__cause__).__name__ if exc.__cause__ is not None else "StorageUnavailable"
    return JSONResponse(
        {"detail": f"the report store is unavailable ({cause}); retry later"},
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


async def _http_error(request: Request, exc: StarletteHTTPException):  # type: ignore[no-untyped-def]
    """FastAPI answers 400 for a body it cannot decode (invalid UTF-8); nndx raises no
    400 itself, so every 400 is that case: answer it like any other malformed JSON."""
    if exc.status_code == 400:
        return JSONResponse(
            {"detail": [{"loc": ["body"], "msg": "body is not valid UTF-8 JSON", "type": "json_invalid"}]},
            status_code=422,
        )
    return await http_exception_handler(request, exc)


def create_app(settings: Settings | None = None) -> FastAPI:
    """The nndx service. ``settings`` default to :meth:`Settings.from_env`."""
    settings = settings or Settings.from_env()
    # read NNDX_LLM_* now, so a bad LLM setting stops start-up instead of failing each explain
    llm_settings = LLMSettings.from_env()
    store = ReportStore(settings.database_url)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # Validating one 50-layer report creates a few thousand short-lived containers,
        # so at CPython's default threshold (700) nearly every POST ran a collection,
        # and with 16 reports in flight the older generations were big: 1.3 ms of GC per
        # report, a fifth of its CPU. Reference counting frees these objects anyway;
        # a higher threshold keeps cycle collection for what is really garbage.
        thresholds = gc.get_threshold()
        gc.set_threshold(max(thresholds[0], GC_THRESHOLD), *thresholds[1:])
        try:
            yield
        finally:
            gc.set_threshold(*thresholds)
            store.close()

    app = FastAPI(
        title="nndx",
        version=__version__,
        description="Stores, diagnoses, renders and explains neural-network training reports.",
        lifespan=lifespan,
        # one schema per model, in validation mode: the request body of POST /v1/reports
        # refers to the DiagnosticReport component that GET /v1/reports/{id} also uses
        separate_input_output_schemas=False,
    )
    app.state.settings = settings
    app.state.llm_settings = llm_settings
    # the LLM calls this process makes at once; an explain beyond it waits for a slot
    app.state.llm_slots = asyncio.Semaphore(settings.llm_max_in_flight)
    app.state.store = store
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(StorageUnavailable, _storage_unavailable)  # type: ignore[arg-type]
    app.add_middleware(
        RequestGuard,
        max_body_bytes=settings.max_body_bytes,
        body_timeout=settings.body_timeout,
        is_authorized=(lambda header: bearer_project(settings, header) is not None) if settings.auth_enabled else None,
    )
    app.add_middleware(SecurityHeaders)
    app.include_router(health.router)
    app.include_router(reports.router)
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(directory=pages.STATIC_DIR), name="static")
    return app
