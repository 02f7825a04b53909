"""The frames a shard process and the driver exchange over its stdin and stdout.

::

    u32 header length | u32 0 | u64 data length | header JSON | data (a wire message)

(:mod:`tensorspark.ps.shard` says what the headers hold.) Pure I/O, on whichever thread
holds the stream: the writer's caller holds its lock.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import IO, Any

from tensorspark import wire

_FRAME = struct.Struct("<IIQ")
_MAX_HEADER = 64 * 1024 * 1024


def write_frame(out: IO[bytes], header: Mapping[str, Any], data: list[Any] | bytes = b"") -> None:
    """Write one frame (not thread-safe: hold the writer's lock)."""
    parts = [data] if isinstance(data, (bytes, bytearray)) else data
    text = json.dumps(header).encode("utf-8")
    out.write(_FRAME.pack(len(text), 0, wire.encoded_size(parts)) + text)
    for part in parts:
        out.write(part)
    out.flush()


def read_frame(inp: IO[bytes]) -> tuple[dict[str, Any], bytearray]:
    """Read one frame; EOFError when the other side closed the pipe."""
    head = _read_exactly(inp, _FRAME.size)
    hlen, _, dlen = _FRAME.unpack(head)
    if hlen > _MAX_HEADER:
        raise EOFError(f"bad frame header length {hlen}")
    header = json.loads(bytes(_read_exactly(inp, hlen)).decode("utf-8"))
    return header, _read_exactly(inp, dlen)


def _read_exactly(inp: IO[bytes], n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        chunk = inp.readinto(view[got:])  # type: ignore[attr-defined]
        if not chunk:
            raise EOFError("the pipe closed")
        got += chunk
    return buf
