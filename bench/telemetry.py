"""Telemetry benchmarks, side by side in one run.

Writer: sustained records/s of ``scalewatch.store.runs.write_steps`` (batches into a fresh
file store: steps, rollups, run row, one transaction per batch) against a raw
``sqlite3`` ``executemany`` of the same rows into an identical table with the same
pragmas. Goals: >= 100k records/s and >= half the raw rate.

Training thread: microseconds per step on the training thread, torch's scaler against
ours with telemetry off and on (a store in a temporary file), interleaved round by round
(every other round in reverse order), for a tiny model step and for the scaler's calls
alone, for ``GradScaler`` and (in a one-process gloo group) ``ShardedGradScaler``, on cpu
or (``--device cuda``) a GPU. Goal:
telemetry on costs < 3 us per step of the training thread's CPU, < 5 us of its wall
time. A second scaler with telemetry off, timed exactly as
the "on" one, gives the method's noise floor (a/a); the CPU time that telemetry's own
threads spend per step is printed beside it, and so is a bootstrap 95% interval of each
on - off median (how far one run's figure can be trusted on this machine). The CPU goal
is read from a second measure taken in every round: off, on and off again run in turns of
about 50 ms each (``BLOCKS_A_ROUND``), so that neighbouring turns share the machine's
state, which whole rounds a second apart do not (on this shared machine the rounds' own
a/a reached +5 us); the wall goal from the rounds, which include what telemetry's threads
take of the GIL.

    python bench/telemetry.py [--records 300000] [--batch 1000] [--rounds 2] [--steps 1000]
        [--training-rounds 31] [--round-seconds 1.0] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchSharded

import scalewatch
from scalewatch.store import StepRecord, open_store, upgrade
from scalewatch.store.records import ParamFinding
from scalewatch.store.runs import create_run, step_rows, write_steps
from scalewatch.store.sqlite import BUSY_TIMEOUT_MS
from scalewatch.store.step_rows import COLUMNS
from scalewatch.telemetry import TelemetrySettings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import figure, median_interval

WRITER_GOAL_RECORDS_PER_S = 100_000
WRITER_GOAL_RATIO = 0.5
TRAINING_GOAL_US = 3.0  # the training thread's CPU, on - off
WALL_GOAL_US = 5.0  # its wall time, which the job feels
WARM_UP_S = 0.3  # untimed steps of the on variant before its round: one write cadence
BLOCKS_A_ROUND = 20  # turns of the blocked CPU measure a round (about 50 ms a block)
# Each round starts from this scale. Left to grow every 100 steps, a float32 model's scale
# reaches inf after ~11,000 steps and every later step overflows, which no run does.
INIT_SCALE = 2.0**16

_RAW_PRAGMAS = (
    f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}",
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = NORMAL",
    "PRAGMA foreign_keys = ON",
)
# every column of a step, as the store writes them (the declaration's order)
_RAW_INSERT = (
    f"INSERT INTO steps (run_id, {', '.join(COLUMNS)})"
    f" VALUES ({', '.join('?' * (len(COLUMNS) + 1))})"
)


def make_records(count: int) -> list[StepRecord]:
    """A plausible fp16 run: growth every 2000 clean steps, an overflow every ~700, a loss
    each step and, at an overflow, the two parameters found non-finite."""
    records: list[StepRecord] = []
    scale, tracker, start = 65536.0, 0, time.time()
    for step in range(1, count + 1):
        overflow = step % 701 == 0
        if overflow:
            after, tracker = scale * 0.5, 0
        else:
            tracker += 1
            after = scale * 2.0 if tracker == 2000 else scale
            tracker %= 2000
        records.append(
            StepRecord(
                step=step,
                wall_time=start + step * 0.05,
                scale=scale,
                overflow=overflow,
                skipped=overflow,
                inf_ranks=(step % 8,) if overflow else (),
                scale_after=after,
                growth_tracker=tracker,
                growth_interval=2000,
                growth_factor=2.0,
                backoff_factor=0.5,
                control_version=0,
                loss=2.0 + 1.0 / step,
                params=_FINDINGS[step % 8] if overflow else (),
            )
        )
        scale = after
    return records


_FINDINGS = tuple(
    (
        ParamFinding(rank, "encoder.layers.11.mlp.fc2.weight", "inf", 4096),
        ParamFinding(rank, "encoder.layers.11.mlp.fc2.bias", "nan", 3),
    )
    for rank in range(8)
)


def _store_rate(directory: Path, records: list[StepRecord], batch: int) -> float:
    with open_store(f"sqlite:///{directory / 'store.db'}") as store:
        run = create_run(store, name="bench", world_size=8, config={}, control={})
        began = time.perf_counter()
        for first in range(0, len(records), batch):
            write_steps(store, run.id, records[first : first + batch])
        return len(records) / (time.perf_counter() - began)


def _raw_rate(directory: Path, records: list[StepRecord], batch: int) -> float:
    path = directory / "raw.db"
    upgrade(f"sqlite:///{path}")  # the identical schema: same table, keys and indexes
    rows = step_rows(1, records)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for pragma in _RAW_PRAGMAS:
            conn.execute(pragma)
        conn.execute(
            "INSERT INTO runs (id, uid, name, status, world_size, config, control,"
            " control_version, torch_version, host, pid, started_at, heartbeat_at,"
            " last_step, dropped)"
            " VALUES (1, 'raw', 'raw', 'running', 8, '{}', '{}', 0, '', '', 0, 0.0, 0.0, 0, 0)"
        )
        began = time.perf_counter()
        for first in range(0, len(rows), batch):
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(_RAW_INSERT, rows[first : first + batch])
            conn.execute("COMMIT")
        return len(rows) / (time.perf_counter() - began)
    finally:
        conn.close()


def bench_writer(records: int = 300_000, batch: int = 1000, rounds: int = 2) -> dict[str, Any]:
    """Best of ``rounds`` alternating runs of each writer, each into a fresh file."""
    data = make_records(records)
    store_rates: list[float] = []
    raw_rates: list[float] = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as scratch:
            store_rates.append(_store_rate(Path(scratch), data, batch))
        with tempfile.TemporaryDirectory() as scratch:
            raw_rates.append(_raw_rate(Path(scratch), data, batch))
    store_rate, raw_rate = max(store_rates), max(raw_rates)
    return {
        "records": records,
        "batch": batch,
        "rounds": rounds,
        "store_records_per_s": store_rate,
        "raw_records_per_s": raw_rate,
        "ratio": store_rate / raw_rate,
        "store_rounds": store_rates,
        "raw_rounds": raw_rates,
    }


def _verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def print_writer(result: dict[str, Any]) -> None:
    rate, raw, ratio = (
        result["store_records_per_s"],
        result["raw_records_per_s"],
        result["ratio"],
    )
    print(
        f"writer: {result['records']} records in batches of {result['batch']},"
        f" best of {result['rounds']} rounds"
    )
    rounds = ", ".join(f"{r:,.0f}" for r in result["store_rounds"])
    print(f"  write_steps (steps + rollups + run row): {rate:>10,.0f} records/s  [{rounds}]")
    rounds = ", ".join(f"{r:,.0f}" for r in result["raw_rounds"])
    print(f"  raw sqlite3 executemany (steps only):    {raw:>10,.0f} records/s  [{rounds}]")
    print(f"  ratio write_steps / raw: {ratio:.2f}")
    print(
        f"  goal >= {WRITER_GOAL_RECORDS_PER_S:,} records/s:"
        f" {_verdict(rate >= WRITER_GOAL_RECORDS_PER_S)};"
        f" goal ratio >= {WRITER_GOAL_RATIO}: {_verdict(ratio >= WRITER_GOAL_RATIO)}"
    )
    figure(
        "telemetry writer throughput",
        f"{rate:,.0f} records/s",
        f">= {WRITER_GOAL_RECORDS_PER_S:,} records/s, >= {WRITER_GOAL_RATIO} of raw",
        rate >= WRITER_GOAL_RECORDS_PER_S and ratio >= WRITER_GOAL_RATIO,
        f"{ratio:.2f} x raw sqlite3 executemany ({raw:,.0f} records/s)",
    )


def _variants(kind: str, url: str, device: str) -> dict[str, Any]:
    """torch's scaler, ours with telemetry off, on, and off again, all with the same settings.

    "off again" is a second scaler with telemetry off, timed the same way as "on": its
    difference to "off" is what the method reads when nothing differs (its noise floor).
    """
    kwargs = {"device": device, "init_scale": INIT_SCALE, "growth_interval": 100}
    theirs, ours = (
        (torch.amp.GradScaler, scalewatch.GradScaler)
        if kind == "GradScaler"
        else (TorchSharded, scalewatch.ShardedGradScaler)
    )
    return {
        "torch": theirs(**kwargs),
        "off": ours(**kwargs, telemetry=False),
        "on": ours(**kwargs, telemetry=url),
        # the same store written by threads of the training process, as before the writer
        # had a process of its own
        "thread": ours(
            **kwargs, telemetry=TelemetrySettings(url.replace(".db", "-thread.db"), writer="thread")
        ),
        "off again": ours(**kwargs, telemetry=False),
    }


def _telemetry_threads_cpu(gs: Any) -> float:
    """CPU seconds used so far by the threads of ``gs``'s telemetry and recorder, and by
    its writer process (which the other variants, telemetry off, leave idle)."""
    session = getattr(gs, "_session", None)  # torch's scalers have none
    if session is None or session.telemetry is None:
        return 0.0
    total = _process_cpu(getattr(session.telemetry, "writer_pid", None))
    recorder = () if session.recorder is None else (session.recorder.thread,)
    for thread in (*session.telemetry.threads, *recorder):
        if thread is None or thread.ident is None or not thread.is_alive():
            continue
        try:
            total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except OSError:  # the thread ended meanwhile
            continue
    return total


def _process_cpu(pid: int | None) -> float:
    """CPU seconds (user and system) used so far by process ``pid``; 0 for None."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed(loop: Any, steps: int) -> tuple[float, float]:
    """(wall seconds, training-thread CPU seconds) per step of ``loop(steps)``.

    The thread's CPU time is what telemetry costs the training thread itself; waiting for
    the GIL while the background threads run is not in it, but is in the wall time.
    """
    wall, cpu = time.perf_counter(), time.thread_time()
    loop(steps)
    return (time.perf_counter() - wall) / steps, (time.thread_time() - cpu) / steps


