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

Pure data; thread-safe. Travels to executors as JSON (:meth:`Layout.to_json`).
"""

from __future__ import annotations

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
        named in ``keep`` (embedding tables that sync row-sparse) are never split: each
        goes whole to the shard its middle byte falls in.

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
            points = [0]
            for cut in cuts if name not in keep else ():
                if offset < cut < end:
                    at = int(round((cut - offset) / item / align)) * align
                    if points[-1] < at < size:
                        points.append(at)
            points.append(size)
            for lo, hi in zip(points, points[1:], strict=False):
                middle = offset + (lo + hi) / 2 * item
                index = min(n - 1, int(middle // target)) if target else 0
                whole = lo == 0 and hi == size
                key = name if whole else f"{name}[{lo}:{hi}]"
                shards[index].append(Piece(name, key, lo, hi, whole))
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
        for index, pieces in enumerate(self.shards):
            for piece in pieces:
                if piece.name == name:
                    return index if piece.whole else None
        return None

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
                part[piece.key] = value if piece.whole else _slice(value, piece.lo, piece.hi)
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
                flat[piece.lo : piece.hi] = arr.reshape(-1)
            out[name] = full
        return out

    # ------------------------------------------------------------------ travelling

    def to_json(self) -> dict[str, Any]:
        return {
            "shapes": [[name, list(shape)] for name, shape in self.shapes],
            "shards": [[[p.name, p.lo, p.hi, p.whole] for p in pieces] for pieces in self.shards],
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Layout:
        shapes = tuple((str(name), tuple(int(d) for d in shape)) for name, shape in obj["shapes"])
        shards = tuple(
            tuple(
                Piece(
                    str(name),
                    str(name) if whole else f"{name}[{lo}:{hi}]",
                    int(lo),
                    int(hi),
                    bool(whole),
                )
                for name, lo, hi, whole in pieces
            )
            for pieces in obj["shards"]
        )
        return cls(shapes, shards)


def _slice(value: wire.Tensor, lo: int, hi: int) -> wire.Tensor:
    """Numbers ``lo:hi`` of a flattened plain or compressed tensor (a view)."""
    if isinstance(value, wire.Encoded):
        scales = value.scales
        if scales is not None:
            assert lo % value.block == 0, "pieces start on a block boundary (Layout.plan's align)"
            scales = scales[lo // value.block : -(-hi // value.block)]
        return wire.Encoded(value.codec, (hi - lo,), value.codes[lo:hi], scales, value.block)
    return np.asarray(value).reshape(-1)[lo:hi]
