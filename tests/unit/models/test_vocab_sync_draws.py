"""The worker draws the initial values of rows admitted or reclaimed for new ids (its
``/vocab`` answers carry ids and rows only): the layer's table and the row-sparse base hold
the server's bits after admission and after a reset, and rows another worker has trained
since come with their values."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.unit

keras = pytest.importorskip("keras")

from tensorspark.models.dynamic_embedding import DynamicEmbedding  # noqa: E402
from tensorspark.models.keras import read_weights  # noqa: E402
from tensorspark.models.row_optimizers import RowAdam  # noqa: E402
from tensorspark.models.vocab_sync import VocabSync, vocab_specs  # noqa: E402
from tensorspark.ps import ParameterClient, ParameterServer  # noqa: E402
from tensorspark.ps.rowsync import RowSync  # noqa: E402
from tests.unit.models.vocab_worker import push_chunk, start_worker  # noqa: E402

CAP, DIM = 4, 5
NAME = "ids/embeddings"


def _model() -> Any:
    inp = keras.Input((2,), dtype="int64")
    init = keras.initializers.TruncatedNormal(stddev=0.3)
    x = DynamicEmbedding(CAP, DIM, name="ids", embeddings_initializer=init)(inp)
    model = keras.Model(inp, keras.layers.Dense(1, name="out")(keras.layers.Flatten()(x)))
    model.compile(optimizer=RowAdam(0.1), loss="mse")
    return model


def _same(model: Any, rows: RowSync, server: Any, at: np.ndarray) -> None:
    table = server.params()[NAME]
    np.testing.assert_array_equal(model.get_layer("ids").embeddings.numpy()[at], table[at])
    np.testing.assert_array_equal(rows.base[NAME][at], table[at])


def _push(core: Any, rows: RowSync, sync: VocabSync, client: Any, chunk: list, seq: int) -> None:
    core.run_steps(True, chunk, 1)
    push_chunk(rows, sync, client, seq=seq, samples=1, base_version=0, partition=sync.partition)


def test_admitted_and_reclaimed_rows_are_drawn_by_the_worker_as_the_server_drew_them() -> None:
    model_a, model_b = _model(), _model()
    specs = vocab_specs(model_a)
    assert specs[NAME]["init"]["kind"] == "normal" and specs[NAME]["init"]["truncated"]
    y = np.ones((1, 1), np.float32)
    with ParameterServer(read_weights(model_a), "delta", embeddings="sparse", vocab=specs) as s:
        with ParameterClient(s.url, **s.client_options()) as client:
            core_a, rows_a, sync_a, _ = start_worker(model_a, client, 0)
            _, rows_b, sync_b, _ = start_worker(model_b, client, 1)
            chunk = [(np.array([[10, 11]], np.int64), y)]
            sync_a.before(chunk, 0, 0)
            assert sync_a.counts["vocab_rows_drawn"] == 2  # no values came for them
            _same(model_a, rows_a, s, np.arange(CAP))
            _push(core_a, rows_a, sync_a, client, chunk, 0)  # rows of 10, 11 train
            # B asks 10 (trained by A: its values come) and 20, 21, 22 (new: drawn by B);
            # two rows are free, the third is reclaimed from 11 and reset.
            sync_b.before([(np.array([[10, 20], [21, 22]], np.int64), y)], 0, 0)
            assert sync_b.counts["vocab_rows_drawn"] == 3
            held = dict(zip(*model_b.get_layer("ids").map_items(), strict=True))
            assert 11 not in held and s.status()["vocab_evicted"] == 1
            _same(model_b, rows_b, s, np.arange(CAP))
            # A's next chunk: B's new ids' rows (the reclaimed one too) come drawn, not sent.
            sync_a.before([(np.array([[22, 10]], np.int64), y)], 0, 1)
            assert sync_a.counts["vocab_rows_drawn"] == 5
            _same(model_a, rows_a, s, np.arange(CAP))
            assert s.status()["vocab_collisions"] == 0
