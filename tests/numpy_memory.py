"""The numpy memory a test process holds, as ``tracemalloc`` counts numpy's data buffers
(their own allocation domain), for tests that assert how many copies of a table stay."""

from __future__ import annotations

import gc
import tracemalloc

NUMPY_DOMAIN = 389047  # numpy's tracemalloc domain (its data buffers)


def numpy_bytes() -> int:
    """Bytes of numpy data buffers alive now (``tracemalloc`` must be tracing), after a
    collection."""
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.DomainFilter(True, NUMPY_DOMAIN)]
    )
    return sum(t.size for t in snapshot.traces)
