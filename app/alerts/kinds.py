"""Rule kinds: each a parameters model and the watch that evaluates it, registered with
:func:`~.watch.kind` in :data:`~.watch.KINDS` (in this order: the default rules' and
docs/ALERTS.md's). :mod:`.watch` says what a watch is, and how a new kind is written.
"""

from __future__ import annotations

from collections import Counter, deque

from pydantic import Field, model_validator

from scalewatch.store.forecast import WINDOW, ScaleStep, read_forecast

from .steps import StepBatch, StepView
from .units import Unit
from .watch import KINDS, Fed, Kind, Params, Reading, RunView, Watch, Windowed, kind

__all__ = [
    "KINDS",
    "AutopilotGaveUp",
    "Fed",
    "GradNormSpike",
    "Kind",
    "LossSpike",
    "Params",
    "RankHotspot",
    "Reading",
    "RunView",
    "ScaleBelow",
    "ScaleDrop",
    "ScaleForecastWatch",
    "ScheduleDrift",
    "SkipRate",
    "SkipStreak",
    "Stalled",
    "StepView",
    "Watch",
    "kind",
]


class Floor(Params):
    threshold: float = Field(default=1.0, gt=0, description="the lowest healthy scale")


@kind(
    "scale_below",
    Floor,
    "the scale after a step is under `threshold`",
    unit=Unit.SCALE,
    says="scale {value}",
)
class ScaleBelow(Watch[Floor]):
    def step(self, row: StepView) -> Reading:
        return Reading(row.scale_after < self.params.threshold, row.scale_after)

    def quiet(self, batch: StepBatch) -> Reading | None:
        floor = self.params.threshold
        if any(after < floor for after in batch.column("scale_after")):
            return None
        return Reading(False, batch.column("scale_after")[-1])


class Drops(Params):
    window: int = Field(default=100, gt=0, le=1_000_000)
    threshold: float = Field(default=8, ge=1, description="backoffs")


@kind(
    "scale_drop",
    Drops,
    "`threshold` backoffs or more within `window` steps",
    unit=Unit.COUNT,
    says="{value} backoffs {detail}",
)
class ScaleDrop(Windowed[Drops]):
    def __init__(self, params: Drops, run: RunView) -> None:
        super().__init__(params, run)
        self.within = f"within {self.window} steps"

    def step(self, row: StepView) -> Reading:
        self.slide(row, True if row.scale_after < row.scale else None)
        count = len(self.items)
        return Reading(count >= self.params.threshold, float(count), self.within)

    def quiet(self, batch: StepBatch) -> Reading | None:
        if any(
            after < before
            for before, after in zip(
                batch.column("scale"), batch.column("scale_after"), strict=True
            )
        ):
            return None
        self.pass_over(batch.steps)  # the count only falls
        return Reading(False, float(len(self.items)), self.within)


class Skips(Params):
    window: int = Field(default=200, gt=0, le=1_000_000)
    threshold: float = Field(default=0.05, ge=0, lt=1, description="share of skipped steps")


@kind(
    "skip_rate",
    Skips,
    "the share of skipped steps over the last `window` steps is above `threshold`"
    " (once the run has `window` steps)",
    unit=Unit.SHARE,
    says="{value} of the {detail} skipped",
)
class SkipRate(Windowed[Skips]):
    def __init__(self, params: Skips, run: RunView) -> None:
        super().__init__(params, run)
        self.seen: deque[int] = deque()  # every step in the window, for the rate's divisor

    def step(self, row: StepView) -> Reading:
        self.slide(row, True if row.skipped else None)
        self.seen.append(row.step)
        while self.seen[0] <= row.step - self.window:
            self.seen.popleft()
        rate = len(self.items) / len(self.seen)
        on = self.full(row) and rate > self.params.threshold
        return Reading(on, rate, f"last {len(self.seen)} steps" if on else "")

    def quiet(self, batch: StepBatch) -> Reading | None:
        """No skipped step: the rate stays 0, or, the window full before and no step
        missing, it only falls (each step adds one to the divisor as one leaves)."""
        steps = batch.steps
        if any(batch.column("skipped")):
            return None
        if self.items:
            last, first = (self.seen[-1], self.first) if self.seen else (None, None)
            if last is None or first is None or last - first + 1 < self.window:
                return None
            if steps[0] != last + 1 or steps[-1] - steps[0] != len(steps) - 1:
                return None
        self.pass_over(steps)
        self.seen.extend(steps)
        while self.seen[0] <= steps[-1] - self.window:
            self.seen.popleft()
        return Reading(False, len(self.items) / len(self.seen), "")


