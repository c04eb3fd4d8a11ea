"""``TensorBoard``: steps as scalars in a ``SummaryWriter``'s event files."""

from __future__ import annotations

import os
from typing import Any

from ._base import Mirror, MirroredStep, RunLinks, require


class TensorBoard(Mirror):
    """Writes each step's values as TensorBoard scalars, at the optimizer step.

    ``target``: a folder (``str`` or path) for a ``SummaryWriter`` of the mirror's own,
    made on the reporting rank only, or the user's own ``SummaryWriter`` (torch's, or any
    with ``add_scalar``), which is flushed but left open. None: ``SummaryWriter()``'s own
    default folder (``runs/...``). Needs ``pip install scalewatch[tensorboard]``.
    """

    name = "tensorboard"

    def __init__(self, target: str | os.PathLike[str] | Any | None = None) -> None:
        super().__init__()
        require("tensorboard", "tensorboard", "scalewatch.mirrors.TensorBoard")
        self._target: Any = target
        self._writer: Any = None

    def _open(self) -> Any:
        if self._writer is None:
            target = self._target
            if target is None or isinstance(target, str | os.PathLike):
                from torch.utils.tensorboard import SummaryWriter

                target = SummaryWriter(None if target is None else os.fspath(target))
            self._writer = target
        return self._writer

    def describe(self, links: RunLinks) -> None:
        writer = self._open()
        text = "\n\n".join(f"{k}: {v}" for k, v in links.as_tags().items())
        writer.add_text("scalewatch/run", text, global_step=0)
        writer.flush()

    def write(self, steps: list[MirroredStep]) -> None:
        writer = self._open()
        for step in steps:
            for key, value in step.values.items():
                writer.add_scalar(key, value, global_step=step.step, walltime=step.wall_time)
        writer.flush()

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is None:
            return
        if writer is self._target:
            writer.flush()  # the user's: theirs to close
        else:
            writer.close()
