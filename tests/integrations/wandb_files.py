"""Read an offline W&B run back from its files, for the tests.

An offline run keeps its history only in ``run-<id>.wandb``: a LevelDB-style log (a
7-byte file header ``:W&B`` + magic + version, then 32 KiB blocks of records, each a
7-byte header — CRC32, length, type FULL/FIRST/MIDDLE/LAST — and a chunk) whose
records are ``wandb_internal_pb2.Record`` protobufs. The library ships no reader for
it any more, so this is one, following the format wandb writes.

``run.finish()`` in offline mode can return before the wandb-core process has written
the log (seen here: a 7-byte file right after ``finish()``), so :func:`history` waits
for the run's ``exit`` record, the last one wandb writes.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK_SIZE = 32 * 1024
HEADER_SIZE = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def run_file(wandb_dir: Path) -> Path:
    """The one ``.wandb`` file of the one offline run under ``wandb_dir``."""
    files = sorted(Path(wandb_dir).glob("**/offline-run-*/run-*.wandb"))
    assert len(files) == 1, f"expected one offline run under {wandb_dir}, found {files}"
    return files[0]


def raw_records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a W&B transaction log"
    pos = HEADER_SIZE
    pending = b""
    while pos + HEADER_SIZE <= len(data):
        room = BLOCK_SIZE - pos % BLOCK_SIZE
        if room < HEADER_SIZE:  # block trailer padding
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER_SIZE])
        pos += HEADER_SIZE
        if kind == 0 and length == 0:
            break
        chunk = data[pos:pos + length]
        pos += length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    parsed = []
    for raw in raw_records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        parsed.append(record)
    return parsed


def finished_records(path: Path, wait_s: float = 60.0) -> list[Any]:
    """The run's records once its ``exit`` record is on disk. W&B's writer may still be flushing:
    a record read half-written does not parse, and is read again on the next poll."""
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + wait_s
    while True:
        try:
            parsed = records(path) if path.stat().st_size > HEADER_SIZE else []
        except DecodeError:
            parsed = []
        if any(r.WhichOneof("record_type") == "exit" for r in parsed):
            return parsed
        if time.monotonic() > deadline:
            raise AssertionError(f"W&B never finished writing {path} ({path.stat().st_size} bytes)")
        time.sleep(0.1)


def history(path: Path) -> list[dict[str, Any]]:
    """Every ``run.log`` row of the finished run, values decoded from JSON (NaN included)."""
    return [
        {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in record.history.item}
        for record in finished_records(path)
        if record.WhichOneof("record_type") == "history"
    ]
