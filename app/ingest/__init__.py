"""What a job sends the service over HTTP (``SCALEWATCH_DB=http://...``), and how it is stored.

``models``: the bodies, validated (a step's fields derived from the step schema); ``body``:
a batch's validated from its bytes; ``writes``:
a run opened for its job, a batch stored in its order, once. Runs on the service's
threadpool, one batch of a run at a time.
"""

from __future__ import annotations

from .body import BATCH_BODY, batch_schemas, parse_batch
from .models import BatchAnswer, BatchIn, PendingControl, RunOpen, RunOpened
from .writes import STORING_THREADS, RunBatches, open_job_run, store_batch

__all__ = [
    "BATCH_BODY",
    "STORING_THREADS",
    "BatchAnswer",
    "BatchIn",
    "PendingControl",
    "RunBatches",
    "RunOpen",
    "RunOpened",
    "batch_schemas",
    "open_job_run",
    "parse_batch",
    "store_batch",
]
