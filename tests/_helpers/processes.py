"""What tests that start processes share."""

from __future__ import annotations

import subprocess
from typing import Any


def end_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """Terminate ``proc`` if it still runs, and kill it if it is not gone in ``timeout`` s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
