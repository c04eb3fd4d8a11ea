from __future__ import annotations

import io
import json
import os
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from fastapi.testclient import TestClient

from scalewatch.app import cli as cli_package
from scalewatch.app import exports
from scalewatch.app.cli import cli, main
from scalewatch.app.cli import export as export_command
from scalewatch.store.control import control_history
from scalewatch.store.engine import Store
from scalewatch.store.runs import end_run
from tests._helpers.golden import GOLDEN_CSV, ROWS
from tests._helpers.imports import ROOT, imported
from tests._helpers.service import add_run, simulate


def scalewatch(*argv: str) -> Result:
    """``scalewatch ARGV`` through click's runner: its exit status, standard output and error."""
    return CliRunner().invoke(cli, list(argv), catch_exceptions=False)


def test_commands_are_registered() -> None:
    assert set(cli.commands) == {
        "serve", "runs", "export", "control", "alerts", "db", "demo", "instrument", "tokens",
        "spool",
    }  # fmt: skip
    assert cli_package.__all__ == ["cli", "main"]


def test_main_is_the_command_line_with_its_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("Usage: scalewatch [OPTIONS] COMMAND")
    assert main(["no-such-command"]) == 2
    assert "No such command 'no-such-command'" in capsys.readouterr().err


def test_usage_mistakes_exit_2_through_clicks_usage_error() -> None:
    for argv, message in (
        (["export"], "Missing argument 'RUN'"),
        (["export", "1", "--what", "everything"], "Invalid value for '--what'"),
        (["control", "x"], "Invalid value for 'RUN'"),
        (["control", "1", "--growth-interval", "1.5"], "Invalid value for '--growth-interval'"),
        (["serve", "--port", "eighty"], "Invalid value for '--port'"),
        (["demo", "--steps", "0"], "Invalid value for '--steps'"),
        (["demo", "--world-size", "0"], "Invalid value for '--world-size'"),
        (["db"], "Usage: scalewatch db"),
        (["db", "downgrade"], "No such command 'downgrade'"),
        (["instrument"], "scalewatch instrument: give the command to run after --"),
        (["serve", "--public-read", "--private-read"], "--public-read and --private-read say"),
    ):
        result = scalewatch(*argv)
        assert result.exit_code == 2, (argv, result.output)
        assert message in result.stderr, (argv, result.stderr)
        assert result.stdout == "", argv


