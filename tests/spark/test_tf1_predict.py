"""Distributed inference with a TF1 session's graph: ``spark_sess.predict(rdd, fetches=y, ...)``."""

from __future__ import annotations

import numpy as np
import pytest

import tensorspark as sps
from tensorspark.errors import ConfigurationError

from .mnist_graph import softmax_regression


@pytest.fixture(scope="module")
def trained():  # type: ignore[no-untyped-def]
    m = softmax_regression()
    rng = np.random.default_rng(0)
    with m.graph.as_default():
        m.W.load(rng.normal(size=(784, 10)).astype(np.float32), m.sess)
        m.b.load(rng.normal(size=10).astype(np.float32), m.sess)
    images = rng.random((600, 784), dtype=np.float32)
    return m, images


def test_rdd_predictions_equal_the_local_session(sc, trained) -> None:
    m, images = trained
    spark_sess = sps.SparkSession(sc, m.sess, batch_size=64)
    rdd = sc.parallelize(list(images), 3)
    out = np.stack(spark_sess.predict(rdd, fetches=m.y, feed_name_list=[m.x.name]).collect())
    expected = m.sess.run(m.y, feed_dict={m.x: images})
    assert np.abs(out - expected).max() < 1e-5


def test_dataframe_top_k_with_labels(spark, trained) -> None:
    m, images = trained
    names = [f"class{i}" for i in range(10)]
    df = spark.createDataFrame(
        [(i, images[i].tolist()) for i in range(50)], "id long, pixels array<float>"
    )
    spark_sess = sps.SparkSession(spark.sparkContext, m.sess)
    out = spark_sess.predict(
        df, fetches=m.y, feed_name_list=[m.x.name], features_col="pixels", top_k=3, labels=names
    )
    rows = sorted(out.collect(), key=lambda r: r.id)
    expected = m.sess.run(m.y, feed_dict={m.x: images[:50]})
    for row in rows:
        best = np.argsort(-expected[row.id])[:3]
        assert [p.label for p in row.prediction] == [names[i] for i in best]
        assert abs(row.prediction[0].score - expected[row.id][best[0]]) < 1e-5


def test_tf1_predict_needs_an_output_tensor(sc, trained) -> None:
    m, images = trained
    spark_sess = sps.SparkSession(sc, m.sess)
    rdd = sc.parallelize(list(images[:10]), 1)
    with pytest.raises(ConfigurationError, match="needs fetches="):
        spark_sess.predict(rdd)
    with pytest.raises(ConfigurationError, match="not an operation"):
        spark_sess.predict(rdd, fetches=m.train_step, feed_name_list=[m.x.name])
