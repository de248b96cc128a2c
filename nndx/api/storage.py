"""Report storage behind one small interface (:class:`ReportStore`), on SQLAlchemy Core.

Any SQLAlchemy URL works. The default is a SQLite file, created on first start, in WAL
mode with ``synchronous=FULL`` so that a report is on disk before the service answers
201 — a crash (even SIGKILL) after the answer loses nothing. For several API processes
on several hosts, point ``NNDX_DATABASE_URL`` at PostgreSQL.

Reports are immutable: there is no update or delete. Each row keeps the validated
report and its diagnosis as JSON (non-finite floats as the strings "NaN"/"Infinity",
see nndx/report.py) plus indexed columns for listing and filtering.

The schema is versioned: ``schema_version`` holds the number of migrations applied, and
:func:`migrate` applies the missing ones from :data:`MIGRATIONS` at start-up.

Writes: one writer thread per store commits whatever adds are queued in one transaction
(group commit, one fsync); a SQLite file gets a ``<file>.write-lock`` beside it, on
which the writers of several processes (``nndx serve --workers``) take turns.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

try:
    import fcntl
except ImportError:  # Windows: SQLite's own locking only
    fcntl = None  # type: ignore[assignment]

from sqlalchemy import (
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    func,
    insert,
    select,
)
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.pool import StaticPool

from nndx.errors import ServiceError, UsageError
from nndx.report import SEVERITY_ORDER, Diagnosis, DiagnosticReport

metadata = MetaData()

schema_version_table = Table(
    "schema_version",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("version", Integer, nullable=False),
)

reports_table = Table(
    "reports",
    metadata,
    # seq orders reports and drives cursor pagination; id is the public, unguessable name
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(32), nullable=False, unique=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("project", Text, nullable=True),
    Column("run_name", Text, nullable=True),
    Column("top_cause", String(64), nullable=True),
    Column("severity_max", String(16), nullable=True),
    Column("idempotency_key", String(128), nullable=True, unique=True),
    Column("report_json", Text, nullable=False),
    Column("diagnosis_json", Text, nullable=False),
    Index("ix_reports_project_seq", "project", "seq"),
    Index("ix_reports_run_name", "run_name"),
    Index("ix_reports_top_cause", "top_cause"),
)

report_causes_table = Table(
    "report_causes",
    metadata,
    Column("report_seq", Integer, ForeignKey("reports.seq"), primary_key=True),
    Column("code", String(64), primary_key=True),
    Index("ix_report_causes_code", "code"),
)


def _migration_1(conn: Connection) -> None:
    """The initial schema."""
    for table in (reports_table, report_causes_table):
        table.create(conn, checkfirst=True)


#: Applied in order; ``schema_version.version`` counts how many ran. Append, never edit.
MIGRATIONS: list[Callable[[Connection], None]] = [_migration_1]
SCHEMA_VERSION = len(MIGRATIONS)

MAX_LIMIT = 200
MAX_BATCH = 64  # reports per group-commit transaction


class StorageError(ServiceError):
    """The store cannot be used (wrong schema version, unreachable database)."""


class InvalidCursor(UsageError):
    """A pagination cursor that this store did not produce."""


class IdempotencyConflict(UsageError):
    """An idempotency key already names a report of another project."""


@dataclass(frozen=True)
class StoredReport:
    """One stored report: its indexed columns, and the report and diagnosis as JSON."""

    id: str
    created_at: datetime
    project: str | None
    run_name: str | None
    top_cause: str | None
    severity_max: str | None
    cause_codes: tuple[str, ...]
    report_json: str
    diagnosis_json: str

    def report(self) -> DiagnosticReport:
        return DiagnosticReport.model_validate_json(self.report_json)

    def diagnosis(self) -> Diagnosis:
        return Diagnosis.model_validate_json(self.diagnosis_json)


@dataclass(frozen=True)
class ReportPage:
    items: list[StoredReport]
    next_cursor: str | None


def encode_cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(f"v1:{seq}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        prefix, _, seq = raw.partition(":")
        if prefix != "v1" or not seq.isdigit():
            raise ValueError
        return int(seq)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidCursor("cursor is not one this service produced") from None


def create_store_engine(database_url: str) -> Engine:
    """An engine for ``database_url``; SQLite gets WAL, FULL sync and a busy timeout."""
    url = make_url(database_url)
    if url.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True)
    in_memory = url.database in (None, "", ":memory:")
    if in_memory:
        engine = create_engine(
            url, connect_args={"check_same_thread": False}, poolclass=StaticPool
        )
    else:
        Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        # timeout: wait for another writer (thread or process) instead of failing at once
        engine = create_engine(url, connect_args={"timeout": 30.0})

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
        cursor = dbapi_connection.cursor()
        if not in_memory:
            cursor.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit is fsynced before we answer 201 (durable across power loss too)
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return engine


def migrate(engine: Engine, *, attempts: int = 5) -> int:
    """Bring the schema to :data:`SCHEMA_VERSION`; returns the version found before.

    Several workers may start at once: a migration that loses a race fails on a lock or
    an existing table, and is retried after the winner's commit becomes visible.
    """
    for attempt in range(attempts):
        try:
            return _migrate_once(engine)
        except (OperationalError, IntegrityError):
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _migrate_once(engine: Engine) -> int:
    with engine.begin() as conn:
        schema_version_table.create(conn, checkfirst=True)
        found = conn.execute(select(schema_version_table.c.version).where(schema_version_table.c.id == 1)).scalar()
        if found is None:
            conn.execute(insert(schema_version_table).values(id=1, version=0))
            found = 0
        if found > SCHEMA_VERSION:
            raise StorageError(
                f"database schema version {found} is newer than this nndx ({SCHEMA_VERSION}); upgrade nndx"
            )
        for version in range(found, SCHEMA_VERSION):
            MIGRATIONS[version](conn)
        if found != SCHEMA_VERSION:
            conn.execute(
                schema_version_table.update().where(schema_version_table.c.id == 1).values(version=SCHEMA_VERSION)
            )
        return found


def _max_severity(diagnosis: Diagnosis) -> str | None:
    if not diagnosis.findings:
        return None
    return max((f.severity for f in diagnosis.findings), key=SEVERITY_ORDER.__getitem__)


class _WriterLock:
    """One writer at a time across the processes sharing a SQLite file.

    SQLite lets one connection write; another that finds the file locked polls with
    sleeps of up to 100 ms (its busy handler), which made those sleeps the p99 latency
    of a POST with two workers. An ``flock`` on a file beside the database queues the
    writers in the kernel instead, and wakes the next one as soon as the lock is free.
    A no-op for other databases, for an in-memory SQLite, and where there is no fcntl.
    """

    def __init__(self, path: Path | None) -> None:
        self._path = path if fcntl is not None else None
        self._file: IO[bytes] | None = None

    @classmethod
    def for_url(cls, database_url: str) -> _WriterLock:
        url = make_url(database_url)
        if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
            return cls(None)
        database = Path(url.database).expanduser()
        return cls(database.with_name(database.name + ".write-lock"))

    def __enter__(self) -> None:
        if self._path is not None:
            if self._file is None:  # opened once, by the writer thread; kept open
                self._file = open(self._path, "a+b")  # noqa: SIM115
            fcntl.flock(self._file, fcntl.LOCK_EX)

    def __exit__(self, *_exc: object) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclass(eq=False)
class _PendingAdd:
    """One add waiting for its commit; ``on_done`` is called once it has a result or error."""

    stored: StoredReport
    idempotency_key: str | None
    on_done: Callable[[], object]
    result: tuple[StoredReport, bool] | None = None
    error: BaseException | None = None

    def outcome(self) -> tuple[StoredReport, bool]:
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


class _Writer:
    """The one thread that writes: group commit.

    Adds queue up while a transaction commits; the thread then writes everything queued
    (up to MAX_BATCH) in one transaction, one fsync, and tells each waiter. A single
    thread, rather than each request writing from a threadpool thread, matters in the
    service: handing every POST to a pool thread and back cost 1.1 ms of CPU per report
    in thread switches and GIL hand-offs, more than storing it.
    """

    def __init__(self, write_batch: Callable[[list[_PendingAdd]], None]) -> None:
        self._write_batch = write_batch
        self._cond = threading.Condition()
        self._queue: list[_PendingAdd] = []
        self._thread: threading.Thread | None = None
        self._stopping = False

    def submit(self, item: _PendingAdd) -> None:
        with self._cond:
            self._queue.append(item)
            if self._thread is None:  # the first add, or the first after close()
                self._thread = threading.Thread(target=self._run, name="nndx-report-writer", daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self) -> None:
        """Write what is queued and stop the thread; a later submit starts a new one."""
        with self._cond:
            thread = self._thread
            self._stopping = thread is not None
            self._cond.notify()
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:  # stopping, and nothing left to write
                    self._thread, self._stopping = None, False
                    return
                batch, self._queue[:] = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            try:
                self._write_batch(batch)
            except BaseException as exc:  # noqa: BLE001 - every waiter must hear of it
                for item in batch:
                    item.error = item.error or exc
            for item in batch:
                try:
                    item.on_done()
                except RuntimeError:  # its event loop closed meanwhile: nobody is waiting
                    pass


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():  # a request cancelled meanwhile (client gone): its report is stored anyway
        future.set_result(None)


class ReportStore:
    """Add, get and list immutable reports. Safe to share between threads."""

    def __init__(self, database_url: str) -> None:
        self.engine = create_store_engine(database_url)
        migrate(self.engine)
        self._writer_lock = _WriterLock.for_url(database_url)
        self._writer = _Writer(self._write_batch)

    def close(self) -> None:
        """Finish the adds under way and release the writer thread and the connections.
        Like SQLAlchemy's ``dispose``, a later call starts them again."""
        self._writer.close()
        self._writer_lock.close()
        self.engine.dispose()

    def ping(self) -> None:
        """Raise if the database cannot answer a trivial query."""
        with self.engine.connect() as conn:
            conn.execute(select(func.count()).select_from(schema_version_table))

    def add(
        self, report: DiagnosticReport, diagnosis: Diagnosis, *, idempotency_key: str | None = None
    ) -> tuple[StoredReport, bool]:
        """Store a report and its diagnosis; returns it and whether it is new.

        The transaction is committed when this returns. With an ``idempotency_key``
        already stored (a client retrying after a lost answer) the existing report is
        returned, unchanged, with ``False``.
        """
        done = threading.Event()
        pending = _PendingAdd(self._row(report, diagnosis), idempotency_key, done.set)
        self._writer.submit(pending)
        done.wait()
        return pending.outcome()

    async def add_async(
        self, report: DiagnosticReport, diagnosis: Diagnosis, *, idempotency_key: str | None = None
    ) -> tuple[StoredReport, bool]:
        """:meth:`add` for an event loop, which goes on serving while the batch commits."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        pending = _PendingAdd(
            self._row(report, diagnosis), idempotency_key, lambda: loop.call_soon_threadsafe(_resolve, done)
        )
        self._writer.submit(pending)
        await done
        return pending.outcome()

    @staticmethod
    def _row(report: DiagnosticReport, diagnosis: Diagnosis) -> StoredReport:
        """The row to insert, serialised in the caller's thread."""
        return StoredReport(
            id=uuid.uuid4().hex,
            created_at=datetime.now(timezone.utc),
            project=report.run.project if report.run else None,
            run_name=report.run.name if report.run else None,
            top_cause=diagnosis.findings[0].code.value if diagnosis.findings else None,
            severity_max=_max_severity(diagnosis),
            cause_codes=tuple(sorted({f.code.value for f in diagnosis.findings})),
            report_json=report.model_dump_json(),
            diagnosis_json=diagnosis.model_dump_json(),
        )

    # ------------------------------------------------------------------ group commit

    def _write_batch(self, batch: list[_PendingAdd]) -> None:
        """Write ``batch`` in one transaction; sets each item's result or error."""
        try:
            with self._writer_lock, self.engine.begin() as conn:
                self._insert(conn, batch)
            for item in batch:
                item.result = (item.stored, True)
        except IntegrityError:
            # an idempotency key seen before: write the batch one by one to isolate it
            for item in batch:
                self._write_one(item)
        except Exception as exc:  # noqa: BLE001 - every waiter gets the failure
            for item in batch:
                item.error = exc

    def _write_one(self, item: _PendingAdd) -> None:
        try:
            with self._writer_lock, self.engine.begin() as conn:
                self._insert(conn, [item])
            item.result = (item.stored, True)
        except IntegrityError as exc:
            key = item.idempotency_key
            existing = None if key is None else self._get_where(reports_table.c.idempotency_key == key)
            if existing is None:
                item.error = exc
            elif existing.project != item.stored.project:
                item.error = IdempotencyConflict("idempotency key already used by another project")
            else:
                item.result = (existing, False)
        except Exception as exc:  # noqa: BLE001 - reported to the waiting request
            item.error = exc

    @staticmethod
    def _insert(conn: Connection, items: list[_PendingAdd]) -> None:
        """Insert ``items`` with two statements however many they are (one multi-row
        INSERT for the reports, one for their cause codes), not two per report: every
        statement costs the writer thread a round of the GIL against the event loop."""
        rows = [
            {
                "id": item.stored.id,
                "created_at": item.stored.created_at,
                "project": item.stored.project,
                "run_name": item.stored.run_name,
                "top_cause": item.stored.top_cause,
                "severity_max": item.stored.severity_max,
                "idempotency_key": item.idempotency_key,
                "report_json": item.stored.report_json,
                "diagnosis_json": item.stored.diagnosis_json,
            }
            for item in items
        ]
        # RETURNING in parameter order is row by row on SQLite; matched on id it is one statement
        seqs = dict(conn.execute(insert(reports_table).returning(reports_table.c.id, reports_table.c.seq), rows).all())
        causes = [
            {"report_seq": seqs[item.stored.id], "code": code} for item in items for code in item.stored.cause_codes
        ]
        if causes:
            conn.execute(insert(report_causes_table), causes)

    def get(self, report_id: str, *, scope: str | None = None) -> StoredReport | None:
        """The report with this id, or None; with ``scope`` only that project's reports."""
        condition = reports_table.c.id == report_id
        if scope is not None:
            condition = condition & (reports_table.c.project == scope)
        return self._get_where(condition)

    def list(
        self,
        *,
        scope: str | None = None,
        project: str | None = None,
        run_name: str | None = None,
        cause: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> ReportPage:
        """Newest first. ``cursor`` is the ``next_cursor`` of the previous page."""
        if not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"limit must be between 1 and {MAX_LIMIT}")
        r = reports_table
        query = select(r).order_by(r.c.seq.desc()).limit(limit + 1)
        if scope is not None:
            query = query.where(r.c.project == scope)
        if project is not None:
            query = query.where(r.c.project == project)
        if run_name is not None:
            query = query.where(r.c.run_name == run_name)
        if cause is not None:
            causes = report_causes_table
            query = query.where(r.c.seq.in_(select(causes.c.report_seq).where(causes.c.code == cause)))
        if cursor is not None:
            query = query.where(r.c.seq < decode_cursor(cursor))
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
            has_more = len(rows) > limit
            rows = rows[:limit]
            codes = self._codes(conn, [row.seq for row in rows])
        items = [self._from_row(row, codes.get(row.seq, ())) for row in rows]
        next_cursor = encode_cursor(rows[-1].seq) if has_more else None
        return ReportPage(items=items, next_cursor=next_cursor)

    def count(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(reports_table)).scalar_one())

    # ------------------------------------------------------------------ helpers

    def _get_where(self, condition) -> StoredReport | None:  # type: ignore[no-untyped-def]
        with self.engine.connect() as conn:
            row = conn.execute(select(reports_table).where(condition)).first()
            if row is None:
                return None
            return self._from_row(row, self._codes(conn, [row.seq]).get(row.seq, ()))

    @staticmethod
    def _codes(conn: Connection, seqs: list[int]) -> dict[int, tuple[str, ...]]:
        if not seqs:
            return {}
        causes = report_causes_table
        rows = conn.execute(
            select(causes.c.report_seq, causes.c.code).where(causes.c.report_seq.in_(seqs)).order_by(causes.c.code)
        )
        codes: dict[int, list[str]] = {}
        for seq, code in rows:
            codes.setdefault(seq, []).append(code)
        return {seq: tuple(values) for seq, values in codes.items()}

    @staticmethod
    def _from_row(row, cause_codes: tuple[str, ...]) -> StoredReport:  # type: ignore[no-untyped-def]
        created_at = row.created_at
        if created_at.tzinfo is None:  # SQLite drops the zone; we only ever store UTC
            created_at = created_at.replace(tzinfo=timezone.utc)
        return StoredReport(
            id=row.id,
            created_at=created_at,
            project=row.project,
            run_name=row.run_name,
            top_cause=row.top_cause,
            severity_max=row.severity_max,
            cause_codes=cause_codes,
            report_json=row.report_json,
            diagnosis_json=row.diagnosis_json,
        )
