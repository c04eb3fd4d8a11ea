"""Step histories for the autopilot's tests: torch's scaler rules over a run whose scale
overflows above a ceiling (or at chosen steps), and the policy's window of a history."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scalewatch.app.autopilot.policy import Window
from scalewatch.store.records import StepRecord
from tests._helpers.records import step_record


@dataclass
class Simulated:
    """A scaler's state between steps (torch's rules, growth and backoff factors 2 and 0.5)."""

    scale: float = 2.0**16
    tracker: int = 0
    step: int = 0
    interval: int = 20
    min_scale: float | None = None

    def run(self, steps: int, overflows: Callable[[int, float], bool]) -> list[StepRecord]:
        """``steps`` more steps; ``overflows(step, scale)`` says which overflow."""
        records = []
        for _ in range(steps):
            self.step += 1
            scale, overflow = self.scale, overflows(self.step, self.scale)
            if overflow:
                after, self.tracker = scale * 0.5, 0
            elif self.tracker + 1 >= self.interval:
                after, self.tracker = scale * 2.0, 0
            else:
                after, self.tracker = scale, self.tracker + 1
            if self.min_scale is not None:
                after = max(after, self.min_scale)
            records.append(
                step_record(
                    self.step,
                    scale=scale,
                    overflow=overflow,
                    inf_ranks=(0,) if overflow else (),
                    scale_after=after,
                    growth_tracker=self.tracker,
                    growth_interval=self.interval,
                )
            )
            self.scale = after
        return records


def above(ceiling: float) -> Callable[[int, float], bool]:
    return lambda _step, scale: scale > ceiling


def window(records: Sequence[StepRecord], previous: StepRecord | None = None) -> Window:
    """The policy's window of ``records``, worked out by brute force; ``previous`` is the
    step before the first (it says whether the first continues a streak)."""
    streaks, before = 0, previous.overflow if previous is not None else False
    for record in records:
        streaks += record.overflow and not before
        before = record.overflow
    overflowed = [r.step for r in records if r.overflow]
    return Window(
        steps=len(records),
        skipped=sum(r.skipped for r in records),
        streaks=streaks,
        overflow_free=records[-1].step - overflowed[-1] if overflowed else len(records),
        scale_max=max(max(r.scale for r in records), records[-1].scale_after),
        scale_now=records[-1].scale_after,
    )
