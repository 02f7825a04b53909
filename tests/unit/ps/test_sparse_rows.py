"""Row-sparse pushes and answers of embedding tables, on a real server over loopback."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from tensorspark import wire
from tensorspark.errors import ParameterServerError
from tensorspark.ps import Compression, ParameterClient, ParameterServer
from tensorspark.ps.rows import IDS, ROWS, rows_entry, split
from tensorspark.ps.rowsync import RowSync
from tensorspark.ps.validation import RequestError

pytestmark = pytest.mark.unit

ROWS_N, DIM = 1000, 8


def _params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "emb/embeddings": rng.normal(size=(ROWS_N, DIM)).astype(np.float32),
        "dense/kernel": rng.normal(size=(DIM, 1)).astype(np.float32),
    }


def _meta(partition: int = 0, seq: int = 0, base: int = 0, samples: int = 10) -> dict[str, Any]:
    return {
        "partition": partition,
        "epoch": 0,
        "seq": seq,
        "attempt": 0,
        "samples": samples,
        "base_version": base,
        "rows": ["emb/embeddings"],
    }


def _push(ids: Any, values: np.ndarray | None = None) -> dict[str, Any]:
    ids = np.asarray(ids, dtype=np.int64)
    if values is None:
        values = np.ones((len(ids), DIM), np.float32)
    out: dict[str, Any] = {"dense/kernel": np.full((DIM, 1), 0.5, np.float32)}
    out.update(rows_entry("emb/embeddings", ids, values))
    return out


def _client(server: ParameterServer) -> ParameterClient:
    return ParameterClient(server.url, **server.client_options())


def test_wire_round_trip_and_int8_scale_per_row() -> None:
    values = np.arange(3 * DIM, dtype=np.float32).reshape(3, DIM)
    entry = rows_entry("t", np.array([4, 0, 9]), values, codec="int8")
    tensors, _ = wire.decode_encoded(wire.encode_bytes(entry, {"rows": ["t"]}))
    enc = tensors["t" + ROWS]
    assert isinstance(enc, wire.Encoded) and enc.block == DIM and enc.scales is not None
    assert enc.scales.shape == (3,)  # one scale per row
    dense, rows = split({"t": np.zeros((10, DIM), np.float32)}, tensors, {"rows": ["t"]})
    assert dense == {} and list(rows["t"].ids) == [4, 0, 9]
    np.testing.assert_allclose(rows["t"].array(), values, atol=values.max() / 254 + 1e-6)


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([1, 2, 1], "more than once"),
        ([-1, 3], "row id -1 is outside"),
        ([5, ROWS_N], f"row id {ROWS_N} is outside"),
    ],
)
def test_bad_ids_are_400_and_change_nothing(ids: list[int], message: str) -> None:
    with ParameterServer(_params()) as server, _client(server) as client:
        client.join(0, 0)
        before = server.params()
        with pytest.raises(ParameterServerError, match=message):
            client.push(_push(ids), _meta())
        after = server.params()
        assert server.version == 0
        for name in before:
            np.testing.assert_array_equal(before[name], after[name])


def test_rows_of_the_wrong_shape_or_a_missing_table_are_refused() -> None:
    model = _params()
    tensors = _push([1, 2])
    tensors["emb/embeddings" + ROWS] = np.ones((2, DIM + 1), np.float32)
    with pytest.raises(RequestError, match="must be float32"):
        split(model, tensors, _meta())
    with pytest.raises(RequestError, match="not a float32 tensor of the model"):
        split(model, _push([1]), {"rows": ["nope"]})
    del tensors["emb/embeddings" + IDS]
    with pytest.raises(RequestError, match="int64"):
        split(model, tensors, _meta())


def test_async_push_applies_rows_and_answers_rows_changed_since_base() -> None:
    params = _params()
    with ParameterServer(params, "delta") as server, _client(server) as client:
        assert client.join(0, 0)["rows"] is True
        first = client.push(_push([3, 7]), _meta(partition=0, seq=0, base=0))
        assert first.status == "applied" and first.version == 1
        assert list(first.params["emb/embeddings" + IDS]) == [3, 7]
        np.testing.assert_allclose(
            first.params["emb/embeddings" + ROWS], params["emb/embeddings"][[3, 7]] + 1
        )
        # Another worker at version 0 gets its own rows and the first worker's.
        client.join(1, 0)
        second = client.push(_push([7, 11]), _meta(partition=1, seq=0, base=0))
        assert list(second.params["emb/embeddings" + IDS]) == [3, 7, 11]
        now = server.params()
        np.testing.assert_allclose(now["emb/embeddings"][7], params["emb/embeddings"][7] + 2)
        np.testing.assert_allclose(now["emb/embeddings"][0], params["emb/embeddings"][0])
        np.testing.assert_allclose(now["dense/kernel"], params["dense/kernel"] + 1.0)
        status = client.status()
        assert status["rows_pushed"] == 4 and status["rows_pulled"] == 5
        assert status["rows_pushed_per_sync"] == 2.0


def test_a_retried_push_is_applied_once_and_answered_the_same_rows() -> None:
    params = _params()
    with ParameterServer(params) as server, _client(server) as client:
        client.join(0, 0)
        first = client.push(_push([5]), _meta(seq=0))
        again = client.push(_push([5]), _meta(seq=0))  # its answer was lost: sent again
        assert again.status == "duplicate" and again.version == first.version == 1
        assert list(again.params["emb/embeddings" + IDS]) == [5]
        np.testing.assert_allclose(
            server.params()["emb/embeddings"][5], params["emb/embeddings"][5] + 1
        )


def test_nan_rows_are_refused() -> None:
    with ParameterServer(_params()) as server, _client(server) as client:
        client.join(0, 0)
        bad = np.ones((1, DIM), np.float32)
        bad[0, 2] = np.nan
        result = client.push(_push([4], bad), _meta())
        assert result.status == "diverged" and server.version == 0


@pytest.mark.parametrize("combiner", ["mean", "nesterov"])
def test_servers_whose_combiner_needs_whole_tensors_refuse_rows(combiner: str) -> None:
    with ParameterServer(_params(), combiner) as server, _client(server) as client:
        assert client.join(0, 0)["rows"] is False
        with pytest.raises(ParameterServerError, match="no row-sparse pushes"):
            client.push(_push([1]), _meta())


def test_sync_round_of_rows_equals_the_dense_round() -> None:
    """Two workers' row pushes in one sync round give the dense round's weights, bit for bit."""
    params = _params()
    rng = np.random.default_rng(1)
    deltas = []
    for _ in range(2):
        d = np.zeros((ROWS_N, DIM), np.float32)
        ids = np.sort(rng.choice(ROWS_N, 50, replace=False))
        d[ids] = rng.normal(size=(50, DIM)).astype(np.float32)
        deltas.append((ids, d))
    results = {}
    for kind in ("dense", "rows"):
        with ParameterServer(params, mode="sync", num_workers=2) as server:
            clients = [_client(server) for _ in range(2)]
            for p, c in enumerate(clients):
                c.join(p, 0)

            def push(p: int, kind: str = kind, clients: list[Any] = clients) -> None:
                ids, d = deltas[p]
                meta = _meta(partition=p, samples=10 + 20 * p)
                dense = {"dense/kernel": np.full((DIM, 1), 0.1 * (p + 1), np.float32)}
                if kind == "dense":
                    meta.pop("rows")
                    clients[p].push({**dense, "emb/embeddings": d}, meta)
                else:
                    entry = rows_entry("emb/embeddings", ids, d[ids])
                    clients[p].push({**dense, **entry}, meta)

            threads = [threading.Thread(target=push, args=(p,)) for p in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            for c in clients:
                c.close()
            results[kind] = server.params()
    for name in params:
        np.testing.assert_array_equal(results["dense"][name], results["rows"][name])


class _Model:
    """A stand-in for the Keras adapter's row access, over plain arrays."""

    def __init__(self, params: dict[str, np.ndarray]) -> None:
        self.weights = {k: v.copy() for k, v in params.items()}
        self.tables = ["emb/embeddings"]

    def candidates(self, name: str) -> None:
        return None

    def read(self, names: list[str]) -> dict[str, np.ndarray]:
        return {n: self.weights[n].copy() for n in names}

    def write(self, params: dict[str, np.ndarray]) -> None:
        for k, v in params.items():
            self.weights[k] = np.array(v, copy=True)

    def read_rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        return self.weights[name][ids].copy()

    def write_rows(self, name: str, ids: np.ndarray, values: np.ndarray) -> None:
        self.weights[name][ids] = values


