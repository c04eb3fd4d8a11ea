"""Every test runs with its own default store, so nothing writes ./scalewatch.db; tests
that want a store of their own take ``db_url`` and ``store``."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


class _CheckoutFolders(importlib.abc.MetaPathFinder):
    """The checkout's folders are the package ``scalewatch``, not packages of their own: the
    tests' process has the checkout on ``sys.path`` (pytest puts the root there for
    ``tests``), but where users have the wheel there is no ``scaler``, ``app``, ``web`` or
    ``migrations`` of ours, so here neither. A module imported under two names would be
    two modules (two classes, two registries)."""

    NAMES = frozenset({"scaler", "app", "web", "migrations"})

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name in self.NAMES:
            raise ModuleNotFoundError(
                f"No module named {name!r} (the checkout's {name}/ is part of scalewatch)",
                name=name,
            )
        return None


sys.meta_path.insert(0, _CheckoutFolders())

from scalewatch.store import Store, open_store  # noqa: E402
from tests._helpers import postgres as _postgres  # noqa: E402


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--wheel", action="store_true", help="run the tests marked wheel (make wheel-check)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked ``cuda`` is skipped on a machine without a CUDA GPU; one marked
    ``wheel`` unless ``--wheel`` is given."""
    import torch

    skips = {}
    if not torch.cuda.is_available():
        skips["cuda"] = pytest.mark.skip(reason="needs a CUDA GPU")
    if not config.getoption("--wheel"):
        skips["wheel"] = pytest.mark.skip(reason="builds and installs the wheel: make wheel-check")
    for item in items:
        for marker, skip in skips.items():
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: the torch lanes run without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` (make test): each of ``GROUPS`` on one worker (the browser tests
    share one Chromium and one served live run, session fixtures started once); every other
    test wherever a worker is free. xdist's own groups are named by a suffix it adds
    to each test's node id, which pytest 9 no longer lets it change."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupsTogether(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return next((group for group in GROUPS if nodeid.startswith(group)), nodeid)

    return GroupsTogether(config, log)


# Each on one worker, one test after the other: the browser tests (one Chromium, one served
# live run), the demo's (each trains several ranks: two at once starve each other) and the
# documents' examples (one module fixture starts every example the session's items name: a
# worker's items are the whole collection, so on three workers each example ran three times).
GROUPS = ("tests/web/", "tests/app/test_demo.py", "tests/test_readme.py")


@pytest.fixture(autouse=True)
def _no_event_loop_left_running(request: pytest.FixtureRequest) -> None:
    """No test starts inside an event loop an earlier test left running in this thread (the
    browser tests' Playwright runs one while it is open): asyncio.run would refuse, and a
    test would fail for where it was scheduled."""
    if request.node.nodeid.startswith("tests/web/"):
        return
    import asyncio

    loop = asyncio.events._get_running_loop()
    assert loop is None, f"an event loop is left running in this thread: {loop!r}"


@pytest.fixture(autouse=True)
def _private_default_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCALEWATCH_DB", f"sqlite:///{tmp_path / 'default-store.db'}")
    monkeypatch.setenv("SCALEWATCH_SPOOL_DIR", str(tmp_path / "spool"))  # never the user's


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """A fresh file store in the test's own directory."""
    return f"sqlite:///{_own_file(tmp_path)}"


def _own_file(tmp_path: Path) -> Path:
    """The file of a test's own store (``db_url``)."""
    return tmp_path / "scalewatch.db"


@pytest.fixture(scope="session")
def _migrated_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store file upgraded to the head once a session: a test's own store starts as a
    copy of it, which costs a file copy rather than the migrations (~50 ms a test)."""
    path = tmp_path_factory.mktemp("migrated") / "scalewatch.db"
    open_store(f"sqlite:///{path}").close()
    return path


@pytest.fixture
def store(db_url: str, tmp_path: Path, _migrated_file: Path) -> Iterator[Store]:
    own = _own_file(tmp_path)
    if db_url == f"sqlite:///{own}" and not own.exists():
        shutil.copyfile(_migrated_file, own)
    with open_store(db_url) as opened:
        yield opened


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[_postgres.Cluster]:
    """A throwaway PostgreSQL server for the session; skips the test without one."""
    bindir = _postgres.server_bindir()
    if bindir is None:
        pytest.skip(_postgres.HOW_TO_GET_ONE)
    pytest.importorskip("psycopg", reason="pip install 'scalewatch[postgres]' (psycopg 3)")
    with _postgres.cluster(bindir) as server:
        yield server


@pytest.fixture
def postgres_url(postgres_cluster: _postgres.Cluster) -> Iterator[str]:
    """An empty database of its own on the session's server, dropped after the test."""
    name = postgres_cluster.new_database()
    try:
        yield postgres_cluster.url(name)
    finally:
        postgres_cluster.drop_database(name)
