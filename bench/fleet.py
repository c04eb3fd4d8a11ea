"""Fleet benchmark: many runs writing to one store at once, with live streams and charts.

50 runs each writing 200 steps/s (a telemetry thread's batch every 0.2 s, each run with a
store of its own; with ``--http`` a sender's post every 0.5 s), each step stamped with its
own time (a stream's lag counts the time a step waited in its batch), 50 SSE clients
(round robin over the runs) and 20 chart requests/s (a random run each, half of them
zoomed), for 60 s, against a real ``scalewatch serve``.
Goals (the design's): chart p99 < 250 ms, SSE lag p99 < 1 s, nothing lost (every step
stored, every stream sees every step in order, every chart answered), the writers' rate
under load >= 0.8 x their rate alone (the same writers, paced, before the load).

    python bench/fleet.py                      # a throwaway PostgreSQL server of its own
    python bench/fleet.py --db postgresql+psycopg://...   # an empty scratch database
    python bench/fleet.py --sqlite             # a SQLite file
    python bench/fleet.py --seconds 10         # shorter
    python bench/fleet.py --auth               # reads need a viewer's token (and carry one)
    python bench/fleet.py --http               # the writers post to the service, as jobs do
    python bench/fleet.py --profile out.txt    # also where the service's CPU went (py-spy)

With ``--http`` the writers are jobs recording through the service (``SCALEWATCH_DB=http://``):
each posts its batches to the service's ingest route with a writer's token, through the
sender's client and body, and the service writes the store. Either way the report gives
the CPU of each component per 1000 step records beside raw baselines run after the load
(``bench/_baselines.py``): the same rows by ``COPY`` (``executemany`` on SQLite), and the
same SSE bytes written to the same clients.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from _baselines import Baseline, sse_bytes, store_rows  # noqa: E402
from _cpu import CpuSplit, Process, QuerySampler, Statements, postmaster, shares  # noqa: E402
from _figures import figure  # noqa: E402
from _fleet_writer import WIRE_ENV  # noqa: E402
from _profile import py_spy, sampled, split_stacks  # noqa: E402

from scalewatch.store.engine import open_store  # noqa: E402
from scalewatch.store.identities import Role, create_identity  # noqa: E402
from scalewatch.store.records import RunRef  # noqa: E402
from scalewatch.store.runs import create_run, heartbeat, write_steps  # noqa: E402
from scalewatch.store.schema import steps  # noqa: E402
from scalewatch.telemetry import TelemetrySettings  # noqa: E402
from tests._helpers.load import TOKEN_ENV, ServiceDidNotStart, records, serving  # noqa: E402

WRITER = "fleet-writer"
CONTROL = {"growth_interval": 2000, "growth_factor": 2.0, "backoff_factor": 0.5}
CATCH_UP_S = 120  # after the writers' last step, for every stream to deliver it
CHART_TIMEOUT_S = 120
TICK = os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def machine_busy() -> tuple[float, float]:
    """CPU seconds of the whole machine so far: (busy, total), from ``/proc/stat``."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]
    return (sum(ticks) - idle) / TICK, sum(ticks) / TICK


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


@contextlib.contextmanager
def _store_url(args: argparse.Namespace) -> Any:
    if args.db:
        yield args.db
        return
    if args.sqlite:
        with tempfile.TemporaryDirectory(prefix="scalewatch-fleet-") as tmp:
            yield f"sqlite:///{Path(tmp) / 'fleet.db'}"
        return
    from tests._helpers import postgres as _postgres

    bindir = _postgres.server_bindir()
    if bindir is None:
        sys.exit(f"bench/fleet.py: {_postgres.HOW_TO_GET_ONE}, or pass --db or --sqlite")
    # pg_stat_statements: each statement's time, for the report's split.
    statements = ("shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=all")
    with _postgres.cluster(bindir, settings=statements) as server:
        yield server.url(server.new_database())


def _guard_reads(url: str) -> tuple[str, ...]:
    """A viewer identity in the store, its token given to the bench's clients, and the
    ``serve`` option that makes every read need one, on loopback too."""
    with open_store(url) as store:
        token = create_identity(store, "fleet-viewer", Role.VIEWER, by="bench").token
    os.environ[TOKEN_ENV] = token  # the chart and stream clients are child processes
    return ("--private-read",)


def _writer_token(url: str) -> str:
    """A writer identity in the store (a job's token): the runs are made in its name."""
    with open_store(url) as store:
        return create_identity(store, WRITER, Role.WRITER, by="bench").token


