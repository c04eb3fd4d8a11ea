"""Spikes and the largest parameter norms, written with the steps they belong to.

Runs where steps are written (``runs.write_step_values``, in its transaction): the
telemetry writer, off the training thread. The batch's spikes are found against the
run's stored history (:mod:`.spikes`); the largest parameter norms a step carries are
kept where it overflowed or spiked. A step written again loses the spikes and norms it
had, as it loses its findings.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from . import postgres
from .rollups import contiguous
from .schema import PARAM_NAME_LENGTH, param_norms, spikes
from .spikes import rule_of, spike_rows
from .sql import driver_sql
from .sqlite import insert_rows
from .step_rows import COLUMNS

# Where a steps row (run_id first) holds each column the spikes are read from.
_AT = {name: COLUMNS.index(name) + 1 for name in ("step", "overflow", "loss", "grad_norm")}
_FLAG = {what: COLUMNS.index(f"{what}_spike") + 1 for what in ("loss", "grad_norm")}
_CONFIG = "SELECT config FROM runs WHERE id = ?"
_HISTORY = (
    "SELECT loss, grad_norm FROM steps WHERE run_id = ? AND step < ? AND NOT overflow"
    " ORDER BY step DESC LIMIT ?"
)
_SPIKE_COLUMNS = tuple(c.name for c in spikes.c)
_NORM_COLUMNS = tuple(c.name for c in param_norms.c)


def write_spikes(
    cursor: Any,
    run_id: int,
    rows: Sequence[tuple[Any, ...]],
    norms: Sequence[Sequence[Any]],
    *,
    dialect: str,
    fresh: bool,
) -> list[tuple[Any, ...]]:
    """Find and store the spikes of ``rows`` (``steps`` rows about to be written;
    ``fresh``: all after the run's last step, none written before), and keep the largest
    parameter norms (``norms``: ``(step, position, name, norm)``) of those steps that
    overflowed or spiked. Returns ``rows`` with their spike flags set."""
    ordered = sorted(rows, key=lambda row: row[_AT["step"]])
    steps = {row[_AT["step"]] for row in ordered}
    for first, last in [] if fresh else contiguous(steps):
        for table in ("spikes", "param_norms"):
            cursor.execute(
                driver_sql(
                    f"DELETE FROM {table} WHERE run_id = ? AND step >= ? AND step <= ?", dialect
                ),
                (run_id, first, last),
            )
    cursor.execute(driver_sql(_CONFIG, dialect), (run_id,))
    found = cursor.fetchone()
    config = found[0] if found else None
    rule = rule_of(json.loads(config) if isinstance(config, str) else config)
    first_step = ordered[0][_AT["step"]]
    cursor.execute(driver_sql(_HISTORY, dialect), (run_id, first_step, rule.window))
    history = list(reversed(cursor.fetchall()))
    spiked = spike_rows(run_id, ordered, history, rule, _AT)
    flagged = list(rows)
    if spiked:
        _insert(cursor, "spikes", _SPIKE_COLUMNS, ("run_id", "step", "what"), spiked, dialect)
        flagged = _flagged(flagged, spiked)
    if not norms:
        return flagged
    kept = {row[_AT["step"]] for row in ordered if row[_AT["overflow"]]}
    kept.update(row[1] for row in spiked)
    norm_rows = [
        (run_id, step, position, str(name)[:PARAM_NAME_LENGTH], _finite(norm))
        for step, position, name, norm in norms
        if step in kept
    ]
    if norm_rows:
        key = ("run_id", "step", "position")
        _insert(cursor, "param_norms", _NORM_COLUMNS, key, norm_rows, dialect)
    return flagged


def _flagged(
    rows: list[tuple[Any, ...]], spiked: Sequence[tuple[int, int, str, float, float]]
) -> list[tuple[Any, ...]]:
    """``rows`` with the flag of each spike set (``loss_spike``, ``grad_norm_spike``)."""
    flags = {(step, what) for _, step, what, _, _ in spiked}
    step_at = _AT["step"]
    out: list[tuple[Any, ...]] = []
    for row in rows:
        step = row[step_at]
        if (step, "loss") in flags or (step, "grad_norm") in flags:
            changed = list(row)
            for what in ("loss", "grad_norm"):
                if (step, what) in flags:
                    changed[_FLAG[what]] = True
            row = tuple(changed)
        out.append(row)
    return out


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _insert(
    cursor: Any,
    table: str,
    columns: Sequence[str],
    key: Sequence[str],
    rows: Sequence[Sequence[Any]],
    dialect: str,
) -> None:
    if dialect == "sqlite":
        insert_rows(cursor, f"INSERT OR REPLACE INTO {table} ({', '.join(columns)})", rows)
    else:
        postgres.upsert_rows(cursor, table, columns, key, rows)
