"""The live stream's page encoder writes exactly what the JSON encoder writes."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from scalewatch.app.live.sse import sse_event, step_events
from scalewatch.store.queries import step_dict


def row(step: int, **changes: Any) -> tuple[Any, ...]:
    values: dict[str, Any] = {
        "step": step,
        "wall_time": 1700000000.123456 + step / 7,
        "scale": 65536.0,
        "overflow": 0,
        "skipped": 0,
        "inf_ranks": "",
        "scale_after": 65536.0,
        "growth_tracker": step % 2000,
        "growth_interval": 2000,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "control_version": 0,
        "loss": 2.75,
        "loss_nonfinite_ranks": "",
        "params_omitted": 0,
        "lr": 0.001,
        "lr_groups": None,
        "schedule_drift": None,
        "grad_norm": None,
        "loss_spike": 0,
        "grad_norm_spike": 0,
        "spike_skipped": 0,
    }
    values.update(changes)
    return tuple(values.values())


def reference(rows: list[tuple[Any, ...]]) -> str:
    return "".join(sse_event("step", step_dict(r), r[0]) for r in rows)


def test_a_random_page_is_the_json_encoders() -> None:
    rng = random.Random(3)
    rows = [
        row(
            step,
            wall_time=rng.uniform(0, 2e9),
            scale=2.0 ** rng.randint(-30, 40),
            overflow=int(step % 5 == 0),
            skipped=int(step % 5 == 0),
            inf_ranks=",".join(map(str, sorted(rng.sample(range(64), step % 4)))),
            scale_after=rng.random() * 1e-300,
            growth_tracker=rng.randint(0, 2**31),
            growth_factor=1.0 + rng.random(),
            backoff_factor=rng.random(),
            control_version=rng.randint(0, 10**12),
            loss=rng.choice([None, rng.uniform(-1e6, 1e6), rng.random() * 1e-300]),
            loss_nonfinite_ranks=",".join(map(str, sorted(rng.sample(range(8), step % 3)))),
            params_omitted=rng.choice([0, 0, rng.randint(1, 10**6)]),
            lr=rng.choice([None, rng.uniform(1e-6, 1e-2)]),
            schedule_drift=rng.choice([None, 0, rng.randint(1, 10**6)]),
            grad_norm=rng.choice([None, rng.uniform(0, 1e4), rng.random() * 1e-300]),
            loss_spike=int(step % 7 == 0),
            grad_norm_spike=int(step % 11 == 0),
            spike_skipped=int(step % 13 == 0),
        )
        for step in range(1000, 1500)
    ]
    assert step_events(rows) == reference(rows)
    assert step_events([]) == ""


@pytest.mark.parametrize(
    "change",
    [
        {"scale": math.inf},
        {"scale_after": -math.inf},
        {"wall_time": math.nan},
        {"inf_ranks": "01,3"},
        {"inf_ranks": "1, 3"},
        {"inf_ranks": None},
        {"growth_tracker": 5.0},
        {"scale": 65536},
        {"overflow": None},
        {"overflow": 2},
        {"loss": None},
        {"loss": math.inf},
        {"loss": 3},
        {"loss": "2.5"},
        {"loss_nonfinite_ranks": "1,"},
        {"params_omitted": None},
        {"lr": None},
        {"lr": math.nan},
        {"lr": 1},
        {"lr_groups": "[[0.001,0.0005],[0.01]]"},
        {"lr_groups": "[[0.001,null]]"},
        {"schedule_drift": 3},
        {"schedule_drift": 3.0},
        {"schedule_drift": True},
    ],
)
def test_a_page_with_an_odd_value_is_still_the_json_encoders(change: dict[str, Any]) -> None:
    rows = [row(1), row(2, **change), row(3)]
    try:
        expected = reference(rows)
    except (TypeError, ValueError, AttributeError):  # step_dict itself refuses it
        with pytest.raises((TypeError, ValueError, AttributeError)):
            step_events(rows)
        return
    assert step_events(rows) == expected
