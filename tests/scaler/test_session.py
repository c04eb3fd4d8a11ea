"""A scaler's run session (scalewatch._recording.RunSession): telemetry made by the factory
it was given, with what the scaler opens its run with, on the reporting rank only."""

from __future__ import annotations

import threading
from typing import Any

import torch

import scalewatch
from scalewatch._control.inbox import ControlInbox
from scalewatch._recording import RunOpening, RunSession
from scalewatch._recording.recorder import StepSample
from scalewatch.store.records import ScaleLoad
from tests.scaler._kept_samples import KeptSamples


class Factory:
    """Makes a KeptSamples per opening, and notes what it was given."""

    def __init__(self) -> None:
        self.openings: list[tuple[RunOpening, ControlInbox]] = []
        self.samples: list[StepSample] = []

    def __call__(self, opening: RunOpening, inbox: ControlInbox) -> KeptSamples:
        self.openings.append((opening, inbox))
        made = KeptSamples(self.samples)
        made.uid = f"uid-{len(self.openings)}"
        return made


def _steps(gs: Any, count: int) -> None:
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(count):
        opt.zero_grad()
        gs.scale(model(torch.ones(1, 2)).sum()).backward()
        gs.step(opt)
        gs.update()


def test_the_first_step_opens_telemetry_through_the_factory_with_the_run_it_names() -> None:
    gs = scalewatch.GradScaler("cpu", init_scale=4.0, growth_interval=5, run_name="named")
    factory = Factory()
    gs._session = RunSession(gs._inbox, factory)
    _steps(gs, 3)
    assert gs.flush()
    ((opening, inbox),) = factory.openings
    assert inbox is gs._inbox
    assert (opening.name, opening.world_size, opening.uid) == ("named", 1, None)
    assert opening.config["growth_interval"] == 5 and opening.control["growth_interval"] == 5
    assert gs.run_uid == "uid-1"
    assert [sample.record.step for sample in factory.samples] == [1, 2, 3]
    assert [sample.record.scale for sample in factory.samples] == [4.0, 4.0, 4.0]
    gs.close()


def test_telemetry_off_opens_a_recorder_and_no_telemetry() -> None:
    gs = scalewatch.GradScaler("cpu", telemetry=False)
    factory = Factory()
    gs._session = RunSession(gs._inbox, factory)
    _steps(gs, 2)
    assert factory.openings == [] and gs._session.telemetry is None
    assert gs.stats().steps == 2 and gs.run_uid is None


def test_a_load_noted_before_the_first_step_opens_with_the_run() -> None:
    session = RunSession(ControlInbox(), Factory())
    load = ScaleLoad(step=9, at=1.0, scale_after=8.0)
    session.pending_load = load
    owner = threading.Event()  # any object that can be weakly referenced
    opening = RunOpening(target=None, name=None, world_size=1, config={}, control={}, uid="u")
    assert session.open(owner, 8.0, opening, on_cpu=True) == "uid-1"
    factory = session._make_telemetry
    assert isinstance(factory, Factory) and factory.openings[0][0].scale_load == load
    assert session.pending_load is None and session.is_open
    session.close()
