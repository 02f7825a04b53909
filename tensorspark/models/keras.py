"""Keras 3 models trained on Spark: weights and the executor adapter.

How a Keras model trains (see :meth:`tensorspark.SparkSession.fit`):

* The driver writes the compiled model in Keras's own ``.keras`` format
  (:func:`~tensorspark.models.keras_io.serialize_model`: architecture config, weights and the
  compile configuration: optimizer, loss, metrics) and broadcasts those bytes; never a pickled
  Keras object. Custom layers/losses are rebuilt on executors from ``custom_objects``.
* On an executor, :class:`KerasTrainer` (the :class:`~tensorspark.models.base.TrainableModel`
  adapter) rebuilds the compiled model once per Python worker process (the bounded cache of
  :mod:`~tensorspark.models.keras_io`, keyed by an id minted on the driver for the run) and
  trains a chunk of ``sync_interval`` mini-batches in ONE call of a compiled ``tf.function``
  that loops over Keras's own ``model.train_step`` (like ``steps_per_execution``), so the
  per-batch Python overhead is paid once per chunk.
* Only the model's weights (``model.weights``, named by :func:`weight_names`) go through the
  parameter server. Each worker keeps its own optimizer state (Adam's moments, the step
  counter): optimizer variables are per-worker state, as in most parameter-server systems,
  because averaging moments of different data streams has no clear meaning and would double
  or triple the bytes on the wire. The driver's optimizer is not changed by ``fit``.

Per-chunk loss and metrics are Keras's running means over the chunk (the loss tracker and
the compiled metrics, reset at the start of a chunk) times the chunk's samples; the jobs sum
them per epoch and divide by the epoch's samples across all workers: exact for mean-type
metrics (loss, accuracy, MAE, ...); for metrics that are not means over examples (AUC, F1)
it is the sample-weighted mean of per-chunk values. Inference's ModelSource pair:
:mod:`~tensorspark.models.keras_source`; driver-side checks of a model and its data:
:mod:`~.keras_checks`; a worker row cache's slot tables: :mod:`~.row_cache`.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorspark.blocks import Block
from tensorspark.errors import CheckpointError, ConfigurationError
from tensorspark.models import keras_io
from tensorspark.models.embeddings import RowAccess, assign_rows, chunk_checker
from tensorspark.models.keras_checks import model_shapes
from tensorspark.models.row_cache import CachedTables

if TYPE_CHECKING:
    import keras


def weight_names(model: keras.Model) -> list[str]:
    """Stable names for ``model.weights``: Keras variable paths (``"dense/kernel"``).

    Runs anywhere; pure. A model rebuilt from its ``.keras`` bytes keeps its layer names,
    but Keras prefixes paths with the model's name in some models and not in their rebuilt
    copies (``"sequential/dense/kernel"`` vs ``"dense/kernel"``), so that prefix is dropped.
    Should two variables then share a name (possible in hand-built subclassed models),
    every name gets its index as a prefix instead.
    """
    prefix = f"{model.name}/"
    names = [str(v.path).removeprefix(prefix) for v in model.weights]
    if len(set(names)) != len(names):
        names = [f"{i:04d}/{n}" for i, n in enumerate(names)]
    return names


def read_weights(model: keras.Model) -> dict[str, np.ndarray]:
    """The model's weights by :func:`weight_names` (copies; runs anywhere)."""
    weights = zip(weight_names(model), model.weights, strict=True)
    return {n: np.asarray(v.numpy()) for n, v in weights}  # numpy() copies: not twice


def assign_weights(model: keras.Model, params: Mapping[str, np.ndarray]) -> None:
    """Assign ``params`` (named by :func:`weight_names`) to the model's variables.

    Raises:
        ConfigurationError: a weight is missing or has another shape.
    """
    for name, variable in zip(weight_names(model), model.weights, strict=True):
        if name not in params:
            raise ConfigurationError(
                f"the weights do not match the model: {name!r} is missing. Received: "
                f"{sorted(params)[:10]}"
            )
        value = params[name]
        if tuple(value.shape) != tuple(variable.shape):
            raise ConfigurationError(
                f"weight {name!r} has shape {tuple(value.shape)}, the model expects "
                f"{tuple(variable.shape)}"
            )
        assign_rows(variable, value)  # in blocks: the table is not copied whole


