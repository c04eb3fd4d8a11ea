"""The found_inf payload: one float64 element carries up to 52 ranks' flags and a request."""

from __future__ import annotations

import random

import torch

from scalewatch._agreement import payload as _payload


def _reduced(world: int, overflowed: set[int], request: bool) -> list[float]:
    """What the all-reduce (a sum) of every rank's contribution gives, in float64."""
    total = torch.zeros(_payload.words(world), dtype=torch.float64)
    for rank in range(world):
        contribution = torch.zeros_like(total)
        if rank in overflowed:
            word, value = _payload.position(rank)
            contribution[word] = value
        if rank == 0 and request:
            contribution[0] += _payload.REQUEST
        total += contribution
    return total.tolist()


def test_one_element_carries_every_rank_up_to_52_and_the_request() -> None:
    assert _payload.words(1) == _payload.words(52) == 1
    host = _reduced(52, set(range(52)), request=True)
    assert len(host) == 1
    assert _payload.overflowed_ranks(host) == tuple(range(52))
    assert _payload.carries_request(host) and _payload.any_overflow(host)


def test_random_worlds_and_flags_decode_exactly() -> None:
    rng = random.Random(0)
    for _ in range(300):
        world = rng.choice([1, 2, 3, 4, 8, 51, 52, 53, 104, 105, 300])
        overflowed = {r for r in range(world) if rng.random() < 0.2}
        request = rng.random() < 0.5
        host = _reduced(world, overflowed, request)
        assert len(host) == _payload.words(world)
        assert _payload.overflowed_ranks(host) == tuple(sorted(overflowed))
        assert _payload.carries_request(host) is request
        assert _payload.any_overflow(host) is bool(overflowed)


def test_a_request_alone_is_no_overflow() -> None:
    host = _reduced(4, set(), request=True)
    assert host == [0.5]
    assert not _payload.any_overflow(host) and _payload.overflowed_ranks(host) == ()