class Streak(Params):
    threshold: float = Field(default=10, ge=1, description="skipped steps in a row")


@kind(
    "skip_streak",
    Streak,
    "`threshold` skipped steps in a row or more",
    unit=Unit.COUNT,
    says="{value} skipped steps in a row",
)
class SkipStreak(Watch[Streak]):
    def __init__(self, params: Streak, run: RunView) -> None:
        super().__init__(params, run)
        self.streak = 0

    @property
    def history(self) -> int:
        return int(self.params.threshold)

    def step(self, row: StepView) -> Reading:
        self.streak = self.streak + 1 if row.skipped else 0
        return Reading(self.streak >= self.params.threshold, float(self.streak))

    def quiet(self, batch: StepBatch) -> Reading | None:
        if any(batch.column("skipped")):
            return None
        self.streak = 0
        return Reading(False, 0.0)


class Lead(Params):
    threshold: float = Field(default=10, ge=1, description="steps the schedule is ahead by")


@kind(
    "schedule_drift",
    Lead,
    "a registered LR scheduler has stepped on `threshold` skipped steps or more: the"
    " schedule runs that many steps ahead of the weights (`scaler.hold` keeps it at 0)",
    unit=Unit.COUNT,
    says="schedule ahead of the weights by {value} {detail}",
)
class ScheduleDrift(Watch[Lead]):
    def step(self, row: StepView) -> Reading:
        return self._reading(row.schedule_drift)

    def quiet(self, batch: StepBatch) -> Reading | None:
        lead = self.params.threshold
        if any(drift is not None and drift >= lead for drift in batch.column("schedule_drift")):
            return None
        return self._reading(batch.column("schedule_drift")[-1])

    def _reading(self, drift: int | None) -> Reading:
        if drift is None:
            return Reading(False, 0.0)
        return Reading(drift >= self.params.threshold, float(drift), _steps(drift))


class Spikes(Params):
    window: int = Field(default=1000, gt=0, le=1_000_000)
    threshold: float = Field(default=1, ge=1, description="spikes within the window")


class _SpikeWatch(Windowed[Spikes]):
    """Counts the steps of the last ``window`` whose ``flag`` is set."""

    flag = ""

    def __init__(self, params: Spikes, run: RunView) -> None:
        super().__init__(params, run)
        self.within = f"within {self.window} steps"

    def step(self, row: StepView) -> Reading:
        self.slide(row, True if getattr(row, self.flag) else None)
        count = len(self.items)
        return Reading(count >= self.params.threshold, float(count), self.within)

    def quiet(self, batch: StepBatch) -> Reading | None:
        if any(batch.column(self.flag)):
            return None
        self.pass_over(batch.steps)  # the count only falls
        return Reading(False, float(len(self.items)), self.within)


@kind(
    "loss_spike",
    Spikes,
    "`threshold` loss spikes or more within `window` steps: a step's loss far above the"
    " run's recent history (robust z over the run's spike window; overflow steps are none)",
    unit=Unit.COUNT,
    says="{value} loss spikes {detail}",
)
class LossSpike(_SpikeWatch):
    flag = "loss_spike"


@kind(
    "grad_norm_spike",
    Spikes,
    "`threshold` gradient-norm spikes or more within `window` steps: a step's gradient norm"
    " far above the run's recent history (runs that record the norm)",
    unit=Unit.COUNT,
    says="{value} gradient-norm spikes {detail}",
)
class GradNormSpike(_SpikeWatch):
    flag = "grad_norm_spike"


def _steps(count: int) -> str:
    return "step" if count == 1 else "steps"


class Silence(Params):
    threshold: float = Field(default=120.0, gt=0, description="seconds without a new step")


