"""``nndx serve`` (the HTTP service under uvicorn) and ``nndx push`` (send the spool)."""

from __future__ import annotations

import argparse
import os
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this subpackage's commands to the ``nndx`` parser. Defaults are left to the
    settings classes (nndx/api/settings.py), which read the environment."""
    serve = subparsers.add_parser(
        "serve",
        help="run the nndx HTTP service",
        description="Serve the nndx API and HTML pages with uvicorn. The database is created "
        "and migrated on start. Settings: flags, else NNDX_* environment variables "
        "(NNDX_TOKENS, NNDX_TOKENS_FILE, NNDX_MAX_BODY_BYTES, NNDX_BODY_TIMEOUT, "
        "NNDX_LLM_MAX_IN_FLIGHT: see nndx/api/settings.py).",
    )
    serve.add_argument("--host", default=None, help="interface to bind (env NNDX_HOST; default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="TCP port (env NNDX_PORT; default 8000)")
    serve.add_argument("--workers", type=int, default=None, help="worker processes (env NNDX_WORKERS; default 1)")
    serve.add_argument("--database-url", default=None,
                       help="SQLAlchemy URL (env NNDX_DATABASE_URL; default sqlite:///./nndx.sqlite3)")
    serve.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    serve.set_defaults(handler=_serve)

    push = subparsers.add_parser(
        "push",
        help="send spooled reports to an nndx service",
        description="Send the reports that nndx.client.submit spooled while the service was "
        "unreachable. A file is deleted only after the service acknowledged it.",
    )
    push.add_argument("--url", default=None, help="service base URL (env NNDX_URL; default http://127.0.0.1:8000)")
    push.add_argument("--token", default=None, help="bearer token (env NNDX_TOKEN)")
    push.add_argument("--spool-dir", default=None,
                      help="spool folder (env NNDX_SPOOL_DIR; default ~/.cache/nndx/spool)")
    push.set_defaults(handler=_push)


def _serve(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401 - the service's extra, checked before anything starts
        import sqlalchemy  # noqa: F401
        import uvicorn
    except ImportError as exc:
        print(f"nndx serve: {exc.name} is not installed; the service needs pip install 'nndx[server]'",
              file=sys.stderr)
        return 2

    from nndx.api.settings import Settings
    from nndx.api.storage import ReportStore
    from nndx.prompts import LLMSettings

    if args.database_url:
        # the one way to hand a setting to uvicorn's worker processes: their environment,
        # which they read through Settings like any other
        os.environ["NNDX_DATABASE_URL"] = args.database_url
    try:
        settings = Settings.from_env()
        LLMSettings.from_env()  # the workers read NNDX_LLM_* too: fail here, once, clearly
        # create and migrate once here, so workers never race on a fresh database
        ReportStore(settings.database_url).close()
    except Exception as exc:  # a bad URL or setting: say so, without a traceback
        print(f"nndx serve: {exc}", file=sys.stderr)
        return 2
    host = args.host or settings.host
    port = settings.port if args.port is None else args.port
    print(f"nndx serve: http://{host}:{port} database {safe_database_url(settings.database_url)}"
          f"{' (token auth)' if settings.auth_enabled else ''}", file=sys.stderr)
    uvicorn.run(
        "nndx.api.app:create_app",
        factory=True,
        host=host,
        port=port,
        workers=args.workers or settings.workers,
        log_level=args.log_level,
    )
    return 0


def safe_database_url(url: str) -> str:
    """The URL with its password masked, to print."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparsable URL fails later, with its own message
        return "(unparsable URL)"


def _push(args: argparse.Namespace) -> int:
    from nndx.api.settings import ClientSettings
    from nndx.client import push, spooled_files

    try:
        client_settings = ClientSettings.from_env()
    except ValueError as exc:
        print(f"nndx push: {exc}", file=sys.stderr)
        return 2
    url = args.url or client_settings.url
    token = args.token or (client_settings.token.get_secret_value() if client_settings.token else None)
    pending = len(spooled_files(args.spool_dir))
    if not pending:
        print("nndx push: the spool is empty", file=sys.stderr)
        return 0
    print(f"nndx push: sending {pending} report(s) to {url}", file=sys.stderr)
    try:
        result = push(url, token, spool_dir=args.spool_dir)
    except ValueError as exc:
        print(f"nndx push: {exc}", file=sys.stderr)
        return 2
    print(f"nndx push: sent {result.sent}, rejected {len(result.rejected)}, left {result.remaining}", file=sys.stderr)
    for path in result.rejected:
        print(f"  rejected (kept): {path}", file=sys.stderr)
    if result.error:
        print(f"nndx push: stopped: {result.error}", file=sys.stderr)
        return 1
    return 1 if result.rejected else 0
