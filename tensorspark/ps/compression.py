"""Compressed updates: the numbers behind ``compression=`` (bf16, fp16, int8 with error feedback).

Pushes carry each float32 delta in a smaller format; pulls carry the float32 weights in
the same format; the server keeps float32 master weights and adds each decoded delta to
them. What travels is a :class:`~tensorspark.wire.Encoded` (laid out by
:mod:`tensorspark.wire`):

* ``bf16``: the upper 16 bits of each float32, rounded to nearest even (8 bits of
  mantissa, the full float32 range); 2 bytes per number.
* ``fp16``: IEEE half precision (11 bits of mantissa, at most 65504); 2 bytes. numpy
  converts float32 to float16 about 8x slower than the bit operations of bf16 on this
  machine, and large values overflow, so bf16 is the better choice for most models.
* ``int8``: per block of ``block`` numbers (default 256), a float32 scale ``max|x| / 127``
  and codes ``round(x / scale)``; about 1.016 bytes per number.

**Error feedback** (the worker, :class:`ErrorFeedback`): what rounding takes from a delta is
kept and added to the next delta before it is rounded, so nothing is lost over time: the
sum of what the server received equals the sum of the true deltas up to one rounding
error. Pulls need none: the worker trains from the rounded weights and pushes its delta
relative to them, and the server's float32 weights are never rounded.

**NaN/Inf**: the encoders keep non-finite values non-finite (a bf16 NaN stays NaN; an int8
block holding one gets a non-finite scale), so :func:`is_finite` on the codes finds what
``np.isfinite`` finds on the delta and the server refuses the push as before.

Every loop here walks the arrays in chunks of :data:`CHUNK` numbers, so the temporaries
stay in the CPU cache and each array is read or written about once: on this machine that
is 2-3x faster than whole-array numpy expressions (``bench/ps_throughput.py``).

Pure functions and small objects; thread-safe except :class:`ErrorFeedback` and
:class:`EncodeBuffers` (one owner each).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark import wire
from tensorspark.errors import ConfigurationError
from tensorspark.ps.validation import all_finite

CODECS = tuple(wire.CODECS)
DEFAULT_BLOCK = 256
#: Numbers per step of the chunked loops (1 MB of float32: its temporaries stay in cache;
#: measured faster here than 256 KB steps, whose per-step overhead shows on large models).
CHUNK = 1 << 18
#: Largest int8 block (a power of two; layouts of sharded servers split tensors on blocks).
MAX_BLOCK = 1 << 16
_F32 = np.dtype("float32")
_TINY = np.float32(1e-30)  # int8 blocks whose largest magnitude is below this are sent as zeros


@dataclass(frozen=True)
class Compression:
    """What crosses the network compressed (``compression=`` of :class:`~tensorspark.SparkSession`).

    Args:
        push: codec of the pushed deltas (``"bf16"``, ``"fp16"``, ``"int8"``) or None.
        pull: codec of the pulled weights, or None for float32.
        block: int8 numbers per scale.

    A string ``"int8"`` means ``Compression("int8", "int8")``; only float32 tensors are
    compressed (others travel as they are).
    """

    push: str | None = None
    pull: str | None = None
    block: int = DEFAULT_BLOCK

    def __post_init__(self) -> None:
        for name in ("push", "pull"):
            value = getattr(self, name)
            if value is not None and value not in CODECS:
                raise ConfigurationError(
                    f"compression {name} codec must be one of {CODECS} or None. Received: "
                    f"{name}={value!r}"
                )
        if (
            isinstance(self.block, bool)
            or not isinstance(self.block, int)
            or not 8 <= self.block <= MAX_BLOCK
            or self.block & (self.block - 1)
        ):
            raise ConfigurationError(
                f"compression block must be a power of two from 8 to {MAX_BLOCK} (blocks then "
                f"never straddle two shards). Received: block={self.block!r}"
            )

    @property
    def name(self) -> str:
        """``"int8"`` when both directions use the same codec, else ``"push=int8,pull=none"``."""
        if self.push == self.pull:
            return str(self.push)
        return f"push={self.push or 'none'},pull={self.pull or 'none'}"

    def to_json(self) -> dict[str, Any]:
        return {"push": self.push, "pull": self.pull, "block": self.block}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Compression:
        """Rebuild from :meth:`to_json` (e.g. a server's ``/join`` answer)."""
        return cls(obj.get("push"), obj.get("pull"), int(obj.get("block", DEFAULT_BLOCK)))


def get_compression(value: Compression | str | None) -> Compression | None:
    """Resolve ``compression=``: None (or ``"none"``), a codec name, or a :class:`Compression`.

    Raises:
        ConfigurationError: an unknown name, naming the allowed ones.
    """
    if value is None or isinstance(value, Compression):
        return None if value is not None and value.push is None and value.pull is None else value
    if isinstance(value, str):
        name = value.strip().lower()
        if name in ("", "none"):
            return None
        if name in CODECS:
            return Compression(name, name)
    raise ConfigurationError(
        f"compression must be None, one of {CODECS} or a tensorspark.ps.Compression. Received: "
        f"compression={value!r}"
    )


# ---------------------------------------------------------------------- chunked loops


def _chunk(codec: str, block: int) -> int:
    """Numbers per step; int8 steps are whole blocks."""
    return max(block, CHUNK - CHUNK % block) if codec == "int8" else CHUNK


def _spans(count: int, step: int) -> Iterator[tuple[int, int]]:
    for start in range(0, count, step):
        yield start, min(count, start + step)


def _int8_rows(x: np.ndarray, codes: np.ndarray, scales: np.ndarray, tmp: np.ndarray) -> None:
    """Quantize ``x`` (rows of one block each) into ``codes`` and ``scales``."""
    scaled = tmp[: x.size].reshape(x.shape)
    np.abs(x, out=scaled)
    top = scaled.max(axis=1)  # NaN and Inf carry through
    np.multiply(top, np.float32(1 / 127), out=scales)
    inv = np.zeros_like(top)
    np.divide(np.float32(127), top, out=inv, where=top >= _TINY)
    np.multiply(x, inv[:, None], out=scaled)
    np.rint(scaled, out=scaled)
    np.copyto(codes, scaled, casting="unsafe")


def _encode_span(
    codec: str,
    x: np.ndarray,
    codes: np.ndarray,
    scales: np.ndarray | None,
    block: int,
    tmp: np.ndarray,
) -> None:
    """Encode the flat float32 ``x`` into ``codes`` (and, int8, ``scales``): one chunk."""
    if codec == "bf16":
        bits = x.view(np.uint32)
        t = tmp[: x.size].view(np.uint32)
        np.right_shift(bits, 16, out=t)
        np.bitwise_and(t, 1, out=t)
        t += 0x7FFF
        t += bits
        np.right_shift(t, 16, out=codes, casting="unsafe")
        if not np.isfinite(x).all():  # rounding may carry a NaN's bits into Inf or -0
            bad = ~np.isfinite(x)
            codes[bad] = np.where(np.isnan(x[bad]), 0x7FC0, (bits[bad] >> 16)).astype(np.uint16)
    elif codec == "fp16":
        np.copyto(codes, x, casting="same_kind")
    else:
        assert scales is not None
        full = x.size // block
        if full:
            _int8_rows(
                x[: full * block].reshape(full, block),
                codes[: full * block].reshape(full, block),
                scales[:full],
                tmp,
            )
        if x.size > full * block:
            _int8_rows(
                x[full * block :].reshape(1, -1),
                codes[full * block :].reshape(1, -1),
                scales[full : full + 1],
                tmp,
            )


def _decode_span(enc: wire.Encoded, lo: int, hi: int, out: np.ndarray) -> None:
    """Decode numbers ``lo:hi`` of ``enc`` into the float32 ``out`` (``hi - lo`` long)."""
    codes = enc.codes[lo:hi]
    if enc.codec == "bf16":
        np.left_shift(codes, 16, out=out.view(np.uint32), dtype=np.uint32)
    elif enc.codec == "fp16":
        np.copyto(out, codes)
    else:
        assert enc.scales is not None
        block = enc.block
        first = lo // block
        full = (hi - lo) // block
        np.copyto(out, codes)  # int8 to float32, then scaled: faster than one mixed-type multiply
        if full:
            rows = out[: full * block].reshape(full, block)
            rows *= enc.scales[first : first + full, None]
        if hi - lo > full * block:
            out[full * block :] *= enc.scales[first + full]


def encode(
    codec: str, arr: np.ndarray, block: int = DEFAULT_BLOCK, into: wire.Encoded | None = None
) -> wire.Encoded:
    """``arr`` (float32) compressed with ``codec``; written into ``into``'s buffers when given.

    Thread-safe (a fresh temporary per call).
    """
    flat = np.ascontiguousarray(arr, dtype=_F32).reshape(-1)
    enc = into if into is not None else empty(codec, arr.shape, block)
    tmp = np.empty(_chunk(codec, block), _F32)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for lo, hi in _spans(flat.size, _chunk(codec, block)):
            scales = None if enc.scales is None else enc.scales[lo // block : -(-hi // block)]
            _encode_span(codec, flat[lo:hi], enc.codes[lo:hi], scales, block, tmp)
    return enc


def empty(codec: str, shape: tuple[int, ...], block: int = DEFAULT_BLOCK) -> wire.Encoded:
    """An :class:`~tensorspark.wire.Encoded` with fresh, unset buffers."""
    count = int(np.prod(shape, dtype=np.int64))
    codes = np.empty(count, wire.CODECS[codec])
    if codec == "int8":
        return wire.Encoded(
            codec, tuple(shape), codes, np.empty(wire.blocks(count, block), _F32), block
        )
    return wire.Encoded(codec, tuple(shape), codes)


def decode(enc: wire.Encoded, out: np.ndarray | None = None) -> np.ndarray:
    """The float32 array ``enc`` stands for (into ``out`` when given). Thread-safe."""
    result = np.empty(enc.shape, _F32) if out is None else out
    flat = result.reshape(-1)
    for lo, hi in _spans(enc.size, _chunk(enc.codec, max(1, enc.block))):
        _decode_span(enc, lo, hi, flat[lo:hi])
    return result


def add_scaled(base: np.ndarray, pushed: wire.Tensor, scale: float, out: np.ndarray) -> np.ndarray:
    """``out = base + scale * pushed`` for a plain or compressed ``pushed`` (float32).

    ``out`` may be ``base`` (in place). Chunked: one read of each input, one write.
    """
    if not isinstance(pushed, wire.Encoded):
        if scale == 1.0:
            return np.add(base, pushed, out=out)
        if not (base.flags.c_contiguous and out.flags.c_contiguous and pushed.flags.c_contiguous):
            np.multiply(pushed, scale, out=out, casting="unsafe")
            out += base
            return out
        b, p, o = base.reshape(-1), pushed.reshape(-1), out.reshape(-1)
        tmp = np.empty(min(CHUNK, b.size), out.dtype)
        for lo, hi in _spans(b.size, CHUNK):  # the scaled delta stays in cache: one pass, not two
            t = tmp[: hi - lo]
            np.multiply(p[lo:hi], scale, out=t, casting="unsafe")
            np.add(b[lo:hi], t, out=o[lo:hi])
        return out
    step = _chunk(pushed.codec, max(1, pushed.block))
    tmp = np.empty(step, _F32)
    b, o = base.reshape(-1), out.reshape(-1)
    for lo, hi in _spans(pushed.size, step):
        t = tmp[: hi - lo]
        _decode_span(pushed, lo, hi, t)
        if scale != 1.0:
            t *= np.float32(scale)
        np.add(b[lo:hi], t, out=o[lo:hi])
    return out


def copy_tensor(value: wire.Tensor) -> wire.Tensor:
    """A copy of a plain or compressed tensor that owns its memory."""
    if isinstance(value, wire.Encoded):
        scales = None if value.scales is None else value.scales.copy()
        return wire.Encoded(value.codec, value.shape, value.codes.copy(), scales, value.block)
    return np.array(value, copy=True)


def as_array(value: wire.Tensor) -> np.ndarray:
    """A plain array for ``value`` (decoded when compressed)."""
    return decode(value) if isinstance(value, wire.Encoded) else value


def is_finite(value: wire.Tensor) -> bool:
    """Whether a plain float array or compressed tensor holds no NaN/Inf (chunked)."""
    if isinstance(value, wire.Encoded):
        if value.codec == "int8":
            assert value.scales is not None
            return bool(np.isfinite(value.scales).all())
        mask = 0x7F80 if value.codec == "bf16" else 0x7C00
        bits = value.codes.view(np.uint16)
        tmp = np.empty(CHUNK, np.uint16)
        for lo, hi in _spans(bits.size, CHUNK):
            t = tmp[: hi - lo]
            np.bitwise_and(bits[lo:hi], mask, out=t)
            if (t == mask).any():
                return False
        return True
    return value.dtype.kind != "f" or all_finite(value)


def compressible(arr: np.ndarray) -> bool:
    """Whether a tensor is compressed (float32 with at least one number)."""
    return arr.dtype == _F32 and arr.size > 0


# ---------------------------------------------------------------------- worker and server state


class ErrorFeedback:
    """A worker's compressor of deltas, which keeps what rounding took (executor side).

    Args:
        codec: the push codec.
        block: int8 numbers per scale.

    Not thread-safe: one per training loop. :meth:`encode`'s result shares buffers with
    the next call's; send it before calling again.
    """

    def __init__(self, codec: str, block: int = DEFAULT_BLOCK) -> None:
        self.codec = codec
        self.block = block
        self._residual: dict[str, np.ndarray] = {}
        self._out: dict[str, wire.Encoded] = {}
        self._tmp = np.empty(_chunk(codec, block), _F32)
        self._acc = np.empty(_chunk(codec, block), _F32)

    def encode(self, delta: Mapping[str, np.ndarray]) -> dict[str, wire.Tensor]:
        """The compressed ``delta + residual``; the new residual is kept for next time."""
        out: dict[str, wire.Tensor] = {}
        for name, value in delta.items():
            arr = np.asarray(value)
            if not compressible(arr):
                out[name] = arr
                continue
            out[name] = self._encode_one(name, arr)
        return out

    def _encode_one(self, name: str, arr: np.ndarray) -> wire.Encoded:
        residual = self._residual.get(name)
        if residual is None or residual.shape != arr.shape:
            residual = self._residual[name] = np.zeros(arr.shape, _F32)
        enc = self._out.get(name)
        if enc is None or enc.shape != arr.shape:
            enc = self._out[name] = empty(self.codec, arr.shape, self.block)
        flat, res = np.ascontiguousarray(arr).reshape(-1), residual.reshape(-1)
        block = self.block
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            for lo, hi in _spans(flat.size, _chunk(self.codec, block)):
                acc, back = self._acc[: hi - lo], self._tmp[: hi - lo]
                np.add(flat[lo:hi], res[lo:hi], out=acc)
                scales = None if enc.scales is None else enc.scales[lo // block : -(-hi // block)]
                _encode_span(self.codec, acc, enc.codes[lo:hi], scales, block, back)
                _decode_span(enc, lo, hi, back)
                np.subtract(acc, back, out=res[lo:hi])
        return enc

    def reset(self) -> None:
        """Forget the residual (after the server refused a non-finite update)."""
        for residual in self._residual.values():
            residual.fill(0.0)

    def residual_norm(self) -> float:
        """The L2 norm of what has not been sent yet (for tests and diagnostics)."""
        return float(
            np.sqrt(
                sum(float(np.dot(r.reshape(-1), r.reshape(-1))) for r in self._residual.values())
            )
        )


class EncodeBuffers:
    """Compressed copies of the server's weights, one per version, with recycled buffers.

    The server answers every request of one version from the same compressed copy (a
    sync round's answers, duplicates, pulls), and reuses a copy's buffers once no response
    is still being written from them. Belongs to the server's loop thread; no locks.
    """

    def __init__(self, compression: Compression) -> None:
        assert compression.pull is not None
        self.codec: str = compression.pull
        self.block = compression.block
        self._key: object = None
        self._current: dict[str, wire.Tensor] | None = None
        self._inflight: dict[int, int] = {}
        self._spare: list[dict[str, wire.Tensor]] = []

    def get(
        self, key: object, params: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, wire.Tensor], Any]:
        """The compressed ``params`` for ``key`` (e.g. the version), and a ``release``
        callback to call once the response written from them has left."""
        if self._current is None or key != self._key:
            old = self._current
            self._current = self._fill(params, self._take_spare(params))
            self._key = key
            if old is not None and self._inflight.get(id(old), 0) == 0:
                self._spare.append(old)
        current = self._current
        ident = id(current)
        self._inflight[ident] = self._inflight.get(ident, 0) + 1
        return current, lambda: self._release(ident, current)

    def _release(self, ident: int, encoded: dict[str, wire.Tensor]) -> None:
        left = self._inflight.get(ident, 0) - 1
        if left > 0:
            self._inflight[ident] = left
            return
        self._inflight.pop(ident, None)
        if encoded is not self._current:
            self._spare.append(encoded)
            del self._spare[:-2]

    def _take_spare(self, params: Mapping[str, np.ndarray]) -> dict[str, wire.Tensor] | None:
        while self._spare:
            spare = self._spare.pop()
            if spare.keys() == params.keys() and all(
                getattr(spare[k], "shape", None) == params[k].shape for k in params
            ):
                return spare
        return None

    def _fill(
        self, params: Mapping[str, np.ndarray], spare: dict[str, wire.Tensor] | None
    ) -> dict[str, wire.Tensor]:
        out: dict[str, wire.Tensor] = {}
        for name, arr in params.items():
            if not compressible(arr):
                out[name] = arr
                continue
            into = spare.get(name) if spare is not None else None
            out[name] = encode(
                self.codec, arr, self.block, into if isinstance(into, wire.Encoded) else None
            )
        return out
