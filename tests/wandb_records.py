"""Read the records of an offline W&B run file (``run-*.wandb``), as W&B itself stores them.

The file is a LevelDB-style log: a 7-byte header (``:W&B``, magic 0xBEE1, version 0), then 32 KiB blocks of
chunks, each with a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) holding a serialised
``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32768
HEADER = struct.Struct("<4sHB")
CHUNK = struct.Struct("<IHB")


def read_records(path: Path) -> list[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    ident, magic, version = HEADER.unpack_from(data, 0)
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), "not a W&B run file"
    records, pending, offset = [], b"", HEADER.size
    while offset + CHUNK.size <= len(data):
        left_in_block = BLOCK - offset % BLOCK
        if left_in_block < CHUNK.size:  # padding at the end of a block
            offset += left_in_block
            continue
        _, length, kind = CHUNK.unpack_from(data, offset)
        payload = data[offset + CHUNK.size : offset + CHUNK.size + length]
        offset += CHUNK.size + length
        if kind == 0 and length == 0:
            continue
        pending = payload if kind in (1, 2) else pending + payload
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def history_values(records: list[wandb_internal_pb2.Record], key: str) -> list[str]:
    """The JSON values logged under ``key``, in order."""
    return [
        item.value_json
        for record in records
        if record.WhichOneof("record_type") == "history"
        for item in record.history.item
        if (item.key or "/".join(item.nested_key)) == key
    ]


def exit_codes(records: list[wandb_internal_pb2.Record]) -> list[int]:
    return [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"]
