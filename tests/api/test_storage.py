"""ReportStore: versioned schema, immutable rows, filters, cursor pagination, scope.

Every test that takes ``store`` runs on SQLite and on PostgreSQL (tests/api/conftest.py).
"""

from __future__ import annotations

import asyncio
import base64
import sqlite3
import threading
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import create_engine, text

from nndx.api.storage import (
    MAX_PROJECT_CHARS,
    MAX_RUN_NAME_CHARS,
    SCHEMA_VERSION,
    IdempotencyConflict,
    InvalidCursor,
    ReportStore,
    StorageError,
    StorageUnavailable,
    UnstorableReport,
    _migration_1,
    encode_cursor,
)
from nndx.report import DiagnosticReport, RunInfo
from tests.api.conftest import both_backends, fake_diagnosis, make_report

database_url = both_backends


@pytest.fixture
def store(database_url):
    store = ReportStore(database_url)
    yield store
    store.close()


@pytest.fixture
def sqlite_store(tmp_path):
    store = ReportStore(f"sqlite:///{tmp_path / 'sub' / 'store.sqlite3'}")
    yield store
    store.close()


def test_first_start_creates_the_file_in_wal_mode_with_a_schema_version(tmp_path, sqlite_store):
    path = tmp_path / "sub" / "store.sqlite3"
    assert path.exists()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]


def test_reopening_keeps_reports_and_does_not_migrate_again(database_url, store):
    stored, _ = store.add(make_report(), fake_diagnosis(make_report()))
    store.close()
    again = ReportStore(database_url)
    try:
        assert again.get(stored.id).report_json == stored.report_json
        assert again.count() == 1
    finally:
        again.close()


def test_a_database_from_a_newer_nndx_is_refused(database_url, store):
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE schema_version SET version = :v"), {"v": SCHEMA_VERSION + 1})
    store.close()
    with pytest.raises(StorageError, match="newer"):
        ReportStore(database_url)


def test_a_version_1_database_is_migrated_with_its_reports(database_url):
    """A store written by the first schema (32-bit seq on PostgreSQL, raw idempotency
    keys, no search columns) opens with its reports listed, searchable and keyed."""
    engine = create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE schema_version (id INTEGER PRIMARY KEY, version INTEGER NOT NULL)"))
        conn.execute(text("INSERT INTO schema_version VALUES (1, 1)"))
        _migration_1(conn)
        report = make_report(name="Old-ReLU-Run", project="p")
        conn.execute(text(
            "INSERT INTO reports (id, created_at, project, run_name, top_cause, severity_max, idempotency_key, "
            "report_json, diagnosis_json) VALUES ('0123456789abcdef0123456789abcdef', :at, 'p', 'Old-ReLU-Run', "
            "'DEAD_RELU', 'warning', 'old-key', :report, :diagnosis)"),
            {"at": datetime.now(timezone.utc), "report": report.model_dump_json(),
             "diagnosis": fake_diagnosis(report).model_dump_json()})
    engine.dispose()
    store = ReportStore(database_url)
    try:
        (old,) = store.list(search="relu", severity="warning").items
        assert old.id == "0123456789abcdef0123456789abcdef"
        again, created = store.add(report, fake_diagnosis(report), idempotency_key="old-key")
        assert (again.id, created) == (old.id, False)
        new, _ = store.add(make_report(name="new"), fake_diagnosis(make_report(name="new")))
        assert [r.id for r in store.list().items] == [new.id, old.id]
    finally:
        store.close()


def test_stored_json_round_trips_nan_and_infinity(store):
    report = make_report(nan_at=3)
    stored, created = store.add(report, fake_diagnosis(report))
    assert created
    back = store.get(stored.id)
    assert '"NaN"' in back.report_json and '"Infinity"' in back.report_json
    assert back.report_json == report.model_dump_json()


def test_indexed_columns_come_from_the_diagnosis(store):
    report = make_report(name="dead_relu and lr_too_high")
    stored, _ = store.add(report, fake_diagnosis(report))
    assert stored.top_cause in {"DEAD_RELU", "LR_TOO_HIGH"}
    assert stored.cause_codes == ("DEAD_RELU", "LR_TOO_HIGH")
    assert stored.severity_max == "error"
    assert (stored.project, stored.run_name) == ("vision", "dead_relu and lr_too_high")
    healthy, _ = store.add(make_report(name="fine"), fake_diagnosis(make_report(name="fine")))
    assert (healthy.top_cause, healthy.cause_codes, healthy.severity_max) == (None, (), None)