def match_weights(
    model: keras.Model, params: Mapping[str, np.ndarray], where: str, what: str
) -> list[np.ndarray]:
    """``params`` (e.g. a checkpoint's) in the order of ``model.weights`` (driver).

    Matched by name: Keras variable paths may or may not start with the model's name
    (``"fashion/dense/kernel"`` vs ``"dense/kernel"``) depending on how the model was
    built, so full paths, :func:`weight_names` and variable names are tried, against the
    names as given and with their first component dropped. When no naming matches all of
    them, by order, if every shape matches in order.

    Raises:
        CheckpointError: neither by name nor by order do ``params`` fit the model (names
            ``where``, the checkpoint, and ``what``, the model).
    """
    from tensorspark.checkpoint import check_signature, model_signature

    variables = list(model.weights)
    namings = [
        [str(v.path) for v in variables],
        weight_names(model),
        [str(v.name) for v in variables],
    ]
    stripped = {n.split("/", 1)[1]: a for n, a in params.items() if "/" in n}
    for candidates in (params, stripped):
        for names in namings:
            if len(set(names)) == len(names) and set(names) == set(candidates):
                expected = {n: np.asarray(v.numpy()) for n, v in zip(names, variables, strict=True)}
                check_signature(model_signature(expected), model_signature(candidates), where)
                return [candidates[n] for n in names]
    ordered = list(params.values())
    if len(ordered) != len(variables) or any(
        tuple(a.shape) != tuple(v.shape) for a, v in zip(ordered, variables, strict=True)
    ):
        raise CheckpointError(
            f"Checkpoint {where} does not match {what}: its parameters "
            f"{model_signature(params)} match the model's weights "
            f"{[(v.path, tuple(v.shape)) for v in variables]} neither by name nor by order. "
            "Pass the model the checkpoint was written from."
        )
    return ordered


def model_payload(
    model: keras.Model, custom_objects: Mapping[str, Any] | None
) -> tuple[bytes, keras.Model]:
    """The model's ``.keras`` bytes, checked by rebuilding them here (driver).

    Rebuilding on the driver proves the executors can do it (custom classes registered or
    in ``custom_objects``) before a job starts. Returns the bytes and the rebuilt, compiled
    copy (used for data checks, so the user's model is not touched).

    Raises:
        ConfigurationError: Keras cannot save the model, or cannot rebuild it (e.g. a custom
            layer missing from ``custom_objects``; the message names it).
    """
    data = keras_io.serialize_model(model)
    copy = _rebuild(data, custom_objects, what=f"model {model.name!r}")
    return data, copy


class CompiledModel:
    """A compiled model and its compiled multi-step functions (one per worker process).

    Not thread-safe: a Spark Python worker runs one task at a time, and the cache hands this
    object to tasks of the same run one after the other.
    """

    def __init__(self, model: keras.Model) -> None:
        self.model = model
        self.names = weight_names(model)
        self.variables = list(model.weights)
        self.input_shape, _ = model_shapes(model)
        self._train_fn: Any = None
        self._test_fn: Any = None
        self._built = False
        self._fresh_optimizer: list[np.ndarray] | None = None  # its state when built
        self._reset_pending = False
        self.tasks = 0  # KerasTrainers made over it in this process (1: this task loaded it)

    def _build(self, x: np.ndarray, y: np.ndarray) -> None:
        if not self._built:
            # What model.fit does before its first step: create the compiled loss/metrics
            # state and the optimizer's slots outside the traced function.
            self.model._symbolic_build(data_batch=(x[:1], y[:1]))
            self._built = True
            optimizer = getattr(self.model, "optimizer", None)
            if self._reset_pending and optimizer is not None:  # kept only when asked for
                self._fresh_optimizer = [np.array(v.numpy()) for v in _reset_state(optimizer)]
        if self._reset_pending:
            self._reset_pending = False
            optimizer = getattr(self.model, "optimizer", None)
            if optimizer is not None and self._fresh_optimizer is None:
                raise RuntimeError(  # a loader's tasks all reset or none: a bug if not
                    "reset_optimizer() after this model trained without it: its built "
                    "optimizer state was not kept"
                )
            if self._fresh_optimizer is not None:
                for variable, value in zip(
                    _reset_state(self.model.optimizer), self._fresh_optimizer, strict=True
                ):
                    variable.assign(value)

    def reset_optimizer(self) -> None:
        """Start the next training step from the optimizer's state as it was built (its
        step count 0, its slots as created) instead of the state this process's earlier
        tasks left: a task's training then depends on its partition and the weights it
        pulls, not on which Python worker ran it before (seeded stream replays).

        The state as built is copied at the first build of a model whose first task asked
        for this; every task of one cache key asks alike (a stream's loader is fixed for
        its query), so the copy exists whenever a later task asks. The copy holds every
        slot (Adam: two per weight, so twice an embedding table's size in memory) but not
        the learning rate: a rate the run's control set (:meth:`KerasTrainer.set_learning_rate`)
        stays."""
        self._reset_pending = True

    def _multi_step(self, step: Callable[[Any], Any], x: np.ndarray, y: np.ndarray) -> Any:
        import tensorflow as tf

        model = self.model
        spec = (
            tf.TensorSpec([None, None, *x.shape[1:]], tf.as_dtype(x.dtype)),
            tf.TensorSpec([None, None, *y.shape[1:]], tf.as_dtype(y.dtype)),
        )

        # Unknown step and batch dimensions: one trace serves full chunks, a shorter last
        # chunk and a smaller last batch alike.
        @tf.function(input_signature=spec, jit_compile=False, reduce_retracing=True)
        def run(xs: Any, ys: Any) -> Any:
            for i in tf.range(tf.shape(xs)[0]):
                step((xs[i], ys[i]))
            return model.get_metrics_result()

        return run

    def features(self, x: np.ndarray) -> np.ndarray:
        if x.shape[1:] != self.input_shape:
            x = x.reshape((len(x), *self.input_shape))
        return x

    def run_steps(
        self, training: bool, batches: Sequence[Block], max_steps: int
    ) -> dict[str, float]:
        """Run every batch through one compiled call per group of equal-size batches;
        return Keras's running metric results over them (metrics reset first)."""
        first_x, first_y = self.features(batches[0][0]), batches[0][1]
        self._build(first_x, first_y)
        if training:
            if self._train_fn is None:
                self._train_fn = self._multi_step(self.model.train_step, first_x, first_y)
            fn = self._train_fn
        else:
            if self._test_fn is None:
                self._test_fn = self._multi_step(self.model.test_step, first_x, first_y)
            fn = self._test_fn
        self.model.reset_metrics()
        result: Any = None
        for group in _groups(batches, max_steps):
            xs = np.stack([self.features(b[0]) for b in group])
            ys = np.stack([b[1] for b in group])
            result = fn(xs, ys)
        return {k: float(v) for k, v in result.items() if np.ndim(v) == 0}

    def set_weights(self, params: Mapping[str, np.ndarray]) -> None:
        for name, variable in zip(self.names, self.variables, strict=True):
            variable.assign(params[name])

    def get_weights(self) -> dict[str, np.ndarray]:
        return {n: np.asarray(v.numpy()) for n, v in zip(self.names, self.variables, strict=True)}


