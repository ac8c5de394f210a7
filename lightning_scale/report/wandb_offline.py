"""Read W&B's own run files (``run-*.wandb``, offline or synced) without uploading them.

The file is a LevelDB-style log: a 7-byte header (``:W&B``, magic 0xBEE1, version 0), then 32 KiB blocks of chunks,
each with a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) holding a serialised
``wandb_internal_pb2.Record``. A run that is still being written ends in a torn chunk, which is ignored.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

__all__ = ["exit_codes", "history_keys", "history_rows", "history_values", "read_records"]

BLOCK = 32768
HEADER = struct.Struct("<4sHB")
CHUNK = struct.Struct("<IHB")


def read_records(path: Path) -> list[Any]:
    """Every complete record of the run file ``path``, in order.

    Raises:
        ValueError: ``path`` is not a W&B run file.
    """
    from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
    from wandb.proto import wandb_internal_pb2  # here: importing W&B costs a process start-up ~0.7 s

    data = Path(path).read_bytes()
    if len(data) < HEADER.size or HEADER.unpack_from(data, 0) != (b":W&B", 0xBEE1, 0):
        raise ValueError(f"{path} is not a W&B run file (no ':W&B' header)")
    records, pending, offset = [], b"", HEADER.size
    while offset + CHUNK.size <= len(data):
        left_in_block = BLOCK - offset % BLOCK
        if left_in_block < CHUNK.size:  # padding at the end of a block
            offset += left_in_block
            continue
        _, length, kind = CHUNK.unpack_from(data, offset)
        payload = data[offset + CHUNK.size : offset + CHUNK.size + length]
        if len(payload) < length:  # the writer is still at it
            break
        offset += CHUNK.size + length
        if kind == 0 and length == 0:
            continue
        pending = payload if kind in (1, 2) else pending + payload
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]  # generated code
            try:
                record.ParseFromString(pending)
            except DecodeError:  # a damaged record: what came before it is what the file can say
                break
            records.append(record)
            pending = b""
    return records


def _key(item: Any) -> str:
    return str(item.key or "/".join(item.nested_key))


def history_values(records: list[Any], key: str) -> list[str]:
    """The JSON values logged under ``key``, in order."""
    return [
        item.value_json
        for record in records
        if record.WhichOneof("record_type") == "history"
        for item in record.history.item
        if _key(item) == key
    ]


def history_rows(records: list[Any]) -> list[dict[str, Any]]:
    """Each history row as ``{key: value}`` (numbers and strings; W&B's media and tables left out)."""
    rows = []
    for record in records:
        if record.WhichOneof("record_type") != "history":
            continue
        row: dict[str, Any] = {}
        for item in record.history.item:
            value = json.loads(item.value_json)
            if isinstance(value, (int, float, str)) and not isinstance(value, bool):
                row[_key(item)] = value
        rows.append(row)
    return rows


def history_keys(records: list[Any]) -> set[str]:
    """Every key the run's history logged, tables and media included."""
    return {_key(item) for r in records if r.WhichOneof("record_type") == "history" for item in r.history.item}


def exit_codes(records: list[Any]) -> list[int]:
    """The exit codes the run file records (one per finished run)."""
    return [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"]
