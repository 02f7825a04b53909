"""tensorspark.ml folders across versions: what they record, and loading them elsewhere.

The cross-interpreter test saves here and loads (and transforms) in another Python
environment with tensorspark installed, which saves again for this one to load: the
interpreter named by TENSORSPARK_OTHER_PYTHON (the compat environments set it, e.g. to the
Python 3.13 / newest environment while this runs on the default one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pyspark.sql import SparkSession as SQLSession

from tensorspark import versions
from tensorspark.errors import ConfigurationError
from tensorspark.ml import KerasModel
from tests.jvm import driver_process_env
from tests.ml_support import small_mlp

pytestmark = pytest.mark.spark

OTHER = os.environ.get("TENSORSPARK_OTHER_PYTHON", "")
ROWS = np.random.default_rng(0).random((6, 49), dtype=np.float32)

# Run by the other interpreter: load what this one saved, transform, save again.
LOAD_ELSEWHERE = """
import json, sys
import numpy as np
from pyspark.sql import SparkSession
from tensorspark import versions
from tensorspark.ml import KerasModel

saved, again, out = sys.argv[1:4]
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").getOrCreate())
model = KerasModel.load(saved)
rows = np.asarray(json.loads(sys.argv[4]), dtype="float32")
frame = spark.createDataFrame([(r.tolist(),) for r in rows], "features array<float>")
scored = model.copy({model.probabilityCol: "probability"}).transform(frame)
got = [list(r.probability) for r in scored.select("probability").collect()]
model.write().overwrite().save(again)
json.dump({"probability": got, "versions": versions.installed().describe()}, open(out, "w"))
spark.stop()
"""


def metadata_file(folder: Path) -> Path:
    (found,) = (folder / "metadata").glob("part-*")  # Spark 4 names it part-00000-<id>.txt
    return found


def rewrite_metadata(folder: Path, meta: dict) -> None:  # type: ignore[type-arg]
    found = metadata_file(folder)
    found.write_text(json.dumps(meta))
    (found.parent / f".{found.name}.crc").unlink(missing_ok=True)  # Hadoop's checksum of it


def metadata(folder: Path) -> dict:  # type: ignore[type-arg]
    return json.loads(metadata_file(folder).read_text())  # type: ignore[no-any-return]


def test_saved_folder_records_the_versions_that_saved_it(spark: SQLSession, tmp_path: Path) -> None:
    KerasModel(small_mlp()).save(str(tmp_path / "m"))
    meta = metadata(tmp_path / "m")
    here = versions.installed()
    assert meta["sparkVersion"] == here.pyspark
    assert meta["tensorspark"]["saved_by"] == {
        "tensorspark": here.tensorspark,
        "pyspark": here.pyspark,
        "python": here.python,
        "tensorflow": here.tensorflow,
        "keras": here.keras,
    }


def test_a_load_that_cannot_work_names_the_versions_that_saved_it(
    spark: SQLSession, tmp_path: Path
) -> None:
    folder = tmp_path / "m"
    KerasModel(small_mlp()).save(str(folder))
    meta = metadata(folder)
    meta["tensorspark"]["saved_by"].update(tensorflow="2.99.0", keras="3.99.0")
    rewrite_metadata(folder, meta)
    (folder / "data" / "model.keras").write_bytes(b"not a keras archive")
    here = versions.installed()

    with pytest.raises(ConfigurationError) as info:
        KerasModel.load(str(folder))

    text = str(info.value)
    assert text.startswith(f"{str(folder)!r} cannot be loaded here: ")
    assert (
        f"It was saved with tensorspark {here.tensorspark}, pyspark {here.pyspark}, "
        f"Python {here.python}, TensorFlow 2.99.0, Keras 3.99.0; this process runs "
        f"{here.describe()}." in text
    )

    # A newer layout is refused before the model file is read, with the same versions.
    meta["tensorspark"]["format"] = 99
    rewrite_metadata(folder, meta)
    with pytest.raises(ConfigurationError, match="saved by a newer tensorspark") as info:
        KerasModel.load(str(folder))
    assert "Received: saved with tensorspark" in str(info.value)
    assert "TensorFlow 2.99.0, Keras 3.99.0; loading with " in str(info.value)


def test_saved_here_loads_in_another_environment_and_back(
    spark: SQLSession, tmp_path: Path
) -> None:
    if not OTHER or not Path(OTHER).is_file():
        pytest.skip(
            "TENSORSPARK_OTHER_PYTHON names no interpreter (it should be another environment's "
            f"python with tensorspark installed). Received: TENSORSPARK_OTHER_PYTHON={OTHER!r}"
        )
    model = KerasModel(small_mlp())
    model.save(str(tmp_path / "here"))
    expected = model.kerasModel.predict(ROWS, verbose=0)
    env = {
        **driver_process_env(os.environ),
        "PYSPARK_PYTHON": OTHER,
        "PYSPARK_DRIVER_PYTHON": OTHER,
    }
    run = subprocess.run(
        [OTHER, "-c", LOAD_ELSEWHERE, str(tmp_path / "here"), str(tmp_path / "there")]
        + [str(tmp_path / "out.json"), json.dumps(ROWS.tolist())],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["versions"] != versions.installed().describe()  # really another environment
    np.testing.assert_allclose(out["probability"], expected, rtol=1e-5, atol=1e-6)

    back = KerasModel.load(str(tmp_path / "there"))
    saved_by = metadata(tmp_path / "there")["tensorspark"]["saved_by"]
    assert saved_by["python"] == out["versions"].split("Python ")[1].split(",")[0]
    np.testing.assert_allclose(back.kerasModel.predict(ROWS, verbose=0), expected, rtol=1e-5)
    assert sys.executable != OTHER
