"""How the ranks of a ShardedGradScaler agree on found_inf, and on a control request.

Runs on the training thread of every rank of a ``ShardedGradScaler``'s group (a
``GradScaler`` agrees nothing): the all-reduce in ``unscale_()`` (or, for a fused
optimizer, ``_check_inf_per_device()``), the broadcast in ``update()``.

Per optimizer and step, one all-reduce of the ``payload`` (one element up to 52 ranks,
as torch's found_inf; one more with ``grad_norm``: the sum of the squares of the gradient
shards of every rank; one more, once a step, with ``skip_on_spike(loss_z=...)``: the sum of
the ranks' losses). On the steps where rank 0 flags a request in it, a broadcast of
the request follows at ``update()``; every rank does the same at the same boundary. On
cuda, what the host reads of them one update later waits in ``host_copies``.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
import torch.distributed as dist

from .. import _control
from .._control import ControlUpdate
from .._control.inbox import ControlInbox
from .._group import Group
from . import payload as _payload
from .host_copies import InFlightCopies

KEEP_REDUCED = 4  # all-reduce handles kept alive after they complete (see Agreement)


class Agreement:
    """The per-step state of the agreement: transient, never pickled.

    This step's payloads and their words read on the host are kept here, by optimizer (its
    ``id``, as torch keys its per-optimizer states), never in torch's per-optimizer dicts:
    those keep torch's shape.
    """

    def __init__(self) -> None:
        self.carrying: ControlUpdate | None = None  # rank 0: the request it flagged
        self.payloads: dict[int, torch.Tensor] = {}  # this step's, by optimizer
        self._host: dict[int, list[float]] = {}  # their words, where read on the host
        self._agreed = _payload.Attribution.single()  # by the ranks of the last agreement
        self._step_host: list[list[float]] | None = None
        self._in_flight = InFlightCopies()
        # The handles of the last all-reduces, kept while the scaler lives. A gloo worker
        # thread drops its reference to a handle just after the all-reduce completes. Were
        # that the last one, the worker would free the handle and let go of the payload,
        # which needs the GIL (the payload is a Python tensor). A process group freed
        # meanwhile holds the GIL while it joins that worker: both wait for ever. Holding
        # the handle here moves that release to the training thread.
        self.reduced: deque[dist.Work] = deque(maxlen=KEEP_REDUCED)

    def agree(
        self,
        optimizer: int,
        per_device: dict[torch.device, torch.Tensor],
        group: Group,
        device: torch.device,
        inbox: ControlInbox,
        process_group: Any,
        reduce_alone: bool,
        extras: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """Agree ``optimizer``'s found_inf (``per_device``, torch's, left 1 where any rank
        overflowed) across the ranks of ``group`` (rank, size).

        ``extras`` (this rank's numbers to sum over the ranks, float64 on ``device``: the
        squares of its gradient shards, its loss) ride at the end of the payload; returns
        their sums (None without ``extras``). The flag words are the payload without them,
        so what reads them reads as before.
        """
        rank, world = group
        request = rank == 0 and bool(inbox) and self.carrying is None
        if request:
            self.carrying = inbox.take_one()
        reduce = world > 1 or reduce_alone  # for one rank the all-reduce is the identity
        summed = None
        in_place = extras is None and len(per_device) == 1 and world <= _payload.IN_PLACE_RANKS
        if device.type == "cpu" and in_place:
            found = next(iter(per_device.values()))
            self._host[optimizer] = self._agree_in_place(
                found, rank, request, reduce, process_group
            )
            payload = found
        else:
            payload = _own_payload(per_device, rank, world, device)
            if request:
                payload[:1].add_(_payload.REQUEST)
            if extras is not None:
                payload = torch.cat((payload, extras))
            if reduce:
                self._all_reduce(payload, process_group)
            if extras is not None:
                count = len(extras)
                summed, payload = payload[-count:], payload[:-count]
            if world > 1 or len(per_device) > 1:
                # 1 where any rank overflowed: a fused optimizer skips its step at 1 only
                total = payload.ge(1.0) if len(payload) == 1 else payload.ge(1.0).any()
                for found in per_device.values():  # a fused optimizer's found_inf is 0-d
                    found.copy_(total.reshape(found.shape))
        self.payloads[optimizer] = payload
        if self._agreed.ranks != world:  # made once: the group's size does not change
            self._agreed = _payload.Attribution.agreed(world)
        return summed

    def _agree_in_place(
        self, found: torch.Tensor, rank: int, request: bool, reduce: bool, process_group: Any
    ) -> list[float]:
        """On cpu, up to ``IN_PLACE_RANKS`` ranks: the payload is found_inf itself, all-reduced
        in place as torch's is. Returns its words as read (a cpu read is no sync); found_inf
        is left 1 where any rank overflowed, 0 where none did."""
        bit = _payload.position(rank)[1]
        if bit != 1.0:
            found.mul_(bit)
        if request:
            found.add_(_payload.REQUEST)
        if reduce:
            self._all_reduce(found, process_group)
        read: Any = found.tolist()  # a fused optimizer's found_inf is 0-d: a float
        host: list[float] = read if isinstance(read, list) else [read]
        word = host[0]
        if word != 0.0 and word != 1.0:
            found.fill_(1.0 if word >= 1.0 else 0.0)
        return host

    def _all_reduce(self, payload: torch.Tensor, process_group: Any) -> None:
        work = dist.all_reduce(payload, group=process_group, async_op=True)
        if work is not None:
            work.wait()
            self.reduced.append(work)

    def agreed(self, optimizer: int) -> bool:
        """Whether ``optimizer``'s found_inf was agreed this step."""
        return optimizer in self.payloads

    def read_with(self, optimizer: int, flag: torch.Tensor) -> tuple[list[float], float]:
        """:meth:`read`, and ``flag`` (0-d, on the payload's device) read with it: on cuda
        one read of both; on cpu, where the words may be read already, a read of memory."""
        payload = self.payloads[optimizer]
        if optimizer in self._host:
            return self._host[optimizer], float(flag.item())
        words = torch.cat((payload, flag.reshape(1).to(payload.dtype))).tolist()
        host = self._host[optimizer] = words[:-1]
        return host, float(words[-1])

    def read(self, optimizer: int) -> list[float] | None:
        """The words of ``optimizer``'s payload of this step, read on the host once (on cuda a
        device read, in place of torch's read of each found_inf); None: it agreed none."""
        host = self._host.get(optimizer)
        if host is None:
            payload = self.payloads.get(optimizer)
            if payload is None:
                return None
            host = self._host[optimizer] = payload.tolist()
        return host

    def flags(self) -> list[torch.Tensor]:
        return list(self.payloads.values())

    def attribution(self) -> _payload.Attribution:
        """Whose flags this step's payloads carry (none agreed yet: a single process's)."""
        return self._agreed if self.payloads else _payload.Attribution.single()

    def host_rows(self) -> list[list[float]] | None:
        """This step's payloads as read on the host (reading them on cpu); None on cuda when
        a payload was not read (the fused-optimizer path)."""
        if self._step_host is not None or not self.payloads:
            return self._step_host
        rows: list[list[float]] = []
        for optimizer, payload in self.payloads.items():
            host = self._host.get(optimizer)
            if host is None:
                if payload.device.type != "cpu":
                    return None
                host = payload.tolist()
            rows.append(host)
        self._step_host = rows
        return rows

    def controls(
        self, group: Group | None, device: torch.device, process_group: Any
    ) -> list[ControlUpdate]:
        """The requests that apply at this update() on every rank; forgets this step.

        A request broadcast on cpu applies at once; on cuda its values reach the host by an
        asynchronous copy, and it applies at the next update(), as does the broadcast itself
        when the payload was not read on the host this step (the fused-optimizer path).
        """
        updates: list[ControlUpdate] = []
        if self._in_flight.pending:  # cuda only: what the last update() left on its way
            decoded = map(_control.decode, self._in_flight.take_slots())
            updates = [update for update in decoded if update is not None]
            if self._in_flight.take_request():
                updates.extend(self._receive(group, device, process_group))
        if self.payloads:
            rows = self.host_rows()
            if rows is None:
                self._in_flight.keep_request_flag(self.flags())
            elif any(_payload.carries_request(row) for row in rows):
                updates.extend(self._receive(group, device, process_group))
        self.payloads.clear()
        self._host.clear()
        self._step_host = None
        return updates

    def _receive(
        self, group: Group | None, device: torch.device, process_group: Any
    ) -> list[ControlUpdate]:
        """Rank 0's request, broadcast to every rank: on cpu returned, on cuda lagged."""
        carrying, self.carrying = self.carrying, None
        encoded = _control.encode(carrying) if carrying is not None else [0.0] * _control.SLOTS
        slots = torch.tensor(encoded, dtype=torch.float64)
        if device.type == "cuda":  # from pinned memory the copy does not block the host
            slots = slots.pin_memory().to(device, non_blocking=True)
        elif device.type != "cpu":
            slots = slots.to(device)
        if group is not None and group.size > 1:
            dist.broadcast(slots, group=process_group, group_src=0)
        if device.type != "cpu":
            self._in_flight.keep_slots(slots)
            return []
        update = _control.decode(slots.tolist())
        return [] if update is None else [update]


def _own_payload(
    per_device: dict[torch.device, torch.Tensor], rank: int, world: int, device: torch.device
) -> torch.Tensor:
    """This rank's contribution: its bit where its local gradients hold inf/NaN."""
    if len(per_device) == 1:
        local = next(iter(per_device.values())).reshape(1)
    else:  # each device's flag is 0 or 1: any of them sets this rank's bit once
        flags = [f.to(device, non_blocking=True).reshape(()) for f in per_device.values()]
        local = torch.stack(flags).sum().clamp_(max=1.0).reshape(1)
    word, bit = _payload.position(rank)
    count = _payload.words(world)
    if count == 1:
        payload = local.to(device=device, dtype=torch.float64, non_blocking=True, copy=True)
        if bit != 1.0:
            payload.mul_(bit)
        return payload
    payload = torch.zeros(count, dtype=torch.float64, device=device)
    payload[word : word + 1] = local.to(device, non_blocking=True) * bit
    return payload
