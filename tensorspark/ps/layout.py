"""How a model's tensors are dealt out to the shards of a sharded parameter server.

With ``ps_shards=N`` each of N server processes holds a slice of the model, balanced by
bytes: the tensors, in the model's order, are laid end to end and cut into N runs of
(nearly) equal bytes. A tensor that a cut falls inside is split there into flat pieces;
cuts fall on multiples of ``align`` numbers of that tensor (:data:`ALIGN`, or the int8
block when larger: a power of two, see :mod:`tensorspark.ps.compression`), so int8
blocks never straddle two shards, and tensors smaller than that are never split. Most
tensors stay whole; at most N - 1 are split.

On a shard, a whole tensor keeps its name and shape; a piece of one is a flat array named
``"<name>[<lo>:<hi>]"``. :meth:`Layout.split` cuts a worker's update into the shards'
parts (views, no copy, for plain and compressed tensors alike) and :meth:`Layout.assemble`
puts the shards' answers back together.

Embedding tables that sync row-sparse (``keep``) are cut by rows instead, and only when
a table is larger than a shard's share of the model: a cut that falls inside such a table
falls on a row boundary (a multiple of the rows that make ``align`` numbers whole), and
each shard then holds a block of whole rows, ``[lo:hi]`` of the table's rows, as a table
of its own named ``"<name>[rows <lo>:<hi>]"`` (shape ``[hi - lo, ...]``): it takes
row-sparse pushes of its rows with ids counted from ``lo``
(:class:`~tensorspark.ps.fanout.ShardedClient` routes each id to its block). A smaller
table stays whole on one shard.

Pure data; thread-safe. Travels to executors as JSON (:meth:`Layout.to_json`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark import wire
from tensorspark.errors import ConfigurationError

#: Split points fall on multiples of this many numbers of a tensor (at least).
ALIGN = 1 << 12


@dataclass(frozen=True)
class Piece:
    """A tensor, or the numbers ``lo:hi`` of it flattened, as one shard holds it."""

    name: str
    key: str
    lo: int
    hi: int
    whole: bool
    #: ``lo:hi`` are rows of a table (a block of whole rows), not flat numbers.
    rows: bool = False

    def numbers(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """The piece's ``lo:hi`` in the flattened tensor of ``shape``."""
        if not self.rows:
            return self.lo, self.hi
        row = int(np.prod(shape[1:], dtype=np.int64))
        return self.lo * row, self.hi * row


def rows_key(name: str, lo: int, hi: int) -> str:
    """The name a shard knows a table's block of rows ``lo:hi`` by."""
    return f"{name}[rows {lo}:{hi}]"