def _add(store, **kwargs):
    report = make_report(**kwargs)
    return store.add(report, fake_diagnosis(report))[0]


def test_filters_by_project_run_name_and_cause(store):
    """Run names here name the fake findings' causes (tests/api/conftest.py)."""
    a = _add(store, project="a", name="dead_relu")
    b = _add(store, project="b", name="dead_relu")
    c = _add(store, project="a", name="overfitting")
    assert [r.id for r in store.list(project="a").items] == [c.id, a.id]
    assert [r.id for r in store.list(run_name="dead_relu").items] == [b.id, a.id]
    assert [r.id for r in store.list(cause="DEAD_RELU", project="a").items] == [a.id]
    assert [r.id for r in store.list(cause="OVERFITTING").items] == [c.id]
    assert store.list(cause="NAN_IN_DATA").items == []


def test_cursor_pagination_visits_every_report_once_newest_first(store):
    ids = [_add(store, name=f"run-{i}").id for i in range(7)]
    seen, cursor, pages = [], None, 0
    while True:
        page = store.list(limit=3, cursor=cursor)
        seen += [r.id for r in page.items]
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == ids[::-1]
    assert pages == 3
    # a report added meanwhile does not shift later pages (cursors are positions, not offsets)
    first = store.list(limit=3)
    _add(store, name="late")
    assert [r.id for r in store.list(limit=3, cursor=first.next_cursor).items] == ids[::-1][3:6]


