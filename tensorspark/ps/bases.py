"""A shard's part of the last consistent cut, as the driver keeps it to restart the shard
from (:mod:`tensorspark.ps.revive`): the init message and books in memory (:class:`Base`),
the slice in ``base-<segment>.bin`` beside the shard's journal (:func:`write_base`, atomic),
the older ones deleted once a newer cut holds (:func:`drop_bases_before`). Driver only."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Base:
    """One shard's part of the last consistent cut: what a restart starts from."""

    init: dict[str, Any]  # the init message (its settings with the shard's port)
    path: Path  # its slice and combiner state (a wire message), in the journal's folder
    segment: int  # the first journal segment after the cut
    ledger: dict[str, Any] | None = None  # its books at the cut (ps/cut_books.py)


def write_base(folder: str | Path, segment: int, data: bytes | bytearray | list[Any]) -> Path:
    """Write a shard's slice at a cut (``data``: a wire message, or its parts) to
    ``base-<segment>.bin`` in its journal folder, atomically; returns the path."""
    path = Path(folder) / f"base-{segment:08d}.bin"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    try:
        with open(tmp, "wb") as f:
            for part in data if isinstance(data, list) else [data]:
                f.write(part)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # nothing half-written left behind
        raise
    return path


def drop_bases_before(folder: str | Path, segment: int) -> None:
    """Delete the shard's bases older than ``segment`` (a newer cut holds)."""
    for path in Path(folder).glob("base-*.bin"):
        if int(path.stem.partition("-")[2]) < segment:
            path.unlink(missing_ok=True)
