"""``$SCALEWATCH_SKIP_ON_SPIKE``: skipping a spiking batch turned on from the environment
(``scalewatch instrument --skip-on-spike``), read without importing torch."""

from __future__ import annotations

import math

__all__ = ["ENV", "thresholds_from_env"]

ENV = "SCALEWATCH_SKIP_ON_SPIKE"


def thresholds_from_env(text: str) -> dict[str, float]:
    """``$SCALEWATCH_SKIP_ON_SPIKE``'s thresholds, as :meth:`skip_on_spike` takes them:
    ``grad_norm_z=8,loss_z=8`` (either alone). A ``ValueError`` of one line names the
    variable and what it takes.

    >>> thresholds_from_env("grad_norm_z=8, loss_z=10")
    {'grad_norm_z': 8.0, 'loss_z': 10.0}
    """
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        name = name.strip()
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if name not in ("grad_norm_z", "loss_z") or name in out or not number > 0:
            raise ValueError(
                f"${ENV} takes grad_norm_z=Z and/or loss_z=Z (each a number above 0,"
                f" comma-separated), not {text!r}"
            )
        out[name] = number
    return out
