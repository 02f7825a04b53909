"""The clock of a parameter server's id maps (:mod:`tensorspark.ps.vocab_route`), and the
meta key a journaled ``/vocab`` request keeps its reading under (:mod:`~tensorspark.ps.journal`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

#: A journaled ``/vocab`` request's clock reading (this host's ``time.monotonic``).
CLOCK = "map_clock"


class MapClock:
    """The clock of a server's id maps: ``time.monotonic`` (plus :attr:`offset`), fixed
    for the length of one ``/vocab`` request (every table maps it at one reading).

    A restarted shard replays the ``/vocab`` requests journaled since its cut
    (:mod:`~tensorspark.ps.journal`) each at the reading it was first mapped at, and counts
    from the cut's reading
    (:meth:`~tensorspark.ps.vocab_route.VocabTables.count_from_cut`): ``ttl`` expiries
    and the least-recently-seen choices (eviction ties, waiting ids forgotten) then come
    out as they did, so the restarted map equals the dead one at the same map versions.
    """

    def __init__(self) -> None:
        self.at: float | None = None  # the request's reading (this host's monotonic clock)
        self.offset = 0.0  # a restarted shard's: its restore's reading minus the cut's

    def __call__(self) -> float:
        return (time.monotonic() if self.at is None else self.at) + self.offset

    @contextmanager
    def fixed(self, at: float | None = None) -> Iterator[float]:
        """Read the clock once and hold that reading (``at``, else one already held, else
        ``time.monotonic()``) until the block ends; yields the reading (this host's)."""
        reading = at if at is not None else self.at if self.at is not None else time.monotonic()
        self.at = reading
        try:
            yield reading
        finally:
            self.at = None
