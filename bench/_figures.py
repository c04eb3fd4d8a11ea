"""One line per published figure, which ``bench/run_all.py`` gathers into docs/BENCHMARKS.md."""

from __future__ import annotations

PREFIX = "FIGURE\t"


def figure(name: str, value: str, goal: str, ok: bool, baseline: str = "") -> None:
    """Print ``name``, its measured ``value``, its ``goal``, whether it met it, and the
    ratio against its baseline measured in the same run (``baseline``)."""
    status = "ok" if ok else "MISSED"
    print(f"{PREFIX}{name}\t{value}\t{goal}\t{status}\t{baseline}", flush=True)