def _what_the_service_said(log: Path) -> None:
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    said = [
        line
        for line in lines
        if line.strip() and not line.startswith(("INFO:", "scalewatch: serving"))
    ]
    if said:  # warnings and errors: a store that failed, a stream cut short
        print(f"the service said ({len(said)} lines, the last 20):", *said[-20:], sep="\n")


def _spawn(
    argv: list[object], stderr: int | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *map(str, argv)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=env,
    )


def _wait_streams_open(sse: subprocess.Popen[str]) -> None:
    """Until the SSE clients say every stream has started (a stream starts at the run's
    last step when it opens: one that opened late would miss the first steps)."""
    assert sse.stderr is not None
    for line in sse.stderr:
        if line.strip() == "streams open":
            return
        print(line, end="", file=sys.stderr)
    raise RuntimeError("the SSE clients ended before their streams opened")


def _result(process: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    out, _ = process.communicate(timeout=timeout)
    if process.returncode != 0:
        raise RuntimeError(f"{process.args} failed: {out[-2000:]}")
    parsed: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return parsed


def _writers(
    target: tuple[str, dict[str, str] | None],
    runs: list[RunRef],
    first: int,
    args: argparse.Namespace,
    seconds: float,
) -> list[subprocess.Popen[str]]:
    """The writer processes, the runs shared among them; ``target``: a store URL, or the
    service's URL with the environment that gives them a writer's token."""
    where, env = target
    names = [run.uid if env else str(run.id) for run in runs]
    share = [names[i :: args.writer_procs] for i in range(args.writer_procs)]
    return [
        _spawn(
            [
                "bench/_fleet_writer.py",
                where,
                ",".join(map(str, part)),
                first,
                args.rate,
                seconds,
                args.batch,
            ],
            env=env,
        )
        for part in share
        if part
    ]


def _merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    written = sum(r["written"] for r in results)
    elapsed = max(r["elapsed"] for r in results)
    return {
        "written": written,
        "rate": written / elapsed,
        "batch_p50_ms": statistics.median(r["batch_p50_ms"] for r in results),
        "batch_p99_ms": max(r["batch_p99_ms"] for r in results),
        "max_late_s": max(r["max_late_s"] for r in results),
        "last_step": {k: v for r in results for k, v in r["last_step"].items()},
        "cpu_s": sum(r["cpu_s"] for r in results),
        "retried": sum(r.get("retried", 0) for r in results),
    }


def prepare(url: str, args: argparse.Namespace) -> list[RunRef]:
    """The runs, each with ``--history`` steps already (what the charts draw); with
    ``--http``, made in the writer's name, as a job's run is."""
    owner = WRITER if args.http else None
    with open_store(url) as store:
        refs = [
            create_run(
                store, name=f"fleet-{i:02d}", world_size=8, config={}, control=CONTROL, owner=owner
            )
            for i in range(args.runs)
        ]
        for run in (ref.id for ref in refs):
            for first in range(1, args.history + 1, 10_000):
                count = min(10_000, args.history - first + 1)
                write_steps(store, run, records(first, count, time.time()))
    return refs


def run_fleet(url: str, base: str, server_pid: int, args: argparse.Namespace) -> dict[str, Any]:
    refs = prepare(url, args)
    runs = [ref.id for ref in refs]
    target = (
        (base, {**os.environ, "SCALEWATCH_TOKEN": _writer_token(url), WIRE_ENV: args.wire})
        if args.http
        else (url, None)
    )
    print(
        f"{args.runs} runs of {args.history:,} steps each; writers alone for {args.solo_seconds} s",
        flush=True,
    )
    solo = _merge(
        [
            _result(p, args.solo_seconds + 60)
            for p in _writers(target, refs, args.history + 1, args, args.solo_seconds)
        ]
    )
    first = max(solo["last_step"].values()) + 1
    batches = int(args.rate * args.seconds) // args.batch
    last_step = first - 1 + batches * args.batch
    print(
        f"under load for {args.seconds} s: steps {first:,}..{last_step:,} of each run", flush=True
    )
    run_list = ",".join(map(str, runs))
    beats = _Heartbeats(url, runs)  # fresh as the streams open, until the writers end
    sse = _spawn(
        [
            "-m",
            "tests._helpers.load",
            "sse",
            base,
            run_list,
            args.sse,
            last_step,
            args.seconds + CATCH_UP_S,
        ],
        stderr=subprocess.PIPE,
    )
    _wait_streams_open(sse)
    server0, (busy0, total0) = cpu_seconds(server_pid), machine_busy()
    load_before = os.getloadavg()[0]
    parts: dict[int, str] = {server_pid: "service", os.getpid(): "bench clients"}
    parts[sse.pid] = "bench clients"

    ours = postmaster(url)  # not another job's PostgreSQL on the same machine

    def component(pid: int, process: Process) -> str | None:
        return parts.get(pid) or ("PostgreSQL" if ours(pid, process) else None)

    split = CpuSplit(component).start()
    postgres = url.startswith("postgresql")
    queries = QuerySampler(url).start() if postgres else None
    statements = Statements(url).start() if postgres else None
    charts = _spawn(
        [
            "-m",
            "tests._helpers.load",
            "charts",
            base,
            run_list,
            args.chart_rate,
            args.seconds,
            first - 1,
            CHART_TIMEOUT_S,
        ]
    )
    writers = _writers(target, refs, first, args, args.seconds)
    parts[charts.pid] = "bench clients"
    parts.update((p.pid, "writers") for p in writers)
    profile = None if args.profile is None else Path(args.profile)
    try:
        with sampled(server_pid, profile):
            loaded = _merge([_result(p, args.seconds + 120) for p in writers])
        beats.stop()
        server_cpu = cpu_seconds(server_pid) - server0
        busy1, total1 = machine_busy()
        split.finish()
        if queries is not None and statements is not None:
            queries.finish()
            statements.finish()
        chart = _result(charts, CHART_TIMEOUT_S + 60)
        streams = _result(sse, CATCH_UP_S + 60)["clients"]
    finally:
        beats.stop()
        for process in (*writers, charts, sse):
            if process.poll() is None:
                process.kill()
                process.wait(timeout=5)
    with open_store(url) as store, store.read() as conn:
        query = select(steps.c.run_id, func.count()).group_by(steps.c.run_id)
        counts = {run: count for run, count in conn.execute(query)}
    stored_ok = all(counts.get(run) == last_step for run in runs)
    baselines = _baselines(url, args)
    streams_ok = all(
        s["status"] == 200
        and not s["errors"]
        and s["gaps"] == 0
        and s["first"] == first
        and s["last"] == last_step
        and s["events"] + s["coalesced"] == last_step - first + 1
        for s in streams
    )
    latencies = chart["latencies"]
    lags = [lag for s in streams for lag in s["lags"]]
    broken = [
        {k: s.get(k) for k in ("run", "status", "first", "last", "events", "gaps", "errors")}
        | {"open_at_deadline": s.get("open_at_deadline", False)}
        for s in streams
        if not (s["first"] == first and s["last"] == last_step and not s["gaps"])
    ]
    window = split.ended - split.began
    records_expected = args.runs * batches * args.batch
    return {
        "runs": args.runs,
        "auth": args.auth,
        "http": args.http,
        "wire": args.wire if args.http else None,
        "rate_per_run": args.rate,
        "seconds": args.seconds,
        "writers_solo": solo | {"last_step": None},
        "writers_load": loaded | {"last_step": None},
        "writer_ratio": loaded["rate"] / solo["rate"],
        "records_expected": records_expected,
        "every_step_stored": stored_ok,
        "every_stream_whole": streams_ok,
        "steps_stored_short": {r: counts.get(r, 0) for r in runs if counts.get(r) != last_step},
        "streams_not_whole": len(broken),
        "streams_not_whole_sample": broken[:3],
        "sse_clients": len(streams),
        "sse_events": sum(s["events"] for s in streams),
        "sse_coalesced": sum(s["coalesced"] for s in streams),
        "sse_lag_p50_ms": 1000 * statistics.median(lags) if lags else None,
        "sse_lag_p99_ms": 1000 * percentile(lags, 0.99) if lags else None,
        "chart_requests": len(latencies),
        "chart_statuses": chart["statuses"],
        "chart_errors": chart["errors"][:5],
        "chart_p50_ms": 1000 * statistics.median(latencies) if latencies else None,
        "chart_p99_ms": 1000 * percentile(latencies, 0.99) if latencies else None,
        "cpu_cores_by_component": split.cores(),
        "cpu_ms_per_1000_records": {
            name: 1e6 * cores * window / records_expected for name, cores in split.cores().items()
        },
        "baselines_cpu_ms_per_1000_records": {b.name: b.per_thousand() for b in baselines},
        "service_samples": None if profile is None else split_stacks(profile.read_text()),
        "postgres_active_queries": (
            {
                "samples": queries.samples,
                "shares": shares(queries.counts, top=8),
                "sessions_per_s": queries.sessions / args.seconds,
                # gist, calls a second, share of a CPU (executing and planning)
                "statements": [
                    (gist, calls / args.seconds, ms / 1000 / args.seconds)
                    for gist, calls, ms in statements.rows[:8]
                ]
                if statements is not None
                else [],
            }
            if queries
            else None
        ),
        "cpu_s_server": server_cpu,
        "loaded_s": window,  # the writers' whole loaded phase: longer than --seconds if held back
        "machine_busy_share": (busy1 - busy0) / (total1 - total0),
        "load_average_before": load_before,
        "cpu_s_writers": loaded["cpu_s"],
    }


def _baselines(url: str, args: argparse.Namespace) -> list[Baseline]:
    """The raw baselines of the same rows and the same events, the load over."""
    steps_each = max(1, args.baseline_records // args.runs // args.batch) * args.batch
    print(f"raw baselines: {steps_each:,} steps of {args.runs} runs", flush=True)
    return [
        store_rows(url, args.runs, steps_each, args.batch),
        sse_bytes(args.runs, args.sse, steps_each, args.batch),
    ]


class _Heartbeats:
    """Every run's heartbeat, now and every 2 s in a thread until :meth:`stop`, as a
    trainer's heartbeat thread beats: a run silent for 15 s reads as crashed and its
    streams end at once, and the bench's writers only write, starting after the streams
    (on a busy machine, their processes take seconds to start)."""

    def __init__(self, url: str, runs: list[int]) -> None:
        self.store, self.runs = open_store(url), runs
        self._beat()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _beat(self) -> None:
        for run in self.runs:
            heartbeat(self.store, run)

    def _loop(self) -> None:
        while not self.stopping.wait(2.0):
            self._beat()

    def stop(self) -> None:
        if not self.stopping.is_set():
            self.stopping.set()
            self.thread.join()
            self.store.close()


def _ms(p99: float | None, p50: float | None) -> str:
    """A percentile pair, or "none" where nothing was measured (no stream sent an event)."""
    return "none" if p99 is None or p50 is None else f"{p99:.0f} ms (p50 {p50:.0f} ms)"


def report(f: dict[str, Any], backend: str) -> bool:
    charts_whole = f["chart_requests"] > 0 and set(f["chart_statuses"]) == {"200"}
    lost_ok = f["every_step_stored"] and f["every_stream_whole"] and charts_whole
    load = f"{f['runs']} runs x {f['rate_per_run']:.0f} steps/s, {f['seconds']:.0f} s"
    if f["auth"]:
        load += ", reads with a viewer's token"
    http = f", jobs post to the service (HTTP, steps as {f.get('wire') or 'rows'})"
    load += http if f["http"] else ", jobs write the store"
    rows = [
        (
            "chart p99",
            _ms(f["chart_p99_ms"], f["chart_p50_ms"]),
            "< 250 ms",
            (f["chart_p99_ms"] or math.inf) < 250,
            f"{f['chart_requests']} requests, statuses {f['chart_statuses']}",
        ),
        (
            "SSE lag p99",
            _ms(f["sse_lag_p99_ms"], f["sse_lag_p50_ms"]),
            "< 1000 ms",
            (f["sse_lag_p99_ms"] or math.inf) < 1000,
            f"{f['sse_clients']} clients, {f['sse_events']:,} events",
        ),
        (
            "nothing lost",
            "yes" if lost_ok else "NO",
            "every step stored, streamed, charted",
            lost_ok,
            f"{f['records_expected']:,} records written under load",
        ),
        (
            "writers' rate under load",
            f"{f['writers_load']['rate']:,.0f} records/s",
            ">= 0.8 x alone",
            f["writer_ratio"] >= 0.8,
            f"{f['writer_ratio']:.3f} x alone ({f['writers_solo']['rate']:,.0f} records/s);"
            f" batch p99 {f['writers_load']['batch_p99_ms']:.0f} ms"
            f" (alone {f['writers_solo']['batch_p99_ms']:.0f} ms);"
            f" {f['writers_load']['retried']} posts answered 429/503 and tried again",
        ),
    ]
    table = [("goal", "measured", "target", "met", "notes")]
    table += [(n, v, g, "pass" if ok else "FAIL", b) for n, v, g, ok, b in rows]
    widths = [max(len(row[i]) for row in table) for i in range(5)]
    print(
        f"\nfleet benchmark on {backend}: {load}, {os.cpu_count()} CPUs; load average"
        f" {f['load_average_before']:.1f} before, machine {f['machine_busy_share']:.0%} busy"
        f" while loaded, the service {f['cpu_s_server'] / f['loaded_s']:.2f} CPUs"
    )
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    split = ", ".join(f"{name} {cores:.2f}" for name, cores in f["cpu_cores_by_component"].items())
    print(f"CPU by component (cores, over the loaded phase; {os.cpu_count()} in all): {split}")
    per = ", ".join(f"{name} {ms:.1f}" for name, ms in f["cpu_ms_per_1000_records"].items())
    print(f"CPU ms per 1000 step records: {per}")
    for name, parts in f["baselines_cpu_ms_per_1000_records"].items():
        raw = " + ".join(f"{part} {ms:.1f}" for part, ms in parts.items())
        print(f"  raw baseline, {name} of the same: {sum(parts.values()):.1f} ({raw})")
    if f["service_samples"]:
        print("where the service's samples went (py-spy, the loaded phase; idle left out):")
        for share, part in f["service_samples"]:
            print(f"  {share:6.1%}  {part}")
    active = f["postgres_active_queries"]
    if active:
        print(
            f"PostgreSQL: {active['sessions_per_s']:.1f} connections opened a second;"
            f" its active queries ({active['samples']} samples of pg_stat_activity):"
        )
        for gist, share in active["shares"]:
            print(f"  {share:5.0%}  {gist}")
        print("  ([wait]: active but waiting, e.g. for the service to read the rows)")
        if active["statements"]:
            print(
                "PostgreSQL's statements by time executing"
                " (pg_stat_statements; a wait inside counts):"
            )
            for gist, calls, cores in active["statements"]:
                print(f"  {cores:5.2f} cores  {calls:7.1f} calls/s  {gist}")
    for name, value, goal, ok, baseline in rows:
        figure(f"fleet ({backend}, {load}): {name}", value, goal, ok, baseline)
    return all(ok for *_, ok, _ in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--db", help="an empty scratch store URL (default: a server of its own)")
    where.add_argument("--sqlite", action="store_true", help="a SQLite file in a temp directory")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--rate", type=float, default=200, help="steps/s of each run")
    parser.add_argument(
        "--batch",
        type=int,
        help="records per write or post (default: the steps of a trainer's coalescing,"
        " TelemetrySettings' coalesce_s into a store, send_interval_s to the service: 40 and"
        " 100 at 200 steps/s)",
    )
    parser.add_argument("--sse", type=int, default=50, help="SSE clients")
    parser.add_argument("--chart-rate", type=float, default=20, help="chart requests/s")
    parser.add_argument("--seconds", type=float, default=60, help="the loaded phase")
    parser.add_argument("--solo-seconds", type=float, default=10, help="the writers alone")
    parser.add_argument("--history", type=int, default=20_000, help="steps of each run before")
    parser.add_argument("--writer-procs", type=int, default=5, help="processes for the runs")
    parser.add_argument(
        "--http",
        action="store_true",
        help="the writers post their batches to the service with a writer's token, as jobs"
        " with SCALEWATCH_DB=http://... do; the service writes the store",
    )
    parser.add_argument(
        "--wire",
        choices=["rows", "objects"],
        default="rows",
        help="with --http: the steps posted as rows of the columns the service names (as a"
        " job does), or as objects (as a job does to a service that names none)",
    )
    parser.add_argument(
        "--baseline-records",
        type=int,
        default=100_000,
        help="records of the raw baselines after the load (COPY or executemany; SSE bytes)",
    )
    parser.add_argument(
        "--auth",
        action="store_true",
        help="reads guarded (serve --private-read): every chart and stream with a viewer's token",
    )
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="py-spy's samples of the service over the loaded phase, to FILE (collapsed"
        " stacks), and split by part in the report (bench/_profile.py); py-spy's own CPU"
        " (about half a core here) shows as 'other' and slows the service: a profiled run's"
        " figures are not comparable with others'",
    )
    args = parser.parse_args()
    if args.profile:
        py_spy()
    if args.batch is None:
        defaults = TelemetrySettings()
        gather = defaults.send_interval_s if args.http else defaults.coalesce_s
        args.batch = max(1, round(args.rate * gather))
    with _store_url(args) as url, tempfile.TemporaryDirectory() as tmp:
        try:
            options = _guard_reads(url) if args.auth else ()
            with serving(url, Path(tmp), token="fleet", options=options) as (base, pid):
                figures = run_fleet(url, base, pid, args)
        except ServiceDidNotStart as error:
            sys.exit(str(error))
        finally:
            _what_the_service_said(Path(tmp) / "serve.log")
    print(json.dumps(figures, indent=1))
    return 0 if report(figures, "SQLite" if url.startswith("sqlite") else "PostgreSQL") else 1


if __name__ == "__main__":
    sys.exit(main())
