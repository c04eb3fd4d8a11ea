"""A damaged store: refused at open by serve and the CLI, and a 503 with its reason in one
line (never a 500 with a traceback) when it breaks while the service is serving it."""

from __future__ import annotations

import logging
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from scalewatch.app.cli import main
from scalewatch.store.engine import Store
from scalewatch.store.errors import storage_failure
from tests._helpers.service import add_run, simulate

DAMAGE_AT, DAMAGE_BYTES = 8192, 16 * 1024


def damage(path: Path) -> None:
    """Overwrite 16 KiB at offset 8192, as a failing disk or a bad copy would."""
    with path.open("r+b") as file:
        file.seek(DAMAGE_AT)
        file.write(b"\xa5" * DAMAGE_BYTES)


def damaged_copy(store: Store, tmp_path: Path) -> Path:
    """A copy of a store holding enough steps to span many pages, then damaged."""
    with store.write() as conn:
        conn.exec_driver_sql("SELECT 1")
    with store.engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    source = Path(store.engine.url.database or "")
    copy = tmp_path / "copy.db"
    shutil.copyfile(source, copy)
    damage(copy)
    return copy


@pytest.fixture
def copy(store: Store, tmp_path: Path) -> Path:
    add_run(store, simulate(5000, {5, 100}))
    return damaged_copy(store, tmp_path)


def test_the_cli_refuses_a_damaged_store_in_one_line(
    copy: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``db upgrade`` exited 0 on it, ``serve`` served it and said it was healthy."""
    monkeypatch.setenv("SCALEWATCH_TOKEN_FILE", str(tmp_path / "token"))
    before = copy.read_bytes()
    for argv in (["db", "upgrade"], ["runs"], ["export", "1"], ["control", "1", "--scale", "2"],
                 ["serve", "--port", "0"]):  # fmt: skip
        assert main([*argv, "--db", str(copy)]) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith(
            f"scalewatch {argv[0]}: the store cannot be read: SQLite's quick_check"
        )
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert "restore it from a copy" in err
    assert copy.read_bytes() == before
    assert not (tmp_path / "token").exists()


def test_a_file_that_never_was_a_store_is_called_so_not_damaged(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``runs --db /etc/passwd`` advised restoring the file "from a copy"."""
    monkeypatch.setenv("SCALEWATCH_TOKEN_FILE", str(tmp_path / "token"))
    text = tmp_path / "passwd"
    text.write_text("root:x:0:0:root:/root:/bin/bash\n")
    for argv in (["db", "upgrade"], ["runs"], ["export", "1"], ["serve", "--port", "0"]):
        assert main([*argv, "--db", str(text)]) == 1, argv
        err = capsys.readouterr().err
        assert err == (
            f"scalewatch {argv[0]}: {text} is not a scalewatch store: not a SQLite database"
            " at all (is --db or $SCALEWATCH_DB the path you meant?)\n"
        ), argv
    assert text.read_text() == "root:x:0:0:root:/root:/bin/bash\n"
    assert not (tmp_path / "token").exists()


def test_a_store_that_breaks_while_serving_is_a_503_with_its_reason(
    client: TestClient, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    run = add_run(store, simulate(5000, {5, 100}))
    assert client.get("/healthz").json() == {"status": "ok"}
    with store.engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    damage(Path(store.engine.url.database or ""))
    client.app.state.services.store.engine.dispose()  # pooled connections keep pages they read
    caplog.set_level(logging.WARNING)
    for path in (f"/api/runs/{run}/steps", f"/api/runs/{run}/overflows", "/api/runs", "/metrics"):
        response = client.get(path)
        assert response.status_code == 503, (path, response.text)
        detail = response.json()["detail"]
        assert detail.startswith("the store cannot be used: ") and "\n" not in detail, detail
    health = client.get("/healthz")
    assert health.status_code == 503
    assert health.json()["status"] == "unavailable"
    assert health.json()["detail"].startswith("the store cannot be used: ")
    assert "Traceback" not in caplog.text
    assert all(record.exc_info is None for record in caplog.records)


def test_healthz_probes_the_store(client: TestClient, store: Store) -> None:
    """No request met the failure yet: the probe of /healthz finds it."""
    with store.engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    path = Path(store.engine.url.database or "")
    with path.open("r+b") as file:
        file.write(b"\0" * 100)  # the header: no longer a database
    client.app.state.services.store.engine.dispose()
    response = client.get("/healthz")
    assert response.status_code == 503, response.text
    assert "not a database" in response.json()["detail"]


def test_only_the_stores_condition_is_a_storage_failure() -> None:
    """A statement SQLite refuses is a bug (a 500 with its traceback), not a 503."""
    assert storage_failure(sqlite3.DatabaseError("database disk image is malformed"))
    assert storage_failure(sqlite3.OperationalError("disk I/O error"))
    assert storage_failure(sqlite3.IntegrityError("UNIQUE constraint failed: runs.id")) is None
    assert storage_failure(sqlite3.ProgrammingError("Cannot operate on a closed database")) is None
    assert storage_failure(ValueError("no")) is None


def test_an_export_the_store_fails_part_way_is_cut_short_in_one_line(
    server: str,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Once the 200 has started, the client must see the file incomplete (never whole) and
    the log one line: it got uvicorn's traceback."""
    import httpx

    import scalewatch.app.routes.export

    run = add_run(store, simulate(20, set()))

    def failing(*args: object, **kwargs: object) -> Iterator[str]:
        yield "step,wall_time\n"
        raise sqlite3.DatabaseError("database disk image is malformed")

    monkeypatch.setattr(scalewatch.app.routes.export, "export_chunks", failing)
    caplog.set_level(logging.WARNING)
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.get(f"{server}/api/runs/{run}/export", timeout=10)
    assert "export cut short: the store cannot be used: database disk image" in caplog.text
    assert "Traceback" not in caplog.text and "Traceback" not in capfd.readouterr().err
