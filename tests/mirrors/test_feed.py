"""A scaler's mirrors: what they are handed follows the step schema, off the training
thread; a tracker that blocks or fails costs the training nothing and the store no record."""

from __future__ import annotations

import copy
import logging
import math
import sys
import threading
import time
from typing import Any

import pytest

import scalewatch
from scalewatch.mirrors import Mirror, MirroredStep, RunLinks
from scalewatch.mirrors._base import PREFIX
from scalewatch.store.step_schema import MIRRORED
from scalewatch.telemetry import TelemetrySettings
from tests._helpers.mirrors import STEPS, stored_steps, train


class Kept(Mirror):
    """Keeps what it is given, and on which thread."""

    name = "kept"

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[MirroredStep] = []
        self.links: list[RunLinks] = []
        self.threads: set[str] = set()
        self.closed = 0

    def write(self, steps: list[MirroredStep]) -> None:
        self.threads.add(threading.current_thread().name)
        self.steps += steps

    def describe(self, links: RunLinks) -> None:
        self.links.append(links)

    def close(self) -> None:
        self.closed += 1


class Blocked(Kept):
    """A tracker that hangs until it is let go."""

    name = "blocked"

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def write(self, steps: list[MirroredStep]) -> None:
        self.entered.set()
        assert self.release.wait(60)
        super().write(steps)


class Failing(Mirror):
    name = "failing"

    def write(self, steps: list[MirroredStep]) -> None:
        raise ConnectionError("tracker unreachable\nsecond line")

    def describe(self, links: RunLinks) -> None:
        raise ConnectionError("tracker unreachable")