def _groups(batches: Sequence[Block], max_steps: int) -> Iterator[Sequence[Block]]:
    """Consecutive runs of equal-size batches, at most ``max_steps`` long."""
    start = 0
    for i in range(1, len(batches) + 1):
        if (
            i == len(batches)
            or len(batches[i][0]) != len(batches[start][0])
            or i - start == max_steps
        ):
            yield batches[start:i]
            start = i


def _rebuild(
    data: bytes,
    custom_objects: Mapping[str, Any] | None,
    what: str = "the model",
    mixed_precision: str | None = None,
) -> keras.Model:
    """The compiled model from its bytes (anywhere), under ``mixed_precision`` if given."""
    with warnings.catch_warnings():
        # The driver's optimizer is saved unbuilt (its variables are not shipped: each
        # worker keeps its own optimizer state), which Keras reports on every load.
        warnings.filterwarnings("ignore", message="Skipping variable loading for optimizer")
        return keras_io.deserialize_model(
            data, custom_objects, compile=True, what=what, mixed_precision=mixed_precision
        )


def rebuild_compiled(data: bytes, what: str = "the model", custom: Any = None) -> keras.Model:
    """The compiled model from its ``.keras`` bytes (``custom``: its ``custom_objects``), as
    executors rebuild it (anywhere; thread-safe): a Spark ML fit's copy, a checked copy."""
    return _rebuild(data, custom, what)


def cached_core(
    key: str,
    payload: bytes | Callable[[], bytes],
    custom_objects: Mapping[str, Any] | None,
    mixed_precision: str | None = None,
) -> CompiledModel:
    """This Python worker's :class:`CompiledModel` under ``key``, rebuilt from ``payload``
    (bytes, or a function returning them, e.g. a broadcast's value) on first use (executor),
    under the ``mixed_precision`` policy when given (:mod:`tensorspark.models.precision`);
    the key must differ between policies."""

    def load() -> CompiledModel:
        data = payload() if callable(payload) else payload
        return CompiledModel(_rebuild(data, custom_objects, mixed_precision=mixed_precision))

    return keras_io.cached(key, load)


