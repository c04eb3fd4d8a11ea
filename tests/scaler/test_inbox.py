"""The control inbox (scalewatch._control.inbox): requests in order, changes by code once."""

from __future__ import annotations

import torch

import scalewatch
from scalewatch._control import ControlUpdate
from scalewatch._control.inbox import ControlInbox


def test_requests_leave_oldest_first_and_changes_by_code_are_taken_once() -> None:
    inbox = ControlInbox()
    for request_id in (1, 2, 3):
        inbox.post(ControlUpdate(request_id, {"growth_interval": request_id}))
    assert len(inbox) == 3
    assert inbox.take_one().request_id == 1
    assert [update.request_id for update in inbox.take_all()] == [2, 3]
    assert not inbox and inbox.take_all() == []
    assert inbox.take_by_code() == ()


def test_a_setter_change_rides_with_the_next_step_only() -> None:
    gs = scalewatch.GradScaler("cpu", telemetry=False)
    gs.set_growth_interval(7)
    (outcome,) = gs._inbox.take_by_code()
    assert outcome.values == {"growth_interval": 7} and outcome.applied
    assert gs._inbox.take_by_code() == ()


def test_a_posted_request_is_applied_at_the_next_update() -> None:
    gs = scalewatch.GradScaler("cpu", init_scale=8.0, telemetry=False)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gs._inbox.post(ControlUpdate(5, {"growth_interval": 3}))
    gs.scale(model(torch.ones(1, 2)).sum()).backward()
    gs.step(opt)
    gs.update()
    assert gs.control_state()["growth_interval"] == 3 and not gs._inbox
