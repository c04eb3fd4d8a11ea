"""Waiting on a condition, never on a guess of how long something takes.

>>> wait_for(lambda: 42, timeout=1.0, what="the answer")
42
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float = 10.0, what: str = "") -> T:
    """Poll ``condition`` until it returns something truthy, and return that; raise
    ``TimeoutError`` naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(0.01)
