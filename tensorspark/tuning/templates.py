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
(weights, moving statistics, the random seed state of dropout layers), the optimizer's
variables as they were when that model's optimizer was first built (iteration count and
slots: their initial values follow from the optimizer's settings and the variables'
shapes, both in the key) with this trial's learning rate and, at each epoch's start as
always, the metrics. A seeded trial trains exactly as it would have on its own fresh
model (tests/unit/tuning/test_trial_templates.py proves it, dropout, batch norm, Adam and
Adagrad included). A reused trial also skips building its fresh model's optimizer
(:func:`~tensorspark.tuning.prebuild.prebuild`), and the trials of a worker share their
arrays as tensors and their validation dataset (:meth:`ModelTemplates.tensor`,
:meth:`ModelTemplates.dataset`).

Only what is known to be safe is reused: Sequential and functional models (Keras's own
classes, not subclasses) made of Keras's own layers (no ``Lambda``, no subclassed layer)
whose configs hold Keras's own objects only (no function of the user's as a loss,
metric, activation or regularizer: a config stores those by name, and a closure over the
trial's parameters would look the same in every trial), compiled, with an optimizer
without moving averages of the weights (``use_ema``: their initial values are the fresh
weights) or weight-decay exclusions (kept outside its config), whose state was prebuilt.
Anything else trains its own fresh model, as before. Under ``mixed_float16`` the
loss-scale optimizer's config names its inner optimizer, so nothing is reused there.

:class:`ModelTemplates` is per search and per Python worker: it rides on the search's
broadcast (:class:`TrialData`), never travels (it pickles as empty), and goes when the
search ends and Spark drops the broadcast.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["ModelTemplates", "TrialData", "architecture_key"]

#: Traced models kept per worker and search (least recently used dropped first).
CAPACITY = 4


def architecture_key(model: Any) -> str | None:
    """What a traced model depends on besides its variables' values; ``None`` for a model
    this module does not reuse (pure; runs anywhere Keras is)."""
    import keras

    kind = type(model)
    if not (kind.__module__.startswith("keras.") and kind.__name__ in ("Sequential", "Functional")):
        return None  # a subclass's own code (compute_loss, train_step, ...) is not in a config
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not model.built or not isinstance(model, keras.Model):
        return None
    for layer in model._flatten_layers(include_self=False):
        module = type(layer).__module__
        if not module.startswith("keras.") or type(layer).__name__ == "Lambda":
            return None
    if getattr(optimizer, "_exclude_from_weight_decay", None) or getattr(
        optimizer, "_exclude_from_weight_decay_pattern", None
    ):
        return None  # kept outside the optimizer's config
    try:
        compiled = dict(model.get_compile_config() or {})
        settings = dict(optimizer.get_config())
        settings.pop("name", None)  # "adam" vs "adam_1": only its variables' paths
        if settings.get("use_ema"):
            return None  # its averages start as the fresh weights
        if isinstance(settings.get("learning_rate"), (int, float)):
            settings.pop("learning_rate")  # a variable the traced step reads
        compiled["optimizer"] = [type(optimizer).__qualname__, settings]
        config = {"model": model.get_config(), "compile": compiled}
    except Exception as err:  # noqa: BLE001 - a model without configs trains fresh
        logger.debug("Not reusing a traced model: %s", err)
        return None
    if not _only_keras_objects(config):
        return None
    # Layer names differ between instances ("dense_7" vs "dense_12"): canonical ones, in the
    # model's order, where a config names a layer or refers to one (a node's history).
    names = [model.name] + [layer.name for layer in model._flatten_layers(include_self=False)]
    canonical = {name: f"\0layer{i}" for i, name in enumerate(sorted(set(names), key=names.index))}
    text = json.dumps(_renamed(config, canonical), sort_keys=True, default=repr)
    shapes = [(tuple(v.shape), str(v.dtype)) for v in model.variables]
    return f"{kind.__name__}|{text}|{shapes}"


def _only_keras_objects(config: Any) -> bool:
    """Whether every object a config serializes is Keras's own: a function or lambda of
    the user's (a loss, metric, activation, regularizer made by a closure over the trial's
    parameters) is stored by name only, so two trials' could differ under one key."""
    if isinstance(config, dict):
        kind = config.get("class_name")
        module = config.get("module")
        if kind == "__lambda__" or (kind == "function" and not str(module).startswith("keras")):
            return False
        if kind is not None and module is not None and not str(module).startswith("keras"):
            return False
        return all(_only_keras_objects(v) for v in config.values())
    if isinstance(config, (list, tuple)):
        return all(_only_keras_objects(v) for v in config)
    return True


