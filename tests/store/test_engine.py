from __future__ import annotations

import multiprocessing
import sqlite3
import threading
from pathlib import Path

import pytest
from sqlalchemy import Connection, exc

from scalewatch.store import Store, default_url, open_store
from scalewatch.store.engine import make_engine
from scalewatch.store.errors import NotAStoreURL, storage_failure
from scalewatch.store.revisions import head_revision
from scalewatch.store.runs import create_run
from scalewatch.store.schema import runs
from scalewatch.store.timeouts import Timeouts
from scalewatch.store.urls import DEFAULT_URL, shown_url
from tests._helpers.postgres import Cluster
from tests._helpers.workers import open_together


@pytest.mark.sqlite_only
def test_every_connection_has_the_pragmas(store: Store) -> None:
    with store.engine.connect() as first, store.engine.connect() as second:
        for conn in (first, second):
            pragma = conn.exec_driver_sql
            assert pragma("PRAGMA journal_mode").scalar_one() == "wal"
            assert pragma("PRAGMA busy_timeout").scalar_one() == 30000
            assert pragma("PRAGMA synchronous").scalar_one() == 1  # NORMAL
            assert pragma("PRAGMA foreign_keys").scalar_one() == 1


@pytest.mark.sqlite_only
def test_write_takes_the_write_lock_at_begin(store: Store) -> None:
    with store.write() as conn:
        other = sqlite3.connect(store.engine.url.database or "", timeout=0)
        try:
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
        finally:
            other.close()
        assert conn.in_transaction()


def test_default_url_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SCALEWATCH_DB", raising=False)
    assert default_url() == DEFAULT_URL == "sqlite:///scalewatch.db"
    url = f"sqlite:///{tmp_path / 'env.db'}"
    monkeypatch.setenv("SCALEWATCH_DB", url)
    with open_store() as store:
        assert store.url == url
    assert (tmp_path / "env.db").is_file()


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such"
    with pytest.raises(FileNotFoundError, match=r"directory .* does not exist"):
        open_store(f"sqlite:///{missing / 'store.db'}")
    assert not missing.exists()


def test_only_sqlite_and_postgresql_urls_are_stores() -> None:
    with pytest.raises(NotAStoreURL, match="SQLite or PostgreSQL"):
        open_store("mysql://me:secret@localhost/scalewatch")
    with pytest.raises(ValueError, match="psycopg 3") as refused:
        open_store("postgresql+psycopg2://me:secret@localhost/scalewatch")
    assert "secret" not in str(refused.value)


def test_passwords_are_masked_wherever_a_url_is_shown() -> None:
    url = "postgresql+psycopg://me:s3cret@db-host:5432/scalewatch?sslmode=require"
    assert shown_url(url) == "postgresql+psycopg://me:***@db-host:5432/scalewatch?sslmode=require"
    assert "s3cret" not in repr(Store(url, make_engine(url)))
    with pytest.raises(NotAStoreURL) as refused:
        open_store("mysql://me:s3cret@localhost/scalewatch")
    assert "s3cret" not in str(refused.value)
    assert shown_url("sqlite:///runs/sw.db") == "sqlite:///runs/sw.db"


def test_close_checkpoints_and_releases_the_file(tmp_path: Path) -> None:
    path = tmp_path / "closed.db"
    with open_store(f"sqlite:///{path}") as store, store.read() as conn:
        conn.exec_driver_sql("SELECT 1").scalar_one()
    assert not Path(f"{path}-wal").exists()  # the last connection closed cleanly


