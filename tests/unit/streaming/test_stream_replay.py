"""The seeds a replayable stream's micro-batches get (tensorspark.streaming.replay)."""

from __future__ import annotations

import subprocess
import sys

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
    today = StreamReplay.of(False, None, 11)
    assert not today.fresh_optimizer
    assert today.seed_of(4) == batch_seed(11, 4)  # the session's seed, per batch
    seeded = StreamReplay.of(True, 0, 11)
    assert seeded.fresh_optimizer and seeded.shuffle
    assert seeded.seed_of(4) == batch_seed(0, 4)


@pytest.mark.parametrize(
    ("shuffle", "seed", "received"),
    [
        ("yes", None, "Received: shuffle='yes'"),
        (False, -1, "Received: seed=-1"),
        (False, 1.5, "Received: seed=1.5"),
        (False, True, "Received: seed=True"),
    ],
)
def test_bad_shuffle_or_seed_is_refused_by_name(
    shuffle: object, seed: object, received: str
) -> None:
    with pytest.raises(ConfigurationError, match=received):
        StreamReplay.of(shuffle, seed, 0)
