"""How the reporting rank learns every rank's findings: one gather, overflow steps only.

Every rank knows from the agreed found_inf that a step overflowed, so every rank enters
the gather at the same point. Each sends a fixed-size encoding of its
:class:`~scalewatch._diagnosis.findings.Report` (a size agreed beforehand would cost a collective of
its own), so one ``dist.gather`` is the whole exchange:

>>> report = Report(1, (("layers.0.weight", FindingKind.INF, 3),), 0, True)
>>> decode(encode(report), 1) == report
True
"""

from __future__ import annotations

import struct
from typing import Any

import torch
import torch.distributed as dist

from .._group import Group
from .._torch_compat import gather_to_group_rank0
from ..store.records import FindingKind
from .findings import LIMIT, NAME_BYTES, Report, cut_name

_HEAD = struct.Struct("<iiB")  # params kept, params omitted, loss non-finite
_PARAM = struct.Struct("<BqH")  # kind, count, name length (then the name's bytes)
SLOT = _HEAD.size + LIMIT * (_PARAM.size + NAME_BYTES)
_KINDS = (FindingKind.INF, FindingKind.NAN, FindingKind.BOTH)  # as encoded: their index


def encode(report: Report) -> bytes:
    """``report`` in ``SLOT`` bytes; names past ``NAME_BYTES`` (UTF-8) are cut."""
    out = bytearray(_HEAD.pack(len(report.params), report.omitted, report.loss_nonfinite))
    for name, kind, count in report.params[:LIMIT]:
        raw = cut_name(name).encode()
        out += _PARAM.pack(_KINDS.index(kind), count, len(raw)) + raw
    return bytes(out.ljust(SLOT, b"\0"))


def decode(data: bytes, rank: int) -> Report:
    kept, omitted, loss = _HEAD.unpack_from(data)
    at = _HEAD.size
    params: list[tuple[str, FindingKind, int]] = []
    for _ in range(kept):
        kind, count, length = _PARAM.unpack_from(data, at)
        at += _PARAM.size
        params.append((data[at : at + length].decode(), _KINDS[kind], count))
        at += length
    return Report(rank, tuple(params), omitted, bool(loss))


def gather_reports(report: Report, group: Group, process_group: Any) -> list[Report] | None:
    """Every rank's report on the group's rank 0, in rank order; None on the other ranks.

    ``report.rank`` is the rank in ``group`` (rank, size).
    """
    rank, world = group
    device = _device_for(process_group)
    mine = torch.frombuffer(bytearray(encode(report)), dtype=torch.uint8).to(device)
    slots = [torch.empty_like(mine) for _ in range(world)] if rank == 0 else None
    gather_to_group_rank0(mine, slots, process_group)
    if slots is None:
        return None
    return [decode(slot.cpu().numpy().tobytes(), r) for r, slot in enumerate(slots)]


def _device_for(process_group: Any) -> torch.device:
    """Where the group's collectives take tensors: cpu, unless only NCCL serves it."""
    backend = str(dist.get_backend(process_group))
    if "gloo" in backend or "mpi" in backend or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())