def test_db_comes_from_the_option_or_scalewatch_db(
    store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_run(store, simulate(3, set()), name="from-the-environment")
    monkeypatch.setenv("SCALEWATCH_DB", db_url)
    result = scalewatch("runs")
    assert result.exit_code == 0 and "from-the-environment" in result.stdout
    monkeypatch.setenv("SCALEWATCH_DB", "/no/such/dir/x.db")
    assert scalewatch("runs", "--db", db_url).exit_code == 0  # the option wins
    result = scalewatch("runs")
    assert result.exit_code == 1
    assert result.stderr.startswith("scalewatch runs: no store at /no/such/dir/x.db")
    assert result.stderr.count("\n") == 1
    groups = [["db", "upgrade"], ["tokens", "create"], ["tokens", "list"], ["tokens", "revoke"]]
    # spool: a node's folder, not a store
    plain = [[name] for name in cli.commands if name not in ("db", "tokens", "spool")]
    for command in plain + groups:
        shown = " ".join(scalewatch(*command, "--help").stdout.split())
        assert "--db URL store URL, or the path of its SQLite file" in shown, command
        assert "[env var: SCALEWATCH_DB]" in shown, command


def test_runs_prints_a_table(store: Store, db_url: str) -> None:
    run = add_run(store, simulate(100, {10}), name="bert")

    result = scalewatch("runs", "--db", db_url)

    assert result.exit_code == 0
    header, row = result.stdout.splitlines()
    assert header.split() == ["ID", "NAME", "STATUS", "WORLD", "STEPS", "SCALE", "OVERFLOWS",
                              "SKIPPED"]  # fmt: skip
    assert row.split()[:5] == [str(run), "bert", "running", "2", "100"]
    assert row.split()[-2:] == ["1", "1.00%"]


def test_export_writes_the_same_csv_as_the_api(store: Store, db_url: str, tmp_path: Path) -> None:
    run = add_run(store, ROWS)
    out = tmp_path / "steps.csv"

    result = scalewatch("export", str(run), "--what", "steps", "--format", "csv", "-o", str(out),
                        "--db", db_url)  # fmt: skip
    assert result.exit_code == 0 and result.stdout == ""
    assert out.read_text() == GOLDEN_CSV

    result = scalewatch("export", str(run), "--what", "overflows", "--format", "jsonl", "--db",
                        db_url)  # fmt: skip
    assert result.exit_code == 0
    assert [json.loads(line)["step"] for line in result.stdout.splitlines()] == [2]
    result = scalewatch("export", "99", "--db", db_url)
    assert (result.exit_code, result.stderr) == (1, "scalewatch export: no run 99\n")


def test_an_interrupted_export_leaves_the_file_it_would_replace(
    store: Store, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = add_run(store, ROWS)
    out = tmp_path / "steps.csv"
    out.write_text("last week's export\n")
    out.chmod(0o640)

    def interrupted(*args: object, **kwargs: object) -> Iterator[str]:
        yield "step,scale\n"
        raise KeyboardInterrupt

    monkeypatch.setattr(exports, "export_chunks", interrupted)
    try:
        result = scalewatch("export", str(run), "-o", str(out), "--db", db_url)
    except KeyboardInterrupt:
        pytest.fail("a Ctrl-C left the command as a traceback")
    assert result.exit_code == 130
    assert result.stderr.strip() == "scalewatch export: interrupted"
    assert out.read_text() == "last week's export\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []
    monkeypatch.undo()

    # A finished export replaces it and keeps its mode; a new file gets the umask's.
    assert scalewatch("export", str(run), "-o", str(out), "--db", db_url).exit_code == 0
    assert out.read_text() == GOLDEN_CSV and out.stat().st_mode & 0o777 == 0o640
    fresh = tmp_path / "fresh.csv"
    assert scalewatch("export", str(run), "-o", str(fresh), "--db", db_url).exit_code == 0
    umask = os.umask(0)
    os.umask(umask)
    assert fresh.stat().st_mode & 0o777 == 0o666 & ~umask
    assert scalewatch("export", str(run), "-o", os.devnull, "--db", db_url).exit_code == 0


def test_an_export_to_a_file_shows_its_rows_on_a_terminal(
    store: Store, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through main(): click's runner gives the command a standard error of its own, never
    a terminal."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    run = add_run(store, ROWS)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(export_command, "PROGRESS_S", 0.0)
    assert main(["export", str(run), "-o", str(tmp_path / "s.csv"), "--db", db_url]) == 0
    rows = GOLDEN_CSV.count("\n") - 1
    shown = terminal.getvalue()
    assert shown.endswith(f"\rscalewatch export: {rows:,} rows written\n")
    assert f"\rscalewatch export: {rows:,} rows\r" in shown

    quiet = io.StringIO()  # no terminal: nothing said on success
    monkeypatch.setattr(sys, "stderr", quiet)
    assert main(["export", str(run), "-o", str(tmp_path / "t.csv"), "--db", db_url]) == 0
    assert quiet.getvalue() == ""


def test_control_files_the_request_as_the_cli_user(store: Store, db_url: str) -> None:
    run = add_run(store, simulate(10, set()))

    result = scalewatch("control", str(run), "--growth-interval", "500", "--growth-factor", "1.5",
                        "--no-wait", "--db", db_url)  # fmt: skip

    assert result.exit_code == 0
    (row,) = control_history(store, run)
    assert row.status == "pending"
    assert row.source == "cli"
    assert row.values == {"growth_interval": 500, "growth_factor": 1.5}


def test_control_refusals_exit_2_with_the_messages(store: Store, db_url: str) -> None:
    run = add_run(store, simulate(10, set()))

    result = scalewatch("control", str(run), "--backoff-factor", "2", "--db", db_url)

    assert result.exit_code == 2
    assert "backoff_factor" in result.stderr
    assert result.stderr.startswith("scalewatch control: backoff_factor must be")  # named once
    assert result.stdout == ""
    result = scalewatch("control", str(run), "--min-scale", "8", "--max-scale", "4", "--db", db_url)
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "scalewatch control: min_scale must be <= max_scale (4.0)",
        "scalewatch control: max_scale must be >= min_scale (8.0)",
    ]
    end_run(store, run)
    result = scalewatch("control", str(run), "--scale", "2", "--db", db_url)
    assert result.exit_code == 1
    assert "finished" in result.stderr


def test_db_upgrade_creates_a_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"

    result = scalewatch("db", "upgrade", "--db", url)

    assert result.exit_code == 0
    assert "at revision" in result.stdout
    assert (tmp_path / "new.db").exists()


def test_a_plain_path_names_a_sqlite_store(store: Store, db_url: str) -> None:
    add_run(store, simulate(3, set()), name="by-path")
    result = scalewatch("runs", "--db", db_url.removeprefix("sqlite:///"))
    assert result.exit_code == 0
    assert "by-path" in result.stdout


def test_errors_a_user_can_fix_are_one_line(
    store: Store, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = add_run(store, simulate(3, set()))
    missing = tmp_path / "mistyped.db"
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_text("not a database")
    cases = [
        (["runs", "--db", str(missing)], f"scalewatch runs: no store at {missing}"),
        (["export", str(run), "--db", str(missing)], "scalewatch export: no store at"),
        (["control", str(run), "--scale", "2", "--db", str(missing)], "no store at"),
        (["runs", "--db", str(corrupt)], f"scalewatch runs: {corrupt} is not a scalewatch store"),
        (
            ["export", str(run), "-o", str(tmp_path / "no" / "dir.csv"), "--db", db_url],
            f"scalewatch export: cannot write {tmp_path / 'no' / 'dir.csv'}: the directory"
            f" {tmp_path / 'no'} does not exist",
        ),
        (["db", "upgrade", "--db", str(tmp_path / "no" / "x.db")], "does not exist"),
        (["serve", "--db", str(corrupt)], f"scalewatch serve: {corrupt} is not a scalewatch store"),
        (["serve", "--port", "70000", "--db", db_url], "serve: --port: Input should be less"),
    ]
    other_database = "mysql://user:secret@127.0.0.1:1/x"
    no_server = "postgresql+psycopg://user:secret@127.0.0.1:1/x"
    for command in (["runs"], ["export", str(run)], ["db", "upgrade"], ["serve"]):
        cases.append(
            (
                [*command, "--db", other_database],
                f"scalewatch {command[0]}: a scalewatch store is a SQLite or PostgreSQL"
                " database; got 'mysql://user:***@127.0.0.1:1/x'",
            )
        )
        cases.append(
            (
                [*command, "--db", no_server],
                f"scalewatch {command[0]}: the store cannot be read: connection failed:",
            )
        )
    cases.append(
        (
            ["runs", "--db", "postgresql+psycopg2://user:secret@127.0.0.1:1/x"],
            "scalewatch runs: a PostgreSQL store is opened through psycopg 3",
        )
    )
    for argv, message in cases:
        result = scalewatch(*argv)
        assert result.exit_code == 1, argv
        err = result.stderr
        assert message in err and "Traceback" not in err and err.count("\n") == 1, err
        assert "secret" not in err
    assert not missing.exists()  # a mistyped path is not made into a new, empty store
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE users (name TEXT)")
    conn.close()
    result = scalewatch("runs", "--db", str(other))
    assert result.exit_code == 1
    assert "is a SQLite database, but not a scalewatch store" in result.stderr
    with sqlite3.connect(other) as conn:  # left as it was
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master")]
    conn.close()
    assert tables == ["users"]
    monkeypatch.setenv("SCALEWATCH_PORT", "70000")
    result = scalewatch("serve", "--db", db_url)
    assert result.exit_code == 1
    assert "scalewatch serve: $SCALEWATCH_PORT: Input should be less than or equal to 65535" in (
        result.stderr
    )


def test_export_takes_a_step_range_as_the_api_does(
    client: TestClient, store: Store, db_url: str
) -> None:
    run = add_run(store, simulate(20, {4, 9, 15}))
    for query, argv in (
        ("start=5&end=12", ["--start", "5", "--end", "12"]),
        ("start=10", ["--start", "10"]),
        ("what=overflows&format=jsonl&end=9", ["--what", "overflows", "--format", "jsonl",
                                                "--end", "9"]),
    ):  # fmt: skip
        result = scalewatch("export", str(run), *argv, "--db", db_url)
        assert result.exit_code == 0
        expected = client.get(f"/api/runs/{run}/export?{query}").text
        assert result.stdout == expected, query
    result = scalewatch("export", str(run), "--start", "9", "--end", "3", "--db", db_url)
    assert result.exit_code == 2
    assert "--start 9 is after --end 3" in result.stderr


def test_runs_shows_an_odd_run_name_on_one_line(store: Store, db_url: str) -> None:
    add_run(store, simulate(2, set()), name="two\nlines\tand a tab")
    result = scalewatch("runs", "--db", db_url)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and "two\\nlines\\tand a tab" in lines[1]


def test_a_store_path_is_taken_as_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Characters a URL reads otherwise (``?``, ``%41``) stay in the file name; ``~`` is home."""
    odd = tmp_path / "a?b %41#.db"
    assert scalewatch("db", "upgrade", "--db", str(odd)).exit_code == 0
    assert odd.exists() and [p.name for p in tmp_path.iterdir()] == [odd.name]
    monkeypatch.setenv("HOME", str(tmp_path))
    assert scalewatch("db", "upgrade", "--db", "~/home.db").exit_code == 0
    assert (tmp_path / "home.db").exists()


def test_demo_refuses_an_unguarded_address_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SCALEWATCH_TOKEN", raising=False)
    monkeypatch.setenv("SCALEWATCH_HOST", "0.0.0.0")
    result = scalewatch("demo", "--db", str(tmp_path / "x.db"))
    assert result.exit_code == 2
    err = result.stderr
    assert err.startswith("scalewatch demo: refusing to bind '0.0.0.0'") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "query", "refused"),
    [
        (["--end", "99999999999999999999999"], "end=99999999999999999999999",
         "--end 99999999999999999999999: Input should be less than or equal to"),
        (["--start", "9223372036854775808", "--what", "overflows"],
         "start=9223372036854775808&what=overflows",
         "--start 9223372036854775808: Input should be less than or equal to"),
        (["--start", "-1"], "start=-1", "--start -1: Input should be greater than or equal to 0"),
    ],
    ids=["end-past-int64", "start-past-int64", "negative"],
)  # fmt: skip
def test_export_refuses_the_steps_the_api_refuses_before_any_output(
    client: TestClient,
    store: Store,
    db_url: str,
    argv: list[str],
    query: str,
    refused: str,
) -> None:
    """A step past the store's 64-bit integers printed the CSV header, then an
    OverflowError traceback (or, for overflows, the header alone and exit 0)."""
    run = add_run(store, simulate(20, {4, 9, 15}))
    assert client.get(f"/api/runs/{run}/export?{query}").status_code == 422
    result = scalewatch("export", str(run), *argv, "--db", db_url)
    assert result.exit_code == 2
    out, err = result.stdout, result.stderr
    assert out == ""
    assert err.startswith(f"scalewatch export: {refused}") and err.count("\n") == 1, err


def test_db_upgrade_refuses_another_programs_database_and_an_empty_file_is_no_store(
    tmp_path: Path,
) -> None:
    """``db upgrade`` added a store's tables to another program's SQLite file; ``runs`` took
    a 0-byte file for an empty store (and made it one)."""
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE users (name TEXT)")
    conn.close()
    result = scalewatch("db", "upgrade", "--db", str(other))
    assert result.exit_code == 1
    assert result.stderr == (
        f"scalewatch db: {other} is a SQLite database, but not a scalewatch store\n"
    )
    with sqlite3.connect(other) as conn:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master")]
    conn.close()
    assert tables == ["users"]
    empty = tmp_path / "empty.db"
    empty.touch()
    for argv in (["runs"], ["export", "1"], ["control", "1", "--scale", "2"]):
        result = scalewatch(*argv, "--db", str(empty))
        assert result.exit_code == 1
        err = result.stderr
        assert f": {empty} is an empty file (training creates a store;" in err, err
        assert err.count("\n") == 1
    assert empty.stat().st_size == 0


def test_the_commands_import_the_shared_module_alone_and_nothing_imports_the_cli() -> None:
    """No import cycle: app/cli/__init__.py gathers the commands; a command module imports
    only the package's private helpers (scalewatch.app.cli._common, _serving, _demo, _store_files),
    never another command, and no module outside the package imports it (the demo's
    machinery in app/cli/_demo.py is the command's, not the other way round)."""
    root = ROOT

    for path in (root / "app" / "cli").glob("*.py"):
        inside = {name for name in imported(path) if name.startswith("scalewatch.app.cli")}
        if path.name == "__init__.py":
            assert inside == {
                "scalewatch.app.cli",
                *(f"scalewatch.app.cli.{name}" for name in cli.commands),
            }
        else:
            modules = inside - {"scalewatch.app.cli"}  # ``from . import _demo`` names both
            helpers = [m for m in modules if m.split(".")[3].startswith("_")]
            assert set(helpers) == modules, path  # no command imports another
    users = [
        path.relative_to(root).as_posix()
        for path in [*(root / "app").rglob("*.py"), *(root / "scaler").rglob("*.py")]
        if "cli" not in path.relative_to(root).parts
        and any(name.startswith("scalewatch.app.cli") for name in imported(path))
    ]
    assert users == ["app/__main__.py"]
