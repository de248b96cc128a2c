"""Report storage behind one small interface (:class:`ReportStore`), on SQLAlchemy Core.

Any SQLAlchemy URL works, and SQLite and PostgreSQL are both tested. The default is a
SQLite file, created on first start, in WAL mode with ``synchronous=FULL``; PostgreSQL
(``postgresql+psycopg://user:password@host:5432/nndx``, ``pip install 'nndx[postgres]'``)
lets service processes on several hosts share one store. Either way a report is
committed before the service answers 201: a crash (even SIGKILL) after the answer
loses nothing.

Reports are immutable: there is no update or delete. Each row keeps the validated
report and its diagnosis as JSON (non-finite floats as the strings "NaN"/"Infinity",
see nndx/report.py) plus indexed columns for listing and filtering. What reaches an
indexed column from a report is checked first (:func:`check_storable`): no NUL
character (PostgreSQL cannot store one in text) and no string longer than an index
entry may be, so the same report is accepted or refused the same way on every backend.

The schema is versioned: ``schema_version`` holds the number of migrations applied, and
:func:`migrate` applies the missing ones from :data:`MIGRATIONS` at start-up.

Writes have two paths that store the same rows:

- :meth:`ReportStore.add`, the plain reference: one report, one transaction, in the
  caller's thread.
- :meth:`ReportStore.add_async`, what the service uses: requests hand their rows to one
  writer thread, which commits everything waiting in one transaction (group commit: one
  fsync for many reports). If the database refuses that transaction for what a report
  holds, each report of it is written again alone, so one bad report fails only itself.

Writers of several processes sharing one SQLite file take turns on an ``flock`` of
``<file>.write-lock`` (see :class:`_WriteTurn`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import hashlib
import os
import queue
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: SQLite's own locking only
    fcntl = None  # type: ignore[assignment]

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    create_engine,
    delete,
    event,
    func,
    insert,
    select,
    text,
)
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import StaticPool

from nndx.errors import ServiceError, UsageError
from nndx.report import SEVERITY_ORDER, Diagnosis, DiagnosticReport

#: 64-bit everywhere. SQLite's INTEGER PRIMARY KEY is already 64-bit (and only that exact
#: spelling is the auto-incrementing rowid); PostgreSQL needs BIGINT.
Sequence = BigInteger().with_variant(Integer(), "sqlite")

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
    Column("seq", Sequence, primary_key=True, autoincrement=True),
    Column("id", String(32), nullable=False, unique=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("project", Text, nullable=True),
    Column("run_name", Text, nullable=True),
    Column("top_cause", String(64), nullable=True),
    Column("severity_max", String(16), nullable=True),
    # sha256 of (project, Idempotency-Key): a key is unique within its project only
    Column("idempotency_key", String(128), nullable=True, unique=True),
    Column("report_json", Text, nullable=False),
    Column("diagnosis_json", Text, nullable=False),
    Column("run_name_folded", Text, nullable=True),  # casefolded, for the run-name search
    Column("severity_rank", SmallInteger, nullable=True),  # SEVERITY_ORDER of severity_max
    Index("ix_reports_project_seq", "project", "seq"),
    Index("ix_reports_run_name", "run_name"),
    Index("ix_reports_top_cause", "top_cause"),
    Index("ix_reports_severity_seq", "severity_rank", "seq"),
    Index("ix_reports_created_at", "created_at"),
)

report_causes_table = Table(
    "report_causes",
    metadata,
    Column("report_seq", Sequence, ForeignKey("reports.seq"), primary_key=True),
    Column("code", String(64), primary_key=True),
    Index("ix_report_causes_code_seq", "code", "report_seq"),
)

#: One row, written and deleted again by :meth:`ReportStore.check_writable`.
write_probe_table = Table(
    "write_probe",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("payload", Text, nullable=False),
)


def _migration_1(conn: Connection) -> None:
    """The initial schema, as it was (32-bit seq on PostgreSQL, no search columns)."""
    v1 = MetaData()
    Table(
        "reports", v1,
        Column("seq", Integer, primary_key=True, autoincrement=True),
        Column("id", String(32), nullable=False, unique=True),
        Column("created_at", DateTime(timezone=True), nullable=False),
        Column("project", Text), Column("run_name", Text),
        Column("top_cause", String(64)), Column("severity_max", String(16)),
        Column("idempotency_key", String(128), unique=True),
        Column("report_json", Text, nullable=False), Column("diagnosis_json", Text, nullable=False),
        Index("ix_reports_project_seq", "project", "seq"),
        Index("ix_reports_run_name", "run_name"),
        Index("ix_reports_top_cause", "top_cause"),
    )  # fmt: skip
    Table(
        "report_causes", v1,
        Column("report_seq", Integer, ForeignKey("reports.seq"), primary_key=True),
        Column("code", String(64), primary_key=True),
        Index("ix_report_causes_code", "code"),
    )  # fmt: skip
    v1.create_all(conn, checkfirst=True)


def _migration_2(conn: Connection) -> None:
    """64-bit sequence numbers on PostgreSQL; the columns and indexes the list filters
    use; idempotency keys scoped to their project; the health check's write probe."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("ALTER TABLE reports ALTER COLUMN seq TYPE BIGINT"))
        conn.execute(text("ALTER SEQUENCE IF EXISTS reports_seq_seq AS BIGINT"))
        conn.execute(text("ALTER TABLE report_causes ALTER COLUMN report_seq TYPE BIGINT"))
    conn.execute(text("ALTER TABLE reports ADD COLUMN run_name_folded TEXT"))
    conn.execute(text("ALTER TABLE reports ADD COLUMN severity_rank SMALLINT"))
    ranks = " ".join(f"WHEN '{name}' THEN {rank}" for name, rank in SEVERITY_ORDER.items())
    conn.execute(text(f"UPDATE reports SET severity_rank = CASE severity_max {ranks} END"))
    rows = conn.execute(text("SELECT seq, project, run_name, idempotency_key FROM reports "
                             "WHERE run_name IS NOT NULL OR idempotency_key IS NOT NULL")).all()  # fmt: skip
    if rows:
        conn.execute(
            text("UPDATE reports SET run_name_folded = :folded, idempotency_key = :key WHERE seq = :seq"),
            [{"seq": seq, "folded": fold(run_name), "key": key and idempotency_digest(project, key)}
             for seq, project, run_name, key in rows],
        )  # fmt: skip
    conn.execute(text("DROP INDEX ix_report_causes_code"))
    new_indexes = {"ix_reports_severity_seq", "ix_reports_created_at", "ix_report_causes_code_seq"}
    for table in (reports_table, report_causes_table):
        for index in table.indexes:
            if index.name in new_indexes:
                index.create(conn)
    write_probe_table.create(conn)


