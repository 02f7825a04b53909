"""Create a compiled model's optimizer and metric state before ``fit``, so that Keras traces
its train function once per trial instead of twice. Runs on the executor, in a trial.

Keras 3 on TensorFlow, without a distribution strategy, defers creating the optimizer's
slot variables and the compiled metrics' variables to the first trace of the train
function. A ``tf.function`` that creates variables while it traces is traced a second
time, without creating them, before it runs: every trial paid for two traces of its train
step. Measured on this README's 2-core machine (the benchmark MLP, 6,000 rows, batch 64,
1 TensorFlow thread, other work on the cores): a 1-epoch ``fit`` took 1.9-3.0 s, and
1.3-1.4 s after :func:`prebuild` (0.1-0.16 s itself); an epoch is some 0.5 s there, so a
trial's fixed cost fell by more than an epoch. It is a fixed cost of every trial, so it
weighs most on the trials a pruner stops after one or two epochs.

:func:`prebuild` does what Keras itself does under a distribution strategy: it builds that
state from the shapes of one input row, symbolically (no op runs, no random draw, so a
seeded trial trains exactly as without it). It only acts on a built model (its layers'
variables exist) that is compiled with an optimizer not built yet; for anything else,
and for a Keras without that step, it leaves the model alone and Keras builds the state
in its trace as before.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["prebuild"]


def prebuild(model: Any, x: Any, y: Any) -> bool:
    """Build ``model``'s optimizer and compiled metrics from the shapes of ``x[:1]`` and
    ``y[:1]`` (executor). Never raises: a model it cannot prebuild trains as it would
    have, its state built while Keras traces.

    Returns:
        Whether it built the state.
    """
    import keras

    optimizer = getattr(model, "optimizer", None)
    symbolic_build = getattr(model, "_symbolic_build", None)
    if (
        keras.backend.backend() != "tensorflow"
        or not getattr(model, "built", False)
        or optimizer is None
        or getattr(optimizer, "built", True)
        or symbolic_build is None
    ):
        return False
    try:
        floatx = keras.backend.floatx()
        # One row of each, floating dtypes cast as tensorspark.tuning.feed feeds them.
        first = [np.asarray(a[:1]) for a in (x, y)]
        first = [a.astype(floatx) if a.dtype.kind == "f" else a for a in first]
        symbolic_build(data_batch=tuple(first))
    except Exception as err:  # noqa: BLE001 - Keras builds it in its trace instead
        logger.debug("Keeping Keras's own build of the training state: %s", err)
        return False
    return True
