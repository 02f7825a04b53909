"""``tf.train.Example``, the records of TFRecord files, without importing TensorFlow.

Decoding uses protobuf's own (C) parser through message classes built here from the same
schema as TensorFlow's ``example.proto`` and ``feature.proto`` (same field numbers and
types, so the same bytes), in a private descriptor pool under the package name
``tensorspark.example``: it never collides with TensorFlow's classes when both are loaded.
Encoding writes the bytes directly (:func:`encode_example`): a fixed, tiny layout, several
times faster than filling messages, and read back by TensorFlow's own parser in the tests.

Runs anywhere; pure functions (the message class is built once per process and never
changes: :func:`example_class`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from tensorspark.errors import ConfigurationError

#: Feature kinds, as named in ``tf.train.Feature``'s ``oneof kind``.
KINDS = ("bytes_list", "float_list", "int64_list")


@functools.lru_cache(maxsize=1)
def example_class() -> Any:
    """The ``Example`` message class (schema of TensorFlow's ``tf.train.Example``)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    package = "tensorspark.example"
    proto = descriptor_pb2.FileDescriptorProto(
        name="tensorspark/example.proto", package=package, syntax="proto3"
    )
    for name, kind in (
        ("BytesList", field.TYPE_BYTES),
        ("FloatList", field.TYPE_FLOAT),
        ("Int64List", field.TYPE_INT64),
    ):
        message = proto.message_type.add(name=name)
        message.field.add(name="value", number=1, type=kind, label=field.LABEL_REPEATED)

    def add_message_field(
        owner: Any,
        name: str,
        number: int,
        message: str,
        label: int = field.LABEL_OPTIONAL,
        **extra: int,
    ) -> None:
        """Field ``number`` of ``owner``, named ``name``, holding the message ``message``."""
        owner.field.add(
            name=name,
            number=number,
            type=field.TYPE_MESSAGE,
            type_name=f".{package}.{message}",
            label=label,
            **extra,
        )

    feature = proto.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, (name, message) in enumerate(
        zip(KINDS, ("BytesList", "FloatList", "Int64List")), start=1
    ):
        add_message_field(feature, name, number, message, oneof_index=0)
    features = proto.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    add_message_field(entry, "value", 2, "Feature")
    add_message_field(features, "feature", 1, "Features.FeatureEntry", field.LABEL_REPEATED)
    example = proto.message_type.add(name="Example")
    add_message_field(example, "features", 1, "Features")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Example"))


# ---------------------------------------------------------------------- encoding


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1  # negative int64s are ten bytes of two's complement
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def delimited(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def varints(values: np.ndarray) -> tuple[bytes, np.ndarray]:
    """int64 ``values`` as protobuf varints, all at once: the bytes back to back and the
    ``len(values) + 1`` offsets where each value's bytes start (numpy, no per-value Python)."""
    v = np.ascontiguousarray(values, dtype=np.int64).reshape(-1).view(np.uint64)
    nbytes = np.ones(len(v), np.int64)
    for k in range(1, 10):
        nbytes += (v >> np.uint64(7 * k)) != 0
    offsets = np.zeros(len(v) + 1, np.int64)
    np.cumsum(nbytes, out=offsets[1:])
    out = np.zeros(int(offsets[-1]), np.uint8)
    for k in range(10):
        has = nbytes > k
        if not has.any():
            break
        byte = ((v[has] >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        more = (nbytes[has] > k + 1).astype(np.uint8) << 7
        out[offsets[:-1][has] + k] = byte | more
    return out.tobytes(), offsets


def encode_feature(kind: str, values: Any) -> bytes:
    """One ``tf.train.Feature`` of ``kind`` holding ``values`` (bytes items for
    ``bytes_list``, numbers otherwise), serialized."""
    if kind == "bytes_list":
        items = [values] if isinstance(values, (bytes, bytearray, memoryview)) else values
        inner = b"".join(delimited(1, bytes(v)) for v in items)
        return delimited(1, inner)
    if kind == "float_list":
        packed = np.ascontiguousarray(values, dtype="<f4").reshape(-1).tobytes()
        return delimited(2, delimited(1, packed) if packed else b"")
    if kind == "int64_list":
        packed, _ = varints(np.asarray(values, dtype=np.int64))
        return delimited(3, delimited(1, packed) if packed else b"")
    raise ConfigurationError(f"a feature's kind must be one of {KINDS}. Received: {kind!r}")


def encode_example(features: Iterable[tuple[str, bytes]]) -> bytes:
    """A serialized ``tf.train.Example`` from ``(name, encoded feature)`` pairs
    (:func:`encode_feature`), in the given order."""
    entries = b"".join(
        delimited(1, delimited(1, name.encode("utf-8")) + delimited(2, feature))
        for name, feature in features
    )
    return delimited(1, entries)


# ---------------------------------------------------------------------- decoding


def parse(record: bytes, where: str) -> Mapping[str, Any]:
    """The features of one serialized Example, by name (protobuf map of ``Feature``).

    Raises:
        ConfigurationError: the bytes are not an Example; ``where`` names the record.
    """
    from google.protobuf.message import DecodeError

    try:
        return example_class().FromString(record).features.feature  # type: ignore[no-any-return]
    except DecodeError as err:
        raise ConfigurationError(f"{where} is not a tf.train.Example ({err})") from None


def values(
    features: Mapping[str, Any], name: str, raw_dtype: np.dtype | None, where: str
) -> np.ndarray:
    """Feature ``name`` of a parsed Example as a flat numpy array.

    ``bytes_list`` features hold one item of raw bytes, read as ``raw_dtype`` (default
    ``uint8``); ``float_list`` gives float32, ``int64_list`` int64.

    Raises:
        ConfigurationError: the feature is missing, empty of kind, a ``bytes_list`` of
            several items, or ``raw_dtype`` was given for numbers.
    """
    if name not in features:
        raise ConfigurationError(
            f"{where} has no feature {name!r}; it has {sorted(features)}. Name the feature "
            "with features= / label="
        )
    feature = features[name]
    kind = feature.WhichOneof("kind")
    if kind == "bytes_list":
        items: Sequence[bytes] = feature.bytes_list.value
        if len(items) != 1:
            raise ConfigurationError(
                f"{where}: feature {name!r} is a bytes_list of {len(items)} items; raw-byte "
                "features must hold one item (the values' bytes, read as feature_dtype)"
            )
        dtype = raw_dtype if raw_dtype is not None else np.dtype(np.uint8)
        data = items[0]
        if len(data) % dtype.itemsize:
            raise ConfigurationError(
                f"{where}: feature {name!r} holds {len(data)} bytes, not a whole number of "
                f"{dtype.name} values ({dtype.itemsize} bytes each); check feature_dtype"
            )
        return np.frombuffer(data, dtype)
    if raw_dtype is not None:
        raise ConfigurationError(
            f"{where}: feature {name!r} is a {kind}; feature_dtype says how raw bytes (a "
            "bytes_list) are read, and numbers carry their own type. Received: "
            f"feature_dtype={raw_dtype.str!r}"
        )
    if kind == "float_list":
        return np.array(feature.float_list.value, dtype=np.float32)
    if kind == "int64_list":
        return np.array(feature.int64_list.value, dtype=np.int64)
    raise ConfigurationError(f"{where}: feature {name!r} holds no value (none of {KINDS} is set)")
