"""The live stream's wire format: server-sent events, encoded once and sent as bytes.

>>> sse_event("end", {"status": "finished"})
'event: end\\ndata: {"status":"finished"}\\n\\n'
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from itertools import chain
from math import copysign, isfinite
from typing import Any

from scalewatch.store.step_rows import step_dict
from scalewatch.store.step_schema import STEP_FIELDS, Kind, StepField

__all__ = [
    "KEEP_ALIVE",
    "coalesced_event",
    "opening",
    "plain_step_events",
    "sse_event",
    "step_events",
]

KEEP_ALIVE = b": keep-alive\n\n"

_JSON = json.JSONEncoder(separators=(",", ":"))


def opening(run_id: int, after: int) -> bytes:
    """A stream's first bytes: the client's reconnection delay, and where it starts.

    >>> opening(3, 41)
    b'retry: 1000\\n: streaming run 3 after step 41\\n\\n'
    """
    return f"retry: 1000\n: streaming run {run_id} after step {after}\n\n".encode()


def sse_event(event: str, data: Any, event_id: int | None = None) -> str:
    """One event, its data as compact JSON, with its ``id`` when it has one."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {_JSON.encode(data)}\n\n"


def coalesced_event(after: int, to: int) -> bytes:
    """The marker of steps a stream skipped while the service was busy: those after
    ``after`` up to ``to`` (the store keeps them). Its id is ``to``, so a client that
    reconnects resumes after the gap.

    >>> coalesced_event(41, 900)
    b'id: 900\\nevent: coalesced\\ndata: {"after":41,"to":900}\\n\\n'
    """
    return sse_event("coalesced", {"after": after, "to": to}, to).encode()


def _placeholder(f: StepField) -> str:
    """Where a field's value goes in the fast path's event: its JSON, as ``%`` writes it."""
    if f.kind is Kind.RANKS:
        return "[%s]"
    if f.nullable or f.kind in (Kind.BOOL, Kind.FLOAT_GROUPS):
        return "%s"  # "null", "true"/"false", or the value's own JSON
    return "%d" if f.kind is Kind.INT else "%r"


_SSE_KEYS = tuple(f.sse_key for f in STEP_FIELDS)
_STEP_EVENT = (
    "id: %d\nevent: step\ndata: {"
    + ",".join(f'"{f.sse_key}":{_placeholder(f)}' for f in STEP_FIELDS)
    + "}\n\n"
)


def _columns(*kinds: Kind, nullable: bool) -> tuple[int, ...]:
    return tuple(i for i, f in enumerate(STEP_FIELDS) if f.kind in kinds and f.nullable is nullable)


_INTS = _columns(Kind.INT, nullable=False)
_FLOATS = _columns(Kind.FLOAT, nullable=False)
_BOOLS = _columns(Kind.BOOL, nullable=False)
_RANKS = _columns(Kind.RANKS, nullable=False)
_MAYBE_FLOATS = _columns(Kind.FLOAT, nullable=True)  # finite floats or None
_MAYBE_INTS = _columns(Kind.INT, nullable=True)  # ints or None
_GROUPS = _columns(Kind.FLOAT_GROUPS, nullable=True)  # None in the fast path
_JSON_BOOL = {False: "false", True: "true"}.__getitem__
_RANK = r"(?:0|[1-9][0-9]*)"
# Ranks strings of a page joined by ";": "1,3;;0" (what write_steps stores).
_RANK_LISTS = re.compile(rf"(?:{_RANK}(?:,{_RANK})*)?(?:;(?:{_RANK}(?:,{_RANK})*)?)*")


def step_events(rows: Sequence[Sequence[Any]]) -> str:
    """The ``event: step`` events of raw step rows (the ``steps`` columns' order): for each,
    exactly ``sse_event("step", step_dict(row, keys), step)`` with the fields' stream keys.

    :func:`plain_step_events` writes most pages; a page with anything else (a non-finite
    float, a value of another type, ranks not in canonical form, learning rates by group)
    goes through the JSON encoder.
    """
    fast = plain_step_events(rows)
    if fast is not None:
        return fast
    return "".join(sse_event("step", step_dict(row, _SSE_KEYS), row[0]) for row in rows)


def plain_step_events(rows: Sequence[Sequence[Any]]) -> str | None:
    """:func:`step_events` of a page of plain rows, None for any other page.

    A plain row is ints, finite floats, 0/1 flags, ranks strings like ``"1,3"``, a loss and
    a learning rate that are finite floats or None and no ``lr_groups``, so one ``%`` over
    the whole page writes what the JSON encoder would (``repr`` of a float is its JSON)
    several times faster. A plain row is also stored and read back as it is, on SQLite
    and PostgreSQL: -0.0 (which SQLite reads back as 0.0) is not plain.
    """
    if not rows:
        return ""
    width = len(STEP_FIELDS)
    values = list(chain.from_iterable(rows))
    columns = {i: values[i::width] for i in (*_INTS, *_FLOATS, *_RANKS, *_MAYBE_FLOATS)}
    present = [v for i in _MAYBE_FLOATS for v in columns[i] if v is not None]
    floats = [v for i in _FLOATS for v in columns[i]]
    zero = 0.0 in floats or 0.0 in present
    if not (
        all(set(map(type, columns[i])) == {int} for i in _INTS)
        and all(set(map(type, columns[i])) == {float} for i in _FLOATS)
        and all(map(isfinite, floats))
        and set(map(type, present)) <= {float}
        and all(map(isfinite, present))
        and not (zero and _negative_zero(floats, present))
    ):
        return None
    if not (
        all(values[i::width].count(None) == len(rows) for i in _GROUPS)
        and all(set(map(type, values[i::width])) <= {int, type(None)} for i in _MAYBE_INTS)
        and all(set(map(type, columns[i])) == {str} for i in _RANKS)
        and all(_RANK_LISTS.fullmatch(";".join(columns[i])) is not None for i in _RANKS)
    ):
        return None
    out: list[Any] = [None] * (len(rows) * (width + 1))
    # Column 0 twice: the step is the event's id and the first field of its data.
    out[0 :: width + 1] = columns[0]
    for i in range(width):
        column = columns[i] if i in columns else values[i::width]
        if i in _BOOLS:
            column = list(map(_JSON_BOOL, map(bool, column)))
        elif i in _MAYBE_FLOATS:
            column = ["null" if v is None else repr(v) for v in column]
        elif i in _GROUPS:
            column = ["null"] * len(rows)
        elif i in _MAYBE_INTS:
            column = ["null" if v is None else v for v in column]
        out[i + 1 :: width + 1] = column
    return (_STEP_EVENT * len(rows)) % tuple(out)


def _negative_zero(*groups: list[float]) -> bool:
    return any(v == 0.0 and copysign(1.0, v) < 0 for group in groups for v in group)
