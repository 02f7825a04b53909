"""Consistent cuts of a sharded server, the driver's side: lining the shards up.

A checkpoint of a :class:`~tensorspark.ps.shards.ShardedServer` must hold every shard's
slice at the same per-partition progress, or a push would be half in it. :func:`line_up`
finds, per partition, the furthest push any shard applied, has every shard apply up to it
and hold newer pushes (they wait, unanswered; the shard's side is
:mod:`tensorspark.ps.holds`), copies the slices, then lets the held pushes through.

Runs on the driver, on the thread that asks for the snapshot; the caller takes one cut at
a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from tensorspark.errors import ParameterServerError

T = TypeVar("T")
#: Per partition, the last applied ``(epoch, seq)``.
Progress = dict[int, tuple[int, int]]
#: Runs a command on every shard at once: ``(command, args, timeout=..., each=...)`` -> the
#: answers (``each``: per shard, its own arguments instead of ``args``).
ShardCall = Callable[..., list[tuple[Any, bytearray]]]


def line_up(
    call: ShardCall,
    each: list[Progress],
    shards: int,
    cut_timeout: float,
    fetch: Callable[[], T],
) -> tuple[Progress, T]:
    """Line the shards up at one progress and copy their slices there (``fetch``).

    Args:
        call: runs a command on every shard at once, with its arguments and a
            ``timeout=``, and returns every shard's answer in shard order.
        each: every shard's progress as the cut starts.
        shards: how many shards there are (for the message).
        cut_timeout: seconds the shards have to reach the target.
        fetch: asks the shards for their slices while they hold there (their answers to
            ``"snapshot"``, one at a time: :func:`tensorspark.ps.cut_rows.read_cut`).

    Returns:
        The progress of the cut and what ``fetch`` returned.

    Raises:
        ParameterServerError: the shards did not line up within ``cut_timeout`` seconds;
            nothing is held back then.
    """
    target: Progress = {}
    for progress in each:
        target = furthest(target, progress)
    try:
        # Each turn only moves the target past pushes already in flight.
        for _ in range(100):
            held = [
                {int(p): (v[0], v[1]) for p, v in r.items()}
                for r, _ in call("hold", {"target": as_json(target)})
            ]
            ahead = target
            for progress in held:
                ahead = furthest(ahead, progress)
            if ahead == target:
                break
            target = ahead
        reached = call(
            "wait",
            {"target": as_json(target), "timeout": cut_timeout},
            timeout=cut_timeout + 30,
        )
        if not all(r for r, _ in reached):
            raise ParameterServerError(
                f"no consistent snapshot of the {shards} shards within {cut_timeout:g}s: "
                "some shard still misses pushes others applied"
            )
        taken = fetch()
    finally:
        call("release")
    return target, taken


def furthest(a: Progress, b: Mapping[int, tuple[int, int]]) -> Progress:
    """Per partition, the later of ``a``'s and ``b``'s ``(epoch, seq)``."""
    out = dict(a)
    for p, t in b.items():
        if p not in out or tuple(t) > out[p]:
            out[p] = (int(t[0]), int(t[1]))
    return out


def as_json(progress: Progress) -> dict[str, list[int]]:
    """``progress`` as the shards' commands take it."""
    return {str(p): [e, s] for p, (e, s) in progress.items()}