@kind(
    "stalled",
    Silence,
    "a running run has had no new step (or, before its first, no start) for `threshold`"
    " seconds: a hung or dead job",
    unit=Unit.SECONDS,
    says="no new step for {value}",
)
class Stalled(Watch[Silence]):
    def __init__(self, params: Silence, run: RunView) -> None:
        super().__init__(params, run)
        self.seen: int | None = None
        self.progress_at = 0.0

    def clock(self, run: RunView, now: float) -> Reading:
        if self.seen is None:  # first look: the store's last word on it
            self.progress_at = min(now, run.last_wall_time or run.started_at)
        elif run.last_step != self.seen:  # new steps since the last tick, seen now
            self.progress_at = now
        self.seen = run.last_step
        silent = now - self.progress_at
        on = run.running and silent > self.params.threshold
        return Reading(on, silent, at=self.progress_at + self.params.threshold if on else now)


# How far under its threshold a firing rank_hotspot's share must fall before it resolves,
# unless the rule sets resolve_below: a share hovering about the threshold (61%, 59%, 62%
# of a 60% one) fired and resolved the alert every few hundred steps.
HOTSPOT_BAND = 0.05


class Hotspot(Params):
    window: int = Field(default=1000, gt=0, le=1_000_000)
    threshold: float = Field(default=0.6, gt=0, le=1, description="a rank's share")
    min_overflows: int = Field(default=5, ge=1, description="overflows in the window, at least")
    resolve_below: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="once firing, it resolves when the share is at or under this (default:"
        " `threshold` - 0.05) or the overflows fewer than `min_overflows`",
    )

    @model_validator(mode="after")
    def _band(self) -> Hotspot:
        if self.resolve_below is not None and self.resolve_below > self.threshold:
            raise ValueError(
                f"resolve_below ({self.resolve_below:g}) must not be above threshold"
                f" ({self.threshold:g})"
            )
        return self

    @property
    def resolve_at(self) -> float:
        """The share at or under which a firing alert resolves."""
        if self.resolve_below is not None:
            return self.resolve_below
        return max(0.0, self.threshold - HOTSPOT_BAND)


@kind(
    "rank_hotspot",
    Hotspot,
    "one rank is in more than `threshold` of the inf/NaN reports of the overflows within"
    " `window` steps (`min_overflows` of them at least; runs of 2 ranks or more); it"
    " resolves once that share is at or under `resolve_below` (default `threshold` - 0.05)",
    unit=Unit.SHARE,
    says="{value} of the {detail}",
    applies=lambda run: run.world_size > 1,
)
class RankHotspot(Windowed[Hotspot]):
    def __init__(self, params: Hotspot, run: RunView) -> None:
        super().__init__(params, run)
        self.reports: Counter[int] = Counter()
        self.total = 0
        self.reading = Reading(False, 0.0)

    def step(self, row: StepView) -> Reading:
        ranks = row.inf_ranks if row.overflow and row.inf_ranks else None
        if ranks is not None:
            self.reports.update(ranks)
            self.total += len(ranks)
        gone = self.slide(row, ranks)
        for left in gone:
            self.reports.subtract(left)
            self.total -= len(left)
        if ranks is not None or gone:  # the window's overflows changed: so may the reading
            self.reading = self._reading()
        return self.reading

    def quiet(self, batch: StepBatch) -> Reading | None:
        """No overflow named a rank and none leaves the window: the reading stays."""
        if any(
            over and ranks
            for over, ranks in zip(batch.column("overflow"), batch.column("inf_ranks"), strict=True)
        ):
            return None
        if self.items and self.items[0][0] <= batch.steps[-1] - self.window:
            return None
        self.pass_over(batch.steps)
        return self.reading

    def _reading(self) -> Reading:
        if len(self.items) < self.params.min_overflows or not self.total:
            return Reading(False, 0.0)
        rank, count = max(self.reports.items(), key=lambda item: (item[1], -item[0]))
        share = count / self.total
        detail = f"last {len(self.items)} overflows on rank {rank}"
        if self.reading.on:  # firing: it holds until the share falls through the band
            return Reading(share > self.params.resolve_at, share, detail=detail)
        return Reading(share > self.params.threshold, share, detail=detail)


