"""What tests that start processes share."""

from __future__ import annotations

import signal
import subprocess
from typing import Any


def interruptible(command: list[str], **options: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(command, **options)`` with SIGINT at its default in the child, so
    that a test's Ctrl-C (``send_signal(SIGINT)``) reaches it however the suite was started:
    a shell starts a background job (``make test &``) with SIGINT ignored, and a child
    inherits that, as Python does at its start (no KeyboardInterrupt then)."""
    return subprocess.Popen(command, preexec_fn=_sigint_at_default, **options)


def _sigint_at_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def end_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """Terminate ``proc`` if it still runs, and kill it if it is not gone in ``timeout`` s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
