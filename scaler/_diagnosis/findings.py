"""What an overflow step finds on one rank: the parameters whose local gradients hold inf
or NaN, and whether the loss did.

Run only at an overflow step. One fused pass (the 2-norm of every gradient, non-finite
when the gradient holds inf or NaN, or when its sum of squares overflows) picks the
gradients to look at; only those are counted, element by element (one whose norm only
overflowed counts no element, and is left out). A DTensor gradient is checked in its local shard,
a flat parameter's gradient (FSDP1) per original parameter it holds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from .._torch_compat import foreach_l2_norm, local_tensor
from ..store.records import FindingKind, ParamFinding
from .names import Names, Segment, positional

LIMIT = 32  # parameters kept per rank and step; the rest are counted
NAME_BYTES = 500  # of a name, in UTF-8, as the store keeps one (overflow_params.name)


@dataclass(frozen=True, slots=True)
class Report:
    """One rank's findings at an overflow step: (name, kind, count) in optimizer order."""

    rank: int
    params: tuple[tuple[str, FindingKind, int], ...] = ()
    omitted: int = 0
    loss_nonfinite: bool = False


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Every rank's findings at one overflow step, as its record carries them."""

    params: tuple[ParamFinding, ...]
    omitted: int
    loss_nonfinite_ranks: tuple[int, ...]


def combine(reports: Iterable[Report]) -> Diagnosis:
    """The reports of the ranks, in rank order, as one diagnosis.

    >>> combine([Report(1, (("w", FindingKind.INF, 2),), 0, True), Report(0)]).params
    (ParamFinding(rank=1, name='w', kind=<FindingKind.INF: 'inf'>, count=2),)
    """
    ordered = sorted(reports, key=lambda report: report.rank)
    return Diagnosis(
        params=tuple(
            ParamFinding(report.rank, name, kind, count)
            for report in ordered
            for name, kind, count in report.params
        ),
        omitted=sum(report.omitted for report in ordered),
        loss_nonfinite_ranks=tuple(report.rank for report in ordered if report.loss_nonfinite),
    )


def cut_name(name: str) -> str:
    """``name`` within ``NAME_BYTES`` of UTF-8, cut at a character.

    >>> len(cut_name("é" * 400).encode())
    500
    """
    raw = name.encode()
    return name if len(raw) <= NAME_BYTES else raw[:NAME_BYTES].decode(errors="ignore")


def kind_of(infs: int, nans: int) -> FindingKind:
    """Which non-finite values ``infs`` and ``nans`` count.

    >>> kind_of(2, 0), kind_of(0, 1), kind_of(1, 1)
    (<FindingKind.INF: 'inf'>, <FindingKind.NAN: 'nan'>, <FindingKind.BOTH: 'both'>)
    """
    if infs and nans:
        return FindingKind.BOTH
    return FindingKind.INF if infs else FindingKind.NAN


def loss_nonfinite(loss: torch.Tensor | None) -> bool:
    """Whether the loss holds inf or NaN. Reads it: a sync on cuda (overflow steps only)."""
    return loss is not None and not bool(loss.detach().isfinite().all())


# A gradient to check: its local values, the parameter, its optimizer group and index.
_Entry = tuple[torch.Tensor, torch.Tensor, int, int]


def scan(
    optimizers: Sequence[torch.optim.Optimizer], names: Names, loss: torch.Tensor | None
) -> Report:
    """The parameters of ``optimizers`` whose local gradients hold inf or NaN, as
    (name, kind, count), the first ``LIMIT`` in optimizer order, with how many more; and
    whether ``loss`` is non-finite. Reads twice (a sync each on cuda): which gradients
    (and the loss) hold inf/NaN, then their counts. The report's rank is 0."""
    entries = _entries(optimizers)
    flagged, bad_loss = _non_finite(entries, loss)
    if not flagged:
        return Report(0, (), 0, bad_loss)
    namings = [_naming(entries[i], names) for i, _ in flagged]
    counts = _counts([(entries[i][0], nan) for i, nan in flagged], namings)
    found: list[tuple[str, FindingKind, int]] = []
    for naming, pairs in zip(namings, counts, strict=True):
        labels = [naming] if isinstance(naming, str) else [name for name, _, _ in naming]
        for label, (infs, nans) in zip(labels, pairs, strict=True):
            if infs or nans:
                found.append((cut_name(label), kind_of(infs, nans), infs + nans))
    return Report(0, tuple(found[:LIMIT]), max(0, len(found) - LIMIT), bad_loss)


