"""idx files (MNIST's format): headers on the driver, byte ranges streamed by the tasks.

An idx data set is a pair of files, images and labels (``train-images-idx3-ubyte`` with
``train-labels-idx1-ubyte``, each optionally ``.gz``), paired by name: the same name with
``images`` for ``labels`` (and any ``idx<N>``). A file whose name holds no ``labels`` is
a features file; its labels file is needed when the job trains or evaluates.

Driver (:func:`inspect`): each file's header (its first bytes; of a ``.gz`` file, the first
decompressed bytes, and its GZIP trailer's size) says the element type and the shape; the
images and labels files of a pair must declare the same number of records, and a raw file
must be as long as its header says. Files are cut into runs of whole records, of about
:data:`SHARD_BYTES` (byte ranges of an uncompressed file) or :data:`GZ_SHARD_BYTES` of a
gzipped one (whose shards each decompress it from the start and skip to their records).

Executor (:func:`read_shard`): the two ranges stream side by side, ``block_rows`` records
at a time.
"""

from __future__ import annotations

import logging
import math
import posixpath
import re
import zlib
from collections.abc import Iterable, Iterator

import numpy as np

from tensorspark.errors import ConfigurationError
from tensorspark.fileio.idx_format import idx_header
from tensorspark.fileio.listing import Listed
from tensorspark.fileio.rangefile import gunzip, stream
from tensorspark.fileio.shards import Shard
from tensorspark.fileio.spec import RawChunk, ReadSpec
from tensorspark.storage import Storage, open_location
from tensorspark.storage.options import StorageOptions

logger = logging.getLogger(__name__)

#: Bytes of images per shard of an uncompressed idx file.
SHARD_BYTES = 8 << 20
#: The same for a gzipped one, larger: every shard of it decompresses the file from its start.
GZ_SHARD_BYTES = 32 << 20
_HEAD = 64  # bytes that hold any idx header this module accepts (up to 15 dimensions)


def _key(name: str) -> str:
    """A file's pairing key: its name without ``.gz``, ``images``/``labels`` and ``idx<N>``."""
    base = posixpath.basename(name)
    base = base[:-3] if base.lower().endswith(".gz") else base
    return re.sub(r"idx\d+", "idx", base.replace("images", "").replace("labels", ""))


def _split_of(name: str) -> str:
    return posixpath.basename(name).split("-", 1)[0]


def _head(
    storage: Storage, path: str, size: int, gz: bool, location: str
) -> tuple[np.dtype, tuple[int, ...], int]:
    """``(dtype, shape, header bytes)`` from the first bytes of one idx file."""
    head = b"".join(storage.read_range(path, 0, min(size, 1 << 16)))
    if gz:
        try:
            head = zlib.decompressobj(wbits=31).decompress(head, _HEAD)
        except zlib.error as err:
            raise ConfigurationError(f"idx file {location} is not valid GZIP data: {err}") from None
    try:
        return idx_header(head)
    except ConfigurationError as err:
        raise ConfigurationError(f"idx file {location}: {err}") from None


def _header(
    storage: Storage, path: str, size: int, gz: bool, location: str
) -> tuple[np.dtype, tuple[int, ...], int]:
    """``(dtype, shape, header bytes)`` of one idx file, its length checked where possible."""
    dtype, shape, header = _head(storage, path, size, gz, location)
    expected = header + math.prod(shape) * dtype.itemsize
    if gz:
        # GZIP's trailer keeps the uncompressed size modulo 2**32 (one-member files).
        trailer = b"".join(storage.read_range(path, size - 4, 4))
        stored = int.from_bytes(trailer, "little") if len(trailer) == 4 else -1
        if stored != expected % (1 << 32):
            raise ConfigurationError(
                f"idx file {location} does not hold what its header declares: shape {shape} of "
                f"{dtype.name} is {expected} bytes uncompressed, its GZIP trailer says {stored}"
            )
    elif size != expected:
        raise ConfigurationError(
            f"idx file {location} does not hold what its header declares: shape {shape} of "
            f"{dtype.name} needs {expected} bytes, the file has {size}"
        )
    return dtype, shape, header


