"""The mirrors ``$SCALEWATCH_MIRROR`` names, for a script that cannot be edited.

>>> parse("")
()
>>> parse("tensorboard:./tb, mlflow")
(('tensorboard', './tb'), ('mlflow', None))
>>> parse("comet")
Traceback (most recent call last):
...
ValueError: SCALEWATCH_MIRROR: unknown tracker 'comet' (one of tensorboard, mlflow, wandb)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from ._base import Mirror

ENV = "SCALEWATCH_MIRROR"
TRACKERS = ("tensorboard", "mlflow", "wandb")
_TAKES_A_FOLDER = {"tensorboard"}


def parse(text: str) -> tuple[tuple[str, str | None], ...]:
    """``tracker[:folder]`` items, comma-separated, as (tracker, folder or None)."""
    named = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        tracker, colon, folder = item.partition(":")
        tracker = tracker.strip().lower()
        if tracker not in TRACKERS:
            raise ValueError(f"{ENV}: unknown tracker {tracker!r} (one of {', '.join(TRACKERS)})")
        if colon and tracker not in _TAKES_A_FOLDER:
            raise ValueError(f"{ENV}: {tracker} takes no folder, got {item!r}")
        named.append((tracker, folder.strip() or None if colon else None))
    return tuple(named)


def from_env() -> tuple[Mirror, ...]:
    """The mirrors ``$SCALEWATCH_MIRROR`` names (none when unset)."""
    from ._mlflow import MLflow
    from ._tensorboard import TensorBoard
    from ._wandb import WandB

    makers: dict[str, Callable[[str | None], Mirror]] = {
        "tensorboard": TensorBoard,
        "mlflow": lambda _: MLflow(),
        "wandb": lambda _: WandB(),
    }
    return tuple(makers[tracker](folder) for tracker, folder in parse(os.environ.get(ENV, "")))


def chosen_mirrors(given: Sequence[Mirror] | None, telemetry: object) -> tuple[Mirror, ...]:
    """A scaler's mirrors: those ``given``, or, None, those ``$SCALEWATCH_MIRROR`` names.

    They log what telemetry records: with it off (``telemetry=False``) the environment's
    are left unused, and mirrors given are refused.
    """
    if given is None:
        return () if telemetry is False else from_env()
    mirrors = tuple(given)
    for mirror in mirrors:
        if not isinstance(mirror, Mirror):
            raise TypeError(f"mirrors must be scalewatch.mirrors.Mirror objects, got {mirror!r}")
    if mirrors and telemetry is False:
        raise ValueError("mirrors log what telemetry records: they need telemetry on")
    return mirrors
