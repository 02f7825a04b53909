"""The worker side of a sharded parameter server: one client per shard, used in parallel.

:class:`ShardedClient` has the calls of :class:`~tensorspark.ps.client.ParameterClient`
(join, pull, push, leave, close) and makes each on every shard at once, over one
keep-alive connection per shard, from a small thread pool (sockets and numpy release
the GIL). A push is cut into the shards' slices by the run's
:class:`~tensorspark.ps.layout.Layout` (views, no copy); the answers are put back
together into whole tensors.

Per shard it keeps the version of that shard's slice the worker last received, and sends
it as the push's ``base_version`` there (staleness is per shard). Before a push it checks
the whole update for NaN/Inf and, if any slice holds one, tells every shard
(``"finite": false``), so all refuse it together. The answers' statuses combine as: any
``diverged`` or ``stale`` wins, then ``applied`` (a retry some shards had already
applied is ``duplicate`` there), else ``duplicate``.

Row-sparse pushes (embedding tables, :mod:`tensorspark.ps.rows`) need each table held by
rows (``Layout.plan``'s ``keep``): whole on one shard, or cut into blocks of whole rows
across shards. After the ids are checked here (a bad id on one shard alone would leave the
others applying the push), each id and its row go to the shard holding that row, the id
counted from the block's first row; the answers' rows come back with the ids turned back
into the table's, beside the assembled whole tensors.

Dynamic tables' ``/vocab`` requests go to the shards owning the ids, and a push's map
versions are each shard's (:mod:`~tensorspark.ps.vocab_fanout`).

Runs on executors. Not thread-safe (one per training loop), like ParameterClient.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, TypeVar

import numpy as np

from tensorspark import wire
from tensorspark.errors import ParameterServerError
from tensorspark.ps.client import ParameterClient, PushResult
from tensorspark.ps.compression import is_finite
from tensorspark.ps.layout import Layout, take_rows
from tensorspark.ps.rows import IDS, ROWS, check_ids
from tensorspark.ps.validation import RequestError
from tensorspark.ps.vocab_fanout import VocabFanout

T = TypeVar("T")
_ORDER = ("diverged", "stale", "applied", "duplicate")


class ShardedClient:
    """A client of every shard of a :class:`~tensorspark.ps.shards.ShardedServer`.

    Args:
        urls: the shards' URLs, in shard order.
        layout: which shard holds which tensors.
        recycle_responses: as for ParameterClient; whole tensors assembled from several
            shards are written into two sets of arrays used in turn.
        **options: passed to each :class:`~tensorspark.ps.client.ParameterClient`.
    """

    def __init__(
        self,
        urls: Sequence[str],
        layout: Layout,
        *,
        recycle_responses: bool = False,
        **options: Any,
    ) -> None:
        if len(urls) != len(layout.shards):
            raise ValueError(f"{len(urls)} shard URLs for a layout of {len(layout.shards)} shards")
        self.url = ",".join(urls)
        self.layout = layout
        self._clients = [
            ParameterClient(u, recycle_responses=recycle_responses, **options) for u in urls
        ]
        self._pool = ThreadPoolExecutor(len(urls), thread_name_prefix="tensorspark-shard-client")
        self._versions = [0] * len(urls)
        self._recycle = recycle_responses
        self._sets: list[dict[str, np.ndarray]] = [{}, {}]
        self._turn = 0
        self._vocab = VocabFanout(layout)  # dynamic tables' requests and map versions

    def _each(self, fn: Callable[[int, ParameterClient], T]) -> list[T]:
        """``fn(i, client)`` on every shard at once; the answers in shard order.

        Every call ends before this returns or raises (the first error in shard order):
        a shard that refused at once must not leave another's request still running on its
        connection, or the next call would share that connection with it and could read
        its answer (a late 409 surfacing as the next request's)."""
        futures = [self._pool.submit(fn, i, c) for i, c in enumerate(self._clients)]
        wait(futures)  # each client's own ps_timeout bounds its call
        return [f.result() for f in futures]

    def _assemble(self, parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        self._turn ^= 1
        return self.layout.assemble(parts, self._sets[self._turn] if self._recycle else None)

    def join(self, partition: int, attempt: int, wait: float | None = None) -> dict[str, Any]:
        """Join every shard; the progress is what all of them applied (the least)."""
        answers = self._each(lambda i, c: c.join(partition, attempt, wait=wait))
        out = dict(answers[0])
        done = [a.get("progress") for a in answers]
        out["progress"] = (
            None
            if any(d is None for d in done)
            else min(
                done,
                key=lambda d: (int(d["epoch"]), int(d["seq"])),  # type: ignore[index]
            )
        )
        self._versions = [int(a.get("version", 0)) for a in answers]
        out["version"] = min(self._versions)
        return out

    def pull(self, partition: int | None = None) -> tuple[int, dict[str, np.ndarray]]:
        """The whole model: ``(least version, tensors)``."""
        answers = self._each(lambda i, c: c.pull(partition))
        self._versions = [v for v, _ in answers]
        return min(self._versions), self._assemble([t for _, t in answers])

    def rows(
        self, asked: Mapping[str, np.ndarray], partition: int | None = None, dense: bool = False
    ) -> tuple[int, dict[str, np.ndarray]]:
        """Rows of tables by id from the shards holding them (a table in row blocks: each
        block's ids from its first row), put back as the table's; with ``dense`` the
        other tensors assembled whole, and the shards' versions taken as the base's
        (a cached worker's first pull). Returns ``(least version, tensors)``."""
        parts: list[dict[str, np.ndarray]] = [{} for _ in self._clients]
        for name, ids in asked.items():
            ids = np.asarray(ids, np.int64)
            for index, piece in self.layout.row_blocks(name):
                mine = ids if piece.whole else ids[(ids >= piece.lo) & (ids < piece.hi)] - piece.lo
                if mine.size or dense:
                    parts[index][piece.key] = mine

        def ask(i: int, client: ParameterClient) -> tuple[int, dict[str, np.ndarray]]:
            if not parts[i] and not dense:
                return self._versions[i], {}
            return client.rows(parts[i], partition, dense)

        answers = self._each(ask)
        out: dict[str, np.ndarray] = {}
        if dense:
            self._versions = [v for v, _ in answers]
            dense_parts = [
                {k: v for k, v in a.items() if not k.endswith((IDS, ROWS))} for _, a in answers
            ]
            out.update(self.layout.assemble(dense_parts))
        out.update(self._answered_rows([a for _, a in answers]))
        return min(v for v, _ in answers), out

    def vocab(
        self, ids: Mapping[str, np.ndarray], versions: Mapping[str, int], *rest: Any, **options: Any
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """``POST /vocab`` (as :meth:`ParameterClient.vocab
        <tensorspark.ps.client.ParameterClient.vocab>`) on the shards holding the dynamic
        tables' blocks, each with the ids it owns; the answers put together as one
        server's (:mod:`~tensorspark.ps.vocab_fanout`). ``rest`` and ``options`` (the chunk's
        key, the attempt, ``rows``, ``draw``) go to each shard unchanged."""
        parts, plan = self._vocab.split(ids, versions)

        def ask(i: int, client: ParameterClient) -> Any:
            part = parts[i]
            return None if part is None else client.vocab(*part, *rest, **options)

        return self._vocab.merge(ids, plan, self._each(ask))

    def push(self, update: Mapping[str, wire.Tensor], meta: Mapping[str, Any]) -> PushResult:
        """Push each shard its slice; the combined answer (see the module docstring).

        A row-sparse push's tables (``meta["rows"]``, each held by rows, see
        :meth:`row_sparse`) go with their ids and rows to the shards holding those rows;
        every shard's push names the tables (or blocks) it gets, maybe none, so each
        answers row-sparse for its own.
        """
        finite = all(is_finite(v) for v in update.values())
        if "vocab" in meta:  # dynamic tables (ps/vocab_fanout.py)
            update = self._vocab.without_default(update, meta)
        parts = self.layout.split(update)
        tables: list[list[str]] = [[] for _ in parts]
        for name in meta.get("rows", ()):
            blocks = self.layout.row_blocks(name)
            if not blocks:
                raise ValueError(f"table {name!r} is not held by rows")
            self._check_rows(name, update, blocks[0][0])
            ids, values = update[name + IDS], update[name + ROWS]
            for index, piece in blocks:
                tables[index].append(piece.key)
                if piece.whole:
                    parts[index][name + IDS], parts[index][name + ROWS] = ids, values
                    continue
                assert isinstance(ids, np.ndarray)
                mine = np.flatnonzero((ids >= piece.lo) & (ids < piece.hi))
                parts[index][piece.key + IDS] = ids[mine] - piece.lo
                if mine.size:
                    parts[index][piece.key + ROWS] = take_rows(values, mine)
                else:  # none of its rows: still named, so its answer brings others' rows
                    shape = self.layout.shape(name)
                    parts[index][piece.key + ROWS] = np.zeros((0, *shape[1:]), np.float32)

        def push_one(i: int, client: ParameterClient) -> PushResult:
            shard_meta = dict(meta, base_version=self._versions[i])
            if "rows" in meta:
                shard_meta["rows"] = tables[i]
            if "vocab" in meta:  # the map versions of its blocks behind the table's
                shard_meta["vocab"] = self._vocab.push_versions(meta["vocab"], i)
            if not finite:
                shard_meta["finite"] = False
            return client.push(parts[i], shard_meta)

        answers = self._each(push_one)
        self._versions = [a.version for a in answers]
        statuses = {a.status for a in answers}
        status = next((s for s in _ORDER if s in statuses), answers[0].status)
        version = min(self._versions)
        params = self._assemble([a.params for a in answers])
        params.update(self._answered_rows([a.params for a in answers]))
        return PushResult(status, version, params, dict(answers[0].meta, version=version))

    def _answered_rows(self, answers: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
        """The row-sparse answers' rows by table: a block's ids turned back into the
        table's, the blocks' rows put together in row order."""
        ids_of: dict[str, list[np.ndarray]] = {}
        rows_of: dict[str, list[np.ndarray]] = {}
        for pieces, answer in zip(self.layout.shards, answers, strict=True):
            for piece in pieces:
                ids = answer.get(piece.key + IDS)
                if ids is None or piece.key + ROWS not in answer:
                    continue
                offset = piece.lo if piece.rows else 0
                ids_of.setdefault(piece.name, []).append(np.asarray(ids) + offset)
                rows_of.setdefault(piece.name, []).append(np.asarray(answer[piece.key + ROWS]))
        out: dict[str, np.ndarray] = {}
        for name, ids in ids_of.items():
            single = len(ids) == 1
            out[name + IDS] = ids[0] if single else np.concatenate(ids)
            out[name + ROWS] = rows_of[name][0] if single else np.concatenate(rows_of[name])
        return out

    def _check_rows(self, name: str, update: Mapping[str, wire.Tensor], index: int) -> None:
        """Refuse a table's bad ids or rows here, as its shard would with a 400: sent, the
        other shards would apply the push and the table's shard not."""
        shape = self.layout.shape(name)
        try:
            ids, values = update[name + IDS], update[name + ROWS]
            if not isinstance(ids, np.ndarray) or ids.dtype != np.int64 or ids.ndim != 1:
                raise RequestError(400, f"table {name[:80]!r}: {name[:80]}{IDS} must be int64 [k]")
            if tuple(values.shape) != (ids.size, *shape[1:]):
                raise RequestError(
                    400, f"table {name[:80]!r}: {name[:80]}{ROWS} must be [{ids.size}, ...]"
                )
            check_ids(name, ids, shape[0])
        except KeyError:
            raise ParameterServerError(
                f"table {name[:80]!r}: its {IDS} or {ROWS} is missing", status=400
            ) from None
        except RequestError as e:
            raise ParameterServerError(str(e), status=400, url=self._clients[index].url) from None

    def row_sparse(self, tables: Sequence[str]) -> bool:
        """Whether every one of ``tables`` is held by rows, whole on one shard or in blocks
        of rows (then their rows can be pushed and answered row-sparse through this
        client)."""
        return all(self.layout.row_blocks(name) for name in tables)

    def leave(self, partition: int, attempt: int, state: str) -> None:
        self._each(lambda i, c: c.leave(partition, attempt, state))

    def status(self) -> dict[str, Any]:
        """Shard 0's ``/status`` (the driver's status page aggregates all of them)."""
        return self._clients[0].status()

    def close(self) -> None:
        for client in self._clients:
            client.close()
        self._pool.shutdown(wait=False)

    def __enter__(self) -> ShardedClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