def inspect(
    listed: list[Listed],
    options: StorageOptions,
    *,
    need_labels: bool,
    split: str | None,
    feature_width: int | None,
    label_width: int | None,
    argument: str,
) -> tuple[list[str], list[Shard], int, tuple[str, str | None]]:
    """Pair the files, check their headers and cut shards (driver; headers only).

    Returns:
        ``(files, shards, rows, (feature dtype, label dtype or None))``: the files the
        shards name (features files, then labels files), the shards, the records in all,
        and the stored element types.

    Raises:
        ConfigurationError: no features file, a missing labels file, headers that do not
            match (record counts, types, shapes between pairs, lengths), features of the
            wrong length, or an ambiguous folder without ``split``.
    """
    labels_by_key = {
        _key(f.location): f for f in listed if "labels" in posixpath.basename(f.location)
    }
    features = [f for f in listed if "labels" not in posixpath.basename(f.location)]
    splits = sorted({_split_of(f.location) for f in features})
    if split is not None:
        features = [f for f in features if _split_of(f.location) == split]
        if not features:
            raise ConfigurationError(
                f"Argument `split` matches no idx file; the files' splits are {splits}. Received: "
                f"split={split!r}"
            )
    elif len(splits) > 1:
        if "train" not in splits:
            raise ConfigurationError(
                f"{argument} holds idx files of several splits {splits}; pick one with split= or a "
                "glob"
            )
        logger.info(
            "idx files of splits %s found; reading split='train' (pass split= for another)", splits
        )
        features = [f for f in features if _split_of(f.location) == "train"]
    if not features:
        raise ConfigurationError(
            f"{argument} holds no idx features file (names without 'labels'). Received: {argument}"
        )
    files: list[str] = []
    shards: list[Shard] = []
    rows = 0
    kinds: tuple[str, str | None] | None = None
    for item in features:
        storage, path = open_location(item.location, options)
        gz = item.location.lower().endswith(".gz")
        dtype, shape, header = _header(storage, path, item.size, gz, item.location)
        width = math.prod(shape[1:])
        if feature_width is not None and width != feature_width:
            raise ConfigurationError(
                f"Features of the wrong length: idx file {item.location} holds records of shape "
                f"{list(shape[1:])} ({width} values); the model takes {feature_width} per record."
            )
        labels = labels_by_key.get(_key(item.location)) if need_labels else None
        label_dtype: str | None = None
        if need_labels:
            if labels is None:
                raise ConfigurationError(
                    f"idx file {item.location} has no labels file beside it (the same name with "
                    f"'labels' for 'images'); training and evaluation need one"
                )
            l_storage, l_path = open_location(labels.location, options)
            l_gz = labels.location.lower().endswith(".gz")
            l_dtype, l_shape, l_header = _header(
                l_storage, l_path, labels.size, l_gz, labels.location
            )
            if l_shape[0] != shape[0]:
                raise ConfigurationError(
                    f"idx header mismatch: {item.location} declares {shape[0]} records, its labels "
                    f"file {labels.location} declares {l_shape[0]}"
                )
            l_width = math.prod(l_shape[1:])
            if label_width is not None and l_width != label_width:
                raise ConfigurationError(
                    f"Labels of the wrong length: idx file {labels.location} holds {l_width} "
                    f"values per record; the model takes {label_width} per record."
                )
            label_dtype = l_dtype.str
        these = (dtype.str, label_dtype)
        if kinds is not None and these != kinds:
            raise ConfigurationError(
                f"idx header mismatch: {item.location} (and its labels) hold {these}, earlier "
                f"files {kinds}"
            )
        kinds = these
        index = len(files)
        files.append(item.location)
        label_index = -1
        if labels is not None:
            label_index = len(files)
            files.append(labels.location)
        shards.extend(
            _cut(
                index,
                label_index,
                shape[0],
                width * dtype.itemsize,
                gz or (labels is not None and l_gz),
            )
        )
        rows += shape[0]
    assert kinds is not None
    return files, shards, rows, kinds