#: Applied in order; ``schema_version.version`` counts how many ran. Append, never edit.
MIGRATIONS: list[Callable[[Connection], None]] = [_migration_1, _migration_2]
SCHEMA_VERSION = len(MIGRATIONS)

MAX_LIMIT = 200
MAX_BATCH = 64  # reports per group-commit transaction
MAX_SEQ = 2**63 - 1
#: Longest project and run name stored. An index entry must fit in a PostgreSQL btree
#: page third (2704 bytes): 200 and 500 characters are at most 800 and 2000 bytes.
MAX_PROJECT_CHARS = 200
MAX_RUN_NAME_CHARS = 500
WRITE_PROBE_BYTES = 64 * 1024  # about two typical reports: can the store take one more?


class StorageError(ServiceError):
    """The store cannot be used (wrong schema version, unreachable database)."""


class StorageUnavailable(StorageError):
    """The database cannot answer now (down, full, read-only); retrying later may work."""


class InvalidCursor(UsageError):
    """A pagination cursor that this store did not produce."""


class IdempotencyConflict(UsageError):
    """An idempotency key already names a different report of the same project."""


class UnstorableReport(UsageError):
    """A report whose indexed text cannot be stored; ``loc`` names the field."""

    def __init__(self, loc: tuple[str, ...], message: str) -> None:
        super().__init__(f"{'.'.join(loc)}: {message}")
        self.loc = loc
        self.message = message


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


