"""A job's link to the service when its store URL is ``http(s)://``: the client of the
service's ingest routes (``client``), and the node-local spool where batches wait while
the service cannot be reached (``folder``).

Imports neither torch nor the scaler's private modules: the telemetry's sender
(``scalewatch.telemetry._sender``) uses both on the reporting rank's writer thread, and
``scalewatch spool`` lists and sends what waits.
"""

from __future__ import annotations

from .client import TOKEN_ENV, ServiceClient, ServiceRefused, is_service_url
from .folder import (
    SPOOL_BYTES_ENV,
    SPOOL_DIR_ENV,
    Spool,
    SpooledRun,
    send_orphans,
    send_spool,
    spool_bytes,
    spool_root,
    spooled_runs,
    unsent_bytes,
)

__all__ = [
    "SPOOL_BYTES_ENV",
    "SPOOL_DIR_ENV",
    "TOKEN_ENV",
    "ServiceClient",
    "ServiceRefused",
    "Spool",
    "SpooledRun",
    "is_service_url",
    "send_orphans",
    "send_spool",
    "spool_bytes",
    "spool_root",
    "spooled_runs",
    "unsent_bytes",
]