def _entries(optimizers: Sequence[torch.optim.Optimizer]) -> list[_Entry]:
    entries: list[_Entry] = []
    seen: set[int] = set()
    for optimizer in optimizers:
        if id(optimizer) in seen:
            continue
        seen.add(id(optimizer))
        for group_index, group in enumerate(optimizer.param_groups):
            for index, param in enumerate(group["params"]):
                grad = param.grad
                if grad is None:
                    continue
                values = grad._values() if grad.is_sparse else local_tensor(grad)
                if values.numel():
                    entries.append((values, param, group_index, index))
    return entries


def _non_finite(
    entries: list[_Entry], loss: torch.Tensor | None
) -> tuple[list[tuple[int, bool]], bool]:
    """The entries that hold inf or NaN, each as (index, whether it may hold NaN), and
    whether the loss does: one fused pass and one read per (device, dtype); the loss rides
    in the read on its device. A 2-norm is NaN exactly when a NaN is summed into it: a
    gradient whose norm is inf holds no NaN, and its NaNs need no counting."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = defaultdict(list)
    for i, (values, _, _, _) in enumerate(entries):
        groups[(values.device, values.dtype)].append(i)
    flagged: list[tuple[int, bool]] = []
    bad_loss: bool | None = None
    for (device, _), indices in groups.items():
        norms = torch.stack(foreach_l2_norm([entries[i][0] for i in indices]))
        flags = [norms.isfinite().logical_not_(), norms.isnan()]
        with_loss = bad_loss is None and loss is not None and loss.device == device
        if with_loss:
            assert loss is not None
            flags.append(loss.detach().isfinite().all().logical_not_().reshape(1))
        read = torch.cat(flags).tolist()
        if with_loss:
            bad_loss = read.pop()
        count = len(indices)
        for i, is_bad, has_nan in zip(indices, read[:count], read[count:], strict=True):
            if is_bad:
                flagged.append((i, has_nan))
    if bad_loss is None:
        bad_loss = loss_nonfinite(loss)
    return sorted(flagged), bad_loss


def _naming(entry: _Entry, names: Names) -> str | tuple[Segment, ...]:
    _, param, group_index, index = entry
    naming = names.lookup(param)
    return positional(group_index, index, param.shape) if naming is None else naming


def _counts(
    tensors: list[tuple[torch.Tensor, bool]], namings: list[str | tuple[Segment, ...]]
) -> list[list[tuple[int, int]]]:
    """(infs, NaNs) of each (tensor, whether it may hold NaN), or of each segment of a flat
    parameter's: one read."""
    parts = [
        _count(values, nan, naming) for (values, nan), naming in zip(tensors, namings, strict=True)
    ]
    by_device: dict[torch.device, list[int]] = defaultdict(list)
    for i, part in enumerate(parts):
        by_device[part.device].append(i)
    read: list[list[tuple[int, int]]] = [[] for _ in parts]
    for indices in by_device.values():
        rows = torch.cat([parts[i] for i in indices]).tolist()
        start = 0
        for i in indices:
            end = start + parts[i].shape[0]
            read[i] = [(int(a), int(b)) for a, b in rows[start:end]]
            start = end
    return read


def _count(values: torch.Tensor, nan: bool, naming: str | tuple[Segment, ...]) -> torch.Tensor:
    """A (segments, 2) tensor of inf and NaN counts, still on the device."""
    if isinstance(naming, str):
        infs = values.isinf().sum()
        return torch.stack((infs, values.isnan().sum() if nan else infs.new_zeros(()))).view(1, 2)
    flat = values.reshape(-1)
    # Running counts, one leading zero: a segment's count is a difference of two.
    infs = flat.isinf()
    nans = flat.isnan() if nan else torch.zeros_like(infs)
    running = torch.stack((infs, nans), dim=1).cumsum(0)
    running = torch.cat((running.new_zeros(1, 2), running))
    starts = torch.tensor([offset for _, offset, _ in naming], device=flat.device)
    ends = torch.tensor([offset + numel for _, offset, numel in naming], device=flat.device)
    return running[ends] - running[starts]
