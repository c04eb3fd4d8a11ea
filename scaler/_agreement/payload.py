"""The found_inf payload: what the one all-reduce of a step carries, in as few elements as can be.

A collective's cost on gloo follows the payload's length, not its dtype (on 4 ranks one
element takes ~0.4 ms and four ~3 ms: gloo's ring algorithm starts at one element a rank).
So every rank's flag is one bit: rank ``r`` adds ``2**(r % 52)`` to word ``r // 52`` when its
local gradients hold inf/NaN. The words are float64, whose integers are exact to 2**53 (on
cpu, up to ``IN_PLACE_RANKS``, the one word is found_inf's own float32), and
bits of different ranks never add into a carry, so the sum is the bitwise OR; up to 52
ranks it is one element, as torch's found_inf is. Rank 0 adds ``REQUEST`` (0.5) to word 0
when it has a runtime-control request for this step: the request itself follows in a
broadcast at ``update()``, on those steps only.

>>> words = [float(2**1 + 2**3) + REQUEST]
>>> overflowed_ranks(words), carries_request(words), any_overflow(words)
((1, 3), True, True)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

BITS = 52
REQUEST = 0.5
# On cpu, up to this many ranks the payload is found_inf itself (float32): 23 rank bits
# and the request's half fit its 24-bit significand, so the sum is exact there too.
IN_PLACE_RANKS = 23


def words(world: int) -> int:
    """Elements of the payload for ``world`` ranks.

    >>> words(2), words(52), words(53)
    (1, 1, 2)
    """
    return (world - 1) // BITS + 1


def position(rank: int) -> tuple[int, float]:
    """(word, value) that ``rank`` adds for an overflow.

    >>> position(0), position(53)
    ((0, 1.0), (1, 2.0))
    """
    return rank // BITS, float(2 ** (rank % BITS))


def any_overflow(host: Sequence[float]) -> bool:
    """Whether any rank's flag is set (the request's half never reaches 1)."""
    return sum(host) >= 1.0


def has_rank(host: Sequence[float], rank: int) -> bool:
    """Whether ``rank``'s flag is set in the payload read on the host.

    >>> has_rank([float(2**1 + 2**3)], 3), has_rank([float(2**1)], 3)
    (True, False)
    """
    word, bit = divmod(rank, BITS)
    return word < len(host) and bool(math.floor(host[word]) >> bit & 1)


def carries_request(host: Sequence[float]) -> bool:
    return bool(host) and host[0] % 1.0 == REQUEST


def overflowed_ranks(host: Sequence[float]) -> tuple[int, ...]:
    """The ranks whose flag is set in the payload read on the host."""
    ranks: list[int] = []
    for index, word in enumerate(host):
        bits = math.floor(word)
        base = index * BITS
        while bits:
            low = bits & -bits
            ranks.append(base + low.bit_length() - 1)
            bits ^= low
    return tuple(ranks)


@dataclass(frozen=True, slots=True)
class Attribution:
    """Which ranks a step's overflow flags name: the ``ranks`` agreed in its payloads, or none.

    >>> Attribution.agreed(4).gathers, Attribution.single().ranks, Attribution.unknown().known
    (True, 0, False)
    """

    ranks: int = 0  # ranks whose flags the payloads carry; 0: no payload
    known: bool = True  # False: ranks of a process group that agree nothing (GradScaler)

    @staticmethod
    def single() -> Attribution:
        """A single process: an overflow is its own (rank 0's)."""
        return _SINGLE

    @staticmethod
    def unknown() -> Attribution:
        """``GradScaler`` in a process group: each rank knows only its own found_inf."""
        return _UNKNOWN

    @staticmethod
    def agreed(ranks: int) -> Attribution:
        """``ranks`` ranks whose flags the all-reduced payloads carry."""
        if ranks < 1:
            raise ValueError(f"a payload is agreed by 1 rank or more, not {ranks}")
        return Attribution(ranks)

    @property
    def gathers(self) -> bool:
        """Whether the ranks gather their findings at an overflow: several agreed found_inf."""
        return self.ranks > 1


_SINGLE = Attribution()
_UNKNOWN = Attribution(known=False)
