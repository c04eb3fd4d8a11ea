from __future__ import annotations

import logging
import shutil
import sqlite3
import threading
import time
from importlib import resources
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect, text

from scalewatch.store import Store, downgrade, open_store, upgrade
from scalewatch.store import revisions as revisions_module
from scalewatch.store.engine import make_engine
from scalewatch.store.errors import MigrationsUnusable
from scalewatch.store.revisions import head_revision
from scalewatch.store.runs import create_run
from scalewatch.store.schema import metadata
from scalewatch.store.timeouts import Timeouts

TABLES = {
    "runs",
    "steps",
    "step_rollups",
    "overflow_params",
    "param_norms",
    "spikes",
    "control_requests",
    "telemetry_gaps",
    "identities",
    "identity_events",
    "autopilots",
    "alerts",
    "scale_loads",
}


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _index_sql(conn: Connection, name: str) -> str:
    if conn.dialect.name == "sqlite":
        query = "SELECT sql FROM sqlite_master WHERE name = :name"
    else:
        query = "SELECT indexdef FROM pg_indexes WHERE indexname = :name"
    sql: str = conn.execute(text(query), {"name": name}).scalar_one()
    return sql


def test_upgrade_creates_the_schema_of_the_models(db_url: str) -> None:
    assert upgrade(db_url) == head_revision()
    assert _tables(db_url) == TABLES | {"alembic_version"}
    assert set(metadata.tables) == TABLES
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert context.get_current_revision() == head_revision()
            assert compare_metadata(context, metadata) == []
            indexes = {ix["name"] for ix in inspect(conn).get_indexes("steps")}
            assert indexes == {"ix_steps_overflow"}
            assert _index_sql(conn, "ix_steps_overflow").endswith("WHERE overflow")
    finally:
        engine.dispose()


def test_upgrade_twice_is_a_no_op(db_url: str) -> None:
    assert upgrade(db_url) == upgrade(db_url) == head_revision()


def test_downgrade_to_base_and_upgrade_again(db_url: str) -> None:
    upgrade(db_url)
    downgrade(db_url, "base")
    assert _tables(db_url) == {"alembic_version"}
    with open_store(db_url) as store, store.read() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM runs").scalar_one() == 0
    assert _tables(db_url) == TABLES | {"alembic_version"}


def test_upgrading_an_older_store_says_so_once_and_a_new_one_says_nothing(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="scalewatch"):
        upgrade(db_url)
        assert caplog.records == []  # a new store: its tables are made in no time
        downgrade(db_url, "e3f1a9c07b42")
        upgrade(db_url)
        upgrade(db_url)
    (record,) = caplog.records
    assert record.getMessage().startswith(
        f"scalewatch: upgrading the store's schema (e3f1a9c07b42 to {head_revision()})"
    )


def test_migrations_ship_as_package_files() -> None:
    package = resources.files("scalewatch.migrations")
    assert package.joinpath("env.py").is_file()
    assert package.joinpath("script.py.mako").is_file()
    versions = [Path(entry.name) for entry in package.joinpath("versions").iterdir()]
    names = {path.name for path in versions}
    assert "e3f1a9c07b42_initial_schema.py" in names
    assert any(name.startswith(f"{head_revision()}_") for name in names)


def test_opening_waits_out_another_process_upgrading_past_the_busy_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An upgrade of a big store holds the write lock longer than the busy timeout; a
    process opening the store meanwhile waits for it instead of failing 'locked'."""
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    downgrade(url, "base")  # an old store: opening it has an upgrade to do
    upgrader = sqlite3.connect(path, isolation_level=None)
    upgrader.execute("BEGIN IMMEDIATE")  # the other process, mid-upgrade
    opened: list[object] = []
    opener = threading.Thread(
        target=lambda: opened.append(open_store(url, timeouts=Timeouts(busy_ms=100)))
    )
    with caplog.at_level(logging.WARNING, logger="scalewatch.store"):
        opener.start()
        deadline = time.monotonic() + 30
        while "waiting up to" not in caplog.text:  # the opener found the lock taken
            assert opener.is_alive() and time.monotonic() < deadline, opened
            time.sleep(0.01)
        upgrader.execute("COMMIT")
        upgrader.close()
        opener.join(30)
    assert not opener.is_alive() and len(opened) == 1
    store = opened[0]
    assert isinstance(store, Store)
    with store.read() as conn:
        assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar_one()
    store.close()


def _revisions() -> list[str]:
    script = ScriptDirectory.from_config(revisions_module._alembic_config())
    return ["base", *reversed([rev.revision for rev in script.walk_revisions()])]


def _alembic_check(url: str) -> None:
    """``alembic check``: autogenerate against the models finds nothing to do."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            command.check(revisions_module._alembic_config(conn))
    finally:
        engine.dispose()


