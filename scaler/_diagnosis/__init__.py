"""Overflow diagnosis in a scaler: ``watch(model)``, the loss seen by ``scale()``, and the
findings of an overflow step.

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
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, overload

import torch

from .._agreement import payload as _payload
from .._agreement.payload import Attribution
from .._torch_compat import opt_step_unless_inf
from .findings import LIMIT, Diagnosis, Report, combine, loss_nonfinite, scan
from .gather import gather_reports
from .names import Names

if TYPE_CHECKING:
    from .._recording.step_values import StepValues
    from .._torch_compat import TorchGradScaler as _Base
else:
    _Base = object

log = logging.getLogger("scaler")


class StepWatch:
    """A scaler's diagnosis state: the names registered, and what this step has seen.

    Transient (a copy of the scaler watches nothing until ``watch()`` is called again).
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

    def add_loss(self, loss: torch.Tensor) -> None:
        """A second ``scale()`` call in a step (gradient accumulation): the sum is kept."""
        assert self.loss is not None
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


class Watching(_Base):
    """The diagnosis half of :class:`scaler._scaler.Instrumented`."""

    _watch: StepWatch

    def watch(self, model: torch.nn.Module) -> int:
        """Name ``model``'s parameters in overflow reports; returns how many names it gave.

        Names are those of ``model.named_parameters()`` (less FSDP's wrapper prefixes):
        plain modules, DDP, FSDP1 (an FSDP1 flat parameter names each original parameter
        it holds) and FSDP2. Parameters no watched model has are named by optimizer
        position and shape, as ``"group 0 param 17 (4096, 4096)"``. A copy of the scaler
        (pickle, deepcopy) forgets the names: call ``watch`` on it again.
        """
        return self._watch.names.watch(model)

    @overload
    def scale(self, outputs: torch.Tensor) -> torch.Tensor: ...

    @overload
    def scale(self, outputs: list[torch.Tensor]) -> list[torch.Tensor]: ...

    @overload
    def scale(self, outputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]: ...

    @overload
    def scale(self, outputs: Iterable[torch.Tensor]) -> Iterable[torch.Tensor]: ...

    def scale(
        self, outputs: torch.Tensor | Iterable[torch.Tensor]
    ) -> torch.Tensor | Iterable[torch.Tensor]:
        """As torch's; a one-element tensor is also this step's loss for the record."""
        scaled = super().scale(outputs)
        if isinstance(outputs, torch.Tensor) and self._enabled and outputs.numel() == 1:
            watch = self._watch
            if watch.loss is None:
                watch.loss = outputs
            else:
                watch.add_loss(outputs)
        return scaled

    def _check_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        self._watch.optimizers.append(optimizer)  # the fused path: no _maybe_opt_step
        return super()._check_inf_per_device(optimizer)

    def _maybe_opt_step(
        self,
        optimizer: torch.optim.Optimizer,
        optimizer_state: dict[str, Any],
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        result, found = opt_step_unless_inf(optimizer, optimizer_state, args, kwargs)
        watch = self._watch
        watch.optimizers.append(optimizer)
        watch.host_rows.append((optimizer, [found]))
        if found:
            self._overflowed_at_step(optimizer, [found], Attribution.single())
        return result

    def _overflowed_at_step(
        self, optimizer: torch.optim.Optimizer, row: list[float], attribution: Attribution
    ) -> None:
        """step() read on the host that ``optimizer``'s step overflowed (``row``: its found_inf
        or payload words, whose flags ``attribution`` says): scan its gradients now."""
        rank, gathering = self._reporting(attribution)
        if not gathering and rank != 0:
            return  # nothing to send, nothing to record
        watch = self._watch
        watch.scanned.add(id(optimizer))
        local = not attribution.ranks or _payload.has_rank(row, rank)
        loss = watch.loss if watch.loss_bad is None else None  # the loss once a step
        report = self._scan_safely([optimizer] if local else [], rank, loss)
        watch.reports.append(report)
        watch.loss_bad = bool(watch.loss_bad) or report.loss_nonfinite

    def _scan_safely(
        self, optimizers: list[torch.optim.Optimizer], rank: int, loss: torch.Tensor | None
    ) -> Report:
        """The findings of ``optimizers`` and ``loss`` (None: not looked at)."""
        try:
            if optimizers:
                return scan(optimizers, self._watch.names, loss)
            return Report(0, loss_nonfinite=loss_nonfinite(loss))
        except Exception:  # a diagnosis must never stop training, nor leave the gather
            log.exception("scalewatch: could not explain this overflow on rank %d", rank)
            return Report(0)

    def _reporting(self, attribution: Attribution) -> tuple[int, bool]:
        """(this rank, whether the ranks gather their findings: they agreed found_inf)."""
        group = self._group_info()
        return (0, False) if group is None else (group[0], attribution.gathers)

    def _diagnose(
        self, values: StepValues | None, attribution: Attribution, loss: torch.Tensor | None
    ) -> Diagnosis | None:
        """This step's findings if the host knows it overflowed (and the rank reports).

        ``values``: a cpu step's values as read; None on cuda, where found_inf is known only
        as ``step()`` read it (the fused-optimizer path reads nothing: its overflows are not
        explained on cuda).
        """
        watch = self._watch
        if values is not None and not values.found > 0 and watch.clean_step():
            return None  # a clean cpu step: nothing to explain
        optimizers, watch.optimizers = watch.optimizers, []
        read, watch.host_rows = watch.host_rows, []
        rows = [row for _, row in read]
        reports, scanned, loss_bad = watch.reports, watch.scanned, watch.loss_bad
        if scanned:  # step() met an overflow: its findings are this step's
            watch.reports, watch.scanned, watch.loss_bad = [], set(), None
        if values is not None:
            if not values.found > 0:
                return None
            rows = values.payloads if attribution.ranks else [[values.found]]
        elif not any(_payload.any_overflow(row) for row in rows):
            return None
        rank, gathering = self._reporting(attribution)
        if not gathering and rank != 0:
            return None
        if values is not None:  # cpu: what step() did not read (a fused optimizer)
            seen = {id(optimizer) for optimizer, _ in read}
            pending = [o for o in optimizers if id(o) not in seen]
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
        group = self._group_info()
        assert group is not None
        gathered = gather_reports(report, group, self._reporting_group())
        return None if gathered is None else combine(gathered)

    if TYPE_CHECKING:  # Instrumented's

        def _group_info(self) -> tuple[int, int] | None: ...

        def _reporting_group(self) -> Any: ...


def _merged(rank: int, reports: list[Report], loss_bad: bool) -> Report:
    """One rank's reports of a step (a scan per optimizer) as one, ``LIMIT`` kept."""
    params = [param for report in reports for param in report.params]
    omitted = sum(report.omitted for report in reports) + max(0, len(params) - LIMIT)
    return Report(rank, tuple(params[:LIMIT]), omitted, loss_bad)