def _renamed(config: Any, canonical: dict[str, str]) -> Any:
    """``config`` with layer names replaced where a config names a layer (a ``"name"``
    field) or refers to one (``[name, node, tensor]``), never in other values."""
    if isinstance(config, dict):
        return {
            k: (
                canonical.get(v, v)
                if k == "name" and isinstance(v, str)
                else _renamed(v, canonical)
            )
            for k, v in config.items()
        }
    if isinstance(config, (list, tuple)):
        items = list(config)
        if (
            len(items) == 3
            and isinstance(items[0], str)
            and all(isinstance(i, int) for i in items[1:])
        ):
            return [canonical.get(items[0], items[0]), *items[1:]]
        return [_renamed(v, canonical) for v in items]
    return config


def _learning_rate(optimizer: Any) -> float | None:
    """The optimizer's plain learning rate (a variable the traced step reads), or None for
    a schedule (which is in the key)."""
    if not isinstance(optimizer.get_config().get("learning_rate"), (int, float)):
        return None
    return float(np.asarray(optimizer.learning_rate))


@dataclass
class _Template:
    model: Any
    #: The optimizer's variables right after it was first built, before any step.
    initial: list[np.ndarray]


def _load_state(template: _Template, fresh: Any) -> bool:
    """Give ``template`` ``fresh``'s variables, its optimizer's initial state and
    ``fresh``'s learning rate (same architecture key)."""
    model = template.model
    pairs = list(zip(model.variables, fresh.variables, strict=True))
    for mine, theirs in pairs:
        if tuple(mine.shape) != tuple(theirs.shape) or str(mine.dtype) != str(theirs.dtype):
            return False
    slots = list(model.optimizer.variables)
    if len(slots) != len(template.initial):
        return False
    rate = _learning_rate(fresh.optimizer)
    for mine, theirs in pairs:
        mine.assign(theirs.value)
    for variable, value in zip(slots, template.initial, strict=True):
        variable.assign(value)
    if rate is not None:
        model.optimizer.learning_rate = rate
    model.stop_training = False
    return True


class ModelTemplates:
    """What the trials of one search share in one Python worker: models already traced,
    by architecture key, and the search's arrays as tensors and datasets.

    Not thread-safe: a Python worker runs one task at a time.
    """

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._capacity = capacity
        self._models: OrderedDict[str, _Template] = OrderedDict()
        self._tensors: dict[str, Any] = {}
        self._datasets: dict[tuple[Any, ...], Any] = {}
        self.reused = 0

    def __len__(self) -> int:
        return len(self._models)

    def reuse(self, fresh: Any) -> Any | None:
        """An earlier, traced model of ``fresh``'s architecture holding ``fresh``'s state,
        ready to train; None if there is none (then prebuild ``fresh`` and :meth:`keep`)."""
        key = architecture_key(fresh)
        template = None if key is None else self._models.get(key)
        if template is None or key is None:
            return None
        try:
            if not _load_state(template, fresh):
                return None
        except Exception as err:  # noqa: BLE001 - the trial trains its fresh model
            logger.debug("Not reusing a traced model: %s", err)
            return None
        self._models.move_to_end(key)
        self.reused += 1
        return template.model

    def keep(self, model: Any) -> None:
        """Keep ``model``, its optimizer state built and not stepped yet, for the trials
        after this one (a model this module does not reuse is not kept)."""
        key = architecture_key(model)
        optimizer = getattr(model, "optimizer", None)
        if key is None or optimizer is None or not getattr(optimizer, "built", False):
            return
        initial = [np.array(v.numpy()) for v in optimizer.variables]
        self._models[key] = _Template(model, initial)
        self._models.move_to_end(key)
        while len(self._models) > self._capacity:
            self._models.popitem(last=False)

    def tensor(self, name: str, array: Any) -> Any:
        """``array`` (the search's ``name``) as a tensor, converted once per worker."""
        from tensorspark.tuning.feed import as_tensor

        if name not in self._tensors:
            self._tensors[name] = as_tensor(array)
        return self._tensors[name]

    def dataset(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """The dataset ``make()`` builds, built once per worker for ``key``."""
        if key not in self._datasets:
            self._datasets[key] = make()
        return self._datasets[key]


class TrialData(dict):  # type: ignore[type-arg]
    """A search's arrays as broadcast: a dict, plus the worker's :class:`ModelTemplates`,
    which never travel (each worker's copy starts empty)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.templates = ModelTemplates()

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        return (TrialData, (dict(self),))
