"""A stand-in training process for the browser tests and screenshots.

It creates a running run, writes one step record at a time into the store (the scale
follows torch's rules: back off on overflow, grow after ``growth_interval`` clean steps)
and applies pending control requests at the next step, as the reporting rank would. It
prints ``{"run_id": N}`` once the run exists and ends the run as finished on SIGTERM.

    python tests/web/_feeder.py --db sqlite:///x.db --name demo --rate 20 --ranks 1,3
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from scaler.store import control, runs
from scaler.store.engine import Store, open_store
from scaler.store.records import StepRecord


@dataclass
class Scaler:
    """Enough of the scaler's update rule to draw believable curves."""

    scale: float = 2.0**16
    tracker: int = 0
    version: int = 0
    control: dict[str, Any] = field(
        default_factory=lambda: {
            "growth_interval": 100,
            "growth_factor": 2.0,
            "backoff_factor": 0.5,
            "min_scale": None,
            "max_scale": None,
            "hysteresis": None,
        }
    )

    def apply(self, values: dict[str, Any]) -> dict[str, Any]:
        for key, value in values.items():
            if key == "scale":
                self.scale = float(value)
            else:
                self.control[key] = value
        self.version += 1
        return {**self.control, "scale": self.scale}

    def update(self, step: int, inf_ranks: tuple[int, ...]) -> StepRecord:
        used = self.scale
        overflow = bool(inf_ranks)
        if overflow:
            self.scale *= self.control["backoff_factor"]
            self.tracker = 0
        else:
            self.tracker += 1
            if self.tracker >= self.control["growth_interval"]:
                self.scale *= self.control["growth_factor"]
                self.tracker = 0
        low, high = self.control["min_scale"], self.control["max_scale"]
        if low is not None:
            self.scale = max(self.scale, low)
        if high is not None:
            self.scale = min(self.scale, high)
        return StepRecord(
            step=step,
            wall_time=time.time(),
            scale=used,
            overflow=overflow,
            skipped=overflow,
            inf_ranks=inf_ranks,
            scale_after=self.scale,
            growth_tracker=self.tracker,
            growth_interval=self.control["growth_interval"],
            growth_factor=self.control["growth_factor"],
            backoff_factor=self.control["backoff_factor"],
            control_version=self.version,
        )


def inf_ranks_at(
    step: int, every: int, ranks: tuple[int, ...], scale: float = 0.0, ceiling: float = 0.0
) -> tuple[int, ...]:
    """Overflow on every ``every``-th step, and on any step whose scale reaches ``ceiling``
    (when set), alternately on the first given rank and on all of them."""
    periodic = every > 0 and step % every == 0
    if not periodic and not (ceiling > 0 and scale >= ceiling):
        return ()
    return ranks if step % 2 == 0 else ranks[:1]


def apply_pending(store: Store, run_id: int, scaler: Scaler, step: int) -> None:
    for request in control.pending_requests(store, run_id):
        state = scaler.apply(dict(request.values))
        control.mark_applied(
            store, request.id, step=step, at=time.time(), state=state, version=scaler.version
        )


def feed(
    store: Store, run_id: int, scaler: Scaler, args: argparse.Namespace, stop: threading.Event
) -> None:
    ranks = tuple(int(rank) for rank in args.ranks.split(",") if rank)

    def record(step: int) -> StepRecord:
        inf_ranks = inf_ranks_at(step, args.overflow_every, ranks, scaler.scale, args.ceiling)
        return scaler.update(step, inf_ranks)

    # write_steps also refreshes the run's heartbeat.
    runs.write_steps(store, run_id, [record(step) for step in range(1, args.history + 1)])
    step = args.history
    started = time.monotonic()
    while not stop.wait(max(0.0, started + (step - args.history) / args.rate - time.monotonic())):
        step += 1
        apply_pending(store, run_id, scaler, step)
        runs.write_steps(store, run_id, [record(step)])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--name", default="demo run")
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--rate", type=float, default=20.0, help="steps per second")
    parser.add_argument("--history", type=int, default=300, help="steps written at start")
    parser.add_argument("--overflow-every", type=int, default=40)
    parser.add_argument("--ranks", default="1,3", help="ranks that overflow")
    parser.add_argument("--ceiling", type=float, default=0.0, help="scale that overflows; 0: off")
    args = parser.parse_args(argv)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with open_store(args.db) as store:
        scaler = Scaler()
        ref = runs.create_run(
            store,
            name=args.name,
            world_size=args.world_size,
            config={"init_scale": scaler.scale, **scaler.control},
            control=scaler.control,
        )
        print(json.dumps({"run_id": ref.id}), flush=True)
        try:
            feed(store, ref.id, scaler, args, stop)
        finally:
            runs.end_run(store, ref.id, "finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
