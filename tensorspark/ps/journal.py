"""A shard's push journal: the pushes it applied since the driver's last base cut, on disk
(and its ``/vocab`` requests and stale refusals).

A :class:`~tensorspark.ps.shards.ShardedServer` restarts a shard process that died from
that shard's part of the last consistent cut, which the driver keeps (on its disk)
(:mod:`tensorspark.ps.revive`). The pushes the shard applied after that cut would be lost
with the process; the other shards still hold them, and the workers were answered. So each
shard writes every push it applies to its journal *before* applying it (a sync round's
contributions as the round completes, :meth:`Store.push <tensorspark.ps.store.Store.push>`),
and the restarted shard replays the journal in order: it ends exactly where the dead one
was, with every push it had answered (exactly once, the same order, so the same weights).

The journal is a folder the driver owns (the shard's process dies, the folder stays), of
numbered segments: ``00000000.log``, ... Each record is ``u64 length | wire message``
(:func:`tensorspark.wire.encode` of the push's tensors and meta). A shard SIGKILLed in the
middle of a write leaves a torn last record: that push was not applied (it is written first)
nor answered, so the worker's retry brings it again, and :func:`records` stops before it.
Written with ``os.write`` and no ``fsync``: a killed process's writes stay in the page
cache; a host that loses its page cache has lost the driver too.

A dynamic table's map (:mod:`~tensorspark.ps.vocab_route`) changes with each ``/vocab``
request: the shard journals the request, with the clock reading it was mapped at, before
its answer is sent, in the same order as the pushes, and the replay asks it again at that
reading (its ids counted, the rows it gave reset to the same draws; ``ttl`` expiries and
least-recently-seen choices alike, :class:`~tensorspark.ps.map_clock.MapClock`), so the
restarted shard holds the same map, at the same map versions. A request replayed twice (a
second restart) is a repeat of its partition's last key, or older: it counts nothing.

Exactly once across a restart, beyond the pushes: the cut's books
(:mod:`~tensorspark.ps.cut_books`) hold each partition's last ``/vocab`` keys and the
bases of the pushes refused as stale (:class:`~tensorspark.ps.push_checks.Rebases`), and
the restarted shard takes them back before its replay. So a worker's retry of a request
answered before the cut (or after it: the journal has it) counts nothing, a late copy of
an older one is still refused with 409, and a push refused as stale is weighed by the
version it was computed on when sent again. A stale refusal after the cut is a record of
its own (meta only, ``kind="refused"``, written before the refusal is answered): the
replay remembers its base (:meth:`Rebases.replayed
<tensorspark.ps.push_checks.Rebases.replayed>`) and pushes nothing.

At a full consistent cut the shard starts the next segment (:meth:`Journal.rotate`); once
the driver keeps that cut as its base, it deletes the older segments (:func:`drop_before`).

:class:`Journal` runs on the shard's loop thread; :func:`records` in the restarted shard
before its loop starts; :func:`drop_before` and :func:`segments` on the driver.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterator, Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from tensorspark import wire
from tensorspark.ps.map_clock import CLOCK
from tensorspark.ps.push_checks import REFUSED
from tensorspark.ps.validation import RequestError

logger = logging.getLogger(__name__)

_LENGTH = struct.Struct("<Q")
#: The meta key that marks a record that is not a push (``"vocab"``: a ``/vocab`` request;
#: :data:`REFUSED`: a push refused as stale, its base only).
KIND = "journal_kind"
_SUFFIX = ".log"


def segment_path(directory: str | Path, segment: int) -> Path:
    """The file of segment ``segment`` in ``directory``."""
    return Path(directory) / f"{segment:08d}{_SUFFIX}"


def segments(directory: str | Path) -> list[int]:
    """The segments in ``directory``, in order."""
    out = []
    for path in Path(directory).glob(f"*{_SUFFIX}"):
        try:
            out.append(int(path.stem))
        except ValueError:
            continue
    return sorted(out)


def drop_before(directory: str | Path, segment: int) -> None:
    """Delete the segments older than ``segment`` (the driver's base cut is newer)."""
    for old in segments(directory):
        if old < segment:
            segment_path(directory, old).unlink(missing_ok=True)


class Journal:
    """The shard's open journal: appends each applied push to the current segment.

    Args:
        directory: the shard's journal folder (made if missing).
        segment: the segment to write (made, or appended to).
    """

    def __init__(self, directory: str | Path, segment: int) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.segment = int(segment)
        self.bytes = 0  # written to the segments since the last rotate
        self._fd = self._open()

    def _open(self) -> int:
        path = segment_path(self.directory, self.segment)
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def write(self, tensors: Mapping[str, Any], meta: Mapping[str, Any], kind: str = "") -> None:
        """Append one push (before it is applied), or with ``kind="vocab"`` one ``/vocab``
        request (mapped, its answer not yet sent: a dynamic table's map changes, see the
        module), or with ``kind=REFUSED`` a stale refusal's record (:meth:`refusal`)."""
        # Always written: a push's meta from the network could name a kind itself.
        parts = wire.encode(dict(tensors), {**meta, KIND: kind})
        size = wire.encoded_size(parts)
        views = [memoryview(_LENGTH.pack(size))] + [memoryview(p).cast("B") for p in parts]
        while views:
            written = os.writev(self._fd, views)
            self.bytes += written
            while views and written >= views[0].nbytes:
                written -= views[0].nbytes
                views.pop(0)
            if views and written:
                views[0] = views[0][written:]

    __call__ = write

    def refusal(self, record: Mapping[str, Any]) -> None:
        """Append the record of a push refused as stale (:attr:`Rebases.journal
        <tensorspark.ps.push_checks.Rebases.journal>`; meta only), before it is answered."""
        self.write({}, record, kind=REFUSED)

    def rotate(self) -> int:
        """Start the next segment (at a full consistent cut); returns its number."""
        old = self._fd
        self.segment += 1
        try:
            self._fd = self._open()
        except OSError:
            self.segment -= 1
            raise
        os.close(old)
        self.bytes = 0
        return self.segment

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass


def records(
    directory: str | Path, first: int, last: int | None = None
) -> Iterator[tuple[dict[str, wire.Tensor], dict[str, Any]]]:
    """The pushes journaled in segments ``first``..``last`` (default: all from ``first``),
    in order, as ``(tensors, meta)``; a torn last record of a segment is left out."""
    for segment in segments(directory):
        if segment < first or (last is not None and segment > last):
            continue
        path = segment_path(directory, segment)
        data = path.read_bytes()
        view = memoryview(data)
        at = 0
        while at + _LENGTH.size <= len(data):
            (size,) = _LENGTH.unpack_from(data, at)
            if at + _LENGTH.size + size > len(data):
                break
            body = bytearray(view[at + _LENGTH.size : at + _LENGTH.size + size])
            at += _LENGTH.size + size
            yield wire.decode_encoded(body)
        if at != len(data):
            logger.warning(
                "journal %s: a torn last record (%d bytes) left out: that push was never "
                "applied nor answered, and its worker sends it again",
                path,
                len(data) - at,
            )


def replay(store: Any, directory: str | Path, first: int, last: int) -> int:
    """Apply the pushes, ``/vocab`` requests and stale refusals journaled in segments
    ``first``..``last`` to ``store`` (a restarted shard's
    :class:`~tensorspark.ps.store.Store`, its cut's books taken back, before its loop
    runs), in order, as they were first applied; returns how many. Its answers go nowhere
    (the workers had them)."""

    def respond(*answer: Any) -> None:
        release = answer[3] if len(answer) > 3 else None
        if callable(release):
            release()  # the lent parameter set goes back to the store's recycling

    count = 0
    for tensors, meta in records(directory, first, last):
        kind = meta.pop(KIND, "")
        if kind == REFUSED:  # its base remembered (and journaled again); nothing pushed
            store.rebases.replayed(meta)
        elif kind == "vocab":
            clock = getattr(store.vocab, "clock", None)
            at = meta.get(CLOCK) if isinstance(meta.get(CLOCK), float) else None
            try:
                with clock.fixed(at) if clock is not None else nullcontext():  # its reading
                    store.pull(respond, (tensors, meta), vocab=True)
            except RequestError:  # replayed already (a second restart): nothing counted
                continue
        else:
            store.push(tensors, meta, respond)
        count += 1
    return count
