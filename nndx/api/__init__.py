"""API: the FastAPI service that stores, diagnoses, renders and explains reports.

Start it with ``nndx serve`` (uvicorn; ``--host --port --workers --database-url``), or
with any ASGI server as the factory ``nndx.api.app:create_app``. Settings come from the
environment, in one place (``nndx.api.settings``): ``NNDX_DATABASE_URL``,
``NNDX_TOKENS`` / ``NNDX_TOKENS_FILE``, ``NNDX_MAX_BODY_BYTES``; the LLM used by
``/explain`` is configured by ``NNDX_LLM_*`` (``nndx.prompts.settings``).

Endpoints (OpenAPI at ``/docs`` and ``/openapi.json``)::

    POST /v1/reports                      validate, diagnose, store → 201 {id, diagnosis}
    GET  /v1/reports                      ?project= &run_name= &q= &cause= &severity= &since= &until=
                                          &limit= &cursor=  (newest first)
    GET  /v1/reports/{id}                 the report as stored
    GET  /v1/reports/{id}/diagnosis       the diagnosis made when it was stored
    GET  /v1/reports/{id}/prompt          prompt-nn-debugger.md (text/markdown)
    GET  /v1/reports/{id}/checklist       skill-debug-checklist.md (text/markdown)
    POST /v1/reports/{id}/explain         ?offline=true for rule-only; else the LLM
    POST /v1/diagnose                     diagnose without storing
    GET  /healthz                         no token needed; reveals no data
    GET  /  and  /reports/{id}            HTML: recent reports; one report with plots

Storage (``nndx.api.storage``): a SQLite file by default (WAL, ``synchronous=FULL``,
created and migrated on start). Concurrent POSTs are group-committed: one transaction
and one fsync for every report waiting, and none answered before its commit, so a
SIGKILL or power cut after a 201 loses nothing. Several workers of one ``nndx serve``
may share the SQLite file; for API processes on several hosts use PostgreSQL
(``NNDX_DATABASE_URL=postgresql+psycopg://user:pass@host/nndx``, ``pip install
'nndx[postgres]'``). Reports are immutable; ``Idempotency-Key`` makes a client's retry
harmless (a key is scoped to its project; reused for a different report: 409).

Auth (``nndx.api.auth``): with tokens configured every endpoint but ``/healthz``
needs ``Authorization: Bearer <token>``, and a token sees only its project's reports
(another project's id answers 404, like a missing one). The HTML pages take the same
header — put a proxy that adds it in front of browsers.

Bad input is a 4xx, never a 5xx: 413 over the body limit (chunked bodies too), 415
for a body not sent as JSON, 408 for a body slower than ``NNDX_BODY_TIMEOUT``, 422 for
malformed JSON, a schema violation or text no index can hold (``loc`` names the field),
404 for an unknown id. A store that is down or full answers 503 with Retry-After.
A POST without a valid token is refused before its body is read. Every answer carries
a Content-Security-Policy (``nndx.api.limits.CONTENT_SECURITY_POLICY``: scripts and
styles from the service itself only), ``X-Content-Type-Options: nosniff`` and
``X-Frame-Options: DENY``.
"""