_CURSOR = re.compile(r"v1:([0-9]{1,19})")


def decode_cursor(cursor: str) -> int:
    """The position in ``cursor``; :class:`InvalidCursor` for anything this store did not
    produce, a number out of the 64-bit range included."""
    try:
        match = _CURSOR.fullmatch(base64.urlsafe_b64decode(cursor[:64] + "=" * (-len(cursor) % 4)).decode())
    except (ValueError, binascii.Error, UnicodeDecodeError):
        match = None
    if match is None or len(cursor) > 64 or not 1 <= int(match.group(1)) <= MAX_SEQ:
        raise InvalidCursor("cursor is not one this service produced")
    return int(match.group(1))


def fold(value: str | None) -> str | None:
    """The form the run-name search compares: casefolded in Python, so that SQLite and
    PostgreSQL (whose ``lower`` differ beyond ASCII) find the same runs."""
    return None if value is None else value.casefold()


def idempotency_digest(project: str | None, key: str) -> str:
    """The stored form of an idempotency key: unique per project, fixed length."""
    return hashlib.sha256(f"{len(project or '')}:{project or ''}:{key}".encode()).hexdigest()


def check_text(value: str, loc: tuple[str, ...], max_chars: int) -> None:
    """Raise :class:`UnstorableReport` for text an index or PostgreSQL cannot hold."""
    if "\x00" in value:
        raise UnstorableReport(loc, "must not contain the NUL character")
    if len(value) > max_chars:
        raise UnstorableReport(loc, f"must be at most {max_chars} characters, got {len(value)}")


def check_storable(report: DiagnosticReport) -> None:
    """Refuse, naming the field, a report whose indexed text no backend could store.

    The rest of a report is stored as JSON, where a NUL is the escape ``\\u0000``."""
    if report.run is None:
        return
    if report.run.project is not None:
        check_text(report.run.project, ("run", "project"), MAX_PROJECT_CHARS)
    if report.run.name is not None:
        check_text(report.run.name, ("run", "name"), MAX_RUN_NAME_CHARS)


def create_store_engine(database_url: str) -> Engine:
    """An engine for ``database_url``; SQLite gets WAL, FULL sync and a busy timeout."""
    url = make_url(database_url)
    if url.get_backend_name() != "sqlite":
        # connect_timeout: an unreachable host answers 503 after 5 s instead of hanging
        connect_args = {"connect_timeout": 5} if url.get_backend_name() == "postgresql" else {}
        return create_engine(url, pool_pre_ping=True, connect_args=connect_args)
    in_memory = url.database in (None, "", ":memory:")
    if in_memory:
        engine = create_engine(url, connect_args={"check_same_thread": False}, poolclass=StaticPool)
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

    Several processes may start at once. On PostgreSQL they queue on an advisory lock;
    on SQLite a migration that loses the race fails on a lock or an existing table, and
    is retried after the winner's commit becomes visible.
    """
    for attempt in range(attempts):
        try:
            return _migrate_once(engine)
        except (OperationalError, IntegrityError, ProgrammingError):
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _migrate_once(engine: Engine) -> int:
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(7120505)"))  # any constant: "nndx migrations"
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


@contextmanager
def _unavailable_on_database_errors() -> Iterator[None]:
    """Turn a database that cannot answer (down, full, read-only, out of connections)
    into :class:`StorageUnavailable`; an IntegrityError is the caller's to handle."""
    try:
        yield
    except IntegrityError:
        raise
    except (DBAPIError, PoolTimeout) as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0][:200]
        raise StorageUnavailable(f"database unavailable: {type(exc).__name__}: {reason}") from exc


