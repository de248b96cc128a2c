"""ReportStore: versioned schema, immutable rows, filters, cursor pagination, scope."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import pytest
from sqlalchemy import text

from nndx.api.storage import SCHEMA_VERSION, InvalidCursor, ReportStore, StorageError, encode_cursor
from tests.api.conftest import fake_diagnosis, make_report


@pytest.fixture
def store(tmp_path):
    store = ReportStore(f"sqlite:///{tmp_path / 'sub' / 'store.sqlite3'}")
    yield store
    store.close()


def test_first_start_creates_the_file_in_wal_mode_with_a_schema_version(tmp_path, store):
    path = tmp_path / "sub" / "store.sqlite3"
    assert path.exists()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]


def test_reopening_keeps_reports_and_does_not_migrate_again(tmp_path, store):
    stored, _ = store.add(make_report(), fake_diagnosis(make_report()))
    store.close()
    again = ReportStore(f"sqlite:///{tmp_path / 'sub' / 'store.sqlite3'}")
    try:
        assert again.get(stored.id).report_json == stored.report_json
        assert again.count() == 1
    finally:
        again.close()


def test_a_database_from_a_newer_nndx_is_refused(tmp_path, store):
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE schema_version SET version = :v"), {"v": SCHEMA_VERSION + 1})
    store.close()
    with pytest.raises(StorageError, match="newer"):
        ReportStore(f"sqlite:///{tmp_path / 'sub' / 'store.sqlite3'}")


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


def test_a_foreign_cursor_is_refused(store):
    for cursor in ("nonsense", "", encode_cursor(5)[:-1] + "!", "djI6MQ"):
        with pytest.raises(InvalidCursor):
            store.list(cursor=cursor)


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


def test_group_commit_isolates_a_repeated_key_and_stores_the_rest(store):
    """Concurrent adds share transactions; one whose idempotency key is already stored
    must not take the others of its batch down with it."""
    report = make_report(name="first")
    original, _ = store.add(report, fake_diagnosis(report), idempotency_key="repeat")
    results: dict[int, tuple] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def write(worker: int) -> None:
        try:
            start.wait()
            key = "repeat" if worker == 0 else f"key-{worker}"
            r = make_report(name=f"w{worker}")
            results[worker] = store.add(r, fake_diagnosis(r), idempotency_key=key)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert results[0] == (original, False)
    assert all(results[w][1] for w in range(1, 8))
    assert store.count() == 8
    assert {r.run_name for r in store.list().items} == {"first", *(f"w{w}" for w in range(1, 8))}


def test_a_failed_commit_reaches_every_waiting_add(tmp_path):
    store = ReportStore(f"sqlite:///{tmp_path / 's.sqlite3'}")
    try:
        with store.engine.begin() as conn:
            conn.execute(text("DROP TABLE report_causes"))
        report = make_report(name="dead_relu")
        with pytest.raises(Exception, match="report_causes"):
            store.add(report, fake_diagnosis(report))
        assert store.count() == 0  # rolled back as a whole
        with pytest.raises(Exception, match="report_causes"):  # the writer lives on for the next add
            store.add(report, fake_diagnosis(report))
    finally:
        store.close()


def test_stores_on_one_file_take_turns_to_write_through_the_writer_lock(tmp_path):
    """Two stores (two worker processes, in production) on one SQLite file: while one
    holds the write lock the other's add waits for it, instead of SQLite's sleep-polling."""
    url = f"sqlite:///{tmp_path / 'shared.sqlite3'}"
    first, second = ReportStore(url), ReportStore(url)
    done = threading.Event()

    def add() -> None:
        second.add(make_report(), fake_diagnosis(make_report()))
        done.set()

    try:
        with first._writer_lock:
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
        with other._writer_lock:  # the writer waits here until the loop is gone
            loop = asyncio.new_event_loop()
            report = make_report(name="orphan")
            task = loop.create_task(store.add_async(report, fake_diagnosis(report)))
            loop.call_soon(loop.stop)
            loop.run_forever()  # runs the add up to its await, then stops
            task.cancel()
            loop.close()
        done: list = []
        adder = threading.Thread(target=lambda: done.append(_add(store, name="next")), daemon=True)
        adder.start()
        adder.join(30)
        assert done, "the writer thread died with the abandoned add"
        assert {r.run_name for r in store.list().items} == {"orphan", "next"}
    finally:
        store.close()
        other.close()
