"""A task may start from its model's weights only when its Python worker loaded the model
for it: a retried task on a reused worker finds what the failed attempt trained
(tensorspark.models.keras; the worker's row-sparse start at version 0 reads ``untouched``)."""

from __future__ import annotations

import numpy as np

from tensorspark.models import keras_io
from tensorspark.models.keras import KerasTrainer

from .test_keras_adapter import batches, data, mlp


def test_only_the_task_that_loaded_the_model_sees_it_untouched() -> None:
    payload = keras_io.serialize_model(mlp())
    first = KerasTrainer(payload, key="retry-start")
    assert first.untouched
    broadcast = first.get_weights()
    x, y = data(48, seed=1)
    first.train_chunk(batches(x, y, 16))  # the failed attempt trained, and never pushed

    retry = KerasTrainer(payload, key="retry-start")  # the same process, the same run
    assert not retry.untouched
    trained = retry.get_weights()
    assert any(not np.array_equal(trained[k], broadcast[k]) for k in broadcast)

    other_run = KerasTrainer(payload, key="retry-other-run")
    assert other_run.untouched
    for name, value in broadcast.items():
        np.testing.assert_array_equal(other_run.get_weights()[name], value)
