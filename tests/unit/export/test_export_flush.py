"""An interval's (or an N-th batch's) export is not lost when the training stops before it
comes: Exporter.flush exports what was trained since the last decision (local disk, a
small Keras model, no gate so no Spark job)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tensorspark.export import Export
from tensorspark.export.publisher import RECORD_FILE, Exporter
from tensorspark.models.keras import read_weights


def small_model() -> Any:
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def exporter(base: Path, **schedule: Any) -> tuple[Exporter, Any]:
    model = small_model()
    spec = Export(str(base), **schedule)
    made = Exporter(
        None, spec, payload=b"", model=model, custom_objects=None, conf={}, batch_size=8,
        tracking=False,
    )  # fmt: skip
    return made, model


def trained(ex: Exporter, model: Any, batch_id: int) -> dict[str, Any] | None:
    now = time.time()
    return ex.after(
        read_weights(model), batch_id=batch_id, rows=10, arrival_median=now, arrival_oldest=now
    )


def versions(base: Path) -> list[str]:
    return sorted(p.name for p in base.iterdir() if not p.name.startswith("."))


def test_a_stop_before_the_interval_exports_what_was_trained(tmp_path: Path) -> None:
    base = tmp_path / "m"
    ex, model = exporter(base, every="1 hour")
    assert trained(ex, model, 0) is None and trained(ex, model, 1) is None  # not due yet
    assert versions(base) == []
    record = ex.flush(read_weights(model), 1)
    assert record is not None and record["published"] and record["version"] == 1
    assert versions(base) == ["1"]
    assert json.loads((base / "1" / RECORD_FILE).read_text())["batch_id"] == 1
    assert record["freshness_p50_s"] is not None  # the two batches' records, now served
    # Nothing trained since: a second stop exports nothing.
    assert ex.flush(read_weights(model), 1) is None
    assert versions(base) == ["1"] and ex.published == 1


@pytest.mark.parametrize("batches", [1, 2])
def test_a_stop_right_after_an_export_exports_nothing_more(tmp_path: Path, batches: int) -> None:
    base = tmp_path / "m"
    ex, model = exporter(base, every_batches=batches)
    for b in range(batches):
        trained(ex, model, b)
    assert versions(base) == ["1"]
    assert ex.flush(read_weights(model), batches - 1) is None
    assert versions(base) == ["1"]


def test_a_stop_before_the_nth_batch_exports_the_batches_since(tmp_path: Path) -> None:
    base = tmp_path / "m"
    ex, model = exporter(base, every_batches=3)
    for b in range(4):
        trained(ex, model, b)  # batch 2 exported version 1; batch 3 waits for the 6th
    assert versions(base) == ["1"]
    record = ex.flush(read_weights(model), 3)
    assert record is not None and record["version"] == 2 and versions(base) == ["1", "2"]
