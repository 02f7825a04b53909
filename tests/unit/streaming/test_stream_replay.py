"""The seeds a replayable stream's micro-batches get (tensorspark.streaming.replay)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.streaming.replay import StreamReplay, batch_seed


def test_a_batch_seed_depends_on_seed_and_batch_only() -> None:
    seeds = {batch_seed(7, b) for b in range(100)}
    assert len(seeds) == 100  # every batch its own shuffle
    assert batch_seed(7, 3) == batch_seed(7, 3) != batch_seed(8, 3)
    assert all(0 <= s < 2**32 for s in seeds)
    # The same in another process (no hash randomisation, no global state): a restarted
    # driver gives a replayed batch the same shuffle.
    code = "from tensorspark.streaming.replay import batch_seed; print(batch_seed(7, 3))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert int(out.stdout.strip()) == batch_seed(7, 3)


def test_only_a_seed_makes_tasks_start_from_a_fresh_optimizer() -> None:
    today = StreamReplay.of(True, None, 11, "async")
    assert not today.fresh_optimizer
    assert today.seed_of(4) == batch_seed(11, 4)  # the session's seed, per batch
    seeded = StreamReplay.of(True, 0, 11, "sync")
    assert seeded.fresh_optimizer and seeded.shuffle
    assert seeded.seed_of(4) == batch_seed(0, 4)  # seed=0 is a seed, not "no seed"


def test_without_shuffle_or_seed_no_batch_seed_is_computed() -> None:
    # numpy's SeedSequence refuses what it cannot seed with; a stream that neither shuffles
    # nor replays has nothing to seed, so no batch computes one.
    plain = StreamReplay.of(False, None, 11, "async")
    assert plain.seed_of(0) is None and plain.seed_of(5) is None
    unshuffled = StreamReplay.of(False, 3, 11, "sync")
    assert unshuffled.fresh_optimizer and unshuffled.seed_of(2) == batch_seed(3, 2)


def test_a_numpy_integer_seed_is_an_int() -> None:
    replay = StreamReplay.of(True, np.int64(5), 0, "sync")
    assert type(replay.seed) is int and replay.seed == 5
    assert replay.seed_of(1) == batch_seed(5, 1)


@pytest.mark.parametrize("mode", ["async", "bounded"])
def test_a_seed_outside_sync_mode_is_refused_naming_the_mode(mode: str) -> None:
    with pytest.raises(
        ConfigurationError, match=f"mode='sync'.*Received: seed=7 with mode='{mode}'"
    ):
        StreamReplay.of(True, 7, 0, mode)
    assert StreamReplay.of(True, None, 0, mode).seed is None  # no seed: any mode


@pytest.mark.parametrize(
    ("shuffle", "seed", "received"),
    [
        ("yes", None, "Received: shuffle='yes'"),
        (False, -1, "Received: seed=-1"),
        (False, 1.5, "Received: seed=1.5"),
        (False, True, "Received: seed=True"),
        (False, np.bool_(True), f"Received: seed={np.bool_(True)!r}"),  # np.True_ or True
        (False, "3", "Received: seed='3'"),
    ],
)
def test_bad_shuffle_or_seed_is_refused_by_name(
    shuffle: object, seed: object, received: str
) -> None:
    with pytest.raises(ConfigurationError, match=received):
        StreamReplay.of(shuffle, seed, 0, "sync")
