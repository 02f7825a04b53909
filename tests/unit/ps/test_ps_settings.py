"""ServerSettings: one frozen, checked definition of a parameter server's settings, taken by
the single server, the sharded one (and its shard processes, as JSON) and a session's runs."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.ps import auth
from tensorspark.ps.combiners import DeltaWeightCombiner, WeightCombiner, get_combiner
from tensorspark.ps.compression import Compression
from tensorspark.ps.server import ParameterServer
from tensorspark.ps.settings import ServerSettings
from tensorspark.ps.shards import ShardedServer

SECRET = b"k" * 32


def test_names_are_resolved_and_the_settings_frozen() -> None:
    names: dict[str, object] = {"combiner": "delta", "compression": "int8", "secret": "s" * 20}
    settings = ServerSettings(**names)  # type: ignore[arg-type]
    assert isinstance(settings.combiner, DeltaWeightCombiner)
    assert settings.compression == Compression("int8", "int8")
    assert settings.secret == b"s" * 20
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.mode = "sync"  # type: ignore[misc]


def test_the_secret_is_never_shown() -> None:
    settings = ServerSettings(secret=SECRET)
    assert "k" * 16 not in repr(settings) and "secret" not in repr(settings)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"mode": "bulk"}, r"mode must be one of \('async', 'sync'\). Received: mode='bulk'"),
        ({"mode": "sync", "max_staleness": 2}, r"max_staleness applies to mode='async'"),
        ({"max_body_bytes": 0}, r"Received: max_body_bytes=0"),
        ({"authenticate": False, "secret": SECRET}, r"secret= needs authenticate=True"),
        ({"shards": 0}, r"shards must be a positive integer. Received: shards=0"),
        ({"combiner": "mean", "compression": "bf16"}, r"compression sends deltas"),
    ],
)
def test_bad_settings_are_refused_when_made(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ServerSettings(**changes)  # type: ignore[arg-type]


def test_a_custom_combiner_cannot_be_sharded() -> None:
    class Custom(DeltaWeightCombiner):
        pass

    with pytest.raises(ConfigurationError, match="must be one of the built-in combiners"):
        ServerSettings(combiner=Custom(), shards=2)


def test_json_round_trip_for_a_shard_process() -> None:
    values: dict[str, object] = {
        "combiner": "nesterov",
        "port": (41000, 41010),
        "mode": "sync",
        "secret": SECRET,
        "compression": "bf16",
        "public_status": True,
        "shards": 2,
        "max_inflight_bodies": 7,
    }
    settings = ServerSettings(**values)  # type: ignore[arg-type]
    again = ServerSettings.from_json(json.loads(json.dumps(settings.to_json())))
    assert again.port == (41000, 41010) and again.secret == SECRET
    assert again.combiner.get_config() == settings.combiner.get_config()
    assert dataclasses.replace(again, combiner=settings.combiner) == settings


def test_a_server_takes_the_settings_or_the_keywords_not_both() -> None:
    params = {"w": np.zeros(3, np.float32)}
    settings = ServerSettings(combiner=get_combiner("delta"), mode="sync", secret=SECRET)
    with ParameterServer(params, settings=settings, num_workers=2) as server:
        assert server.settings is settings
        assert server.mode == "sync" and server.combiner.name == "delta"
        assert server.client_options() == {"secret": SECRET}
    keywords = ParameterServer(params, "delta", mode="sync", num_workers=2, secret=SECRET)
    assert keywords.settings == dataclasses.replace(settings, combiner=keywords.settings.combiner)
    with pytest.raises(ConfigurationError, match="either as settings= or as keyword arguments"):
        ParameterServer(params, settings=settings, mode="sync")
    with pytest.raises(ConfigurationError, match="use ShardedServer for shards"):
        ParameterServer(params, settings=settings.replace(shards=2), num_workers=2)
    with pytest.raises(ConfigurationError, match=r"needs shards >= 2. Received: shards=1"):
        ShardedServer(params, settings=settings, num_workers=2)


def test_combiner_is_one_instance_per_settings() -> None:
    first, second = ServerSettings(), ServerSettings()
    assert isinstance(first.combiner, WeightCombiner) and first.combiner is not second.combiner


@pytest.mark.parametrize("value", ["big", 1.5, True, -1])
def test_max_body_bytes_must_be_a_whole_number_of_bytes(value: object) -> None:
    message = (
        f"max_body_bytes must be a positive number of bytes. Received: max_body_bytes={value!r}"
    )
    with pytest.raises(ConfigurationError) as info:
        ServerSettings(max_body_bytes=value)  # type: ignore[arg-type]
    assert str(info.value) == message


def test_whole_settings_are_kept_as_ints() -> None:
    whole: dict[str, object] = {"max_body_bytes": np.int64(1000), "shards": np.int64(2)}
    settings = ServerSettings(**whole)  # type: ignore[arg-type]
    assert type(settings.max_body_bytes) is int and type(settings.shards) is int
    assert json.loads(json.dumps(settings.to_json()))["max_body_bytes"] == 1000


def test_sync_servers_check_num_workers_alike() -> None:
    params = {"w": np.zeros(4, np.float32)}
    message = (
        r"mode='sync' needs num_workers >= 1 \(the partitions in each round\). "
        r"Received: num_workers=0"
    )
    with pytest.raises(ConfigurationError, match=message):
        ParameterServer(params, mode="sync", num_workers=0)
    with pytest.raises(ConfigurationError, match=message):
        ShardedServer(params, mode="sync", shards=2, num_workers=0)
    with pytest.raises(ConfigurationError, match=r"Received: num_workers=None"):
        ShardedServer(params, mode="sync", shards=2)


def test_a_sharded_server_refuses_a_shard_count_that_is_no_integer() -> None:
    params = {"w": np.zeros(4, np.float32)}
    with pytest.raises(ConfigurationError, match=r"Received: shards=2.0"):
        ShardedServer(params, shards=2.0)


def test_the_verifier_checks_its_window_and_nonce_bound() -> None:
    with pytest.raises(ConfigurationError, match=r"Received: auth_window=0"):
        auth.Verifier(SECRET, window=0)
    with pytest.raises(ConfigurationError, match=r"Received: max_nonces=0"):
        auth.Verifier(SECRET, max_nonces=0)
