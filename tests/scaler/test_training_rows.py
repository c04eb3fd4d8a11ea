"""A clean cpu step's row as the training thread hands it to a writer process: plain
values the garbage collector stops tracking, and the same ``steps`` row whichever way the
writer process makes it (``row_values`` straight, or ``step_values`` of ``record_of``)."""

from __future__ import annotations

import gc
import math
import threading
from typing import Any

import pytest
import torch

import scalewatch
from scalewatch._control.inbox import ControlInbox
from scalewatch._recording import RunOpening, RunSession
from scalewatch._step_sample import record_of, row_values, step_rates
from scalewatch.store.step_rows import step_values


class KeptRows:
    """A run's telemetry that takes rows from the training thread and keeps them."""

    uid: str | None = None
    run_id: int | None = None
    dropped = 0
    threads: tuple[threading.Thread, ...] = ()
    closed = False

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.add_row = self.rows.append

    def submit(self, samples: list[Any]) -> None:
        raise AssertionError("a clean cpu step goes as a row")

    def note_scale_load(self, load: Any) -> None:
        pass

    def flush(self, timeout: float = 30.0) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


def _rows(optimizers: int, groups: int, steps: int = 6) -> list[tuple[Any, ...]]:
    torch.manual_seed(0)
    gs = scalewatch.GradScaler("cpu", init_scale=2.0**10)
    kept = KeptRows()

    def make(opening: RunOpening, inbox: ControlInbox) -> KeptRows:
        return kept

    gs._session = RunSession(gs._inbox, make)
    gs._telemetry_option = True  # a reporting rank's run, with the telemetry made above
    params = [torch.nn.Parameter(torch.randn(4)) for _ in range(optimizers * groups)]
    opts = [
        torch.optim.SGD(
            [{"params": [params[o * groups + g]], "lr": 0.1 / (g + 1)} for g in range(groups)]
        )
        for o in range(optimizers)
    ]
    for _ in range(steps):
        loss = sum((p * p).sum() for p in params)
        assert isinstance(loss, torch.Tensor)
        gs.scale(loss).backward()
        for opt in opts:
            gs.step(opt)
            opt.zero_grad()
        gs.update()
    return kept.rows


def test_a_row_of_one_rate_is_plain_and_left_untracked() -> None:
    rows = _rows(optimizers=1, groups=1)
    assert len(rows) == 6
    gc.collect()
    # Tracked rows waiting to be sent were promoted, generation by generation, and
    # brought on full collections of the whole training process.
    assert [gc.is_tracked(row) for row in rows] == [False] * 6
    assert all(row[13] == pytest.approx(0.1) for row in rows)


@pytest.mark.parametrize(("optimizers", "groups"), [(1, 1), (1, 2), (2, 1)])
def test_the_writer_makes_the_same_steps_row_either_way(optimizers: int, groups: int) -> None:
    rows = _rows(optimizers, groups)
    for row in rows:
        straight, through_record = row_values(row), step_values(record_of(row))
        assert len(straight) == len(through_record)
        for a, b in zip(straight, through_record, strict=True):
            assert type(a) is type(b)
            assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))
    lr, groups_kept = step_rates(rows[0][13])
    assert lr == pytest.approx(0.1)
    # every optimizer's first group runs at 0.1: the groups are kept where one differs
    assert (groups_kept is None) == (groups == 1)


def test_a_row_of_several_rates_keeps_them_all() -> None:
    row = _rows(optimizers=1, groups=2)[0]
    lr, groups = step_rates(row[13])
    assert lr == pytest.approx(0.1)
    assert groups == ((pytest.approx(0.1), pytest.approx(0.05)),)
    record = record_of(row)
    assert record.lr == pytest.approx(0.1)
    assert record.lr_groups is not None