@dataclass(frozen=True)
class Layout:
    """Which shard holds which tensors (see the module docstring).

    Attributes:
        shapes: the model's tensors in order: ``(name, shape)``.
        shards: per shard, its pieces.
    """

    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    shards: tuple[tuple[Piece, ...], ...]

    @classmethod
    def plan(
        cls,
        params: Mapping[str, np.ndarray],
        n: int,
        align: int = ALIGN,
        keep: Sequence[str] = (),
    ) -> Layout:
        """Deal ``params`` out to ``n`` shards, balanced by bytes; split points fall on
        multiples of ``align`` numbers (a power of two, at least :data:`ALIGN`). The tensors
        named in ``keep`` (embedding tables that sync row-sparse) are never cut into flat
        pieces: one larger than a shard's share is cut between rows into blocks of whole
        rows, a smaller one goes whole to the shard its middle byte falls in.

        Raises:
            ConfigurationError: a shard would hold nothing (the model is too small to split
                that many ways), or a tensor name looks like a piece's.
        """
        arrays = {str(k): np.asarray(v) for k, v in params.items()}
        total = sum(a.nbytes for a in arrays.values())
        target = total / n if n else 0.0
        cuts = [k * target for k in range(1, n)]
        shards: list[list[Piece]] = [[] for _ in range(n)]
        offset = 0
        for name, arr in arrays.items():
            if name.endswith("]") and "[" in name:
                raise ConfigurationError(
                    "ps_shards>1 names split tensors '<name>[lo:hi]'; rename the parameter. "
                    f"Received: {name!r}"
                )
            size, item = arr.size, max(1, arr.itemsize)
            end = offset + arr.nbytes
            by_rows = name in keep
            if by_rows:  # cut between rows, on multiples of `step` rows, if at all
                row = int(np.prod(arr.shape[1:], dtype=np.int64)) if arr.ndim else 1
                size, item = (arr.shape[0] if arr.ndim else 1), max(1, arr.itemsize * row)
                step = align // math.gcd(align, max(1, row))
                if arr.ndim < 2 or arr.nbytes <= target:
                    step = size + 1  # a small table stays whole on one shard
            else:
                step = align
            points = [0]
            for cut in cuts:
                if offset < cut < end:
                    at = int(round((cut - offset) / item / step)) * step
                    if points[-1] < at < size:
                        points.append(at)
            points.append(size)
            for lo, hi in zip(points, points[1:], strict=False):
                middle = offset + (lo + hi) / 2 * item
                index = min(n - 1, int(middle // target)) if target else 0
                whole = lo == 0 and hi == size
                if whole:
                    shards[index].append(Piece(name, name, lo, hi, True))
                elif by_rows:
                    shards[index].append(Piece(name, rows_key(name, lo, hi), lo, hi, False, True))
                else:
                    shards[index].append(Piece(name, f"{name}[{lo}:{hi}]", lo, hi, False))
            offset = end
        empty = [i for i, pieces in enumerate(shards) if not pieces]
        if empty:
            raise ConfigurationError(
                f"ps_shards={n} leaves shards {empty} without parameters: the model ({total} bytes "
                f"in {len(arrays)} tensors) is too small to deal out that many ways (tensors under "
                f"{align} numbers are not split). Use fewer shards. Received: ps_shards={n}"
            )
        shapes = tuple((name, tuple(int(d) for d in arr.shape)) for name, arr in arrays.items())
        return cls(shapes, tuple(tuple(p) for p in shards))

    def holder(self, name: str) -> int | None:
        """The shard that holds ``name`` whole, or None (split, or not in the model)."""
        blocks = self.row_blocks(name)
        return blocks[0][0] if len(blocks) == 1 and blocks[0][1].whole else None

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of the model's tensor ``name``.

        Raises:
            KeyError: ``name`` is not in the model.
        """
        return self._shapes[name]

    @functools.cached_property
    def _shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self.shapes)

    def row_blocks(self, name: str) -> list[tuple[int, Piece]]:
        """Where the rows of table ``name`` are: ``(shard, piece)`` in row order, one whole
        piece or its blocks of rows; empty if it is not held by rows (cut into flat
        pieces, or not in the model)."""
        found = [(i, p) for i, pieces in enumerate(self.shards) for p in pieces if p.name == name]
        if not found or not all(p.whole or p.rows for _, p in found):
            return []
        return sorted(found, key=lambda ip: ip[1].lo)

    # ------------------------------------------------------------------ moving tensors

    def split(self, tensors: Mapping[str, wire.Tensor]) -> list[dict[str, wire.Tensor]]:
        """Cut a full update (or parameter set) into the shards' parts: views, no copies.

        Tensors missing from ``tensors`` are left out of the parts.
        """
        out: list[dict[str, wire.Tensor]] = []
        for pieces in self.shards:
            part: dict[str, wire.Tensor] = {}
            for piece in pieces:
                value = tensors.get(piece.name)
                if value is None:
                    continue
                if piece.whole:
                    part[piece.key] = value
                elif piece.rows:
                    part[piece.key] = _row_slice(value, piece.lo, piece.hi)
                else:
                    part[piece.key] = _slice(value, piece.lo, piece.hi)
            out.append(part)
        return out

    def assemble(
        self, parts: Sequence[Mapping[str, np.ndarray]], into: dict[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """The full tensors from the shards' parts. A whole tensor is the shard's array
        itself; a split one is copied into ``into[name]`` (reused when its shape fits)."""
        out: dict[str, np.ndarray] = {}
        spare = into if into is not None else {}
        pieces_of: dict[str, list[tuple[Piece, np.ndarray]]] = {}
        for pieces, part in zip(self.shards, parts, strict=True):
            for piece in pieces:
                if piece.key in part:
                    pieces_of.setdefault(piece.name, []).append((piece, part[piece.key]))
        for name, shape in self.shapes:
            found = pieces_of.get(name)
            if found is None:  # a row-sparse table: its rows travel beside the layout
                continue
            if len(found) == 1 and found[0][0].whole:
                out[name] = found[0][1]
                continue
            dtype = found[0][1].dtype
            full = spare.get(name)
            if full is None or full.shape != shape or full.dtype != dtype:
                full = spare[name] = np.empty(shape, dtype)
            flat = full.reshape(-1)
            for piece, arr in found:
                lo, hi = piece.numbers(shape)
                flat[lo:hi] = arr.reshape(-1)
            out[name] = full
        return out

    # ------------------------------------------------------------------ travelling

    def to_json(self) -> dict[str, Any]:
        return {
            "shapes": [[name, list(shape)] for name, shape in self.shapes],
            "shards": [
                [[p.name, p.lo, p.hi, p.whole, p.rows] for p in pieces] for pieces in self.shards
            ],
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Layout:
        shapes = tuple((str(name), tuple(int(d) for d in shape)) for name, shape in obj["shapes"])

        def piece(name: str, lo: int, hi: int, whole: bool, rows: bool = False) -> Piece:
            if whole:
                key = str(name)
            elif rows:
                key = rows_key(str(name), int(lo), int(hi))
            else:
                key = f"{name}[{lo}:{hi}]"
            return Piece(str(name), key, int(lo), int(hi), bool(whole), bool(rows))

        shards = tuple(tuple(piece(*p) for p in pieces) for pieces in obj["shards"])
        return cls(shapes, shards)


def take_rows(value: wire.Tensor, index: np.ndarray) -> wire.Tensor:
    """The rows at ``index`` of a plain or compressed ``[k, ...]`` block of rows (int8:
    one scale per row, as :func:`tensorspark.ps.rows.encode_rows` makes them)."""
    if not isinstance(value, wire.Encoded):
        return np.asarray(value)[index]
    k = int(value.shape[0]) if value.shape else 0
    row = int(np.prod(value.shape[1:], dtype=np.int64))
    codes = value.codes.reshape(k, row)[index].reshape(-1)
    scales = value.scales
    if scales is not None:
        assert value.block == row and scales.size == k, "int8 rows carry one scale per row"
        scales = scales[index]
    return wire.Encoded(value.codec, (len(index), *value.shape[1:]), codes, scales, value.block)


def _row_slice(value: wire.Tensor, lo: int, hi: int) -> wire.Tensor:
    """Rows ``lo:hi`` of a plain or compressed table (a view), shaped ``[hi - lo, ...]``."""
    if isinstance(value, wire.Encoded):
        row = int(np.prod(value.shape[1:], dtype=np.int64))
        flat = _slice(value, lo * row, hi * row)
        assert isinstance(flat, wire.Encoded)
        return wire.Encoded(flat.codec, (hi - lo, *value.shape[1:]), flat.codes, flat.scales,
                            flat.block)  # fmt: skip
    return np.asarray(value)[lo:hi]


def _slice(value: wire.Tensor, lo: int, hi: int) -> wire.Tensor:
    """Numbers ``lo:hi`` of a flattened plain or compressed tensor (a view)."""
    if isinstance(value, wire.Encoded):
        scales = value.scales
        if scales is not None:
            assert lo % value.block == 0, "pieces start on a block boundary (Layout.plan's align)"
            scales = scales[lo // value.block : -(-hi // value.block)]
        return wire.Encoded(value.codec, (hi - lo,), value.codes[lo:hi], scales, value.block)
    return np.asarray(value).reshape(-1)[lo:hi]
