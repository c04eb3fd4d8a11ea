"""``scalewatch alerts``: the alerts in the store, newest first, as a table or JSON Lines."""

from __future__ import annotations

import argparse
import json
import sys
import time

from app.cli import _db_argument, _existing_store, _print_table, command

__all__ = ["alerts"]


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", type=int, help="only this run's (its id)")
    parser.add_argument("--firing", action="store_true", help="only those firing now")
    parser.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    parser.add_argument("--jsonl", action="store_true", help="one JSON object a line")
    _db_argument(parser)


def _when(at: float | None) -> str:
    return "-" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


@command("alerts", "list the alerts the service's rules raised, newest first", _arguments)
def alerts(args: argparse.Namespace) -> int:
    from scaler.store.alerts import alert_page
    from scaler.store.engine import open_store
    from scaler.store.queries import run_status
    from scaler.store.states import AlertState

    if args.limit < 1:
        print("scalewatch alerts: --limit must be 1 or more", file=sys.stderr)
        return 2
    with open_store(_existing_store(args), check=True) as store:
        if args.run is not None and run_status(store, args.run) is None:
            print(f"scalewatch alerts: no run {args.run}", file=sys.stderr)
            return 1
        state = AlertState.FIRING if args.firing else None
        rows, _ = alert_page(store, run_id=args.run, state=state, limit=args.limit)
    if args.jsonl:
        for row in rows:
            print(json.dumps(row.to_dict()))
        return 0
    table = [["ID", "RUN", "RULE", "STATE", "STEP", "FIRED", "RESOLVED", "VALUE", "THRESHOLD"]]
    for row in rows:
        resolved = "" if row.resolved_step is None else str(row.resolved_step)
        table.append(
            [
                str(row.id),
                f"#{row.run_id} {row.run_name}",
                row.rule if not row.detail else f"{row.rule} ({row.detail})",
                row.state,
                f"{row.fired_step}-{resolved}",
                _when(row.fired_at),
                _when(row.resolved_at),
                f"{row.value:.4g}",
                f"{row.threshold:.4g}",
            ]
        )
    _print_table(table, sys.stdout)
    return 0
