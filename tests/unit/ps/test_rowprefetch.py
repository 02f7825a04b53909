"""The row cache's prefetch against a real server: the next chunk's missing rows are
fetched while a chunk trains and taken at its admission, a row another worker changed
after the fetch gets the value of the answer that came back in between, and a fetch that
fails or does not come back in time is given up for a synchronous pull (counted)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest

from tensorspark.ps import ParameterClient, ParameterServer
from tensorspark.ps.prefetch import Prefetch
from tensorspark.ps.rowcache import RowCache, SlotMap
from tensorspark.ps.rows import rows_entry
from tensorspark.ps.rowsync import RowSync

pytestmark = pytest.mark.unit

TABLE, ROWS_N, DIM, SLOTS = "emb/embeddings", 20000, 8, 8


def _params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        TABLE: rng.normal(size=(ROWS_N, DIM)).astype(np.float32),
        "dense/bias": np.zeros(4, np.float32),
    }


class _SlotModel:
    """A worker's weights as numpy arrays (the table: ``SLOTS`` slots), for RowSync."""

    tables = [TABLE]

    def __init__(self) -> None:
        self.weights: dict[str, np.ndarray] = {}

    def candidates(self, name: str) -> None:
        return None  # compare every slot

    def read(self, names: list[str]) -> dict[str, np.ndarray]:
        return {n: self.weights[n].copy() for n in names}

    def write(self, params: Mapping[str, np.ndarray]) -> None:
        self.weights.update({k: np.array(v, copy=True) for k, v in params.items()})

    def read_rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        return self.weights[name][ids]

    def write_rows(self, name: str, ids: np.ndarray, values: np.ndarray) -> None:
        self.weights[name][ids] = values


def _chunk(ids: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(np.array([ids], np.int32), np.zeros(1, np.float32))]