def _run(make_loop: Any, device: str, gs: Any, steps: int) -> tuple[float, float]:
    """(wall, CPU) seconds per step of ``steps`` steps of ``make_loop(gs, device)``."""
    return _timed(make_loop(gs, device), steps)


def _model_loop(gs: Any, device: str) -> Any:
    """``loop(n)``: n steps of a tiny model's whole step (forward, backward, step, update;
    the model made once), then a sync on cuda."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = torch.randn(16, 32, device=device)

    def loop(n: int) -> None:
        for _ in range(n):
            opt.zero_grad(set_to_none=False)
            gs.scale(model(data).pow(2).mean()).backward()
            gs.step(opt)
            gs.update()
        _sync(device)

    return loop


def _calls_loop(gs: Any, device: str) -> Any:
    """``loop(n)``: n steps of the scaler's own calls alone (scale, unscale_, step with lr
    0, update), then a sync on cuda."""
    param = torch.nn.Parameter(torch.zeros(8, device=device))
    param.grad = torch.ones(8, device=device)
    opt = torch.optim.SGD([param], lr=0.0)
    loss = torch.ones((), device=device)

    def loop(n: int) -> None:
        for _ in range(n):
            gs.scale(loss)
            gs.unscale_(opt)
            gs.step(opt)
            gs.update()
        _sync(device)

    return loop


_LOOPS = {"model step": _model_loop, "scaler calls": _calls_loop}
BLOCKED = ("off", "on", "off again")  # the variants of the blocked CPU rounds


def _blocked_cpu(
    scalers: dict[str, Any], loops: dict[str, Any], steps: int, block: int
) -> dict[str, float]:
    """The training thread's CPU seconds per step of each of ``loops``, run in turns of
    ``block`` steps (every other turn in reverse) until each has run ``steps``.

    Adjacent blocks of tens of milliseconds share the machine's state, which rounds a second
    apart do not; a variant's background threads keep running through the others' blocks,
    so this reads the training thread's own work, not what those threads take of the wall
    time (the round-level wall rows do).
    """
    cpu = dict.fromkeys(loops, 0.0)
    names = list(loops)
    turns = max(1, steps // block)
    for turn in range(turns):
        for name in names[::-1] if turn % 2 else names:
            scalers[name].update(new_scale=INIT_SCALE)  # untimed: see INIT_SCALE
            began = time.thread_time()
            loops[name](block)
            cpu[name] += time.thread_time() - began
    return {name: total / (turns * block) for name, total in cpu.items()}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def bench_training_thread(
    steps: int = 1000, rounds: int = 31, min_round_s: float = 1.0, device: str = "cpu"
) -> dict[str, Any]:
    """Median us/step per (class, workload, variant) over rounds that interleave the variants.

    On - off is the median of each round's own difference: rounds side by side share the
    machine's state at that moment, which a best-of or a difference of medians does not.
    A round is ``steps`` steps, or more to last ``min_round_s``: the writer writes every
    ``TelemetrySettings.coalesce_s``, and a round must hold several of its writes, not
    none or one.
    """
    torch.set_num_threads(1)
    began = time.perf_counter()
    results: dict[str, Any] = {
        "steps": steps,
        "rounds": rounds,
        "min_round_s": min_round_s,
        "device": device,
        "rows": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group(
            "gloo", init_method=f"file://{Path(tmp) / 'pg'}", rank=0, world_size=1
        )
        try:
            for kind in ("GradScaler", "ShardedGradScaler"):
                for workload, make_loop in _LOOPS.items():
                    fn = functools.partial(_run, make_loop, device)
                    url = f"sqlite:///{Path(tmp) / f'{kind}-{workload}.db'}"
                    variants = _variants(kind, url, device)
                    samples: dict[str, list[tuple[float, float]]] = {n: [] for n in variants}
                    for gs in variants.values():
                        fn(gs, 50)  # warm up; the first update() starts the writer
                    n = max(steps, math.ceil(min_round_s / fn(variants["off"], 200)[0]))
                    threads_cpu: list[float] = []
                    blocked: list[dict[str, float]] = []
                    for round_no in range(rounds):
                        # Every other round runs the variants in reverse, so a machine that
                        # speeds up or slows down during a round favours none of them.
                        order = list(variants.items())
                        for name, gs in order[::-1] if round_no % 2 else order:
                            gs.update(new_scale=INIT_SCALE)  # untimed: see INIT_SCALE
                            # None of the on variant's writes may land in another's round,
                            # and its own round starts with its writer in its usual cadence.
                            variants["on"].flush(60)
                            variants["thread"].flush(60)
                            if name in ("on", "thread", "off again"):  # timed alike
                                fn(gs, math.ceil(n * WARM_UP_S / min_round_s))
                            before = _telemetry_threads_cpu(gs)
                            wall, cpu = fn(gs, n)
                            samples[name].append((wall * 1e6, cpu * 1e6))
                            if name == "on":
                                threads_cpu.append((_telemetry_threads_cpu(gs) - before) / n)
                        scalers = {name: variants[name] for name in BLOCKED}
                        loops = {name: make_loop(gs, device) for name, gs in scalers.items()}
                        blocked.append(_blocked_cpu(scalers, loops, n, max(1, n // BLOCKS_A_ROUND)))
                    written = all(
                        variants[name]._session.telemetry is not None
                        and variants[name]._session.telemetry.flush(60)
                        for name in ("on", "thread")
                    )
                    for gs in variants.values():
                        if hasattr(gs, "close"):
                            gs.close()
                    row: dict[str, Any] = {
                        "written": written,
                        "threads_cpu": statistics.median(threads_cpu) * 1e6,
                    }
                    for i, metric in enumerate(("wall", "cpu")):
                        row[metric] = {
                            name: statistics.median(x[i] for x in xs)
                            for name, xs in samples.items()
                        }
                        for label, other in (
                            ("on-off", "on"),
                            ("thread-off", "thread"),
                            ("a/a", "off again"),
                        ):
                            differences = [
                                x[i] - off[i]
                                for x, off in zip(samples[other], samples["off"], strict=True)
                            ]
                            row[metric][label] = statistics.median(differences)
                            row[metric][f"{label} interval"] = median_interval(differences)
                    row["blocked"] = {
                        name: statistics.median(b[name] * 1e6 for b in blocked) for name in BLOCKED
                    }
                    for label, other in (("on-off", "on"), ("a/a", "off again")):
                        differences = [(b[other] - b["off"]) * 1e6 for b in blocked]
                        row["blocked"][label] = statistics.median(differences)
                        row["blocked"][f"{label} interval"] = median_interval(differences)
                    results["rows"][(kind, workload)] = row
                    print(
                        f"  measured {kind} {workload} ({n} steps a round)"
                        f" at {time.perf_counter() - began:.0f} s",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            dist.destroy_process_group()
    return results


def print_training_thread(result: dict[str, Any]) -> None:
    print(
        f"training thread ({result['device']} steps): us/step,"
        f" medians of {result['rounds']} interleaved rounds"
        f" of {result['steps']} steps or {result['min_round_s']} s;"
        " on-off = median of each round's difference;"
        " cpu = the training thread's own CPU time"
    )
    print(
        "  a/a = the same difference between two scalers with telemetry off (the method's"
        " noise floor); threads = CPU per step of telemetry's threads in the training"
        " process and of its writer process;"
        " 95% = a bootstrap interval of the on-off median;"
        " thread-off = on - off with the store written by threads of the training process"
        ' (TelemetrySettings(writer="thread"));'
        f" blk = the training thread's CPU with off, on and off again run in turns of"
        f" 1/{BLOCKS_A_ROUND} of a round (medians of the rounds' figures; what the CPU goal"
        " reads)"
    )
    print(
        f"  {'class':<18} {'workload':<13} {'time':<5} {'torch':>8} {'off':>8} {'on':>8}"
        f" {'on-off':>8} {'95%':>15} {'a/a':>7} {'on-torch':>9} {'threads':>8}"
        f" {'thread-off':>11}"
    )
    worst: dict[str, float] = {}
    for (kind, workload), row in result["rows"].items():
        for metric in ("cpu", "wall"):
            t = row[metric]
            for label in ("on-off", "a/a"):
                key = f"{metric} {label}"
                worst[key] = max(worst.get(key, float("-inf")), t[label])
            threads = f"{row['threads_cpu']:>8.1f}" if metric == "cpu" else f"{'':>8}"
            low, high = t["on-off interval"]
            interval = f"[{low:+.1f}, {high:+.1f}]"
            print(
                f"  {kind:<18} {workload:<13} {metric:<5} {t['torch']:>8.1f} {t['off']:>8.1f}"
                f" {t['on']:>8.1f} {t['on-off']:>+8.1f} {interval:>15} {t['a/a']:>+7.1f}"
                f" {t['on'] - t['torch']:>+9.1f} {threads} {t['thread-off']:>+11.1f}"
                + ("" if row["written"] else "  (store not flushed)")
            )
        b = row["blocked"]
        for label in ("on-off", "a/a"):
            key = f"blocked {label}"
            worst[key] = max(worst.get(key, float("-inf")), b[label])
        low, high = b["on-off interval"]
        interval = f"[{low:+.1f}, {high:+.1f}]"
        print(
            f"  {kind:<18} {workload:<13} {'blk':<5} {'':>8} {b['off']:>8.1f}"
            f" {b['on']:>8.1f} {b['on-off']:>+8.1f} {interval:>15} {b['a/a']:>+7.1f}"
        )
    worst_cpu, worst_wall = worst["blocked on-off"], worst["wall on-off"]
    ok = worst_cpu < TRAINING_GOAL_US and worst_wall < WALL_GOAL_US
    worst_row = max(result["rows"].values(), key=lambda row: row["blocked"]["on-off"])
    worst_low, worst_high = worst_row["blocked"]["on-off interval"]
    above = [
        f"{kind} {workload} {row['blocked']['on-off interval'][0]:+.1f}"
        for (kind, workload), row in result["rows"].items()
        if row["blocked"]["on-off interval"][0] >= TRAINING_GOAL_US
    ]
    print(
        f"  goal: telemetry on - off < {TRAINING_GOAL_US} us/step of training-thread CPU (blk)"
        f" and < {WALL_GOAL_US} us of wall time: {_verdict(ok)} (worst {worst_cpu:+.1f} us"
        f" cpu, {worst_wall:+.1f} us wall)"
    )
    print(
        "  rows whose whole 95% blk interval lies at or above the CPU goal: "
        + (", ".join(above) if above else "none")
    )
    print(
        f"  noise floor: the worst a/a row is {worst['blocked a/a']:+.1f} us cpu (blk),"
        f" {worst['cpu a/a']:+.1f} us cpu (rounds), {worst['wall a/a']:+.1f} us wall"
    )
    figure(
        "telemetry cost on the training thread (on - off, CPU time per step)",
        f"{worst_cpu:+.1f} us",
        f"< {TRAINING_GOAL_US} us cpu, < {WALL_GOAL_US} us wall",
        ok,
        f"blocks interleaved; 95% interval [{worst_low:+.1f}, {worst_high:+.1f}] us;"
        f" wall time on - off {worst_wall:+.1f} us/step (rounds); off - off (noise floor)"
        f" {worst['blocked a/a']:+.1f} us cpu",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2, help="writer rounds")
    parser.add_argument("--steps", type=int, default=1000, help="steps per training round")
    parser.add_argument("--training-rounds", type=int, default=31)
    parser.add_argument("--round-seconds", type=float, default=1.0, help="shortest training round")
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="of the training steps"
    )
    args = parser.parse_args()
    print_training_thread(
        bench_training_thread(args.steps, args.training_rounds, args.round_seconds, args.device)
    )
    print_writer(bench_writer(args.records, args.batch, args.rounds))


if __name__ == "__main__":
    main()
