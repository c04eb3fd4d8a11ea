"""What a rule kind's value and threshold count, and how a person says one.

>>> Unit.SHARE.say(0.6363636363636364), Unit.SECONDS.say(185.2), Unit.SCALE.say(0.5)
('64%', '3 min 5 s', '0.5')
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Unit"]


class Unit(Enum):
    """What a kind's value and threshold count."""

    NUMBER = "number"  # a plain number
    SCALE = "scale"
    COUNT = "count"
    SHARE = "share"
    SECONDS = "seconds"
    FLAG = "flag"

    def say(self, value: float) -> str:
        if self is Unit.SHARE:  # whole percents from 10% up: "64%", "8.1%", "0.5%"
            percent = value * 100
            return f"{percent:.0f}%" if percent >= 10 else f"{percent:.2g}%"
        if self is Unit.SECONDS:
            return _duration(value)
        if self in (Unit.COUNT, Unit.FLAG) and float(value).is_integer():
            return str(int(value))
        return f"{value:.4g}"


def _duration(seconds: float) -> str:
    whole = round(seconds)
    if whole < 60:
        return f"{seconds:.3g} s" if seconds < 10 else f"{whole} s"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(hours, "h"), (minutes, "min"), (secs, "s")]
    shown = [f"{n} {name}" for n, name in parts if n][:2]
    return " ".join(shown)