@pytest.mark.parametrize("revision", _revisions()[:-1])
def test_a_store_at_each_older_revision_upgrades_to_the_models(db_url: str, revision: str) -> None:
    upgrade(db_url)
    downgrade(db_url, revision)
    assert upgrade(db_url) == head_revision()
    _alembic_check(db_url)


def test_the_autopilots_reasons_move_to_note_and_back(db_url: str) -> None:
    """073a2251585d: an autopilot's request not rejected keeps its reason as ``note``; a
    rejection's reason stays ``reason``. The downgrade puts the notes back."""
    with open_store(db_url) as store:
        run = create_run(store, name="old", world_size=1, config={}, control={})
    downgrade(db_url, "4865aa3504de")
    rows = [  # (source, status, reason) as that revision stored them
        ("autopilot", "applied", "skip rate over the target"),
        ("autopilot", "pending", "scale collapsed"),
        ("autopilot", "rejected", "the run finished first"),
        ("api", "rejected", "scale above max_scale"),
        ("api", "applied", None),
    ]
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            for source, status, reason in rows:
                conn.execute(
                    text(
                        'INSERT INTO control_requests (run_id, "values", source, requested_by,'
                        " requested_at, status, reason) VALUES (:run, '{}', :source, 'x', 1.0,"
                        " :status, :reason)"
                    ),
                    {"run": run.id, "source": source, "status": status, "reason": reason},
                )
        assert upgrade(db_url) == head_revision()
        read = "SELECT reason, note FROM control_requests ORDER BY id"
        with engine.connect() as conn:
            assert [tuple(row) for row in conn.execute(text(read))] == [
                (None, "skip rate over the target"),
                (None, "scale collapsed"),
                ("the run finished first", None),
                ("scale above max_scale", None),
                (None, None),
            ]
        downgrade(db_url, "4865aa3504de")
        with engine.connect() as conn:
            stored = conn.execute(text("SELECT reason FROM control_requests ORDER BY id"))
            assert [row[0] for row in stored] == [reason for _, _, reason in rows]
    finally:
        engine.dispose()


def test_a_store_of_a_newer_scalewatch_is_refused_in_one_line_naming_it(db_url: str) -> None:
    upgrade(db_url)
    with open_store(db_url) as store, store.write() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = 'f00dfacef00d'")
    with pytest.raises(MigrationsUnusable) as refused:
        open_store(db_url)
    said = str(refused.value)
    assert "\n" not in said
    assert "is at revision f00dfacef00d, which this scalewatch does not know" in said
    assert f"its head is {head_revision()}" in said
    versions = Path(str(resources.files("scalewatch.migrations"))) / "versions"
    assert said.endswith(f"(revisions read from {versions})")


def test_migrations_without_revisions_are_named_by_their_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the trainer's warning says when the package it loaded holds no revision."""
    installed = Path(str(resources.files("scalewatch.migrations")))
    empty = tmp_path / "migrations"
    (empty / "versions").mkdir(parents=True)
    for name in ("__init__.py", "env.py", "script.py.mako"):
        shutil.copy(installed / name, empty / name)
    monkeypatch.setattr(revisions_module.migrations, "__file__", str(empty / "__init__.py"))
    with pytest.raises(MigrationsUnusable) as refused:
        open_store(f"sqlite:///{tmp_path / 'new.db'}")
    assert str(refused.value) == (
        f"the store cannot be opened: no revision files (revisions read from {empty / 'versions'})"
    )


def test_threads_of_one_process_upgrade_stores_of_their_own_at_once(tmp_path: Path) -> None:
    """Alembic binds its command's context module-wide: two threads upgrading two stores
    together (two scalers' writers in one process) each get the whole schema."""
    urls = [f"sqlite:///{tmp_path / f'store{i}.db'}" for i in range(4)]
    start = threading.Barrier(len(urls))
    errors: list[BaseException] = []

    def upgrade_at_once(url: str) -> None:
        start.wait()
        try:
            upgrade(url)
        except BaseException as error:  # reported below, with the url
            errors.append(error)

    threads = [threading.Thread(target=upgrade_at_once, args=(url,)) for url in urls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    for url in urls:
        assert _tables(url) >= TABLES
