"""A run's control: checked fields; a real server puts it in every answer and forgets it
for the next run; a real worker loop leaves after the sync whose answer says stop (each
push applied once) and takes a new learning rate from its next chunk on."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest

from tensorspark.ps.client import ParameterClient
from tensorspark.ps.control import merge_control, read_control
from tensorspark.ps.fanout import ShardedClient
from tensorspark.ps.server import ParameterServer
from tensorspark.ps.shards import ShardedServer
from tensorspark.worker import WorkerConfig, train_partition

pytestmark = pytest.mark.unit


def test_merge_control_checks_each_field() -> None:
    assert merge_control({}, {"learning_rate": 1}) == {"learning_rate": 1.0}
    assert merge_control({"learning_rate": 0.1}, {"stop": True}) == {
        "learning_rate": 0.1,
        "stop": True,
    }
    with pytest.raises(ValueError, match="Received: pause=True"):
        merge_control({}, {"pause": True})
    with pytest.raises(ValueError, match="Received: stop=False"):
        merge_control({}, {"stop": False})
    for bad in (0, -1.0, math.nan, math.inf, True, "0.1"):
        with pytest.raises(ValueError, match="Received: learning_rate="):
            merge_control({}, {"learning_rate": bad})


def test_read_control_ignores_what_it_does_not_know() -> None:
    assert read_control({}) == {}
    assert read_control({"control": "stop"}) == {}
    meta = {"control": {"stop": True, "learning_rate": 0.5, "other": 1}}
    assert read_control(meta) == {"stop": True, "learning_rate": 0.5}
    assert read_control({"control": {"stop": 1, "learning_rate": -1.0}}) == {}


def _push(client: ParameterClient, seq: int) -> Any:
    meta = {"partition": 0, "epoch": 0, "seq": seq, "attempt": 0, "samples": 1}
    return client.push({"w": np.ones(3, np.float32)}, dict(meta, base_version=seq))


def test_the_server_answers_with_the_control_until_a_new_run() -> None:
    with ParameterServer({"w": np.zeros(3, np.float32)}, authenticate=False) as server:
        with ParameterClient(server.url, timeout=10, ps_timeout=10) as client:
            assert client.join(0, 0)["control"] == {}
            assert "control" not in _push(client, 0).meta
            assert server.set_control({"learning_rate": 0.01}) == {"learning_rate": 0.01}
            assert server.set_control({"stop": True}) == {"learning_rate": 0.01, "stop": True}
            with pytest.raises(ValueError, match="Received: learning_rate=-1"):
                server.set_control({"learning_rate": -1})
            answer = _push(client, 1)
            assert answer.status == "applied"
            assert answer.meta["control"] == {"learning_rate": 0.01, "stop": True}
            assert client.join(0, 1)["control"] == {"learning_rate": 0.01, "stop": True}
            server.reset_progress()  # the next run on a reused server
            assert client.join(0, 0)["control"] == {}


class _Model:
    """A model whose chunk adds the learning rate to its weight, and which tells the
    server to stop (or change the rate) while training chosen chunks: as a driver would."""

    def __init__(self, server: ParameterServer, at: Mapping[int, dict[str, Any]]) -> None:
        self.server, self.at = server, dict(at)
        self.w = np.zeros(3, np.float32)
        self.rate = 1.0
        self.rates: list[float] = []
        self.chunks = 0

    def get_weights(self) -> dict[str, np.ndarray]:
        return {"w": self.w.copy()}

    def set_weights(self, params: Mapping[str, np.ndarray]) -> None:
        self.w = np.array(params["w"])

    def set_learning_rate(self, rate: float) -> None:
        self.rate = rate

    def train_chunk(self, batches: list[Any]) -> dict[str, float]:
        self.rates.append(self.rate)
        self.w = self.w + np.float32(self.rate)
        if self.chunks in self.at:
            self.server.set_control(self.at[self.chunks])
        self.chunks += 1
        return {"samples": sum(len(b[0]) for b in batches), "loss": 1.0}

    def close(self) -> None:
        pass


def _blocks() -> Iterator[tuple[np.ndarray, ...]]:
    yield (np.zeros((40, 2), np.float32), np.zeros((40, 1), np.float32))


def _config(server: ParameterServer) -> WorkerConfig:
    return WorkerConfig(
        server_url=server.url, sync_interval=1, batch_size=4, num_epoch=3, ps_timeout=10
    )


def test_a_worker_leaves_after_the_sync_whose_answer_says_stop() -> None:
    with ParameterServer({"w": np.zeros(3, np.float32)}, authenticate=False) as server:
        model = _Model(server, {1: {"learning_rate": 0.5}, 4: {"stop": True}})
        stats = train_partition(0, 0, _blocks(), _config(server), lambda: model)
        status = server.status()
        # Chunk 4's push was answered with the stop: 5 chunks trained, 5 pushes, no more.
        assert model.chunks == 5
        assert stats["stopped"] is True
        assert stats["counts"]["applied"] == 5 == status["applied_pushes"]
        assert status["duplicate_pushes"] == 0
        assert status["workers"][0]["state"] == "done"
        # The new rate applies from the chunk after the sync that brought it.
        assert model.rates == [1.0, 1.0, 0.5, 0.5, 0.5]
        assert stats["learning_rate"] == 0.5
        np.testing.assert_allclose(server.params()["w"], np.full(3, 3.5, np.float32))
        # A task that joins after the stop trains nothing.
        late = _Model(server, {})
        stats = train_partition(1, 0, _blocks(), _config(server), lambda: late)
        assert late.chunks == 0 and stats["stopped"] is True and stats["epochs"] == []
        assert late.rate == 0.5  # told at /join


def test_a_sharded_server_puts_the_control_in_every_shard_s_answers() -> None:
    params = {"a": np.zeros(3, np.float32), "b": np.zeros(5, np.float32)}
    with ShardedServer(params, "delta", shards=2) as server:
        client = ShardedClient(server.urls, server.layout, **server.client_options())
        try:
            assert client.join(0, 0)["control"] == {}
            assert server.set_control({"stop": True}) == {"stop": True}
            meta = {"partition": 0, "epoch": 0, "seq": 0, "attempt": 0, "samples": 1}
            answer = client.push({k: np.ones_like(v) for k, v in params.items()}, meta)
            assert answer.status == "applied"
            assert read_control(answer.meta) == {"stop": True}
            for url in server.urls:  # each shard answers with it
                with ParameterClient(url, timeout=10, **server.client_options()) as one:
                    assert one.join(1, 0)["control"] == {"stop": True}
        finally:
            client.close()
