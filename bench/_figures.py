"""Helpers for the bench scripts: one line per published figure, which ``bench/run_all.py``
gathers into docs/BENCHMARKS.md, and the bootstrap interval printed beside a median."""

from __future__ import annotations

import random
import statistics

PREFIX = "FIGURE\t"


def figure(name: str, value: str, goal: str, ok: bool, baseline: str = "") -> None:
    """Print ``name``, its measured ``value``, its ``goal``, whether it met it, and the
    ratio against its baseline measured in the same run (``baseline``)."""
    status = "ok" if ok else "MISSED"
    print(f"{PREFIX}{name}\t{value}\t{goal}\t{status}\t{baseline}", flush=True)


def median_interval(
    values: list[float], level: float = 0.95, resamples: int = 2000
) -> tuple[float, float]:
    """A percentile-bootstrap ``level`` interval of the median of ``values`` (seeded).

    What one run can say: a median outside the goal with the goal inside its interval is
    not told apart from the goal by this many rounds on this machine.
    """
    rng = random.Random(0)
    medians = sorted(
        statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples)
    )
    tail = int((1 - level) / 2 * resamples)
    return medians[tail], medians[resamples - 1 - tail]
