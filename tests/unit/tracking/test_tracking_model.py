"""tensorspark.tracking.model and the input check's example: the input example a tracked fit
takes from the example the check read (no job of its own), and MLflow's requirements check
swapped out only while a model with pins read here is saved, then put back."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from mlflow.utils import environment

from tensorspark.errors import ConfigurationError
from tensorspark.models.keras_checks import KerasFeed
from tensorspark.tracking.model import (
    example_of,
    pinned_here,
    requirements,
    seen_example,
    signature,
)

pytestmark = pytest.mark.unit


def _model() -> keras.Model:
    model = keras.Sequential([keras.Input((2, 3)), keras.layers.Flatten(), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def test_the_feed_keeps_the_first_checked_example_only_when_asked() -> None:
    model = _model()
    first = np.arange(6, dtype=np.float32).reshape(2, 3)
    seen: list[object] = []
    feed = KerasFeed(model, seen=seen)
    feed.check_row((first, 1), argument="data", what="data=RDD")
    feed.check_row((first + 1, 0), argument="data", what="data=RDD")
    assert len(seen) == 1 and seen[0] is first
    with pytest.raises(ConfigurationError):  # a refused example is not kept
        KerasFeed(model, seen=(refused := [])).check_row((np.zeros(5), 1), argument="d", what="")
    assert refused == []
    plain = KerasFeed(model)
    plain.check_row((first, 1), argument="data", what="data=RDD")
    assert plain.seen is None and plain == KerasFeed(model)


def test_example_of_shapes_rows_as_the_model_takes_them() -> None:
    model = _model()
    example = example_of(model, [list(range(6))])
    assert example is not None and example.shape == (1, 2, 3) and example.dtype == np.float32
    np.testing.assert_array_equal(example[0], np.arange(6).reshape(2, 3))
    assert example_of(model, []) is None
    assert seen_example(model, [np.zeros(5)]) is None  # does not fit: no example, no error


def test_pinned_here_swaps_mlflows_check_for_the_save_and_puts_it_back() -> None:
    original = environment.warn_dependency_requirement_mismatches
    with pinned_here():
        assert environment.warn_dependency_requirement_mismatches is not original
        environment.warn_dependency_requirement_mismatches(requirements())
    assert environment.warn_dependency_requirement_mismatches is original
    with pytest.raises(RuntimeError), pinned_here():
        raise RuntimeError("the save failed")
    assert environment.warn_dependency_requirement_mismatches is original


def test_requirements_pin_what_is_installed() -> None:
    pins = dict(r.split("==") for r in requirements())
    assert pins["keras"] == keras.__version__ and pins["numpy"] == np.__version__


def test_integer_inputs_keep_int64_in_the_example_and_the_signature() -> None:
    """Raw ids (a ``DynamicEmbedding``'s) above 2**24 would be rounded by float32: the
    input example and the signature keep the input's int64; float inputs stay float32."""
    import tensorspark as sps

    ids = keras.Input((2,), dtype="int64")
    out = keras.layers.Dense(1)(keras.layers.Flatten()(sps.DynamicEmbedding(8, 2)(ids)))
    model = keras.Model(ids, out)
    big = [10**12 + 1, 2**62 + 3]
    example = example_of(model, [big])
    assert example is not None and example.dtype == np.int64 and example.tolist() == [big]
    (spec,) = signature(model).inputs.to_dict()
    assert spec["tensor-spec"]["dtype"] == "int64" and list(spec["tensor-spec"]["shape"]) == [-1, 2]
    dense = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    assert example_of(dense, [[1, 2, 3]]).dtype == np.float32  # type: ignore[union-attr]
    assert signature(dense).inputs.to_dict()[0]["tensor-spec"]["dtype"] == "float32"
