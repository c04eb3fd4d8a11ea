"""Where a process stands in the process group a scaler agrees over. Any thread, every rank.

>>> Group(rank=1, size=4)
Group(rank=1, size=4)
>>> Group(rank=0, size=4).reports, Group(rank=1, size=4).reports
(True, False)
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Group"]


class Group(NamedTuple):
    """This process's rank in the group, and the group's size."""

    rank: int
    size: int

    @property
    def reports(self) -> bool:
        """Whether this rank is the group's rank 0, the one that records the run."""
        return self.rank == 0