def _cut(file: int, labels: int, count: int, record_bytes: int, gz: bool) -> list[Shard]:
    """Runs of whole records of about :data:`SHARD_BYTES` (:data:`GZ_SHARD_BYTES` when
    gzipped: such a shard decompresses the file from its start and skips what lies before)."""
    if count == 0:
        return [Shard(file=file, first=0, count=0, labels=labels, nbytes=0)]
    per = max(1, (GZ_SHARD_BYTES if gz else SHARD_BYTES) // max(1, record_bytes))
    return [
        Shard(
            file=file,
            first=start,
            count=min(per, count - start),
            labels=labels,
            nbytes=min(per, count - start) * record_bytes,
        )
        for start in range(0, count, per)
    ]


# ---------------------------------------------------------------------- executor


def _records(pieces: Iterable[bytes], record_bytes: int, block: int, where: str) -> Iterator[bytes]:
    """Whole runs of up to ``block`` records of ``record_bytes`` each, from a byte stream."""
    buf = bytearray()
    want = record_bytes * block
    for piece in pieces:
        buf += piece
        while len(buf) >= want:
            yield bytes(buf[:want])
            del buf[:want]
    if len(buf) % record_bytes:
        raise ConfigurationError(
            f"idx file {where} ends inside a record ({len(buf) % record_bytes} bytes left over)"
        )
    if buf:
        yield bytes(buf)


def _range(
    storage: Storage,
    path: str,
    size: int,
    gz: bool,
    header: int,
    first: int,
    count: int,
    record_bytes: int,
    where: str,
) -> Iterator[bytes]:
    """The bytes of records ``[first, first + count)``: a byte range of a raw file, or the
    decompressed stream of a gzipped one with what lies outside cut off."""
    start, length = header + first * record_bytes, count * record_bytes
    if not gz:
        return stream(storage, path, start, length)
    return _skip(gunzip(stream(storage, path, 0, size), f"idx file {where}"), start, length)


def _skip(pieces: Iterable[bytes], start: int, length: int) -> Iterator[bytes]:
    position = 0
    for piece in pieces:
        lo, hi = max(start - position, 0), min(start + length - position, len(piece))
        if lo < hi:
            yield piece[lo:hi]
        position += len(piece)
        if position >= start + length:
            return


def _file_records(
    storage: Storage, path: str, spec: ReadSpec, file: int, shard: Shard
) -> tuple[np.dtype, int, Iterator[bytes]]:
    """``(dtype, values per record, runs of records)`` of file ``file``'s part of ``shard``:
    its header read again on the executor, then its records streamed ``spec.block_rows`` at a
    time."""
    location, gz, size = spec.files[file], spec.gzip[file], spec.sizes[file]
    dtype, shape, header = _head(storage, path, size, gz, location)
    width = math.prod(shape[1:])
    record_bytes = width * dtype.itemsize
    pieces = _range(
        storage, path, size, gz, header, shard.first, shard.count, record_bytes, location
    )
    return dtype, width, _records(pieces, record_bytes, spec.block_rows, location)


def read_shard(
    spec: ReadSpec, open_file: Storage, path: str, shard: Shard, labels: tuple[Storage, str] | None
) -> Iterator[RawChunk]:
    """The records of one shard, ``spec.block_rows`` at a time (executor).

    ``open_file``/``path`` reach the features file; ``labels`` the labels file, when read.
    """
    location = spec.files[shard.file]
    dtype, width, x_stream = _file_records(open_file, path, spec, shard.file, shard)
    y_stream: Iterator[bytes] | None = None
    l_dtype, l_width = dtype, 0
    if labels is not None and spec.wants_label:
        l_dtype, l_width, y_stream = _file_records(labels[0], labels[1], spec, shard.labels, shard)
    first = shard.first
    for xs in x_stream:
        x = np.frombuffer(xs, dtype).reshape(-1, width)
        y = None
        if y_stream is not None:
            ys = next(y_stream, None)
            if ys is None:
                raise ConfigurationError(
                    f"idx labels file {spec.files[shard.labels]} ends before its images file "
                    f"{location}"
                )
            y = np.frombuffer(ys, l_dtype).reshape(-1, l_width)
        yield RawChunk(
            x.astype(dtype.newbyteorder("="), copy=False),
            None if y is None else y.astype(l_dtype.newbyteorder("="), copy=False),
            f"idx file {location}",
            f"record {first}",
        )
        first += len(x)
