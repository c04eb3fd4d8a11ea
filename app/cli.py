"""The ``scalewatch`` command line: ``serve``, ``runs``, ``export``, ``control``, ``alerts``,
``db upgrade``.

Each subcommand is one function registered with :func:`command`; a new one is added by
decorating a function in this module (or in a module imported from :func:`main`).
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from pydantic import ValidationError

from app.settings import Settings
from scaler.store.rules import FIELDS, INT_FIELDS

__all__ = ["COMMANDS", "Command", "command", "main"]

PROGRESS_S = 0.5  # how often a long export to a file shows its rows on a terminal

Arguments = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    arguments: Arguments
    run: Run


COMMANDS: dict[str, Command] = {}


def _db_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        help="store URL, or the path of its SQLite file"
        " (default: $SCALEWATCH_DB or sqlite:///scalewatch.db)",
    )


def command(name: str, help: str, arguments: Arguments = _db_argument) -> Callable[[Run], Run]:
    """Register ``run(args) -> exit code`` as the subcommand ``name``."""

    def register(run: Run) -> Run:
        COMMANDS[name] = Command(name, help, arguments, run)
        return run

    return register


def _settings(args: argparse.Namespace, **overrides: object) -> Settings:
    values = {key: value for key, value in overrides.items() if value is not None}
    if getattr(args, "db", None):
        values["db"] = args.db
    try:
        return Settings(**values)  # type: ignore[arg-type]
    except ValidationError as error:
        raise BadSetting(_refused(error, given=set(values))) from None


class BadSetting(ValueError):
    """A setting from the command line or the environment that the service refuses."""


def _refused(error: ValidationError, given: set[str]) -> str:
    """Each refused setting, named as the user gave it: an option, or ``$SCALEWATCH_*``."""
    problems = []
    for detail in error.errors():
        name = ".".join(map(str, detail["loc"])) or "settings"
        variable = f"SCALEWATCH_{name.upper()}"
        if name in given:
            name = f"--{name}"
        elif variable in os.environ:
            name = f"${variable}"
        problems.append(f"{name}: {detail['msg']}")
    return "; ".join(problems)


def _existing_store(args: argparse.Namespace) -> str:
    from app.store_files import existing_store

    return existing_store(_settings(args).db)


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    _db_argument(parser)
    parser.add_argument("--host", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default 8765)")
    parser.add_argument(
        "--alerts",
        help="alert rules and webhooks, a TOML file (default: $SCALEWATCH_ALERTS, else the"
        " default rules and no webhooks)",
    )


@command(
    "serve",
    "run the service and the dashboard. Control requests need the bearer token from"
    " $SCALEWATCH_TOKEN; without it a new token is generated, printed once and written to"
    " ~/.scalewatch/token-PORT (mode 0600; $SCALEWATCH_TOKEN_FILE to move it). Binding an"
    " address other than loopback requires a $SCALEWATCH_TOKEN of 16 characters or more.",
    _serve_arguments,
)
def serve(args: argparse.Namespace) -> int:
    from app.alerts.rules import RulesFileError, load_rules
    from app.main import create_app
    from app.serving import CannotServe, make_server, ready_to_serve

    settings = _settings(args, host=args.host, port=args.port, alerts=args.alerts)
    try:
        rules = load_rules(settings.alerts) if settings.alerts is not None else None
    except RulesFileError as refused:  # before anything else: nothing bound, no token
        print(f"scalewatch serve: alert rules: {refused}", file=sys.stderr)
        return 2
    try:
        settings, sock = ready_to_serve(settings, out=sys.stdout)
    except CannotServe as refused:
        print(f"scalewatch serve: {refused}", file=sys.stderr)
        return refused.code
    with sock:
        server = make_server(create_app(settings, rules), settings, sock)
        host, port = sock.getsockname()[:2]
        url = f"http://{f'[{host}]' if ':' in host else host}:{port}/"
        print(f"scalewatch: serving {url} (Ctrl-C to stop)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):  # uvicorn hands Ctrl-C back once stopped
            server.run(sockets=[sock])
    return 0 if server.started else 3


def _print_table(rows: list[list[str]], out: TextIO) -> None:
    # A character that is not printable (a newline in a run's name) is shown escaped.
    rows = [["".join(c if c.isprintable() else repr(c)[1:-1] for c in cell) for cell in row]
            for row in rows]  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(),
            file=out,
        )


@command("runs", "list the runs in the store")
def runs(args: argparse.Namespace) -> int:
    from scaler.store import queries
    from scaler.store.engine import open_store

    with open_store(_existing_store(args), check=True) as store:
        infos = queries.list_runs(store)
    table = [["ID", "NAME", "STATUS", "WORLD", "STEPS", "SCALE", "OVERFLOWS", "SKIPPED"]]
    for run in infos:
        scale = "-" if run.scale is None else f"{run.scale:g}"
        table.append(
            [
                str(run.id),
                run.name,
                run.status,
                str(run.world_size),
                str(run.steps),
                scale,
                str(run.overflows),
                f"{run.skipped_rate:.2%}",
            ]
        )
    _print_table(table, sys.stdout)
    return 0


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=int, help="run id")
    parser.add_argument(
        "--what",
        choices=["steps", "overflows"],
        default="steps",
        help="every step, or only the steps that overflowed (default steps)",
    )
    parser.add_argument("--format", choices=["csv", "jsonl"], default="csv", help="(default csv)")
    parser.add_argument("--start", type=int, help="first step (default: the first)")
    parser.add_argument("--end", type=int, help="last step (default: the last)")
    parser.add_argument("-o", "--output", help="file to write (default: standard output)")
    _db_argument(parser)


def _step_range_refused(start: int | None, end: int | None) -> str | None:
    """Why ``start`` and ``end`` are refused, as one line; None if they are taken. The
    bounds are the API's own (:data:`app.models.Step`), which it refuses with 422; a
    start after the end, which the API answers with an empty range, is a usage mistake."""
    from pydantic import TypeAdapter

    from app.models import Step

    step = TypeAdapter(Step)
    for name, value in (("--start", start), ("--end", end)):
        try:
            if value is not None:
                step.validate_python(value)
        except ValidationError as error:
            return f"{name} {value}: {error.errors()[0]['msg']}"
    if start is not None and end is not None and start > end:
        return f"--start {start} is after --end {end}"
    return None


@command("export", "export a run's steps or overflows as CSV or JSON Lines", _export_arguments)
def export(args: argparse.Namespace) -> int:
    from app.exports import export_chunks
    from scaler.store.engine import open_store
    from scaler.store.queries import run_status

    refused = _step_range_refused(args.start, args.end)
    if refused is not None:  # before a byte of output
        print(f"scalewatch export: {refused}", file=sys.stderr)
        return 2
    with open_store(_existing_store(args), check=True) as store:
        if run_status(store, args.run) is None:
            print(f"scalewatch export: no run {args.run}", file=sys.stderr)
            return 1
        chunks = export_chunks(
            store, args.run, what=args.what, fmt=args.format, start=args.start, end=args.end
        )
        if args.output is None:
            sys.stdout.writelines(chunks)
        else:
            if sys.stderr.isatty():
                chunks = _counted(chunks, header=args.format == "csv", out=sys.stderr)
            _write_whole(Path(args.output), chunks)
    return 0


def _counted(chunks: Iterable[str], *, header: bool, out: TextIO) -> Iterator[str]:
    """``chunks`` as they come, the rows so far shown on ``out`` (a terminal) as they grow."""
    rows = -1 if header else 0  # a CSV's first line names the columns
    shown = time.monotonic()
    for chunk in chunks:
        rows += chunk.count("\n")
        if time.monotonic() - shown >= PROGRESS_S:
            print(f"\rscalewatch export: {rows:,} rows", end="", file=out, flush=True)
            shown = time.monotonic()
        yield chunk
    print(f"\rscalewatch export: {max(rows, 0):,} rows written", file=out, flush=True)


def _write_whole(path: Path, chunks: Iterable[str]) -> None:
    """Write ``chunks`` to ``path`` through a file beside it, renamed over it at the end: an
    export that fails or is interrupted leaves ``path`` as it was, and no part file.

    A path that is no regular file (``/dev/stdout``, a pipe) is written to as it is.
    """
    if path.exists() and not path.is_file():
        with open(path, "w", encoding="utf-8", newline="") as out:
            out.writelines(chunks)
        return
    if not path.parent.is_dir():
        raise FileNotFoundError(f"cannot write {path}: the directory {path.parent} does not exist")
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask()
    handle, part = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with open(handle, "w", encoding="utf-8", newline="") as out:
            out.writelines(chunks)
        os.chmod(part, mode)  # as a file opened for writing would have it, not mkstemp's 0600
        os.replace(part, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


CONTROL_OPTIONS: dict[str, type] = {name: int if name in INT_FIELDS else float for name in FIELDS}


CONTROL_HELP = {
    "growth_interval": "clean steps between two growths (an integer >= 1)",
    "growth_factor": "what a growth multiplies the scale by (> 1)",
    "backoff_factor": "what an overflow multiplies the scale by (between 0 and 1)",
    "scale": "set the scale now",
    "min_scale": "the lowest the scale may go (once set, it can be moved, not removed)",
    "max_scale": "the highest the scale may go (once set, it can be moved, not removed)",
    "hysteresis": "overflows since the last growth before a backoff (an integer >= 1; once"
    " set it cannot be removed, and 1 backs off at every overflow, as without it)",
}


def _control_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=int, help="run id")
    for name, kind in CONTROL_OPTIONS.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}", dest=name, type=kind, help=CONTROL_HELP[name]
        )
    _db_argument(parser)


@command("control", "request a change to a running job's scaler", _control_arguments)
def control(args: argparse.Namespace) -> int:
    from scaler.store.control import request_control
    from scaler.store.engine import open_store
    from scaler.store.errors import ControlValidationError, RunNotFound, RunNotRunning
    from scaler.store.states import RequestSource

    values = {name: getattr(args, name) for name in CONTROL_OPTIONS}
    values = {name: value for name, value in values.items() if value is not None}
    with open_store(_existing_store(args), check=True) as store:
        try:
            row = request_control(
                store, args.run, values, requested_by=getpass.getuser(), source=RequestSource.CLI
            )
        except ControlValidationError as refused:
            for name, message in refused.errors.items():
                print(f"scalewatch control: {name}: {message}", file=sys.stderr)
            return 2
        except (RunNotFound, RunNotRunning) as refused:
            print(f"scalewatch control: {refused}", file=sys.stderr)
            return 1
    print(json.dumps(row.to_dict(), indent=2))
    return 0


def _db_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["upgrade"], help="upgrade: migrate to the head")
    _db_argument(parser)


@command("db", "manage the store's schema", _db_arguments)
def db(args: argparse.Namespace) -> int:
    from app.store_files import refuse_foreign
    from scaler.store.engine import shown_url, upgrade

    url = _settings(args).db
    refuse_foreign(url)  # upgrading would add a store's tables to another program's data
    print(f"{shown_url(url)}: at revision {upgrade(url)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scalewatch",
        description="Loss-scale telemetry of fp16 training: serve the dashboard, list and"
        " export runs, change a running job's scaler.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for spec in COMMANDS.values():
        spec.arguments(commands.add_parser(spec.name, help=spec.help, description=spec.help))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import app.alerts.cli
    import app.demo
    import app.instrument  # noqa: F401  (registers ``instrument``)

    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command].run(args)
    except KeyboardInterrupt:
        print(f"\nscalewatch {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader left (``scalewatch runs | head -1``): stop quietly, as other tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except Exception as error:
        message = _user_error(error)
        if message is None:
            raise
        print(f"scalewatch {args.command}: {message}", file=sys.stderr)
        return 1


def _user_error(error: Exception) -> str | None:
    """One line for an error a user can fix (a path, a store, a setting); None for a bug."""
    from alembic.util.exc import CommandError
    from sqlalchemy.exc import ArgumentError, DBAPIError

    from app.alerts.rules import RulesFileError
    from scaler.store.errors import NotAStoreURL, StoreDamaged

    if isinstance(error, RulesFileError):  # $SCALEWATCH_ALERTS, read where the app is built
        return f"alert rules: {error}"
    if isinstance(error, ValidationError):
        return _refused(error, given=set())
    if isinstance(error, BadSetting | NotAStoreURL | StoreDamaged):
        return str(error)
    if isinstance(error, DBAPIError):
        # The driver's first line says what failed; libpq adds hints on lines of their own.
        reason = str(error.orig).strip().splitlines()
        return f"the store cannot be read: {reason[0] if reason else type(error.orig).__name__}"
    if isinstance(error, CommandError):
        return f"the store's schema: {error} (was it written by a newer scalewatch?)"
    if isinstance(error, ArgumentError | OSError):
        return str(error)
    return None
