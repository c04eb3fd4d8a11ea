"""The host rows that carry a step's values to the recorder (pinned, on cuda)."""

from __future__ import annotations

import pytest
import torch

import scalewatch
from scalewatch._recording.pinned_rows import PinnedRing, PinnedRings
from scalewatch._recording.step_values import split_values
from tests._helpers.twin import INJECT, mlp, sgd, train


def test_split_gives_each_optimizers_payload_words() -> None:
    # scale, tracker, found, loss, then two payloads of two words each
    values = [1024.0, 3.0, 1.0, 0.25, 2.0, 0.0, 1.5, 4.0]
    # (the gradient norm and the largest parameter norms travel apart: Captured.read takes
    # them out of the row first)
    split = split_values(values, 2)
    assert split == (1024.0, 3, 1.0, 0.25, [[2.0, 0.0], [1.5, 4.0]], None, None, False)
    assert split_values(values[:6], 1) == (1024.0, 3, 1.0, 0.25, [[2.0, 0.0]], None, None, False)
    assert split_values([*values[:3], None], 0) == (1024.0, 3, 1.0, None, [], None, None, False)


DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("device", DEVICES)
def test_a_ring_reuses_its_rows_and_says_when_it_is_full(device: str) -> None:
    ring = PinnedRing((1, 1, 1, 1), torch.device(device), rows=2)
    scale = torch.full((), 2.0**16, device=device)
    tracker = torch.full((), 2**30 - 1, dtype=torch.int32, device=device)  # exact in float64
    found = torch.ones(1, device=device)
    payload = torch.tensor([0.5], dtype=torch.float64, device=device)
    first = ring.capture([scale.reshape(1), tracker.reshape(1), found, payload])
    scale.mul_(2)  # the next step changes the scale in place: the row keeps this step's value
    second = ring.capture([scale.reshape(1), tracker.reshape(1), found, payload])
    assert first is not None and second is not None and first != second
    assert ring.capture([scale.reshape(1), tracker.reshape(1), found, payload]) is None
    assert ring.read(first) == [2.0**16, 2**30 - 1, 1.0, 0.5]
    assert ring.read(second) == [2.0**17, 2**30 - 1, 1.0, 0.5]
    again = ring.capture([scale.reshape(1), tracker.reshape(1), found, payload])
    assert again in (first, second)
    ring.release(again)


@pytest.mark.cuda
def test_steps_on_two_streams_keep_their_own_values() -> None:
    """A step queued behind slow work on one stream is not overwritten from the other."""
    ring = PinnedRing((2,), torch.device("cuda"), rows=8)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    rows = []
    for step in range(6):
        with torch.cuda.stream(streams[step % 2]):
            if step % 2 == 0:
                torch.cuda._sleep(20_000_000)  # holds this stream's copy back
            value = torch.full((2,), float(step), device="cuda")
            rows.append(ring.capture([value]))
    assert all(row is not None for row in rows)
    assert [ring.read(row) for row in rows if row is not None] == [
        [float(step)] * 2 for step in range(6)
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_rings_are_kept_per_layout(device: str) -> None:
    rings = PinnedRings()
    one = torch.ones(1, device=device)
    narrow = rings.capture([one, one, one])
    wide = rings.capture([one, one, one, torch.zeros(3, device=device)])
    # Two payloads of one value each: as wide as three ones, but not the same parts.
    split = rings.capture([one, one, one, torch.full((2,), 2.0, device=device)])
    both = rings.capture([one, one, one, torch.full((1,), 3.0, device=device), one])
    assert (narrow[0].width, wide[0].width, split[0].width, both[0].width) == (3, 6, 5, 5)
    assert len({id(ring) for ring, _ in (narrow, wide, split, both)}) == 4
    assert narrow[0].read(narrow[1]) == [1.0, 1.0, 1.0]
    assert wide[0].read(wide[1]) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert split[0].read(split[1]) == [1.0, 1.0, 1.0, 2.0, 2.0]
    assert both[0].read(both[1]) == [1.0, 1.0, 1.0, 3.0, 1.0]


def test_a_cpu_row_takes_0d_values_and_holds_them_when_they_change() -> None:
    ring = PinnedRing((1, 1, 1), torch.device("cpu"), rows=4)
    scale, tracker = torch.full((), 1024.0), torch.zeros((), dtype=torch.int32)
    rows = []
    for _ in range(3):
        rows.append(ring.capture([scale, tracker, torch.zeros(1)]))
        scale.mul_(2)  # in place, as update() does
        tracker.add_(1)
    assert [ring.read(row) for row in rows if row is not None] == [
        [1024.0, 0.0, 0.0],
        [2048.0, 1.0, 0.0],
        [4096.0, 2.0, 0.0],
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [2, None], ids=["ring-full-often", "default-ring"])
def test_rows_match_torch_when_the_ring_fills_up(kind: str, rows: int | None, device: str) -> None:
    """A full ring falls back to a buffer of the step's own: no step is lost or misread."""
    kwargs = {"device": device, "init_scale": 2.0**10, "growth_interval": 2}
    if kind == "plain":
        theirs, ours = (
            torch.amp.GradScaler(**kwargs),
            scalewatch.GradScaler(**kwargs, telemetry=False),
        )
    else:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchSharded

        theirs = TorchSharded(**kwargs)
        ours = scalewatch.ShardedGradScaler(**kwargs, telemetry=False)
    ours._step_context.pinned = PinnedRings(rows=rows)
    traces = []
    for gs in (theirs, ours):
        model = mlp().to(device)
        traces.append(train(gs, model, sgd(model), steps=40, inject=INJECT))
    traces[1].assert_same(traces[0])
    stats = ours.stats()
    assert stats.steps == 40
    assert stats.overflows == len([s for s in INJECT if s < 40])
    assert stats.current_scale == traces[0].scales[-1]
    assert stats.dropped_records == 0
    ours.close()
