"""Each public call reads the Spark conf from the JVM once (tensorspark.conf.ConfSnapshot),
however many steps of the call need the conf; the Hadoop site files are read only when an
hdfs:// location is opened (at most once), never for local files."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tensorspark import conf as tsconf
from tensorspark.fileio.source import FileSource


@dataclass
class Reads:
    """How often the Spark conf (``sc.getConf()``) and the Hadoop site files were read."""

    conf: int = 0
    site: int = 0

    def reset(self) -> None:
        self.conf = self.site = 0


@pytest.fixture
def reads(sc: SparkContext, monkeypatch: pytest.MonkeyPatch) -> Iterator[Reads]:
    """Counts the reads of ``sc``'s conf (every one goes through ``sc.getConf()``) and of
    the Hadoop site files on the driver's JVM."""
    counted = Reads()
    get_conf = sc.getConf
    site_setting = tsconf.hadoop_site_setting

    def counting_get_conf() -> Any:
        counted.conf += 1
        return get_conf()

    def counting_site_setting(jvm: Any, key: str, resource: str) -> str | None:
        counted.site += 1
        return site_setting(jvm, key, resource)

    monkeypatch.setattr(sc, "getConf", counting_get_conf)
    monkeypatch.setattr(tsconf, "hadoop_site_setting", counting_site_setting)
    yield counted


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def _files(folder: Path, rows: int = 64) -> FileSource:
    rng = np.random.default_rng(0)
    table = pa.table(
        {
            "x": pa.array(list(rng.random((rows, 4), dtype=np.float32)), pa.list_(pa.float32())),
            "y": rng.integers(0, 3, rows),
        }
    )
    folder.mkdir()
    pq.write_table(table, folder / "part.parquet")
    return sps.files(str(folder), "x", "y", num_partitions=2)


def test_one_predict_reads_the_conf_once(sc: SparkContext, reads: Reads, tmp_path: Path) -> None:
    model = _model()
    model_file = tmp_path / "m.keras"
    model.save(model_file)
    data = _files(tmp_path / "in")
    reads.reset()
    result = sps.predict(sc, str(model_file), data, batch_size=16)
    assert (reads.conf, reads.site) == (1, 0)  # local files: no WebHDFS address is needed
    assert len(result.collect()) == 64
    assert reads.conf == 1  # the job reads nothing more


def test_a_session_and_its_fit_and_predict_read_the_conf_once_each(
    sc: SparkContext, reads: Reads, tmp_path: Path
) -> None:
    data = _files(tmp_path / "in")
    reads.reset()
    ks = sps.SparkSession(sc, _model(), batch_size=16, sync_interval=2, warm_up=False)
    assert reads.conf == 1
    reads.reset()
    ks.fit(data, epochs=1, validation_data=data, progress=False)
    assert reads.conf == 1 and reads.site == 0  # local files: no site file
    reads.reset()
    ks.predict(sc.parallelize(np.zeros((8, 4), np.float32), 2)).collect()
    assert reads.conf == 1
    ks.close()