class KerasTrainer:
    """The :class:`~tensorspark.models.base.TrainableModel` adapter for a compiled Keras model.

    Runs on executors. Built by :class:`KerasTrainerLoader` from the broadcast ``.keras``
    bytes. The compiled model (and its traced training function) is
    cached per Python worker process under ``key`` (minted on the driver for one ``fit``), so
    a process that trains several partitions of the run rebuilds nothing; the optimizer state
    then carries over between those partitions, as it would within one worker. Not
    thread-safe (one task at a time per process).

    Args:
        payload: the model's ``.keras`` bytes (compiled).
        key: the run's cache key.
        custom_objects: custom Keras classes needed to rebuild the model.
        sync_interval: mini-batches per chunk (the length of one compiled loop).
        mixed_precision: ``"mixed_float16"``/``"mixed_bfloat16"`` to train under that Keras
            policy (float32 variables, so the weights moved stay float32), or ``None``.
        fresh_optimizer: start this task from the optimizer's built state rather than
            the state earlier tasks of this process left (seeded stream replays).
        row_cache: the worker row cache's plan (``payload``'s tables are slot tables).
    """

    def __init__(
        self,
        payload: bytes,
        key: str | None = None,
        custom_objects: Mapping[str, Any] | None = None,
        sync_interval: int = 100,
        mixed_precision: str | None = None,
        fresh_optimizer: bool = False,
        row_cache: Mapping[str, Any] | None = None,
    ) -> None:
        self._core = cached_core(
            f"fit-{key or uuid.uuid4().hex}-{mixed_precision}",
            payload,
            custom_objects,
            mixed_precision,
        )
        if fresh_optimizer:
            self._core.reset_optimizer()
        self._core.tasks += 1  # an earlier task's model (a retry's) holds what it trained
        self.untouched = self._core.tasks == 1  # the broadcast's weights, as loaded
        self._max_steps = max(1, int(sync_interval))
        self._rows: RowAccess | None = None
        self.check_ids = chunk_checker(self._core.model)  # the worker's, before each chunk
        self.row_cache = None if row_cache is None else CachedTables(self._core, row_cache)
        if self.row_cache is not None:  # against the tables' true rows, not the slots
            self.check_ids = self.row_cache.check_ids

    @property
    def model(self) -> keras.Model:
        return self._core.model

    @property
    def rows(self) -> RowAccess:
        """Row access to the embedding tables, for row-sparse sync (made when first asked)."""
        if self._rows is None:
            self._rows = RowAccess(self._core.model, self._core.names)
        return self._rows

    def get_weights(self) -> dict[str, np.ndarray]:
        return self._core.get_weights()

    def set_weights(self, params: Mapping[str, np.ndarray]) -> None:
        self._core.set_weights(params)

    def set_learning_rate(self, rate: float) -> None:
        """The optimizer's learning rate from the next chunk on (a driver's callback, e.g.
        ``ReduceLROnPlateau``, through the run's control; :mod:`tensorspark.ps.control`).
        The compiled step reads the rate's variable, so nothing is traced again."""
        self._core.model.optimizer.learning_rate = float(rate)

    def train_chunk(self, batches: list[Block]) -> dict[str, float]:
        """Train on ``batches`` in order in one compiled call; return sums over them."""
        if not batches:
            return {"samples": 0}
        samples = sum(len(b[0]) for b in batches)
        if self._rows is not None:
            self._rows.saw([b[0] for b in batches])
        means = self._core.run_steps(True, batches, self._max_steps)
        sums: dict[str, float] = {"samples": samples}
        sums.update({k: v * samples for k, v in means.items()})
        return sums

    def close(self) -> None:
        """Nothing to free: the model stays cached for the run's next task in this process."""


def _reset_state(optimizer: Any) -> list[Any]:
    """The optimizer's variables a reset restores (:meth:`CompiledModel.reset_optimizer`):
    all of them (step count, slots) but the learning rate's, which Keras 3 lists among
    them and which the run's control may have set since (a loss-scaling optimizer's inner
    one's too)."""
    inner = getattr(optimizer, "inner_optimizer", None)
    rates = {id(getattr(o, "_learning_rate", None)) for o in (optimizer, inner) if o is not None}
    return [v for v in optimizer.variables if id(v) not in rates]


@dataclass(frozen=True)
class KerasTrainerLoader:
    """Builds a :class:`KerasTrainer` on an executor: the
    :class:`~tensorspark.models.base.TrainerLoader` of Keras (plain values only, shipped).

    Args:
        key: the run's cache key (minted on the driver for one ``fit``).
        custom_objects: custom Keras classes needed to rebuild the model.
        sync_interval: mini-batches per chunk.
        mixed_precision: the Keras dtype policy to train under, or ``None``.
        fresh_optimizer: each task starts from the optimizer's built state (see
            :meth:`CompiledModel.reset_optimizer`), not the process's earlier tasks' state.
    """

    key: str
    custom_objects: Mapping[str, Any] | None = None
    sync_interval: int = 100
    mixed_precision: str | None = None
    fresh_optimizer: bool = False
    row_cache: Mapping[str, Any] | None = None  # the plan (models/row_cache.py), if cached

    def load(self, payload: object, threads: int) -> KerasTrainer:
        """The adapter over the broadcast ``.keras`` bytes (``threads``: Keras reads the
        worker's TF settings itself); this loader's fields are its keyword options, one
        for one."""
        assert isinstance(payload, (bytes, bytearray)), type(payload)
        return KerasTrainer(bytes(payload), **vars(self))
