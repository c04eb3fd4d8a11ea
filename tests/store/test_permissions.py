"""A store's files are readable by their owner alone (scalewatch.store.permissions): the
database, its -wal and -shm, whatever the umask; ``serve`` says when an existing one is not."""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

import scalewatch
from scalewatch.app.cli._serving import ready_to_serve
from scalewatch.app.settings import Settings
from scalewatch.store import open_store
from scalewatch.store.permissions import readable_by_others
from tests._helpers.service import add_run, simulate
from tests._helpers.twin import mlp, sgd, train_step


@pytest.fixture
def lax_umask() -> Iterator[None]:
    """A umask that lets every user of the host read new files (and the group write them)."""
    before = os.umask(0o002)
    try:
        yield
    finally:
        os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("lax_umask")
def test_a_new_store_its_wal_and_shm_are_its_owners_alone(tmp_path: Path) -> None:
    db = tmp_path / "scalewatch.db"
    with open_store(f"sqlite:///{db}") as store:
        add_run(store, simulate(3, set()), name="secret")
        files = [db, Path(f"{db}-wal"), Path(f"{db}-shm")]
        assert [(file.name, mode(file)) for file in files] == [(file.name, 0o600) for file in files]
    assert readable_by_others(str(db)) == []


@pytest.mark.usefixtures("lax_umask")
def test_a_store_a_training_job_creates_is_its_owners_alone(tmp_path: Path) -> None:
    db = tmp_path / "trained.db"
    model = mlp()
    opt = sgd(model)[0]
    with scalewatch.GradScaler("cpu", telemetry=f"sqlite:///{db}", run_name="private") as scaler:
        for step in range(1, 4):
            train_step(scaler, model, opt, step)
        assert scaler.flush(30)
        files = [db, Path(f"{db}-wal"), Path(f"{db}-shm")]
        assert [(file.name, mode(file)) for file in files] == [(file.name, 0o600) for file in files]


@pytest.mark.usefixtures("lax_umask")
def test_an_existing_stores_mode_is_left_as_its_owner_set_it(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    open_store(f"sqlite:///{db}").close()
    db.chmod(0o640)  # shared with a group on purpose
    open_store(f"sqlite:///{db}").close()
    assert mode(db) == 0o640


def test_serve_warns_once_of_a_store_others_can_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "old.db"
    open_store(f"sqlite:///{db}").close()
    db.chmod(0o644)  # as SQLite made stores before
    settings = Settings(db=f"sqlite:///{db}", port=0, token=SecretStr("t" * 20))

    _, sock = ready_to_serve(settings, out=io.StringIO())
    sock.close()

    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 1, warnings
    assert "other users can read the store" in warnings[0]
    assert warnings[0].endswith(f"chmod 600 {db}")


def test_serve_says_nothing_of_a_store_its_owners_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(db=f"sqlite:///{tmp_path / 'new.db'}", port=0, token=SecretStr("t" * 20))
    _, sock = ready_to_serve(settings, out=io.StringIO())
    sock.close()
    assert capsys.readouterr().err == ""
