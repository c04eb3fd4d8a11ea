"""The service's autopilot loop: every few seconds, each run whose autopilot is on is
evaluated by the policy, and a change it decides on is filed as an ordinary control
request (``source`` and ``requested_by`` "autopilot", the reason in the audit trail).

A tick costs one query for the runs, and for each run with new steps two small ones (its
requests, an aggregate over at most ``WINDOW_COOLDOWNS`` cooldowns of steps); a run with
no new step since the last tick costs nothing more.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
from sqlalchemy.exc import DBAPIError

from scalewatch.store.autopilot import (
    REQUESTED_BY,
    AutopilotRow,
    RunFacts,
    enabled_autopilots,
    runs_without_autopilot,
    save_decision,
    set_autopilot,
)
from scalewatch.store.engine import Store
from scalewatch.store.errors import ControlValidationError, RunNotFound, RunNotRunning
from scalewatch.store.states import RunStatus
from scalewatch.store.summaries import request_summary, step_summary

from ..alerts.config import AutopilotRule
from .policy import Action, Control, Decision, Memory, Settings, Window, decide

__all__ = ["REFRESH_S", "REQUESTED_BY", "WINDOW_COOLDOWNS", "AutopilotLoop", "run_loop"]

# The skip rate is judged over at most this many cooldowns of steps since the last change.
WINDOW_COOLDOWNS = 4
# A hold of the same reason is written again after this many seconds, so that GET shows
# figures this recent; a new reason is written at once.
REFRESH_S = 5.0

log = logging.getLogger("scalewatch.app.autopilot")


class AutopilotLoop:
    """Evaluates the store's enabled autopilots, one :meth:`tick` at a time."""

    def __init__(
        self,
        store: Store,
        *,
        rules: Sequence[AutopilotRule] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.rules = tuple(rules)  # the rules file's [[autopilot]] tables
        self.clock = clock
        self.ticks = 0  # ticks done: tests wait on it
        self._seen: dict[int, int] = {}  # run id -> the last step evaluated
        self._ruled: set[int] = set()  # runs the rules were applied to, or matched none

    def tick(self) -> None:
        now = self.clock()
        if self.rules:
            self._apply_rules(now)
        for row, run in enabled_autopilots(self.store, now=now):
            if run.status is not RunStatus.RUNNING or self._seen.get(row.run_id) == run.last_step:
                continue
            self._seen[row.run_id] = run.last_step
            self.evaluate(row, run, now)
        self.ticks += 1

    def _apply_rules(self, now: float) -> None:
        """Turn the autopilot on, as the first rule whose glob matches its name says, for
        each running run whose autopilot was never set (one a person turned off stays off)."""
        for run_id, name in runs_without_autopilot(self.store, now=now):
            if run_id in self._ruled:
                continue
            self._ruled.add(run_id)
            rule = next((rule for rule in self.rules if rule.applies_to(name)), None)
            if rule is None:
                continue
            try:
                set_autopilot(self.store, run_id, rule.settings, now=now)
            except (ControlValidationError, RunNotFound, RunNotRunning) as error:
                log.warning("scalewatch: autopilot rule %r not applied to run %d: %s",
                            rule.run, run_id, error)  # fmt: skip
            else:
                log.info("scalewatch: autopilot on for run %d (%s) by rule %r", run_id, name,
                         rule.run)  # fmt: skip

    def evaluate(self, row: AutopilotRow, run: RunFacts, now: float) -> Decision | None:
        """Decide for one run, file the change if any, record the decision."""
        requests = request_summary(self.store, row.run_id, since=now - 3600.0)
        start = max(requests.changed_at_step, run.last_step - WINDOW_COOLDOWNS * row.cooldown_steps)
        steps = step_summary(self.store, row.run_id, after=start)
        if steps is None:
            return None
        last_overflow = steps.last_overflow
        window = Window(
            steps=steps.steps,
            skipped=steps.skipped,
            streaks=steps.streaks,
            overflow_free=steps.steps if last_overflow is None else steps.last_step - last_overflow,
            scale_max=steps.scale_max,
            scale_now=steps.scale_now,
        )
        memory = Memory(
            steps_since_change=steps.last_step - requests.changed_at_step,
            pending=requests.pending,
            changes_last_hour=requests.changes_since,
            helped_below=row.helped_below,
            misses=row.misses,
        )
        decision = decide(window, _control(run.control), _settings(row), memory)
        record = {**decision.to_dict(), "step": steps.last_step, "at": now, "request_id": None}
        if not decision.values and not self._worth_writing(row, decision, now):
            return decision
        gave_up = decision.reason if decision.action is Action.GIVE_UP else None
        save_decision(  # files decision.values, if any, in the same transaction
            self.store,
            row.run_id,
            decision=record,
            misses=decision.misses,
            helped_below=decision.helped_below,
            gave_up=gave_up,
            change=decision.values,
            now=now,
        )
        return decision

    @staticmethod
    def _worth_writing(row: AutopilotRow, decision: Decision, now: float) -> bool:
        last = row.decision or {}
        if last.get("code") != decision.code or row.misses != decision.misses:
            return True
        return bool(now - float(last.get("at", 0.0)) >= REFRESH_S)


def _control(control: dict[str, Any]) -> Control:
    return Control(
        growth_interval=int(control.get("growth_interval") or 1),
        min_scale=control.get("min_scale"),
        max_scale=control.get("max_scale"),
    )


def _settings(row: AutopilotRow) -> Settings:
    return Settings(
        target_skip_rate=row.target_skip_rate,
        min_growth_interval=row.min_growth_interval,
        max_growth_interval=row.max_growth_interval,
        min_scale=row.min_scale,
        cooldown_steps=row.cooldown_steps,
        max_changes_per_hour=row.max_changes_per_hour,
    )


async def run_loop(loop: AutopilotLoop, interval_s: float) -> None:
    """Tick every ``interval_s`` until cancelled; a failing tick (the store unavailable for
    a while) is logged, once until one succeeds again, and the next one tries again."""
    failing = False
    while True:
        try:
            await anyio.to_thread.run_sync(loop.tick)
        except DBAPIError as error:  # the store away a while: one line, as the routes say it
            if not failing:
                log.warning(
                    "scalewatch: the autopilot cannot read the store (%s); it tries again",
                    type(error.orig or error).__name__,
                )
            failing = True
        except Exception:
            if not failing:
                log.exception("scalewatch: the autopilot's evaluation failed; it tries again")
            failing = True
        else:
            if failing:
                log.warning("scalewatch: the autopilot evaluates runs again")
            failing = False
        await anyio.sleep(interval_s)