def _cursor(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


@pytest.mark.parametrize("cursor", [
    "nonsense", "", encode_cursor(5)[:-1] + "!", "djI6MQ", _cursor("v1:0"), _cursor(f"v1:{2**63}"),
    _cursor(f"v1:{10**40}"), _cursor("v1:-1"), _cursor("v1:\u00b2"), _cursor("v1:12 "), "A" * 10_000,
])
def test_a_foreign_or_out_of_range_cursor_is_refused(store, cursor):
    with pytest.raises(InvalidCursor):
        store.list(cursor=cursor)


def test_cursors_past_32_bits_work(store):
    """The sequence is 64-bit on every backend: a cursor beyond 2**31 is a position."""
    stored = _add(store)
    for seq in (2**31, 2**32 + 5, 2**63 - 1):
        assert [r.id for r in store.list(cursor=encode_cursor(seq)).items] == [stored.id]
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE reports SET seq = :seq"), {"seq": 2**40})
    assert [r.id for r in store.list(cursor=encode_cursor(2**40 + 1)).items] == [stored.id]


def test_search_severity_and_date_filters(store):
    relu = _add(store, name="ResNet-DEAD_RELU-a")  # error (the fake's first finding)
    quiet = _add(store, name="quiet")  # no finding
    both = _add(store, name="MLP overfitting + lr_too_high")  # error and warning
    assert {r.id for r in store.list(search="resnet").items} == {relu.id}
    assert {r.id for r in store.list(search="_RELU-").items} == {relu.id}
    assert store.list(search="%").items == [] and store.list(search="_x").items == []  # no wildcards
    assert {r.id for r in store.list(severity="error").items} == {relu.id, both.id}
    assert {r.id for r in store.list(severity="info").items} == {relu.id, both.id}
    assert quiet.id not in {r.id for r in store.list(severity="info").items}
    assert {r.id for r in store.list(cause="LR_TOO_HIGH", severity="warning").items} == {both.id}
    now = datetime.now(timezone.utc)
    hour = timedelta(hours=1)
    assert len(store.list(since=now - hour).items) == 3
    assert store.list(since=now + hour).items == []
    assert store.list(until=now - hour).items == []
    naive_utc = (now + hour).replace(tzinfo=None)  # a naive time is read as UTC
    assert len(store.list(until=naive_utc).items) == 3
    elsewhere = timezone(timedelta(hours=-5))
    assert len(store.list(since=(now - hour).astimezone(elsewhere)).items) == 3


def test_search_folds_case_beyond_ascii_the_same_on_every_backend(store):
    stored = _add(store, name="Straße-ÉCOLE")
    assert [r.id for r in store.list(search="STRASSE-école").items] == [stored.id]


@pytest.mark.parametrize("run", [
    RunInfo(name="a\x00b"), RunInfo(project="p\x00"), RunInfo(name="n" * (MAX_RUN_NAME_CHARS + 1)),
    RunInfo(project="p" * (MAX_PROJECT_CHARS + 1)), RunInfo(name="é" * (MAX_RUN_NAME_CHARS + 1)),
])
def test_text_no_backend_can_index_is_refused_naming_the_field(store, run):
    report = DiagnosticReport(run=run)
    with pytest.raises(UnstorableReport) as info:
        store.add(report, fake_diagnosis(report))
    assert info.value.loc == ("run", "name" if run.name else "project")
    assert store.count() == 0


def test_the_longest_storable_texts_and_nul_elsewhere_are_stored_intact(store):
    report = make_report(name="🙂" * MAX_RUN_NAME_CHARS, project="€" * MAX_PROJECT_CHARS)
    report.layers[0].name = "layer\x00with\u202enul"
    stored, _ = store.add(report, fake_diagnosis(report))
    back = store.get(stored.id)
    assert back.report_json == report.model_dump_json()
    assert back.report().layers[0].name == "layer\x00with\u202enul"
    assert [r.id for r in store.list(project="€" * MAX_PROJECT_CHARS, run_name="🙂" * MAX_RUN_NAME_CHARS).items] == [
        stored.id]


def test_scope_hides_other_projects(store):
    mine = _add(store, project="a")
    theirs = _add(store, project="b")
    assert store.get(theirs.id, scope="a") is None
    assert store.get(mine.id, scope="a").id == mine.id
    assert [r.id for r in store.list(scope="a").items] == [mine.id]
    assert store.list(scope="a", project="b").items == []


def test_idempotency_key_stores_a_retry_once(store):
    report = make_report()
    first, created = store.add(report, fake_diagnosis(report), idempotency_key="k1")
    again, created_again = store.add(report, fake_diagnosis(report), idempotency_key="k1")
    assert created and not created_again
    assert again.id == first.id
    assert store.count() == 1


def test_idempotency_keys_belong_to_their_project(store):
    """The same key with another report is a conflict naming the key; the same key in
    another project is unused there (nothing tells a project what another one sent)."""
    mine = make_report(project="a", name="one")
    store.add(mine, fake_diagnosis(mine), idempotency_key="k")
    different = make_report(project="a", name="two")
    with pytest.raises(IdempotencyConflict, match="'k'"):
        store.add(different, fake_diagnosis(different), idempotency_key="k")
    theirs = make_report(project="b", name="one")
    stored, created = store.add(theirs, fake_diagnosis(theirs), idempotency_key="k")
    assert created and stored.project == "b"
    no_project = make_report(project=None)
    assert store.add(no_project, fake_diagnosis(no_project), idempotency_key="k")[1]
    assert not store.add(no_project, fake_diagnosis(no_project), idempotency_key="k")[1]
    assert store.count() == 3


def test_concurrent_writers_lose_nothing(store):
    errors: list[BaseException] = []

    def write(worker: int) -> None:
        try:
            for i in range(10):
                _add(store, name=f"w{worker}-{i}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.count() == 40
    assert len({r.run_name for r in store.list(limit=200).items}) == 40


def _add_all_at_once(store, items):
    """``add_async`` every (report, key) pair concurrently, so they share transactions;
    returns each one's outcome: (stored, created) or the exception."""

    async def add_all():
        return await asyncio.gather(
            *(store.add_async(r, fake_diagnosis(r), idempotency_key=key) for r, key in items), return_exceptions=True)

    return asyncio.run(add_all())


def test_group_commit_isolates_a_repeated_key_and_stores_the_rest(store):
    """Concurrent adds share transactions; one whose idempotency key is already stored
    must not take the others of its batch down with it."""
    report = make_report(name="first")
    original, _ = store.add(report, fake_diagnosis(report), idempotency_key="repeat")
    items = [(report, "repeat"), (make_report(name="other"), "repeat")] + [
        (make_report(name=f"w{w}"), f"key-{w}") for w in range(2, 40)]
    outcomes = _add_all_at_once(store, items)
    assert outcomes[0] == (original, False)
    assert isinstance(outcomes[1], IdempotencyConflict)
    assert all(outcome[1] for outcome in outcomes[2:])
    assert store.count() == 39
    assert {r.run_name for r in store.list().items} == {"first", *(f"w{w}" for w in range(2, 40))}


def test_a_report_that_fails_in_a_batch_fails_only_itself(store):
    """One report the database refuses (here a constraint added for the test; before,
    a NUL on PostgreSQL) among valid ones batched with it: only it fails."""
    with store.engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            conn.execute(text("CREATE TRIGGER refuse BEFORE INSERT ON reports WHEN NEW.run_name = 'bad' "
                              "BEGIN SELECT RAISE(ABORT, 'refused'); END"))
        else:
            conn.execute(text("ALTER TABLE reports ADD CONSTRAINT refuse CHECK (run_name <> 'bad')"))
    items = [(make_report(name="bad" if i == 7 else f"ok-{i}"), None) for i in range(40)]
    outcomes = _add_all_at_once(store, items)
    assert isinstance(outcomes[7], Exception)
    assert all(outcomes[i][1] for i in range(40) if i != 7)
    assert store.count() == 39


def test_group_commit_stores_what_the_plain_path_stores(database_url, tmp_path):
    """The fast path (add_async, batched) and the reference (add, one by one) agree on
    every outcome and every stored column but the generated id and time."""
    items = [(make_report(name=f"dead_relu {i % 5}", project=f"p{i % 3}"), f"k{i % 7}") for i in range(30)]

    def columns(store, outcome):
        if isinstance(outcome, BaseException):
            return type(outcome).__name__
        stored, created = outcome
        return (created, stored.project, stored.run_name, stored.top_cause, stored.severity_max,
                stored.cause_codes, stored.report_json, stored.diagnosis_json)

    plain_store = ReportStore(f"sqlite:///{tmp_path / 'plain.sqlite3'}")
    fast_store = ReportStore(database_url)
    try:
        plain = []
        for report, key in items:
            try:
                plain.append(columns(plain_store, plain_store.add(report, fake_diagnosis(report), idempotency_key=key)))
            except Exception as exc:  # noqa: BLE001 - compared below
                plain.append(type(exc).__name__)
        # one add first, so that the batch meets an already used key as the plain path did
        fast = [columns(fast_store, fast_store.add(*items[0][:1], fake_diagnosis(items[0][0]),
                                                   idempotency_key=items[0][1]))]
        fast += [columns(fast_store, o) for o in _add_all_at_once(fast_store, items[1:])]
        assert sorted(map(repr, fast)) == sorted(map(repr, plain))
        listed = [(r.project, r.run_name, r.cause_codes) for r in fast_store.list(limit=200).items]
        expected = [(r.project, r.run_name, r.cause_codes) for r in plain_store.list(limit=200).items]
        assert sorted(listed) == sorted(expected)
    finally:
        plain_store.close()
        fast_store.close()


def test_a_failed_commit_reaches_every_waiting_add(store):
    with store.engine.begin() as conn:
        conn.execute(text("DROP TABLE report_causes"))
    reports = [make_report(name=f"dead_relu {i}") for i in range(8)]
    outcomes = _add_all_at_once(store, [(r, None) for r in reports])
    assert all(isinstance(o, StorageUnavailable) and "report_causes" in str(o) for o in outcomes)
    assert store.count() == 0  # each rolled back as a whole
    with pytest.raises(StorageUnavailable, match="report_causes"):  # the writer lives on for the next add
        asyncio.run(store.add_async(reports[0], fake_diagnosis(reports[0])))


def test_a_stopped_database_is_unavailable_not_an_error(store):
    """What a stopped PostgreSQL server looks like: nothing listens at the address."""
    store.engine.dispose()
    store.engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none", connect_args={"connect_timeout": 5})
    for call in (store.check_writable, store.count, lambda: store.list(), lambda: store.get("0" * 32)):
        with pytest.raises(StorageUnavailable, match="OperationalError"):
            call()
    with pytest.raises(StorageUnavailable):
        store.add(make_report(), fake_diagnosis(make_report()))


def test_a_full_sqlite_file_fails_the_write_check(tmp_path):
    """A full disk, as SQLite reports it (max_page_count reached): adds and the health
    check's write probe fail with StorageUnavailable; reads still work."""
    from sqlalchemy import event

    store = ReportStore(f"sqlite:///{tmp_path / 'full.sqlite3'}")
    try:
        stored, _ = store.add(make_report(), fake_diagnosis(make_report()))
        store.check_writable()
        with store.engine.connect() as conn:
            conn.execute(text("VACUUM"))  # no free pages left in the file
        store.engine.dispose()

        @event.listens_for(store.engine, "connect")
        def _full(dbapi_connection, _record):
            pages = dbapi_connection.execute("PRAGMA page_count").fetchone()[0]
            dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")

        with pytest.raises(StorageUnavailable, match="full"):
            store.add(make_report(layers=60), fake_diagnosis(make_report()))
        with pytest.raises(StorageUnavailable, match="full"):
            store.check_writable()
        assert store.get(stored.id).id == stored.id
    finally:
        store.close()


def test_stores_on_one_file_take_turns_to_write(tmp_path):
    """Two stores (two worker processes, in production) on one SQLite file: while one
    holds the write lock the other's add waits for it, instead of SQLite's sleep-polling."""
    url = f"sqlite:///{tmp_path / 'shared.sqlite3'}"
    first, second = ReportStore(url), ReportStore(url)
    done = threading.Event()

    def add() -> None:
        second.add(make_report(), fake_diagnosis(make_report()))
        done.set()

    try:
        with first._write_turn.held():
            writer = threading.Thread(target=add)
            writer.start()
            assert not done.wait(0.5), "the add did not wait for the writer lock"
        assert done.wait(30)
        writer.join()
        assert first.count() == 1
        assert (tmp_path / "shared.sqlite3.write-lock").exists()
    finally:
        first.close()
        second.close()


def test_an_in_memory_store_needs_no_lock_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = ReportStore("sqlite://")
    try:
        store.add(make_report(), fake_diagnosis(make_report()))
        assert store.count() == 1 and not list(tmp_path.iterdir())
    finally:
        store.close()


def test_async_adds_from_an_event_loop_are_committed_together(store):
    reports = [make_report(name=f"a{i}") for i in range(16)]

    async def add_all() -> list[tuple]:
        return await asyncio.gather(*(store.add_async(r, fake_diagnosis(r)) for r in reports))

    results = asyncio.run(add_all())
    assert all(created for _, created in results)
    assert {stored.run_name for stored, _ in results} == {f"a{i}" for i in range(16)}
    assert store.count() == 16


def test_close_writes_what_is_queued_and_a_later_add_starts_again(tmp_path):
    url = f"sqlite:///{tmp_path / 'c.sqlite3'}"
    store = ReportStore(url)
    threads = [threading.Thread(target=_add, args=(store,), kwargs={"name": f"t{i}"}) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()
    again = ReportStore(url)
    try:
        assert again.count() == 8
        _add(store, name="after-close")  # the app reopens a store it closed (a new lifespan)
        store.close()
        assert again.count() == 9
    finally:
        again.close()


def test_an_add_whose_event_loop_closed_does_not_stop_the_writer(tmp_path):
    """A request abandoned with its loop (a test client shut down, a worker stopping)
    must not take the writer thread, or the adds batched with it, down."""
    url = f"sqlite:///{tmp_path / 'loop.sqlite3'}"
    store, other = ReportStore(url), ReportStore(url)
    try:
        with other._write_turn.held():  # the writer waits here until the loop is gone
            loop = asyncio.new_event_loop()
            first, second = make_report(name="orphan"), make_report(name="cancelled")
            loop.create_task(store.add_async(first, fake_diagnosis(first)))
            cancelled = loop.create_task(store.add_async(second, fake_diagnosis(second)))
            loop.call_soon(loop.stop)
            loop.run_forever()  # runs the adds up to their await, then stops
            cancelled.cancel()
            loop.run_until_complete(asyncio.sleep(0))
            loop.close()
        done: list = []
        after = make_report(name="next")  # through the writer too: queued after the orphan
        adder = threading.Thread(target=lambda: done.append(asyncio.run(store.add_async(after, fake_diagnosis(after)))),
                                 daemon=True)  # fmt: skip
        adder.start()
        adder.join(30)
        assert done, "the writer thread died with the abandoned add"
        # the orphan was already being written; one cancelled before its turn may be left out
        assert {"orphan", "next"} <= {r.run_name for r in store.list().items} <= {"orphan", "cancelled", "next"}
    finally:
        store.close()
        other.close()


def test_a_batch_on_a_stopped_database_fails_once_not_row_by_row(store, monkeypatch):
    """A database that cannot be reached fails the whole batch with one error: retrying
    each of its rows alone would wait on the dead server once per row."""
    store.engine.dispose()
    store.engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none", connect_args={"connect_timeout": 5})
    attempts = []
    transaction = store._transaction

    def counted():
        attempts.append(1)
        return transaction()

    monkeypatch.setattr(store, "_transaction", counted)
    outcomes = _add_all_at_once(store, [(make_report(name=f"r{i}"), None) for i in range(20)])
    assert all(isinstance(o, StorageUnavailable) for o in outcomes)
    assert len(attempts) < 20