@pytest.mark.parametrize("codec", [None, "int8"])
def test_worker_row_sync_against_a_server_tracks_the_global_weights(codec: str | None) -> None:
    """Two workers sync rows for 30 rounds; each worker's copy equals the server's after
    every sync, and int8's per-row error feedback keeps the sum of pushes close."""
    params = _params()
    rng = np.random.default_rng(2)
    compression = None if codec is None else Compression(push=codec, pull=None)
    with ParameterServer(params, "delta", compression=compression) as server:
        workers = []
        for p in range(2):
            client = _client(server)
            client.join(p, 0)
            version, pulled = client.pull()
            model = _Model(params)
            counts: dict[str, int] = {}
            sync = RowSync(model, codec, counts)
            sync.start(pulled)
            workers.append((client, model, sync, [version]))
        true_sum = np.zeros((ROWS_N, DIM), np.float32)
        for seq in range(30):
            for p, (client, model, sync, version) in enumerate(workers):
                ids = rng.choice(ROWS_N, 20, replace=False)
                step = rng.normal(size=(20, DIM)).astype(np.float32) * 0.01
                model.weights["emb/embeddings"][ids] += step
                true_sum[ids] += step
                meta = _meta(partition=p, seq=seq, base=version[0])
                deltas, rows = sync.update(meta)
                result = client.push({**deltas, **rows}, meta)
                assert result.status == "applied"
                version[0] = result.version
                sync.absorb(result.params)
                sync.install()
                if p == 1:  # the last to push: its copy is the server's
                    np.testing.assert_array_equal(
                        model.weights["emb/embeddings"], server.params()["emb/embeddings"]
                    )
        final = server.params()["emb/embeddings"] - params["emb/embeddings"]
        tol = 1e-5 if codec is None else 0.01 * 0.5  # int8: within a rounding of a step
        assert np.abs(final - true_sum).max() < tol
        assert counts["rows_pushed"] > 0 and counts["rows_pulled"] > 0
        for client, *_ in workers:
            client.close()


