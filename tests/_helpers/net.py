"""Ports for tests that open sockets: each xdist worker draws from a block of its own.

``bind(("127.0.0.1", 0))`` would hand out a port from the kernel's ephemeral range, where
another worker's ``bind(0)`` (or a gloo rank's outgoing connection) may take it again before
the test listens on it: a 4-rank job whose rank 0 has not bound its store yet would lose its
port. The blocks lie below that range (Linux's is 32768-60999 by default), one per worker,
and a port is handed out only once it binds right now.

    >>> port = free_port()
    >>> FIRST <= port < FIRST + BLOCK * WORKERS
    True
"""

from __future__ import annotations

import itertools
import os
import socket

FIRST = 20_000
BLOCK = 1_000
WORKERS = 12  # blocks; a worker past the twelfth shares one (a port is still checked free)


def _worker_block() -> int:
    """This process's block: ``gw3`` (``PYTEST_XDIST_WORKER``) has the fourth; a run
    without xdist the first."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    return int(name) % WORKERS if name.isdigit() else 0


# From a place in the block that differs from process to process: two serial runs from two
# checkouts at once rarely try the same port first.
_offsets = itertools.count(os.getpid() % BLOCK)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now, from this worker's block."""
    first = FIRST + _worker_block() * BLOCK
    for _ in range(BLOCK):
        port = first + next(_offsets) % BLOCK
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise OSError(f"no free port in {first}-{first + BLOCK - 1}")