class Stopped(Params):
    threshold: float = Field(
        default=1.0, ge=1, le=1, description="1: fires while the value (1 if stopped) reaches it"
    )


@kind(
    "autopilot",
    Stopped,
    "the run's autopilot stopped itself, its changes not helping (value 1 while it stays"
    " stopped; the reason in the alert's detail)",
    unit=Unit.FLAG,
    says="the autopilot stopped: {detail}",
)
class AutopilotGaveUp(Watch[Stopped]):
    def clock(self, run: RunView, now: float) -> Reading:
        reason = run.autopilot_gave_up
        if reason is None:
            return Reading(False, 0.0)
        return Reading(True, 1.0, detail=reason[:200])


class Heading(Params):
    threshold: float = Field(
        default=20_000, gt=0, description="steps ahead: fires when the floor is forecast within"
    )
    floor: float | None = Field(
        default=None, gt=0, description="unset: the run's min_scale where it has one, else 1.0"
    )
    window: int = Field(default=WINDOW, ge=10, le=1_000_000, description="steps read")


@kind(
    "scale_forecast",
    Heading,
    "at the rate the scale fell over the last `window` steps, it reaches `floor` within"
    " `threshold` steps (before `scale_below` would fire)",
    unit=Unit.COUNT,
    says="the scale reaches its floor in ~{value} steps: {detail}",
)
class ScaleForecastWatch(Watch[Heading]):
    """Keeps the window's scale changes, and the scale at its start: a forecast costs as
    many of them as the window holds, read again on a change and every ``EVERY`` steps."""

    EVERY = 50

    def __init__(self, params: Heading, run: RunView) -> None:
        super().__init__(params, run)
        self.changes: deque[ScaleStep] = deque()
        self.start: ScaleStep | None = None  # the scale the window starts from
        self.reading = Reading(False, 0.0)
        self.since = 0

    @property
    def history(self) -> int:
        return self.params.window

    def step(self, row: StepView) -> Reading:
        now = ScaleStep(row.step, row.scale, row.scale_after)
        if self.start is None:
            self.start = now
        changed = row.scale_after != row.scale
        if changed:
            self.changes.append(now)
        self._slide(row.step)
        self.since += 1
        if changed or self.since >= self.EVERY:
            self.since = 0
            self.reading = self._reading(now)
        return self.reading

    def feed(self, batch: StepBatch, on: bool) -> Fed:
        """A batch where the scale does not change is read only where a reading is due
        (every ``EVERY`` steps): between them the window moves and nothing else."""
        scale, after = batch.column("scale"), batch.column("scale_after")
        if self.start is None or any(a != s for s, a in zip(scale, after, strict=True)):
            return super().feed(batch, on)
        steps, turns = batch.steps, []
        for i in range(self.EVERY - self.since - 1, len(steps), self.EVERY):
            self._slide(steps[i])
            self.reading = self._reading(ScaleStep(steps[i], scale[i], after[i]))
            if bool(self.reading.on) != on:
                on = not on
                turns.append((i, self.reading))
        self._slide(steps[-1])
        self.since = (self.since + len(steps)) % self.EVERY
        return Fed(turns, self.reading)

    def _slide(self, step: int) -> None:
        """Move the window to end at ``step``: the changes before it leave, the scale it
        starts from is the last of them."""
        assert self.start is not None
        first = step - self.params.window + 1
        while self.changes and self.changes[0].step < first:
            left = self.changes.popleft()
            self.start = ScaleStep(first, left.scale_after, left.scale_after)
        if self.start.step < first:
            self.start = ScaleStep(first, self.start.scale_after, self.start.scale_after)

    def _reading(self, now: ScaleStep) -> Reading:
        assert self.start is not None
        rows = [self.start, *(c for c in self.changes if c.step > self.start.step)]
        if rows[-1].step != now.step:
            rows.append(now)
        floor = self.params.floor or self.run.min_scale or 1.0
        found = read_forecast(rows, floor=floor)
        if found is None or found.steps_to_floor is None:
            return Reading(False, 0.0)
        # At the floor already: scale_below's to say, not a forecast's.
        ahead = 0 < found.steps_to_floor <= self.params.threshold
        return Reading(ahead, found.steps_to_floor, found.text)