def test_a_row_sparse_answer_carries_the_run_s_control() -> None:
    """The stop and learning rate a driver sets (Keras callbacks) reach a worker that syncs
    row-sparse: the sparse answer builds its own meta, which must still hold the control."""
    with ParameterServer(_params(), "delta") as server, _client(server) as client:
        client.join(0, 0)
        assert "control" not in client.push(_push([1]), _meta(seq=0, base=0)).meta
        server.set_control({"stop": True, "learning_rate": 0.05})
        answer = client.push(_push([2]), _meta(seq=1, base=1))
        assert list(answer.params["emb/embeddings" + IDS]) == [2]
        assert answer.meta["control"] == {"stop": True, "learning_rate": 0.05}


def test_row_marks_give_np_unique_s_answer() -> None:
    from tensorspark.ps.rows import RowMarks

    marks = RowMarks(100)
    rng = np.random.default_rng(0)
    for _ in range(5):  # the mask is reused: no id of one call may leak into the next
        a, b = rng.integers(0, 100, 300), rng.integers(0, 100, (7, 3))
        got = marks.unique(a, b)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, np.unique(np.concatenate([a, b.reshape(-1)])))
    # Out of range (a negative id would mark a row from the end) and float ids: np.unique.
    np.testing.assert_array_equal(marks.unique(np.array([-1, 5, 5])), [-1, 5])
    np.testing.assert_array_equal(marks.unique(np.array([100, 3])), [3, 100])
    np.testing.assert_array_equal(marks.unique(np.array([2.0, 1.0, 2.0])), [1, 2])
    np.testing.assert_array_equal(marks.unique(np.array([7])), [7])
    assert marks.unique().size == 0 and marks.unique(np.zeros(0, np.int64)).size == 0
