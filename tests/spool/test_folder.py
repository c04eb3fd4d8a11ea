"""The spool's folder: batches appended in order, sent from the oldest, a line cut short by
a kill dropped, the folder held by one process at a time and removed once all is sent."""

from __future__ import annotations

import json
from pathlib import Path

import scalewatch.spool
from scalewatch.spool import Spool, spooled_runs, unsent_bytes


def test_public_names_are_pinned() -> None:
    assert set(scalewatch.spool.__all__) == {
        "SPOOL_BYTES_ENV", "SPOOL_DIR_ENV", "TOKEN_ENV", "ServiceClient", "ServiceRefused",
        "Spool", "SpooledRun", "is_service_url", "send_orphans", "send_spool", "spool_bytes",
        "spool_root", "spooled_runs", "unsent_bytes",
    }  # fmt: skip


def test_batches_leave_in_order_and_the_folder_goes_with_the_last(tmp_path: Path) -> None:
    spool = Spool(tmp_path, "ab" * 16)
    assert spool.claim()
    assert not Spool(tmp_path, "ab" * 16).claim()  # one sender a run
    spool.write_run("http://sw:8765", {"name": "job"})
    for sequence in (1, 2, 3):
        spool.append({"sequence": sequence, "items": []})
    # A kill in the middle of a line: the next claim cuts it off.
    with open(spool.folder / "batches.jsonl", "ab") as file:
        file.write(b'{"sequence": 4, "it')
    spool.release()
    assert [(r.name, r.batches, r.held) for r in spooled_runs(tmp_path)] == [("job", 3, False)]

    again = Spool(tmp_path, "ab" * 16)
    assert again.claim() and again.last_sequence == 3
    sent = []
    while (head := again.head()) is not None:
        body, length = head
        sent.append(body["sequence"])
        again.pop(length)
        if body["sequence"] == 1:  # what a new process sees after the first was stored
            assert json.loads((again.folder / "sent").read_text()) == length
    assert sent == [1, 2, 3] and unsent_bytes(tmp_path) == 0
    again.release()
    assert not again.folder.exists()
