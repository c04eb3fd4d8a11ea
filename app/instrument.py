"""``scalewatch instrument -- COMMAND``: run COMMAND with scalewatch's scalers in place of
torch's, in every Python process it starts (see :mod:`scaler.instrument`)."""

from __future__ import annotations

import argparse
import os
import sys

from app.cli import _db_argument, command

USAGE = "give the command to run after --, as: scalewatch instrument -- torchrun ... train.py"


def _arguments(parser: argparse.ArgumentParser) -> None:
    _db_argument(parser)
    parser.add_argument("--run-name", help="the run's name (default: $SCALEWATCH_RUN_NAME)")
    parser.add_argument("command_line", nargs=argparse.REMAINDER, help="the command, after --")


@command("instrument", "run a command with scalewatch's scalers in place of torch's", _arguments)
def instrument(args: argparse.Namespace) -> int:
    argv = list(args.command_line)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(f"scalewatch instrument: {USAGE}", file=sys.stderr)
        return 2
    from scaler.instrument import site_dir

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(site_dir()), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
    )
    if args.db:
        env["SCALEWATCH_DB"] = args.db
    if args.run_name:
        env["SCALEWATCH_RUN_NAME"] = args.run_name
    sys.stdout.flush()
    try:  # COMMAND takes this process's place: its exit status and signals are its own
        os.execvpe(argv[0], argv, env)
    except OSError as error:
        print(f"scalewatch instrument: cannot run {argv[0]}: {error.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached
