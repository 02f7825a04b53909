"""Buffer recycling for the parameter server's store.

A 100 MB model allocated afresh for every push costs more in page faults than the
arithmetic, so superseded parameter sets and large request bodies are reused instead.
A parameter set is reused only once no response is still being written from its memory.

Thread ownership: like :class:`~tensorspark.ps.store.Store`, which holds them, these
belong to the server's loop thread and take no locks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

_RECYCLE_FROM = 1 << 20  # request bodies this large are reused between requests
_MAX_BODIES = 4

Params = dict[str, np.ndarray]


class ParamSets:
    """The current global parameter set, and the superseded ones waiting to be reused."""

    def __init__(self, params: Params) -> None:
        self.current = params
        self._inflight: dict[int, int] = {}  # id(set) -> responses still sending it
        self._retired: dict[int, Params] = {}  # superseded sets still being sent
        self._spare: Params | None = None

    def lend(self) -> tuple[Params, Callable[[], None]]:
        """The current set, counted as in flight until the returned ``release`` is called
        (once, when the response written from it has left)."""
        params = self.current
        key = id(params)
        self._inflight[key] = self._inflight.get(key, 0) + 1
        return params, lambda: self._release(key)

    def install(self, new: Params) -> None:
        """Make ``new`` the current set; the old one becomes the spare once no response is
        still sending it."""
        old = self.current
        self.current = new
        if old is new:
            return
        key = id(old)
        if self._inflight.get(key, 0) == 0:
            self._inflight.pop(key, None)
            self._spare = old
        else:
            self._retired[key] = old

    def _release(self, key: int) -> None:
        left = self._inflight.get(key, 0) - 1
        if left > 0:
            self._inflight[key] = left
            return
        self._inflight.pop(key, None)
        old = self._retired.pop(key, None)
        if old is not None:
            self._spare = old

    def take_spare(self) -> Params | None:
        """A recycled set to combine into, if one has the current names, shapes and dtypes."""
        spare, self._spare = self._spare, None
        if spare is None or spare.keys() != self.current.keys():
            return None
        for k, v in self.current.items():
            if spare[k].shape != v.shape or spare[k].dtype != v.dtype:
                return None
        return spare


class BodyPool:
    """A few large request-body buffers kept for the next request of the same size."""

    def __init__(self) -> None:
        self._bodies: list[bytearray] = []

    def take(self, length: int) -> bytearray:
        """A buffer of ``length`` bytes (recycled when one fits, else new)."""
        if length >= _RECYCLE_FROM:
            for i, buf in enumerate(self._bodies):
                if len(buf) == length:
                    return self._bodies.pop(i)
        return bytearray(length)

    def give(self, body: bytearray) -> None:
        """Keep ``body``, which nothing refers to any more, for reuse."""
        if len(body) >= _RECYCLE_FROM:
            self._bodies.append(body)
            del self._bodies[:-_MAX_BODIES]