class _WriteTurn:
    """One writer at a time across the threads and processes sharing a SQLite file.

    SQLite lets one connection write; another that finds the file locked polls with
    sleeps of up to 100 ms (its busy handler), which made those sleeps the p99 latency
    of a POST with two workers. An ``flock`` on a file beside the database queues the
    writers in the kernel instead, and wakes the next one as soon as the lock is free.
    A thread lock in front of it, because an flock does not exclude other threads of
    its own process. Nothing to do for other databases or an in-memory SQLite.
    """

    def __init__(self, database_url: str) -> None:
        url = make_url(database_url)
        self._path: Path | None = None
        if fcntl is not None and url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            database = Path(url.database).expanduser()
            self._path = database.with_name(database.name + ".write-lock")
        self._thread_lock = threading.Lock()
        self._fd: int | None = None

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._thread_lock:
            if self._path is None:
                yield
                return
            if self._fd is None:
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        with self._thread_lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


@dataclass(frozen=True)
class _Row:
    """A report ready to insert, serialised in the caller's thread."""

    stored: StoredReport
    idempotency_key: str | None  # as the client sent it

    @property
    def key_digest(self) -> str | None:
        return None if self.idempotency_key is None else idempotency_digest(self.stored.project, self.idempotency_key)


_STOP = object()


class _GroupCommitWriter:
    """The writer thread of :meth:`ReportStore.add_async`: it takes every row waiting
    (up to MAX_BATCH) and has them written in one transaction.

    One thread, rather than each request writing from a threadpool thread: handing every
    POST to a pool thread and back cost more CPU than storing it (bench/README.md).
    """

    def __init__(self, write: Callable[[list[_Row]], list[tuple[StoredReport, bool] | BaseException]]) -> None:
        self._write = write
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def submit(self, row: _Row) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._start_lock:
            if self._thread is None:  # the first add, or the first after close()
                self._thread = threading.Thread(target=self._run, name="nndx-report-writer", daemon=True)
                self._thread.start()
            self._queue.put((row, future))
        return future

    def close(self) -> None:
        """Write what is queued and stop the thread; a later submit starts a new one."""
        with self._start_lock:
            thread, self._thread = self._thread, None
            if thread is not None:
                self._queue.put(_STOP)
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get())
            stopping = _STOP in batch
            # a request that gave up before its turn (the client left) is not written
            waiting = [(row, future) for row, future in (i for i in batch if i is not _STOP)
                       if future.set_running_or_notify_cancel()]  # fmt: skip
            if waiting:
                try:
                    outcomes = self._write([row for row, _ in waiting])
                    if len(outcomes) != len(waiting):
                        raise AssertionError(f"{len(outcomes)} outcomes for {len(waiting)} rows")
                except Exception as exc:  # noqa: BLE001 - a bug here must not strand the waiters
                    outcomes = [exc] * len(waiting)
                for (_, future), outcome in zip(waiting, outcomes):
                    if isinstance(outcome, BaseException):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)
            if stopping:
                return