@pytest.mark.sqlite_only
def test_opening_an_up_to_date_store_needs_no_write_lock(db_url: str, store: Store) -> None:
    # A service starting while the trainer holds the write lock must not wait for it.
    holder = sqlite3.connect(store.engine.url.database or "", timeout=0, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with open_store(db_url) as second:
            assert second.url == db_url
    finally:
        holder.close()


@pytest.mark.slow
def test_processes_opening_fresh_files_together_all_succeed(tmp_path: Path) -> None:
    processes, store_rounds, connect_rounds = 4, 15, 150
    rounds = [(f"sqlite:///{tmp_path / f'store{i}.db'}", "store") for i in range(store_rounds)]
    # Switching a new file to WAL races too; it is cheap, so it gets many more rounds.
    rounds += [(f"sqlite:///{tmp_path / f'wal{i}.db'}", "connect") for i in range(connect_rounds)]
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(processes)
    results = context.Queue()
    workers = [
        context.Process(target=open_together, args=(rounds, barrier, results))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    try:
        outcomes = [results.get(timeout=120) for _ in range(processes * len(rounds))]
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
    assert [worker.exitcode for worker in workers] == [0] * processes
    failures = [outcome for outcome in outcomes if outcome[1] != "ok"]
    assert failures == []
    assert len(outcomes) == processes * len(rounds)
    for i in range(store_rounds):
        db = sqlite3.connect(tmp_path / f"store{i}.db")
        try:
            assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [
                (head_revision(),)
            ]
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        finally:
            db.close()


def _open_at_once(url: str, openers: int) -> list[str]:
    barrier = threading.Barrier(openers)
    outcomes: list[str] = []

    def open_it() -> None:
        barrier.wait(timeout=60)
        try:
            with open_store(url) as store, store.read() as conn:
                conn.exec_driver_sql("SELECT count(*) FROM runs").scalar_one()
        except Exception as error:
            outcomes.append(f"{type(error).__name__}: {error}")
        else:
            outcomes.append("ok")

    threads = [threading.Thread(target=open_it) for _ in range(openers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return outcomes


@pytest.mark.postgres
def test_many_opening_a_new_postgresql_store_at_once_all_succeed(
    postgres_cluster: Cluster,
) -> None:
    """Trainers and the service starting together: the advisory lock lets one upgrade,
    the others wait for it and find the schema at the head."""
    for _ in range(3):
        url = postgres_cluster.url(postgres_cluster.new_database())
        assert _open_at_once(url, 6) == ["ok"] * 6
        engine = make_engine(url)
        try:
            with engine.connect() as conn:
                versions = conn.exec_driver_sql("SELECT version_num FROM alembic_version").all()
            assert versions == [(head_revision(),)]
        finally:
            engine.dispose()


@pytest.mark.postgres
def test_a_postgresql_store_through_a_libpq_service_file(
    postgres_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/POSTGRES.md's way to keep connection settings (and a password) out of the URL."""
    name = postgres_cluster.new_database()
    services = tmp_path / "pg_service.conf"
    services.write_text(
        f"[scalewatch]\nhost=127.0.0.1\nport={postgres_cluster.port}\nuser=postgres\n"
        f"dbname={name}\n"
    )
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    with open_store("postgresql+psycopg://?service=scalewatch") as store, store.read() as conn:
        assert conn.exec_driver_sql("SELECT current_database()").scalar_one() == name
        assert conn.exec_driver_sql("SELECT count(*) FROM runs").scalar_one() == 0


def test_a_postgresql_server_that_is_down_is_a_storage_failure() -> None:
    """The service answers 503 with the first line of the driver's message (not a 500)."""
    psycopg = pytest.importorskip("psycopg")
    down = psycopg.OperationalError('connection to server at "127.0.0.1" failed\nIs it running?')
    assert storage_failure(down) == 'connection to server at "127.0.0.1" failed'
    assert storage_failure(psycopg.errors.UniqueViolation("duplicate key")) is None


def _backend_pid(conn: Connection) -> int:
    return int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())


@pytest.mark.postgres
def test_postgresql_reads_autocommit_and_writes_are_transactions(postgres_url: str) -> None:
    """A read is one statement on the wire (no BEGIN, no ROLLBACK); a write is one
    transaction, so a write that fails half-way leaves nothing."""
    with open_store(postgres_url) as store:
        with store.read() as conn:
            assert conn.connection.driver_connection.autocommit is True
            status = conn.exec_driver_sql(
                "SELECT state FROM pg_stat_activity WHERE pid = pg_backend_pid()"
            ).scalar_one()
            assert status == "active"  # "idle in transaction" would mean a BEGIN was sent
        create_run(store, name="kept", world_size=1, config={}, control={})
        with pytest.raises(RuntimeError), store.write() as conn:
            assert conn.connection.driver_connection.autocommit is False
            conn.execute(runs.delete())
            raise RuntimeError("half-way")
        with store.read() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM runs").scalar_one() == 1
            assert conn.connection.driver_connection.autocommit is True  # reset on return


@pytest.mark.postgres
def test_postgresql_sessions_compile_no_query(postgres_url: str) -> None:
    """No JIT: compiling the evaluator's statement over many runs cost 90 ms a run of it;
    options in the URL itself are left as they are."""
    with open_store(postgres_url) as store, store.read() as conn:
        assert conn.exec_driver_sql("SHOW jit").scalar_one() == "off"
    own = f"{postgres_url}?options=-c%20work_mem%3D8MB"
    with open_store(own) as store, store.read() as conn:
        assert conn.exec_driver_sql("SHOW work_mem").scalar_one() == "8MB"
        assert conn.exec_driver_sql("SHOW jit").scalar_one() == "on"


@pytest.mark.postgres
@pytest.mark.parametrize("idle_s", [0.0, 3600.0])
def test_a_pooled_connection_the_server_dropped_is_replaced_once_it_sat_idle(
    postgres_url: str, idle_s: float
) -> None:
    """A connection idle in the pool longer than ping_idle_s is pinged at checkout and, if
    the server dropped it (a restart), replaced without an error; one back in use sooner
    is not pinged (a trip saved on every statement under load), so its next use fails."""
    with open_store(postgres_url, timeouts=Timeouts(ping_idle_s=idle_s)) as store:
        with store.read() as conn:
            dropped = _backend_pid(conn)
        killer = make_engine(postgres_url)  # as a restart would: not through the pool
        try:
            with killer.connect() as other:
                other.exec_driver_sql(f"SELECT pg_terminate_backend({dropped})")
        finally:
            killer.dispose()
        if idle_s:
            with pytest.raises(exc.OperationalError), store.read() as conn:
                _backend_pid(conn)
            return
        with store.read() as conn:
            assert _backend_pid(conn) != dropped
