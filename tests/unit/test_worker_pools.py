"""worker_pools.share: what it sets in a SparkContext's environment, and when it keeps out."""

from __future__ import annotations

import pytest

from tensorspark import worker_pools

pytestmark = pytest.mark.unit


class _Context:
    def __init__(self, environment: object) -> None:
        self.environment = environment


def test_share_sets_the_dataframe_jobs_variable_once_and_keeps_an_applications_own() -> None:
    sc = _Context({"PYTHONHASHSEED": "0"})
    assert worker_pools.share(sc)
    assert sc.environment == {"PYTHONHASHSEED": "0", worker_pools.SHARED_ENV: "1"}
    assert worker_pools.share(sc)  # idempotent
    assert sc.environment == {"PYTHONHASHSEED": "0", worker_pools.SHARED_ENV: "1"}
    own = _Context({worker_pools.SHARED_ENV: "0"})
    assert not worker_pools.share(own)  # the application's value stands: two pools
    assert own.environment == {worker_pools.SHARED_ENV: "0"}


def test_share_leaves_an_object_without_an_environment_alone() -> None:
    assert not worker_pools.share(object())
    assert not worker_pools.share(_Context(None))