@pytest.mark.heavy
@pytest.mark.parametrize("writer", ["process", "thread"])
def test_mirrors_get_every_step_off_the_training_thread(
    db_url: str, writer: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three mirrors on one scaler: one keeps what it gets, one hangs until the training is
    done, one raises at every call. Training finishes while the hung one still hangs; the
    store has every step; the one that keeps them got every step, each with the values of
    every field the step schema mirrors, named under scalewatch/; the failures are counted
    and said in one line."""
    monkeypatch.setenv("SCALEWATCH_DASHBOARD_URL", "http://127.0.0.1:8765/")
    kept, blocked, failing = Kept(), Blocked(), Failing()
    scaler = scalewatch.GradScaler(
        "cpu",
        init_scale=2.0**18,
        telemetry=TelemetrySettings(db_url, writer=writer),
        mirrors=[kept, blocked, failing],
    )
    with caplog.at_level(logging.WARNING, logger="scalewatch"):
        started = time.monotonic()
        train(scaler)
        trained_in = time.monotonic() - started
        assert scaler.flush(30)
        assert blocked.entered.wait(30)  # its thread holds a batch, and hangs
        assert not blocked.release.is_set() and blocked.steps == []
        blocked.release.set()
        scaler.close()
    rows = stored_steps(db_url)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert (
        [s.step for s in kept.steps] == [s.step for s in blocked.steps] == [r["step"] for r in rows]
    )
    assert trained_in < 30
    assert kept.threads == {"scalewatch-mirror-kept"}
    for step, row in zip(kept.steps, rows, strict=True):
        expected = {
            PREFIX + f.mirror_name: float(row[f.name])
            for f in MIRRORED
            if row[f.name] is not None and math.isfinite(row[f.name])
        }
        assert step.values == expected
        assert step.wall_time == row["wall_time"]
    names = set(kept.steps[-1].values)
    assert {"loss_scale", "overflow", "skipped", "growth_tracker", "schedule_drift"} <= {
        n.removeprefix(PREFIX) for n in names
    }
    assert "scalewatch/learning_rate" in names
    assert any(s.values["scalewatch/overflow"] for s in kept.steps)  # the first steps
    (links,) = kept.links
    assert links.run_id == scaler.run_id and links.uid == scaler.run_uid
    assert links.page == f"http://127.0.0.1:8765/run.html?run={scaler.run_id}"
    assert kept.closed == blocked.closed == 1
    assert failing.failures >= 2 and failing.dropped == STEPS
    said = [r.getMessage() for r in caplog.records if "mirror" in r.getMessage()]
    assert said == [
        "scalewatch: the failing mirror failed (ConnectionError: tracker unreachable);"
        " scalewatch's own records are kept, and its later failures only counted"
    ]


def test_mirrors_are_refused_without_telemetry() -> None:
    with pytest.raises(ValueError, match="need telemetry on"):
        scalewatch.GradScaler("cpu", telemetry=False, mirrors=[Kept()])
    with pytest.raises(TypeError, match=r"scalewatch\.mirrors\.Mirror"):
        scalewatch.GradScaler("cpu", mirrors=["tensorboard"])


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("comet", "SCALEWATCH_MIRROR: unknown tracker 'comet' (one of tensorboard, mlflow, wandb)"),
        ("mlflow:./x", "SCALEWATCH_MIRROR: mlflow takes no folder, got 'mlflow:./x'"),
    ],
)
def test_a_bad_mirror_variable_is_refused_at_construction(
    value: str, error: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCALEWATCH_MIRROR", value)
    with pytest.raises(ValueError) as raised:
        scalewatch.ShardedGradScaler("cpu")
    assert str(raised.value) == error
    scalewatch.GradScaler("cpu", telemetry=False)  # telemetry off: nothing to mirror


@pytest.mark.parametrize(
    ("tracker", "module", "extra"),
    [
        ("TensorBoard", "tensorboard", "tensorboard"),
        ("MLflow", "mlflow", "mlflow"),
        ("WandB", "wandb", "wandb"),
    ],
)
def test_a_missing_tracker_is_refused_in_one_line_naming_its_extra(
    tracker: str, module: str, extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    make: Any = getattr(scalewatch.mirrors, tracker)
    with pytest.raises(ImportError) as raised:
        make()
    assert str(raised.value) == (
        f"scalewatch.mirrors.{tracker} needs {module}: pip install scalewatch[{extra}]"
    )
    monkeypatch.setenv("SCALEWATCH_MIRROR", extra)
    with pytest.raises(ImportError, match=rf"pip install scalewatch\[{extra}\]"):
        scalewatch.GradScaler("cpu")


def test_a_copy_of_a_scaler_mirrors_nothing() -> None:
    """A copy (pickle, deepcopy) starts a run of its own: the trackers show the original's."""
    scaler = scalewatch.GradScaler("cpu", mirrors=[Kept()])
    assert copy.deepcopy(scaler).mirrors == ()


def test_the_public_names_are_pinned() -> None:
    assert scalewatch.mirrors.__all__ == [
        "MLflow",
        "Mirror",
        "MirroredStep",
        "RunLinks",
        "TensorBoard",
        "WandB",
    ]


def test_close_waits_for_a_hung_tracker_no_longer_than_its_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """At close, a tracker that hangs holds the exit up to the bound, no more; what it did
    not write is counted and said."""
    from scalewatch._step_sample import StepSample
    from scalewatch.mirrors._feed import MirrorFeed
    from scalewatch.store.records import StepRecord

    hung = Blocked()
    feed = MirrorFeed([hung], lambda: ("uid", 1))
    record = StepRecord(
        step=1, wall_time=1.0, scale=8.0, overflow=False, skipped=False, inf_ranks=(),
        scale_after=8.0, growth_tracker=1, growth_interval=100, growth_factor=2.0,
        backoff_factor=0.5, control_version=0,
    )  # fmt: skip
    feed.put([StepSample(record)])
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="scalewatch"):
        feed.close(timeout=0.5)
    assert time.monotonic() - started < 5.0
    assert hung.entered.is_set() and hung.dropped == 1
    assert [r.getMessage() for r in caplog.records] == [
        "scalewatch: the blocked mirror did not finish in 0.5 s; 1 steps not mirrored"
    ]
    hung.release.set()