class ReportStore:
    """Add, get and list immutable reports. Safe to share between threads."""

    def __init__(self, database_url: str) -> None:
        self.engine = create_store_engine(database_url)
        with _unavailable_on_database_errors():
            migrate(self.engine)
        self._write_turn = _WriteTurn(database_url)
        self._writer = _GroupCommitWriter(self._write_rows)

    def close(self) -> None:
        """Finish the adds under way and release the writer thread and the connections.
        Like SQLAlchemy's ``dispose``, a later call starts them again."""
        self._writer.close()
        self._write_turn.close()
        self.engine.dispose()

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        with _unavailable_on_database_errors(), self._write_turn.held(), self.engine.begin() as conn:
            yield conn

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        with _unavailable_on_database_errors(), self.engine.connect() as conn:
            yield conn

    def check_writable(self) -> None:
        """Raise :class:`StorageUnavailable` unless the database takes a write of about a
        report's size now (a full disk or a stopped server fail here)."""
        with self._transaction() as conn:
            conn.execute(insert(write_probe_table).values(id=1, payload="x" * WRITE_PROBE_BYTES))
            conn.execute(delete(write_probe_table))

    # ------------------------------------------------------------------ writing

    def add(
        self, report: DiagnosticReport, diagnosis: Diagnosis, *, idempotency_key: str | None = None
    ) -> tuple[StoredReport, bool]:
        """Store a report and its diagnosis; returns it and whether it is new.

        The plain path: one transaction, committed when this returns. With an
        ``idempotency_key`` this project already used for the same report (a client
        retrying after a lost answer) the existing report is returned, unchanged, with
        ``False``; for a different report, :class:`IdempotencyConflict`.
        """
        (outcome,) = self._write_rows([self._row(report, diagnosis, idempotency_key)])
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def add_async(
        self, report: DiagnosticReport, diagnosis: Diagnosis, *, idempotency_key: str | None = None
    ) -> tuple[StoredReport, bool]:
        """:meth:`add` for an event loop, group-committed with the other adds waiting;
        the loop goes on serving while the batch commits."""
        future = self._writer.submit(self._row(report, diagnosis, idempotency_key))
        return await asyncio.wrap_future(future)

    @staticmethod
    def _row(report: DiagnosticReport, diagnosis: Diagnosis, idempotency_key: str | None) -> _Row:
        check_storable(report)
        severity = _max_severity(diagnosis)
        stored = StoredReport(
            id=uuid.uuid4().hex,
            created_at=datetime.now(timezone.utc),
            project=report.run.project if report.run else None,
            run_name=report.run.name if report.run else None,
            top_cause=diagnosis.findings[0].code.value if diagnosis.findings else None,
            severity_max=severity,
            cause_codes=tuple(sorted({f.code.value for f in diagnosis.findings})),
            report_json=report.model_dump_json(),
            diagnosis_json=diagnosis.model_dump_json(),
        )
        return _Row(stored, idempotency_key)

    def _write_rows(self, rows: list[_Row]) -> list[tuple[StoredReport, bool] | BaseException]:
        """Write ``rows`` in one transaction; if it fails, each row alone, so that every
        row gets its own outcome: (stored, created) or the exception it raised."""
        try:
            with self._transaction() as conn:
                self._insert(conn, rows)
            return [(row.stored, True) for row in rows]
        except Exception as exc:  # noqa: BLE001 - the outcome of the rows, reported to them
            if len(rows) > 1 and _refused_for_its_content(exc):
                return [self._write_rows([row])[0] for row in rows]
            if len(rows) == 1 and isinstance(exc, IntegrityError) and rows[0].idempotency_key is not None:
                return [self._repeated(rows[0], exc)]
            return [exc] * len(rows)

    def _repeated(self, row: _Row, error: IntegrityError) -> tuple[StoredReport, bool] | BaseException:
        """The outcome of a row whose idempotency key its project already used."""
        try:
            existing = self._get_where(reports_table.c.idempotency_key == row.key_digest)
        except StorageUnavailable as exc:
            return exc
        if existing is None:  # the conflict was another column's
            return error
        if existing.report_json != row.stored.report_json:
            return IdempotencyConflict(
                f"Idempotency-Key {row.idempotency_key!r} was already used for a different report"
            )
        return existing, False

    @staticmethod
    def _insert(conn: Connection, rows: list[_Row]) -> None:
        """Two statements however many rows (one multi-row INSERT for the reports, one
        for their cause codes): every statement costs the writer thread a round of the
        GIL against the event loop."""
        values = [
            {
                "id": row.stored.id,
                "created_at": row.stored.created_at,
                "project": row.stored.project,
                "run_name": row.stored.run_name,
                "run_name_folded": fold(row.stored.run_name),
                "top_cause": row.stored.top_cause,
                "severity_max": row.stored.severity_max,
                "severity_rank": SEVERITY_ORDER.get(row.stored.severity_max or ""),
                "idempotency_key": row.key_digest,
                "report_json": row.stored.report_json,
                "diagnosis_json": row.stored.diagnosis_json,
            }
            for row in rows
        ]
        # RETURNING in parameter order is row by row on SQLite; matched on id it is one statement
        seqs = dict(conn.execute(insert(reports_table).returning(reports_table.c.id, reports_table.c.seq), values).all())
        causes = [{"report_seq": seqs[row.stored.id], "code": code} for row in rows for code in row.stored.cause_codes]
        if causes:
            conn.execute(insert(report_causes_table), causes)

    # ------------------------------------------------------------------ reading

    def get(self, report_id: str, *, scope: str | None = None) -> StoredReport | None:
        """The report with this id, or None; with ``scope`` only that project's reports."""
        if not re.fullmatch(r"[0-9a-f]{32}", report_id):
            return None  # not an id this store made: nothing to look up
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
        search: str | None = None,
        cause: str | None = None,
        severity: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> ReportPage:
        """Newest first, filtered. ``cursor`` is the ``next_cursor`` of the previous page.

        ``run_name`` matches exactly; ``search`` is a case-insensitive substring of the
        run name; ``cause`` a cause code of any finding; ``severity`` the least top
        severity (``warning`` lists warnings and errors); ``since``/``until`` bound the
        time the report was stored (``since`` <= created_at < ``until``).
        """
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
        if search:
            query = query.where(r.c.run_name_folded.contains(fold(search), autoescape=True))
        if cause is not None:
            causes = report_causes_table
            query = query.where(r.c.seq.in_(select(causes.c.report_seq).where(causes.c.code == cause)))
        if severity is not None:
            query = query.where(r.c.severity_rank >= SEVERITY_ORDER[severity])
        if since is not None:
            query = query.where(r.c.created_at >= _utc(since))
        if until is not None:
            query = query.where(r.c.created_at < _utc(until))
        if cursor is not None:
            query = query.where(r.c.seq < decode_cursor(cursor))
        with self._reading() as conn:
            rows = conn.execute(query).all()
            has_more = len(rows) > limit
            rows = rows[:limit]
            codes = self._codes(conn, [row.seq for row in rows])
        items = [self._from_row(row, codes.get(row.seq, ())) for row in rows]
        next_cursor = encode_cursor(rows[-1].seq) if has_more else None
        return ReportPage(items=items, next_cursor=next_cursor)

    def count(self) -> int:
        with self._reading() as conn:
            return int(conn.execute(select(func.count()).select_from(reports_table)).scalar_one())

    # ------------------------------------------------------------------ helpers

    def _get_where(self, condition) -> StoredReport | None:  # type: ignore[no-untyped-def]
        with self._reading() as conn:
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
        return StoredReport(
            id=row.id,
            created_at=_utc(row.created_at),
            project=row.project,
            run_name=row.run_name,
            top_cause=row.top_cause,
            severity_max=row.severity_max,
            cause_codes=cause_codes,
            report_json=row.report_json,
            diagnosis_json=row.diagnosis_json,
        )


def _refused_for_its_content(exc: BaseException) -> bool:
    """Whether the database refused ``exc``'s transaction for what a row holds (a
    constraint, a value it cannot store, a row over a limit), so that the rows of a
    batch are worth writing one by one; not for a database that is down or broken,
    where each row would only fail again."""
    cause = exc.__cause__ if isinstance(exc, StorageUnavailable) else exc
    if isinstance(cause, (IntegrityError, DataError)):
        return True
    sqlstate = getattr(getattr(cause, "orig", None), "sqlstate", None) or ""
    return sqlstate[:2] in ("22", "23", "54")  # data exception, integrity, program limit exceeded


def _utc(moment: datetime) -> datetime:
    """``moment`` in UTC; a naive one is taken to be UTC already (SQLite drops the zone,
    and we only ever store UTC)."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def _max_severity(diagnosis: Diagnosis) -> str | None:
    if not diagnosis.findings:
        return None
    return max((f.severity for f in diagnosis.findings), key=SEVERITY_ORDER.__getitem__)
