"""tensorspark.tuning.feed: the batches a trial trains and validates on, without helper threads."""

from __future__ import annotations

import keras
import numpy as np

from tensorspark.tuning import feed


def _labels(dataset) -> list[list[int]]:  # type: ignore[no-untyped-def]
    return [batch[1].numpy().tolist() for batch in dataset]


def test_every_pass_is_a_new_permutation_of_all_rows_with_a_partial_last_batch() -> None:
    x = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)
    y = np.arange(10)
    dataset = feed.training_dataset(x, y, batch_size=4, seed=1)
    passes = [_labels(dataset) for _ in range(3)]
    for batches in passes:
        assert [len(b) for b in batches] == [4, 4, 2]
        assert sorted(sum(batches, [])) == list(range(10))
    assert len({str(b) for b in passes}) == 3  # reshuffled every epoch
    # The features travel with their labels.
    for xb, yb in dataset:
        np.testing.assert_array_equal(xb.numpy(), x[yb.numpy()])


def test_the_same_seed_gives_the_same_batches_and_another_seed_others() -> None:
    x = np.zeros((50, 2), np.float32)
    y = np.arange(50)

    def passes(seed: int) -> list[list[list[int]]]:
        dataset = feed.training_dataset(x, y, 8, seed=seed)
        return [_labels(dataset) for _ in range(3)]

    first = passes(7)
    assert first == passes(7)  # every epoch repeats, not just the first
    assert first != passes(8)


def test_floats_are_cast_to_floatx_as_keras_does_and_small_sets_work() -> None:
    x = np.arange(6, dtype=np.float64).reshape(3, 2)
    y = np.ones((3, 1), dtype=np.float64)
    dataset = feed.training_dataset(x, y, batch_size=8, seed=0)
    assert int(dataset.cardinality()) == 1  # fewer rows than a batch: one partial batch
    xb, yb = next(iter(dataset))
    assert xb.dtype.name == keras.backend.floatx() and yb.dtype.name == keras.backend.floatx()
    assert xb.shape == (3, 2) and yb.shape == (3, 1)
    ints = feed.evaluation_dataset(np.zeros((2, 2), np.float32), np.arange(2), 8)
    assert next(iter(ints))[1].dtype.name == "int64"


def test_evaluation_batches_keep_row_order() -> None:
    x = np.arange(5, dtype=np.float32).reshape(5, 1)
    assert _labels(feed.evaluation_dataset(x, np.arange(5), 2)) == [[0, 1], [2, 3], [4]]


def test_keras_trains_on_it_and_a_seeded_fit_repeats_exactly() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)

    def fit() -> list[float]:
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
        model.compile(
            optimizer=keras.optimizers.Adam(0.05),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
        history = model.fit(
            feed.training_dataset(x, y, 32, seed=3),
            validation_data=feed.evaluation_dataset(x, y, 32),
            epochs=3,
            shuffle=False,
            verbose=0,
        )
        return history.history["val_accuracy"]

    scores = fit()
    assert scores == fit()
    assert scores[-1] > 0.8


def test_keras_knows_the_epoch_length_and_trains_every_epoch() -> None:
    import warnings

    x = np.zeros((70, 2), np.float32)
    y = np.zeros(70, np.int64)
    dataset = feed.training_dataset(x, y, 32, seed=0)
    assert int(dataset.cardinality()) == 3
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. Keras's "Your input ran out of data"
        history = model.fit(dataset, epochs=4, shuffle=False, verbose=0)
    assert len(history.history["loss"]) == 4
