"""The service's CPU for a job's batches over HTTP, alone: no streams, no charts.

Starts a real ``scalewatch serve`` (SQLite in a temporary folder, or ``--db URL``), opens
``--runs`` runs in a writer identity's name, and posts ``--batches`` batches of each size
in ``--sizes`` (steps a batch, as the sender posts them: ``ServiceClient`` and ``items``)
from ``--clients`` threads, the runs taken in turn, each size with the steps as rows and
as objects (``--wires``). The service's CPU (user + system, from ``/proc``) over each
case's posts gives its CPU a batch and per 1000 records, and this process's own CPU over
them the posting threads' (the jobs' side: the items made, encoded and sent); a
``GET /healthz`` as many times gives the floor of a request that does nothing. The cases
are measured in turn, ``--rounds`` times, so a busy machine's swings fall on all of them.

    python bench/ingest.py                          # sizes 40 100 200, SQLite
    python bench/ingest.py --sizes 40 --profile out # also py-spy's samples of the service

``--profile PREFIX``: ``py-spy record`` (on PATH or beside the interpreter) samples the
service over the last round of each case, written to ``PREFIX-SIZE-WIRE.txt`` as collapsed
stacks, and split by part (``bench/_profile.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from _fleet_writer import opening  # noqa: E402
from _profile import py_spy, sampled, split_stacks  # noqa: E402

from scalewatch.spool.client import ServiceClient  # noqa: E402
from scalewatch.store.engine import open_store  # noqa: E402
from scalewatch.store.identities import Role, create_identity  # noqa: E402
from scalewatch.store.step_rows import step_values  # noqa: E402
from scalewatch.telemetry._batches import items  # noqa: E402
from tests._helpers.load import records, serving  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Job:
    """One run posting as the sender does: its client, its run id, its next step."""

    def __init__(self, base: str, uid: str) -> None:
        self.client = ServiceClient(base)
        self.run_id, self.sequence = self.client.open_run(opening(uid))
        self.step = 1

    def post(self, size: int, wire: str) -> None:
        rows: list[Any] = [step_values(r) for r in records(self.step, size, time.time())]
        self.sequence += 1
        as_rows = self.client.row_columns if wire == "rows" else None
        body = {"sequence": self.sequence, "items": items(rows, reason="", rows=as_rows)}
        try:
            self.client.post_batch(self.run_id, body)
        except httpx.TransportError:  # a kept-alive connection the service closed meanwhile
            self.client.post_batch(self.run_id, body)  # the same number: stored once
        self.step += size


def _in_turn(jobs: list[Job], clients: int, count: int, action: Any) -> None:
    """``action(job)`` ``count`` times from ``clients`` threads, the jobs taken in turn."""
    lock, left = threading.Lock(), iter(range(count))

    def loop() -> None:
        while True:
            with lock:
                i = next(left, None)
            if i is None:
                return
            action(jobs[i % len(jobs)])

    threads = [threading.Thread(target=loop) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def measure(base: str, pid: int, args: argparse.Namespace) -> dict[str, list[float]]:
    uids = [os.urandom(16).hex() for _ in range(args.runs)]
    jobs = [Job(base, uid) for uid in uids]
    health = httpx.Client(base_url=base)
    out: dict[str, list[float]] = {}
    cases: list[tuple[str, int, str]] = [("healthz", 0, "")]
    cases += [(f"{size} {wire}", size, wire) for size in args.sizes for wire in args.wires]
    for round_ in range(args.rounds):
        last = round_ == args.rounds - 1
        for name, size, wire in cases:
            label = name.replace(" ", "-")
            profile = Path(f"{args.profile}-{label}.txt") if args.profile and last else None
            with sampled(pid, profile):
                before, own = cpu_seconds(pid), time.process_time()
                if size == 0:
                    _in_turn(jobs, args.clients, args.batches, lambda _: health.get("/healthz"))
                else:
                    post = lambda job, n=size, w=wire: job.post(n, w)  # noqa: E731
                    _in_turn(jobs, args.clients, args.batches, post)
                spent, posting = cpu_seconds(pid) - before, time.process_time() - own
            out.setdefault(name, []).append(1000 * spent / args.batches)
            out.setdefault(f"{name} (jobs)", []).append(1000 * posting / args.batches)
            if profile is not None:
                print(f"\n{name}: where the service's samples went ({profile})")
                for share, part in split_stacks(profile.read_text()):
                    print(f"  {share:6.1%}  {part}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--db", help="a store URL (default: SQLite in a temporary folder)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[40, 100, 200])
    parser.add_argument("--batches", type=int, default=1000, help="posts of each size a round")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--clients", type=int, default=8, help="threads posting at once")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--wires",
        nargs="+",
        choices=["rows", "objects"],
        default=["rows", "objects"],
        help="how the steps travel: as rows of the columns the service names, or as objects",
    )
    parser.add_argument("--profile", help="py-spy's samples of the last round to PREFIX-SIZE.txt")
    args = parser.parse_args()
    if args.profile:
        py_spy()
    with tempfile.TemporaryDirectory(prefix="scalewatch-ingest-") as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'ingest.db'}"
        with open_store(url) as store:
            os.environ["SCALEWATCH_TOKEN"] = create_identity(
                store, "bench-job", Role.WRITER, by="bench"
            ).token
        print(f"load average {os.getloadavg()[0]:.1f} before", flush=True)
        with serving(url, Path(tmp), token="bench-admin") as (base, pid):
            figures = measure(base, pid, args)
        print(f"load average {os.getloadavg()[0]:.1f} after")
    print(
        "CPU ms a request, each round, of the service and (jobs) of the posting threads"
        " (a batch's steps: per 1000 records):"
    )
    for name, values in figures.items():
        rounds = " ".join(f"{v:.2f}" for v in values)
        size = int(name.split()[0]) if name[0].isdigit() else 0
        per = (
            "  per 1000 records: " + " ".join(f"{1000 * v / size:.0f}" for v in values)
            if size
            else ""
        )
        print(f"  {name:>22}: {rounds}{per}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