def _idle(prefetch: Prefetch, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while prefetch.busy():
        assert time.monotonic() < deadline, "the prefetch thread did not end"
        time.sleep(0.01)


def _worker(
    server: ParameterServer, prefetch_client: Any, wait: float = 10.0
) -> tuple[RowCache, RowSync, dict[str, int], ParameterClient]:
    client = ParameterClient(server.url, **server.client_options())
    counts: dict[str, int] = {}
    prefetch = Prefetch(prefetch_client, [TABLE], 0, wait)
    cache = RowCache(SlotMap(SLOTS), [TABLE], client, 0, counts, lambda t, s: None, prefetch)
    sync = RowSync(_SlotModel(), None, counts, cache)
    sync.start({TABLE: np.zeros((SLOTS, DIM), np.float32), "dense/bias": np.zeros(4, np.float32)})
    return cache, sync, counts, client


def _push(client: ParameterClient, ids: list[int], delta: float, base: int, seq: int) -> Any:
    """Another worker's row-sparse push (partition 1) adding ``delta`` to rows ``ids``."""
    meta = {
        "partition": 1, "epoch": 0, "seq": seq, "attempt": 0, "samples": 1,
        "base_version": base, "rows": [TABLE],
    }  # fmt: skip
    update: dict[str, Any] = {"dense/bias": np.zeros(4, np.float32)}
    values = np.full((len(ids), DIM), delta, np.float32)
    update.update(rows_entry(TABLE, np.array(ids, np.int64), values))
    return client.push(update, meta)


def test_the_next_chunks_misses_are_prefetched_and_take_the_newer_answers_rows() -> None:
    params = _params()
    with ParameterServer(params, "delta", embeddings="sparse") as server:
        options = server.client_options()
        other = ParameterClient(server.url, **options)
        cache, sync, counts, client = _worker(server, ParameterClient(server.url, **options))
        assert cache.prefetch is not None
        try:
            first = _chunk([1, 2, 3])
            at = cache.admit(cache.chunk_ids(first), sync)  # nothing expected: pulled
            assert counts["cache_prefetch_fallbacks"] == 0 and counts["cache_rows_pulled"] == 3
            following = _chunk([3, 4, 5, 6])
            cache.ahead(following)  # 4, 5, 6 (3 is held and stays held)
            _idle(cache.prefetch)  # fetched at version 0 ...
            # ... then another worker changes row 4 (a prefetched one) and row 2 (held).
            assert _push(other, [4, 2], 0.5, base=0, seq=0).status == "applied"
            # "Chunk k trains" (row 1 moves) and syncs: its answer brings rows 4, 2 and 1.
            sync.model.weights[TABLE][at[0]] += 1.0  # type: ignore[attr-defined]
            meta: dict[str, Any] = {
                "partition": 0, "epoch": 0, "seq": 0, "attempt": 0, "samples": 1,
                "base_version": 0,
            }  # fmt: skip
            dense, rows = sync.update(meta)
            answer = client.push({**dense, **rows}, meta)
            assert answer.status == "applied"
            sync.absorb(answer.params)
            sync.install()
            ids = cache.chunk_ids(following)
            slots = cache.admit(ids, sync)
            assert counts["cache_prefetch_hits"] == 3 and counts["cache_prefetched"] == 3
            assert counts["cache_prefetch_fallbacks"] == 0
            assert counts["cache_rows_pulled"] == 6 and counts["cache_misses"] == 6
            _, now = client.pull()
            expected = now[TABLE][ids]
            np.testing.assert_array_equal(sync.base[TABLE][slots], expected)
            np.testing.assert_array_equal(sync.model.weights[TABLE][slots], expected)  # type: ignore[attr-defined]
            np.testing.assert_allclose(expected[1], params[TABLE][4] + 0.5, rtol=0, atol=1e-6)
            # A chunk whose ids are all held and fresh fetches nothing.
            cache.ahead(_chunk([4, 5]))
            assert not cache.prefetch.busy()
            cache.admit(np.array([4, 5], np.int64), sync)
            assert counts["cache_prefetch_fallbacks"] == 0 and counts["cache_hits"] == 3
        finally:
            cache.close()
            client.close()
            other.close()


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A TCP port that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


@pytest.fixture
def closed_port() -> str:
    """A port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("where", ["silent_server", "closed_port"])
def test_a_prefetch_that_fails_or_is_late_falls_back_to_a_pull(
    where: str, request: pytest.FixtureRequest
) -> None:
    params = _params()
    url = request.getfixturevalue(where)
    with ParameterServer(params, "delta", embeddings="sparse") as server:
        late = ParameterClient(url, timeout=1.0, ps_timeout=1.0, connect_timeout=0.5)
        cache, sync, counts, client = _worker(server, late, wait=0.3)
        assert cache.prefetch is not None
        try:
            cache.admit(np.array([1, 2], np.int64), sync)
            following = _chunk([2, 7, 9])
            cache.ahead(following)
            started = time.monotonic()
            ids = cache.chunk_ids(following)
            slots = cache.admit(ids, sync)
            assert time.monotonic() - started < 5.0
            assert counts["cache_prefetch_fallbacks"] == 1 and counts["cache_prefetch_hits"] == 0
            assert counts["cache_rows_pulled"] == 4  # 1, 2, then 7 and 9 pulled here
            np.testing.assert_array_equal(sync.base[TABLE][slots], params[TABLE][ids])
            if where == "silent_server":  # still out: the next chunk gets no fetch
                assert cache.prefetch.busy()
                cache.ahead(_chunk([11]))
                assert counts["cache_prefetch_fallbacks"] == 2
                cache.admit(np.array([11], np.int64), sync)
                assert counts["cache_prefetch_fallbacks"] == 2  # not counted twice
            np.testing.assert_array_equal(sync.base[TABLE][cache.map.slot_of(9)], params[TABLE][9])
        finally:
            cache.close()
            client.close()
            _idle(cache.prefetch)  # its thread ends with its client's timeouts
