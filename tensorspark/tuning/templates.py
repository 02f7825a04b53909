"""Reuse a trial's traced model for the next trial of the same architecture (executor).

A trial's fixed cost is mostly TensorFlow tracing its train and test steps: every trial
builds a new model, and a new model's ``tf.function`` is traced afresh. Measured in one
process on this README's 2-core machine (the benchmark MLP, 6,000 rows, batch 64), a
1-epoch trial took 0.54 s and a 4-epoch one 1.35 s: a fixed 0.27 s, as long as an epoch,
twice that on a loaded machine. It weighs most on what pruning stops after an epoch.

Searches often vary only the learning rate, or vary a few architectures: most trials in a
Python worker rebuild a model that one of its earlier trials already traced. Keras keeps a
model's traced functions (``train_function``, ``test_function``) until it is compiled
again; they read the model's and the optimizer's variables, and the learning rate is one
of those variables. So a trial whose freshly built model has the same architecture,
compile settings and optimizer settings (all but a plain learning rate) as an earlier one
loads its fresh state into the earlier model and trains that: every variable of the model
(weights, moving statistics, the random seed state of dropout layers), every variable of
the optimizer (its iteration count, learning rate and slots, freshly built by
:func:`~tensorspark.tuning.prebuild.prebuild`) and, at each epoch's start as always, the
metrics. A seeded trial trains exactly as it would have on its own fresh model
(tests/unit/test_trial_templates.py proves it, dropout included).

Only what is known to be safe is reused: Sequential and functional models made of
Keras's own layers (no ``Lambda``, no subclassed model or layer, whose code may read the
trial's parameters outside their config), compiled, with an optimizer prebuilt. Anything
else trains its own fresh model, as before.

:class:`ModelTemplates` is per search and per Python worker: it rides on the search's
broadcast (:class:`TrialData`), never travels (it pickles as empty), and goes when the
search ends and Spark drops the broadcast.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["ModelTemplates", "TrialData", "architecture_key"]

#: Traced models kept per worker and search (least recently used dropped first).
CAPACITY = 4


def architecture_key(model: Any) -> str | None:
    """What a traced model depends on besides its variables' values; ``None`` for a model
    this module does not reuse (pure; runs anywhere Keras is)."""
    import keras

    if not (isinstance(model, keras.Sequential) or type(model).__name__ == "Functional"):
        return None
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not getattr(optimizer, "built", False) or not model.built:
        return None
    for layer in model._flatten_layers(include_self=False):
        module = type(layer).__module__
        if not module.startswith("keras.") or type(layer).__name__ == "Lambda":
            return None
    try:
        compiled = dict(model.get_compile_config() or {})
        settings = dict(optimizer.get_config())
        settings.pop("name", None)  # "adam" vs "adam_1": only its variables' paths
        if isinstance(settings.get("learning_rate"), (int, float)):
            settings.pop("learning_rate")  # a variable the traced step reads
        compiled["optimizer"] = [type(optimizer).__qualname__, settings]
        text = json.dumps(
            {"model": model.get_config(), "compile": compiled}, sort_keys=True, default=repr
        )
    except Exception as err:  # noqa: BLE001 - a model without configs trains fresh
        logger.debug("Not reusing a traced model: %s", err)
        return None
    # Layer names differ between instances ("dense_7" vs "dense_12"): canonical ones, in the
    # model's order, keep the wiring a functional config records by name.
    names = [model.name] + [layer.name for layer in model._flatten_layers(include_self=False)]
    for i, name in enumerate(sorted(set(names), key=names.index)):
        text = text.replace(json.dumps(name), json.dumps(f"\0layer{i}"))
    shapes = [(tuple(v.shape), str(v.dtype)) for v in model.variables]
    slots = [(tuple(v.shape), str(v.dtype)) for v in optimizer.variables]
    return f"{type(model).__name__}|{text}|{shapes}|{slots}"


def _load_state(template: Any, fresh: Any) -> bool:
    """Give ``template`` every variable value of ``fresh`` (same architecture key)."""
    pairs = list(zip(template.variables, fresh.variables, strict=True))
    pairs += list(zip(template.optimizer.variables, fresh.optimizer.variables, strict=True))
    for mine, theirs in pairs:
        if tuple(mine.shape) != tuple(theirs.shape) or str(mine.dtype) != str(theirs.dtype):
            return False
    for mine, theirs in pairs:
        mine.assign(theirs.value)
    template.stop_training = False
    return True


class ModelTemplates:
    """Models already traced in this Python worker for one search, by architecture key.

    Not thread-safe: a Python worker runs one task at a time.
    """

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._capacity = capacity
        self._models: OrderedDict[str, Any] = OrderedDict()
        self.reused = 0

    def __len__(self) -> int:
        return len(self._models)

    def adopt(self, fresh: Any) -> Any:
        """The model this trial trains: an earlier, traced model of the same architecture
        holding ``fresh``'s state, or ``fresh`` itself (kept for the trials after it)."""
        key = architecture_key(fresh)
        if key is None:
            return fresh
        template = self._models.get(key)
        if template is not None:
            try:
                if _load_state(template, fresh):
                    self._models.move_to_end(key)
                    self.reused += 1
                    return template
            except Exception as err:  # noqa: BLE001 - fall back to the fresh model
                logger.debug("Not reusing a traced model: %s", err)
        self._models[key] = fresh
        self._models.move_to_end(key)
        while len(self._models) > self._capacity:
            self._models.popitem(last=False)
        return fresh


class TrialData(dict):  # type: ignore[type-arg]
    """A search's arrays as broadcast: a dict, plus the worker's :class:`ModelTemplates`,
    which never travel (each worker's copy starts empty)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.templates = ModelTemplates()

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        return (TrialData, (dict(self),))
