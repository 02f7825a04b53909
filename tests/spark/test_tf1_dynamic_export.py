"""A TF1 graph's dynamic table exported with its map on local Spark: ``run(...,
export=Export(...))`` after training on the drifting click log writes a SavedModel whose
``ids`` input takes raw int64 ids and maps them through the server's final id -> row map
inside it, so that plain TensorFlow, in a fresh process without tensorspark, answers raw
ids as the trained session answers their rows (max difference 1e-5), ids the map does
not hold (evicted, never seen) with the default row; and ``session.predict`` on an RDD of
raw ids answers the same on the executors (the map sent with the graph)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tests.spark.test_tf1_dynamic import OPTIONS, _graph, _log, _rdd, _scores

pytestmark = pytest.mark.spark

_FRESH = """
import json, sys
import numpy as np
import tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
ids = np.array(json.loads(sys.argv[2]), np.int64)
out = loaded.signatures["serving_default"](ids=tf.constant(ids))
print(json.dumps(out["logit"].numpy().tolist()))
"""


def _fresh_process(folder: str, ids: np.ndarray) -> np.ndarray:
    """What the SavedModel answers for raw ``ids``, loaded with plain TensorFlow in a new
    process."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("PYTHONPATH", None)  # no tensorspark
    done = subprocess.run(
        [sys.executable, "-c", _FRESH, folder, json.dumps(ids.tolist())],
        capture_output=True, text=True, timeout=240, env=env, check=True, cwd="/",
    )  # fmt: skip
    return np.asarray(json.loads(done.stdout.strip().splitlines()[-1]), np.float32)


def test_the_export_answers_raw_ids_as_the_trained_graph(sc: SparkContext, tmp_path: Path) -> None:
    train, test = _log()
    g = _graph()
    told: list[dict] = []

    class _Told(sps.RunListener):
        def on_export(self, record: dict) -> None:
            told.append(dict(record))

    session = sps.SparkSession(sc, g["sess"], **OPTIONS)
    session.run(
        g["train"],
        feed_rdd=_rdd(sc, train),
        feed_name_list=[g["ids"].name, g["y"].name],
        num_epoch=1,
        loss=g["loss"],
        progress=False,
        listeners=[_Told()],
        export=sps.Export(
            str(tmp_path / "g"), inputs={"ids": g["ids"].name}, outputs={"logit": g["logit"].name}
        ),
    )
    assert [r["version"] for r in told] == [1]
    held, _ = g["table"].map_items()
    evicted = np.setdiff1d(np.unique(train.ids), held)[:4]
    assert evicted.size == 4  # the drift: ids trained, then evicted
    probe = np.concatenate(
        [test.ids[:200], evicted.reshape(2, 2), np.array([[7, -3], [10**18, held[0]]])]
    ).astype(np.int64)
    want = _scores(g, probe)  # the session on the rows of the table's map
    assert np.unique(np.round(want, 4)).size > 20  # the answers differ by id
    # Distributed inference on the same raw ids: the map travels with the graph.
    scored = session.predict(
        sc.parallelize(list(probe), 2), fetches=g["logit"], feed_name_list=[g["ids"].name]
    ).collect()
    session.close()
    np.testing.assert_allclose(np.reshape(scored, -1), want, rtol=0, atol=1e-5)
    got = _fresh_process(told[0]["path"], probe)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    # Ids the map does not hold read the default row: the bias alone.
    bias = float(g["sess"].run(g["bias"]))
    np.testing.assert_allclose(got[200:203], bias, rtol=0, atol=1e-6)
