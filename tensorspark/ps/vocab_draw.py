"""The initial values of a dynamic table's fresh rows, drawn from a seed the server and
its workers share, so that a ``/vocab`` answer need not carry them.

A row given to a new id is reset to a draw of the layer's initializer. The draw is a
function of ``(table seed, id, row)`` alone (counter-based: each value comes from a hash of
those and its position, never from a generator's running state), so the server and every
worker compute the same float32 bits without sending them (:mod:`~.vocab_route`). The
same id given the same row again starts from the same values (still a reset: what it
trained before is gone); another id, or another row, draws others.

Bit-identical wherever it runs: only integer hashing (``uint64``, wrapping) and float64
``+ - * /``, ``sqrt`` and ``frexp``, which IEEE 754 rounds exactly, so no SIMD path or
libm changes a bit; the logarithm the normal draws need is computed here from those (a
series), not by ``np.log``. Pure numpy, on the server (driver) and the worker alike.

The distributions, as the Keras initializers give them:

* ``uniform``: ``low + (high - low) * u``, ``u`` uniform on [0, 1) with 53 bits;
* ``normal``: ``mean + stddev * z``, ``z`` standard normal by Marsaglia's polar method
  (a pair of uniforms in the unit disc; a pair outside is drawn again, with the next
  counters);
* ``normal`` with ``truncated``: the same, drawn again while ``|z| > 2`` (as Keras's
  ``TruncatedNormal``);
* ``zeros``: zeros.

A value still rejected after :data:`TRIES` draws (odds below 1e-23 per value) takes the
mean.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

import numpy as np

#: Draws per value before the normal kinds give up and take the mean.
TRIES = 40
_U64 = np.uint64
_GOLDEN = _U64(0x9E3779B97F4A7C15)
_STEP = _U64(0xD1B54A32D192ED03)
_M1 = _U64(0xBF58476D1CE4E5B9)
_M2 = _U64(0x94D049BB133111EB)
_LN2 = 0.6931471805599453
_SQRT_HALF = 0.7071067811865476
#: ``1 / (2k + 1)``, k = 0..14: the series of ``atanh`` (``ln m = 2 atanh((m-1)/(m+1))``).
_ODD = tuple(1.0 / (2 * k + 1) for k in range(15))


def new_seed() -> int:
    """A table seed when the initializer names none (63 bits, from the OS)."""
    return secrets.randbits(63)


def seed_of(init: Mapping[str, Any]) -> int | None:
    """The seed an initializer spec names (an int >= 0), or None."""
    seed = init.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        return None
    return seed % (1 << 63)


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer, elementwise on ``uint64`` (wrapping): also the stable hash
    that routes an id to its shard (:mod:`~.vocab_shards`)."""
    x = x ^ (x >> _U64(30))
    x = x * _M1
    x = x ^ (x >> _U64(27))
    x = x * _M2
    return x ^ (x >> _U64(31))


def _uniforms(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """float64 on [0, 1): one per ``(key, counter)`` pair (broadcast), 53 bits each."""
    bits = mix64(keys + (counters + _U64(1)) * _STEP)
    return (bits >> _U64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _log(s: np.ndarray) -> np.ndarray:
    """``ln s`` for ``s > 0``, from ``frexp`` and a series (exactly rounded operations
    only, so it is the same bits on every machine; accurate to about 1e-16)."""
    m, e = np.frexp(s)
    low = m < _SQRT_HALF
    m = np.where(low, m * 2.0, m)  # m in [sqrt(1/2), sqrt(2))
    e = (e - low).astype(np.float64)
    t = (m - 1.0) / (m + 1.0)
    t2 = t * t
    acc = np.full_like(t, _ODD[-1])
    for c in reversed(_ODD[:-1]):
        acc = acc * t2 + c
    return e * _LN2 + 2.0 * t * acc


def _normal(keys: np.ndarray, width: int, truncated: bool) -> np.ndarray:
    """Standard normal float64 ``[n, width]`` (the polar method; see the module)."""
    n = keys.size
    out = np.zeros((n, width), np.float64)
    todo = np.ones((n, width), bool)
    position = np.arange(width, dtype=np.uint64)[None, :]
    for k in range(TRIES):
        rows, cols = np.nonzero(todo)
        if rows.size == 0:
            break
        first = _U64(2 * k * width) + _U64(2) * position[0, cols]
        x = 2.0 * _uniforms(keys[rows], first) - 1.0
        y = 2.0 * _uniforms(keys[rows], first + _U64(1)) - 1.0
        s = x * x + y * y
        ok = (s > 0.0) & (s < 1.0)
        z = np.zeros_like(s)
        z[ok] = x[ok] * np.sqrt(-2.0 * _log(s[ok]) / s[ok])
        if truncated:
            ok &= np.abs(z) <= 2.0
        out[rows[ok], cols[ok]] = z[ok]
        todo[rows[ok], cols[ok]] = False
    return out


def draw_rows(
    init: Mapping[str, Any], seed: int, ids: np.ndarray, rows: np.ndarray, tail: tuple[int, ...]
) -> np.ndarray:
    """float32 ``[n, *tail]``: the initial values of rows ``rows`` given to ids ``ids``
    (int64, ``n`` each) of a table seeded ``seed``, under initializer spec ``init``
    (``{"kind": "uniform", "low", "high"}``, ``{"kind": "normal", "mean", "stddev",
    "truncated"}`` or ``{"kind": "zeros"}``: see the module)."""
    ids = np.ascontiguousarray(ids, np.int64).reshape(-1)
    rows = np.ascontiguousarray(rows, np.int64).reshape(-1)
    if ids.size != rows.size:
        raise ValueError(f"ids and rows disagree in count. Received: {ids.size} and {rows.size}")
    width = int(np.prod(tail, dtype=np.int64)) if tail else 1
    kind = init.get("kind", "zeros")
    if kind == "zeros" or ids.size == 0:
        return np.zeros((ids.size, *tail), np.float32)
    with np.errstate(over="ignore"):
        keys = mix64(_U64(seed % (1 << 64)) + mix64(ids.view(np.uint64) + _GOLDEN))
        keys = mix64(keys + (rows.view(np.uint64) + _U64(1)) * _GOLDEN)
        if kind == "uniform":
            u = _uniforms(keys[:, None], np.arange(width, dtype=np.uint64)[None, :])
            low, high = float(init["low"]), float(init["high"])
            values = low + (high - low) * u
        elif kind == "normal":
            z = _normal(keys, width, bool(init.get("truncated")))
            values = float(init["mean"]) + float(init["stddev"]) * z
        else:
            raise ValueError(
                f"an initializer spec of kind 'uniform', 'normal' or 'zeros'. Received: {kind!r}"
            )
    return values.astype(np.float32).reshape((ids.size, *tail))
