"""A W&B run's ``.wandb`` file read back: its records, as W&B's own protobuf messages.

The file is W&B's transaction log: a 7-byte header (``:W&B``, its magic, a version), then
LevelDB's log format in 32 KiB blocks (a record's chunks, each a 7-byte header of checksum,
length and type: full, first, middle, last). Each record is a ``wandb_internal_pb2.Record``
(what ``wandb sync`` uploads from an offline run).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = struct.Struct("<4sHB")  # ":W&B", 0xBEE1, version
CHUNK = struct.Struct("<IHB")  # checksum, length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    """Every record of a ``.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, _ = HEADER.unpack_from(data)
    assert (ident, magic) == (b":W&B", 0xBEE1), (ident, magic)
    out, pending, at = [], b"", HEADER.size
    while at + CHUNK.size <= len(data):
        left = BLOCK - at % BLOCK
        if left < CHUNK.size:  # a block's tail too short for a chunk is padding
            at += left
            continue
        _, length, kind = CHUNK.unpack_from(data, at)
        at += CHUNK.size
        if kind == 0 and length == 0:
            break
        pending += data[at : at + length]
        at += length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def history(path: Path) -> list[dict[str, Any]]:
    """The rows ``run.log`` wrote, each a dict of its keys and values."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows


def config(path: Path) -> dict[str, Any]:
    """The run's config as its updates left it."""
    values: dict[str, Any] = {}
    for record in records(path):
        if record.WhichOneof("record_type") == "config":
            for item in record.config.update:
                values[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return values
