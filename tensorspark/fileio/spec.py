"""What a task is told about its files, and how the rows it reads become batches.

:class:`ReadSpec` (plain values, shipped to executors) says where the files are, which
columns hold the features and the label, and what the consumer wants (:class:`Feed`:
per-record shapes and dtypes, from the model on the driver). The format readers yield
:class:`RawChunk` s, rows as stored; :func:`to_block` checks and converts them into the
``(features, label)`` blocks the partition loops train on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tensorspark.blocks import Block
from tensorspark.errors import ConfigurationError
from tensorspark.storage.options import StorageOptions

#: Rows a reader hands over at once when the row's size is not known in advance.
BLOCK_ROWS = 4096
#: About the bytes of one chunk as fed (float32 features), when the row's size is known:
#: small chunks keep the task's memory flat, large ones keep the per-chunk overhead low.
BLOCK_BYTES = 2 << 20


def block_rows(feature_width: int | None) -> int:
    """Rows per chunk for records of ``feature_width`` values (256 to 16,384)."""
    if not feature_width:
        return BLOCK_ROWS
    return max(256, min(16384, BLOCK_BYTES // (4 * feature_width)))


@dataclass(frozen=True)
class Feed:
    """What the model takes per record: shapes without the batch dimension (``None``: as
    stored) and numpy dtype names. ``label_dtype`` ``None``: no label is read."""

    feature_shape: tuple[int, ...] | None
    feature_dtype: str
    label_shape: tuple[int, ...] | None = None
    label_dtype: str | None = None


@dataclass(frozen=True)
class ReadSpec:
    """How every task of a job reads its shards (plain values; shipped to executors).

    Attributes:
        format: ``"parquet"``, ``"tfrecord"`` or ``"idx"``.
        files: the files' locations, as :class:`~tensorspark.storage.options.StorageOptions`
            reopens them on an executor; shards name them by index.
        sizes: their sizes in bytes, as listed.
        gzip: per file, whether it is GZIP-compressed (TFRecord, idx).
        features: the column or feature of the features (``None`` for idx).
        label: the column or feature of the label (``None``: idx, or no label read).
        raw_dtype: the dtype string raw-byte features are read as (``None``: ``uint8``
            where bytes are found, numbers as stored).
        scale: what the features are multiplied by, or ``None``.
        one_hot: classes of one-hot labels made from class ids, or ``None``.
        feed: what the model takes.
        storage: how to reach the files.
        shuffle_buffer: rows kept to shuffle within a task (0: shards only).
        block_rows: rows per chunk a reader hands over (:func:`block_rows`).
    """

    format: str
    files: tuple[str, ...]
    sizes: tuple[int, ...]
    gzip: tuple[bool, ...]
    features: str | None
    label: str | None
    raw_dtype: str | None
    scale: float | None
    one_hot: int | None
    feed: Feed
    storage: StorageOptions
    shuffle_buffer: int = 0
    block_rows: int = BLOCK_ROWS

    @property
    def wants_label(self) -> bool:
        return self.feed.label_dtype is not None

    def feature_width(self) -> int | None:
        """Numbers per record the features must hold, when the model says (else ``None``)."""
        shape = self.feed.feature_shape
        return None if shape is None else math.prod(shape)

    def label_width(self) -> int | None:
        """Numbers per record the label must hold (a class id with ``one_hot``), or ``None``."""
        if self.one_hot is not None:
            return 1
        shape = self.feed.label_shape
        return None if shape is None else math.prod(shape)


@dataclass
class RawChunk:
    """Rows as a reader found them: ``features`` ``[n, width]`` in the stored dtype,
    ``label`` ``[n, width]`` or ``None``; ``where`` names the file and ``first`` the first
    row (for messages)."""

    features: np.ndarray
    label: np.ndarray | None
    where: str
    first: str


def width_error(
    what: str, where: str, got: int, expected: int, hint: str = ""
) -> ConfigurationError:
    """The message for a record whose features (``what="features"``) or label hold the
    wrong number of values; the same text from every format."""
    kind = "Features" if what == "feature" else "Labels"
    return ConfigurationError(
        f"{kind} of the wrong length: {where} holds {got} {what} values; the model takes "
        f"{expected} per record{hint}."
    )


def check_width(
    spec: ReadSpec, what: str, got: int, where: str, first_width: int | None = None
) -> None:
    """Raise :func:`width_error` when ``got`` values per record do not fit (executor).

    Without a width from the model, records must agree with the first one (``first_width``).
    """
    expected = spec.feature_width() if what == "feature" else spec.label_width()
    if expected is None:
        expected = first_width
        if expected is None or got == expected:
            return
        raise ConfigurationError(
            f"Records differ in length: {where} holds {got} {what} values, earlier records "
            f"{expected}."
        )
    if got != expected:
        hint = (
            " (set feature_dtype if the bytes hold another type)"
            if what == "feature" and spec.raw_dtype is None
            else ""
        )
        raise width_error(what, where, got, expected, hint)


def to_block(spec: ReadSpec, chunk: RawChunk) -> Block:
    """The chunk as the ``(features, label)`` block the model takes (executor): features
    cast, scaled and shaped; labels one-hot encoded, cast and shaped.

    Raises:
        ConfigurationError: a class id outside ``[0, one_hot)`` or not a whole number.
    """
    feed = spec.feed
    n = len(chunk.features)
    features = chunk.features.reshape(n, -1).astype(feed.feature_dtype, copy=False)
    if spec.scale is not None:
        features = features * np.asarray(spec.scale, dtype=features.dtype)
    if feed.feature_shape is not None:
        features = features.reshape((n, *feed.feature_shape))
    if not spec.wants_label or chunk.label is None:
        return (features,)
    label = chunk.label.reshape(n, -1)
    if spec.one_hot is not None:
        ids = label[:, 0]
        bad = np.flatnonzero((ids < 0) | (ids >= spec.one_hot) | (ids != np.floor(ids)))
        if len(bad):
            raise ConfigurationError(
                f"one_hot={spec.one_hot} takes class ids 0..{spec.one_hot - 1}; {chunk.where} "
                f"(row {bad[0]} of the rows from {chunk.first}) holds {ids[bad[0]]!r}"
            )
        encoded = np.zeros((n, spec.one_hot), dtype=feed.label_dtype)
        encoded[np.arange(n), ids.astype(np.int64)] = 1
        label = encoded
    else:
        label = label.astype(feed.label_dtype or label.dtype, copy=False)
    if feed.label_shape is not None:
        label = label.reshape((n, *feed.label_shape))
    return features, label
