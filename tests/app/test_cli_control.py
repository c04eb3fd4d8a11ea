"""``scalewatch control`` waits for the job: the step every rank applied the request at, or
why it was not, in one line; ``--no-wait`` only files it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from click.testing import CliRunner, Result

from scalewatch.app.cli import cli
from scalewatch.store.control import control_state, mark_applied, mark_rejected, pending_requests
from scalewatch.store.engine import Store
from scalewatch.store.records import ControlRequestRow
from tests._helpers.service import add_run, simulate


def scalewatch(*argv: str) -> Result:
    return CliRunner().invoke(cli, list(argv), catch_exceptions=False)


@pytest.fixture
def job(store: Store) -> Iterator[Callable[[Callable[[ControlRequestRow], None]], None]]:
    """A stand-in for the reporting rank: it takes the run's first pending request and
    settles it with the function given (a thread, as the job is another process)."""
    threads: list[threading.Thread] = []

    def start(settle: Callable[[ControlRequestRow], None]) -> None:
        def poll() -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                pending = pending_requests(store, 1)
                if pending:
                    settle(pending[0])
                    return
                time.sleep(0.02)

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        threads.append(thread)

    yield start
    for thread in threads:
        thread.join(30)


def test_control_waits_and_says_the_step_it_was_applied_at(
    store: Store, db_url: str, job: Callable[[Callable[[ControlRequestRow], None]], None]
) -> None:
    run = add_run(store, simulate(10, set()))
    assert run == 1

    def apply(row: ControlRequestRow) -> None:
        state = {k: v for k, v in control_state(store, run).items() if k != "version"}
        mark_applied(
            store, row.id, step=11, at=time.time(), state={**state, **row.values}, version=1
        )

    job(apply)
    result = scalewatch("control", str(run), "--growth-interval", "500", "--db", db_url)

    assert result.exit_code == 0, result.stderr
    assert result.stdout == (
        "request 1 applied at step 11 on every rank of run 1: growth_interval = 500\n"
    )
    assert result.stderr.startswith("request 1 filed: waiting for run 1 to apply it")
    assert '"status"' not in result.stdout


def test_control_says_why_the_job_rejected_it(
    store: Store, db_url: str, job: Callable[[Callable[[ControlRequestRow], None]], None]
) -> None:
    run = add_run(store, simulate(10, set()))
    job(lambda row: mark_rejected(store, row.id, reason="the scaler refused it", step=11))

    result = scalewatch("control", str(run), "--scale", "2", "--db", db_url)

    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        "scalewatch control: request 1 rejected: the scaler refused it"
    )


def test_control_gives_up_after_its_timeout_saying_how_long_it_waited(
    store: Store, db_url: str
) -> None:
    run = add_run(store, simulate(10, set()))
    started = time.monotonic()

    result = scalewatch("control", str(run), "--scale", "2", "--timeout", "1", "--db", db_url)

    assert 1 <= time.monotonic() - started < 10
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert any(line.startswith("request 1: still pending after") for line in lines), lines
    assert lines[-1].startswith("scalewatch control: request 1 still pending after 1 s")
    assert len(pending_requests(store, run)) == 1  # still filed: the job applies it later


def test_no_wait_only_files_the_request(store: Store, db_url: str) -> None:
    run = add_run(store, simulate(10, set()))

    result = scalewatch(
        "control", str(run), "--growth-interval", "500", "--no-wait", "--db", db_url
    )

    assert result.exit_code == 0
    assert result.stdout == (
        "request 1 filed: growth_interval = 500 (pending: the job applies it at its next step)\n"
    )
    assert [row.values for row in pending_requests(store, run)] == [{"growth_interval": 500}]
