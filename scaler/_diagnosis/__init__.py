"""Overflow diagnosis in a scaler (``Diagnoser``): the names ``watch(model)`` gave, the loss
seen by ``scale()``, and the findings of an overflow step.

Runs on the training thread of every rank, and costs nothing but on overflow steps: a
rank whose own gradients hold inf/NaN scans them (``findings``) and names the parameters
(``names``, as ``watch()`` registered them); with ``ShardedGradScaler`` on several ranks,
every rank then enters one gather to the reporting rank (``gather``).

A clean step costs a reference to the loss, one to each optimizer stepped, and a test
of values the host holds already (a cpu step's values, or found_inf as ``step()`` read
it). ``GradScaler`` learns of an optimizer from ``step()`` (``_maybe_opt_step``, or the
fused path's ``_check_inf_per_device``); a fused optimizer that ``unscale_()`` was called
on first passes neither, and its gradients are not scanned. ``ShardedGradScaler`` sees
every optimizer in its own ``_unscale_grads_``.

Only a step the host knows overflowed is explained: each rank that saw inf/NaN in its
own gradients scans them once, and with ``ShardedGradScaler`` on several ranks the
reporting rank gathers every rank's findings in one collective (see ``gather``). The
scan runs in ``step()``, right after torch's own read of found_inf synchronised (on cuda
``update()`` then reads nothing); only a cpu fused optimizer, whose overflow the host
learns from the step's values, is scanned in ``update()``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .._agreement import payload as _payload
from .._agreement.payload import Attribution
from .._group import Group
from .findings import LIMIT, Diagnosis, Report, combine, loss_nonfinite, scan
from .gather import gather_reports
from .names import Names

if TYPE_CHECKING:
    from .._recording.step_values import StepValues

log = logging.getLogger("scalewatch")


class Diagnoser:
    """A scaler's diagnosis state: the names registered, and what this step has seen.

    The scaler's overrides feed it (``scale()`` the loss, ``step()`` each optimizer and
    its found_inf as read) and ``update()`` asks it for the step's findings; what it
    needs of the scaler (its group) comes as arguments. Transient: a copy of the scaler
    watches nothing until ``watch()`` is called again.
    """

    __slots__ = ("host_rows", "loss", "loss_bad", "names", "optimizers", "reports", "scanned")

    def __init__(self) -> None:
        self.names = Names()
        self.loss: torch.Tensor | None = None
        self.optimizers: list[torch.optim.Optimizer] = []
        # found_inf of each optimizer as step() read it: [found] or the payload's words
        self.host_rows: list[tuple[torch.optim.Optimizer, list[float]]] = []
        # what step() found at an overflow: its scans, the optimizers it saw, the loss
        self.reports: list[Report] = []
        self.scanned: set[int] = set()
        self.loss_bad: bool | None = None  # None: not looked at

    def saw_loss(self, loss: torch.Tensor) -> None:
        """``scale()`` scaled ``loss``; a second call in a step (gradient accumulation) adds
        to it."""
        if self.loss is None:
            self.loss = loss
        else:
            self.loss = self.loss.detach() + loss.detach()

    def take_loss(self) -> torch.Tensor | None:
        loss, self.loss = self.loss, None
        return loss

    def clean_step(self) -> bool:
        """Forget a step that ``step()`` found clean; False (nothing forgotten) if it met
        an overflow, whose findings are still to be told."""
        if self.scanned:
            return False
        self.loss = None
        self.optimizers.clear()
        self.host_rows.clear()
        return True

    def read_at_step(
        self,
        optimizer: torch.optim.Optimizer,
        row: list[float],
        overflow: bool,
        attribution: Attribution,
        group: Group | None,
    ) -> None:
        """step() read ``optimizer``'s found_inf on the host (``row``: it, or the payload's
        words, whose flags ``attribution`` says); an ``overflow`` is scanned now."""
        self.host_rows.append((optimizer, row))
        if not overflow:
            return
        rank, gathering = _reporting(group, attribution)
        if not gathering and rank != 0:
            return  # nothing to send, nothing to record
        self.scanned.add(id(optimizer))
        local = not attribution.ranks or _payload.has_rank(row, rank)
        loss = self.loss if self.loss_bad is None else None  # the loss once a step
        report = self._scan_safely([optimizer] if local else [], rank, loss)
        self.reports.append(report)
        self.loss_bad = bool(self.loss_bad) or report.loss_nonfinite

    def _scan_safely(
        self, optimizers: list[torch.optim.Optimizer], rank: int, loss: torch.Tensor | None
    ) -> Report:
        """The findings of ``optimizers`` and ``loss`` (None: not looked at)."""
        try:
            if optimizers:
                return scan(optimizers, self.names, loss)
            return Report(0, loss_nonfinite=loss_nonfinite(loss))
        except Exception:  # a diagnosis must never stop training, nor leave the gather
            log.exception("scalewatch: could not explain this overflow on rank %d", rank)
            return Report(0)

    def end_step(self, values: StepValues | None, attribution: Attribution) -> Overflow | None:
        """Forget this step's state; what ``explain`` needs if the host knows it overflowed.

        ``values``: a cpu step's values as read; None on cuda, where found_inf is known only
        as ``step()`` read it (the fused-optimizer path reads nothing: its overflows are not
        explained on cuda).
        """
        if values is not None and not values.found > 0 and self.clean_step():
            return None  # a clean cpu step: nothing to explain
        optimizers, self.optimizers = self.optimizers, []
        read, self.host_rows = self.host_rows, []
        reports, loss_bad = self.reports, self.loss_bad
        if self.scanned:  # step() met an overflow: its findings are this step's
            self.reports, self.scanned, self.loss_bad = [], set(), None
        if values is not None:
            if not values.found > 0:
                return None
            rows = values.payloads if attribution.ranks else [[values.found]]
        else:
            rows = [row for _, row in read]
            if not any(_payload.any_overflow(row) for row in rows):
                return None
        return Overflow(
            optimizers=optimizers, read=read, rows=rows, reports=reports, loss_bad=loss_bad
        )

    def explain(
        self,
        overflow: Overflow,
        values: StepValues | None,
        attribution: Attribution,
        loss: torch.Tensor | None,
        group: Group | None,
        process_group: Any,
    ) -> Diagnosis | None:
        """The findings of an ``overflow`` step (``end_step``'s; ``loss``: the one
        ``scale()`` saw), gathered from every rank of ``group`` where they agreed found_inf;
        None on a rank that does not report."""
        rank, gathering = _reporting(group, attribution)
        if not gathering and rank != 0:
            return None
        reports, loss_bad = overflow.reports, overflow.loss_bad
        if values is not None:  # cpu: what step() did not read (a fused optimizer)
            seen = {id(optimizer) for optimizer, _ in overflow.read}
            pending = [o for o in overflow.optimizers if id(o) not in seen]
            rows = overflow.rows
            local = not attribution.ranks or any(_payload.has_rank(row, rank) for row in rows)
            if (pending and local) or loss_bad is None:
                report = self._scan_safely(
                    pending if local else [], rank, loss if loss_bad is None else None
                )
                reports = [*reports, report]
                loss_bad = bool(loss_bad) or report.loss_nonfinite
        report = _merged(rank, reports, bool(loss_bad))
        if not gathering:
            return combine([report])
        assert group is not None
        gathered = gather_reports(report, group, process_group)
        return None if gathered is None else combine(gathered)


@dataclass(frozen=True, slots=True, kw_only=True)
class Overflow:
    """What a step the host knows overflowed leaves to explain (``Diagnoser.end_step``)."""

    optimizers: list[torch.optim.Optimizer]  # every optimizer the step saw
    read: list[tuple[torch.optim.Optimizer, list[float]]]  # those step() read found_inf of
    rows: Sequence[list[float]]  # found_inf as read: [found] or each payload's words
    reports: list[Report]  # step()'s scans
    loss_bad: bool | None  # whether the loss was non-finite; None: not looked at


def _reporting(group: Group | None, attribution: Attribution) -> tuple[int, bool]:
    """(this rank, whether the ranks gather their findings: they agreed found_inf)."""
    return (0, False) if group is None else (group.rank, attribution.gathers)


def _merged(rank: int, reports: list[Report], loss_bad: bool) -> Report:
    """One rank's reports of a step (a scan per optimizer) as one, ``LIMIT`` kept."""
    params = [param for report in reports for param in report.params]
    omitted = sum(report.omitted for report in reports) + max(0, len(params) - LIMIT)
    return Report(rank, tuple(params[:LIMIT]), omitted, bool(loss_bad))
