"""The chains of a checkpoint folder: which files follow which, from their names (pure).

A full checkpoint (``ckpt-<version>.safetensors``) starts a chain; each increment
(``incr-<version>-<depth>-<previous>.safetensors``, :mod:`.increments`) follows the file of
version ``previous`` one depth before it (depth 0: the full checkpoint). Newest is the
highest ``(version, depth)``: an increment written at the version of its predecessor (a
micro-batch that changed nothing) still comes after it. The files' own headers name their
predecessor and its digest; the manager verifies those when it reads a chain.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tensorspark.checkpoint.format import NAME_PATTERN, Checkpoint
from tensorspark.checkpoint.increments import Increment, apply_increment, increment_fields
from tensorspark.errors import CheckpointError


@dataclass(frozen=True, order=True)
class Entry:
    """One checkpoint file of a folder; ordered oldest first.

    Attributes:
        version: the parameter server's version it holds.
        depth: 0 for a full checkpoint, else its place after the full one.
        previous: the predecessor's version (None for a full checkpoint).
        name: the file name.
    """

    version: int
    depth: int
    previous: int | None
    name: str

    @property
    def full(self) -> bool:
        return self.depth == 0


def parse(names: Iterable[str]) -> list[Entry]:
    """The checkpoint files among ``names`` (others ignored), oldest first."""
    found = []
    for name in names:
        match = NAME_PATTERN.match(name)
        if match:
            found.append(Entry(int(match.group(1)), 0, None, name))
            continue
        fields = increment_fields(name)
        if fields is not None and fields[1] > 0 and fields[2] <= fields[0]:
            found.append(Entry(fields[0], fields[1], fields[2], name))
    return sorted(found)


def predecessors(entry: Entry, entries: Iterable[Entry]) -> list[Entry]:
    """The files that can precede ``entry`` by their names (one in a sound folder)."""
    if entry.full:
        return []
    return [e for e in entries if e.version == entry.previous and e.depth == entry.depth - 1]


def retained(entries: list[Entry], keep: int, also: Iterable[str] = ()) -> set[str]:
    """The names kept when only the newest ``keep`` checkpoints (and ``also``) are: those,
    and every file a kept increment needs (its predecessors down to its full checkpoint).
    """
    wanted = {e.name for e in entries[max(0, len(entries) - keep) :]} | set(also)
    todo = [e for e in entries if e.name in wanted]
    while todo:
        entry = todo.pop()
        for before in predecessors(entry, entries):
            if before.name not in wanted:
                wanted.add(before.name)
                todo.append(before)
    return wanted


def resolve(
    entry: Entry,
    entries: list[Entry],
    read_full: Callable[[str], Checkpoint],
    read_increment: Callable[[str], Increment],
    where: Callable[[str], str],
) -> Checkpoint:
    """The state an increment's chain restores: its full checkpoint with every increment
    after it applied in order, each link verified (the predecessor's name and digest that
    the increment's header names, the full checkpoint it names).

    ``read_full``/``read_increment`` read and verify one file (raising
    :class:`CheckpointError` naming it); ``where`` gives a name's location.

    Raises:
        CheckpointError: a file of the chain is missing, unreadable or not the one its
            successor names; the message names the file and how to fall back.
    """
    hint = (
        "Restore the missing file, or pass checkpoint_fallback=True to resume from the "
        "newest consistent checkpoint before it."
    )
    increments: list[Increment] = []
    current = read_increment(entry.name)
    names = {e.name for e in entries}
    while True:
        increments.append(current)
        previous = str(current.meta["previous"])
        base = str(current.meta["base"])
        if previous not in names:
            raise CheckpointError(
                f"Checkpoint increment {current.path} cannot be restored: the checkpoint it "
                f"follows, {where(previous)}, is missing. {hint}"
            )
        try:
            if NAME_PATTERN.match(previous):
                full = read_full(previous)
                found = full.meta.get("sha256")
            else:
                before = read_increment(previous)
                found = before.meta.get("sha256")
        except CheckpointError as err:
            raise CheckpointError(
                f"Checkpoint increment {current.path} cannot be restored: the checkpoint it "
                f"follows is unreadable: {err} {hint}"
            ) from err
        if found != current.meta["previous_sha256"]:
            raise CheckpointError(
                f"Checkpoint increment {current.path} cannot be restored: {where(previous)} "
                f"is not the checkpoint it follows (another digest; written by another run?). "
                f"{hint}"
            )
        if NAME_PATTERN.match(previous):
            if previous != base:
                raise CheckpointError(
                    f"Checkpoint increment {current.path} names {where(base)} as its full "
                    f"checkpoint but its chain reaches {where(previous)}. {hint}"
                )
            break
        if str(before.meta["base"]) != base or before.version > current.version:
            raise CheckpointError(
                f"Checkpoint increment {current.path} and {before.path} belong to different "
                f"chains. {hint}"
            )
        current = before
    state = full
    for increment in reversed(increments):
        state = apply_increment(state, increment)
    return state
