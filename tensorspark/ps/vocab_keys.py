"""The exactly-once keys of ``POST /vocab``: per partition, the latest ``(attempt, key)``
counted, and each table's map's own last key (:meth:`IdMap.map
<tensorspark.ps.vocab.IdMap.map>`). :mod:`~tensorspark.ps.vocab_route` documents the rules:
a retry counts nothing, a superseded attempt's request or a late copy is refused with 409.

A shard's books at a consistent cut carry them (:meth:`VocabKeys.books`,
:mod:`~tensorspark.ps.cut_books`), so a shard restarted from the cut still counts a retry
of a request it answered before the cut once, and still refuses a late copy. A checkpoint
does not: a job resumed from one starts its attempts again, and the old job's keys would
refuse its requests. A new run on the same server starts them again
(:meth:`VocabKeys.new_run`).

Not thread-safe: the store's loop thread owns it, like the maps.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from tensorspark.ps.validation import RequestError
from tensorspark.ps.vocab import IdMap

logger = logging.getLogger(__name__)


class VocabKeys:
    """The ``/vocab`` keys of a store's dynamic tables.

    Args:
        maps: the tables' maps, by name: the dict :class:`~.vocab_route.VocabTables` holds
            (a map it replaces there, restored from a checkpoint, is the one read).
    """

    def __init__(self, maps: Mapping[str, IdMap]) -> None:
        self.maps = maps
        #: Per partition, the latest ``(attempt, key)`` of a ``/vocab`` request counted.
        self._last: dict[int, tuple[int, int]] = {}

    def take(self, partition: int, attempt: int, key: int) -> None:
        """Accept a request's ``(attempt, key)`` for ``partition`` (see the module).

        Raises:
            RequestError: 409: an older attempt than the latest, or a key older than the
                latest attempt's last (a late copy); nothing changed.
        """
        last = self._last.get(partition)
        if last is not None and attempt < last[0]:
            raise RequestError(
                409,
                f"partition {partition}'s attempt {attempt} was superseded by attempt "
                f"{last[0]}; its /vocab request is refused (nothing counted)",
            )
        if last is not None and attempt == last[0] and key < last[1]:
            raise RequestError(
                409,
                f"a late copy of an earlier /vocab request of partition {partition}'s attempt "
                f"{attempt}; refused (nothing counted)",
            )
        if last is not None and key < last[1]:  # a new attempt from an earlier chunk
            for idmap in self.maps.values():
                idmap.forget(partition)
        self._last[partition] = (attempt, key)

    def new_run(self) -> None:
        """A new run on this server: every partition's keys and attempts start again."""
        for partition in self._last:
            for idmap in self.maps.values():
                idmap.forget(partition)
        self._last.clear()

    def books(self) -> dict[str, Any]:
        """The keys as JSON, for a shard's books at a consistent cut: ``last``: ``[partition,
        attempt, key]`` each; ``maps``: per table, ``[partition, key]`` each."""
        return {
            "last": [[p, attempt, key] for p, (attempt, key) in self._last.items()],
            "maps": {
                name: [[p, key] for p, key in idmap.last_keys().items()]
                for name, idmap in self.maps.items()
            },
        }

    def load(self, books: Mapping[str, Any]) -> None:
        """Take :meth:`books` back (a shard restarted from the cut, before its replay). A
        map's keys come without their first answers (:meth:`IdMap.restore_keys
        <tensorspark.ps.vocab.IdMap.restore_keys>`); tables the books do not name keep none."""
        self._last = {int(p): (int(attempt), int(key)) for p, attempt, key in books["last"]}
        for name, keys in dict(books.get("maps") or {}).items():
            idmap = self.maps.get(name)
            if idmap is None:
                logger.warning("the cut's /vocab keys name table %r, not held here", name)
                continue
            idmap.restore_keys({int(p): int(key) for p, key in keys})
