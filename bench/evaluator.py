"""The alert evaluator's CPU per step fed, in process: a SQLite store with ``--runs``
running runs (8 ranks each, as the fleet's), the default rules, and ticks that each feed
``--steps`` new steps of every run (an overflow on one rank every ``--overflow-every``
steps, the scale halved, as the fleet's trainers write). Only ``Evaluator.tick`` is timed,
by the CPU of its thread (``time.thread_time``): the store's read and the watches.

    python bench/evaluator.py [--base DIR] [--rounds 7] [--runs 50] [--steps 200]

Each measurement is a process of its own. With ``--base DIR`` (a folder holding another
checkout's ``scalewatch`` package) the rounds alternate between it and this checkout,
so both see the same machine load; the medians and spreads of both are printed, with
``uptime`` before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # tests._helpers; scalewatch stays the one on the path before


def measure(runs: int, steps: int, ticks: int, overflow_every: int) -> dict[str, Any]:
    """Microseconds of tick CPU per step fed, over ``ticks`` ticks after a warm one."""
    from scalewatch.app.alerts.config import default_rules
    from scalewatch.app.alerts.evaluate import Evaluator
    from scalewatch.store.engine import open_store
    from scalewatch.store.runs import create_run, write_steps
    from tests._helpers.records import step_record

    def records(first: int) -> list[Any]:
        return [
            step_record(
                step,
                wall_time=1_700_000_000.0 + step * 0.005,
                scale=65536.0,
                overflow=step % overflow_every == 0,
                inf_ranks=(step % 8,) if step % overflow_every == 0 else (),
                scale_after=32768.0 if step % overflow_every == 0 else 65536.0,
                growth_tracker=step % 2000,
            )
            for step in range(first, first + steps)
        ]

    with tempfile.TemporaryDirectory() as tmp, open_store(f"sqlite:///{tmp}/b.db") as store:
        ids = [
            create_run(store, name=f"r{i}", world_size=8, config={}, control={}).id
            for i in range(runs)
        ]
        evaluator = Evaluator(store, default_rules(), clock=lambda: 1_700_000_000.0)
        fired, cpu, first = 0, [], 1
        for tick in range(ticks + 1):
            for run in ids:
                write_steps(store, run, records(first))
            first += steps
            began = time.thread_time()
            fired += len(evaluator.tick())
            if tick:  # the first tick reads a new watch's history
                cpu.append(time.thread_time() - began)
    return {"us_per_step": 1e6 * sum(cpu) / (ticks * runs * steps), "changes": fired}


def _one(base: str | None, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ)
    if base:
        env["PYTHONPATH"] = base
    command = [sys.executable, __file__, "--measure", *_options(args)]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout.splitlines()[-1]))


def _options(args: argparse.Namespace) -> list[str]:
    return [
        f"--runs={args.runs}",
        f"--steps={args.steps}",
        f"--ticks={args.ticks}",
        f"--overflow-every={args.overflow_every}",
    ]


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--steps", type=int, default=200, help="new steps per run and tick")
    parser.add_argument("--ticks", type=int, default=10, help="timed ticks per measurement")
    parser.add_argument("--overflow-every", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--base", help="a folder with another checkout's scalewatch package")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.runs, args.steps, args.ticks, args.overflow_every)))
        return
    print("before:", _uptime())
    sides = {"base": args.base, "head": None} if args.base else {"head": None}
    figures: dict[str, list[float]] = {name: [] for name in sides}
    changes: dict[str, set[int]] = {name: set() for name in sides}
    for round_ in range(args.rounds):
        order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
        for name in order:
            result = _one(sides[name], args)
            figures[name].append(result["us_per_step"])
            changes[name].add(result["changes"])
            print(f"round {round_ + 1} {name}: {result['us_per_step']:.2f} us/step", flush=True)
    print("after: ", _uptime())
    for name, values in figures.items():
        print(
            f"{name}: median {statistics.median(values):.2f} us/step,"
            f" min {min(values):.2f} max {max(values):.2f} over {len(values)} rounds;"
            f" alert changes per measurement {sorted(changes[name])}"
        )
    if args.base:
        ratio = statistics.median(figures["head"]) / statistics.median(figures["base"])
        print(f"head/base medians: {ratio:.2f}")


if __name__ == "__main__":
    main()
