"""The params and tag that name the table version a tracked run trained on."""

from __future__ import annotations

from tensorspark.listeners import RunInfo
from tensorspark.tracking.fit import data_params


def _info(data: dict[str, object]) -> RunInfo:
    return RunInfo("n", "async", 1, 2, None, "http://x", {}, data)


def test_a_delta_table_version_becomes_params_and_a_tag() -> None:
    params, tags = data_params(_info({"format": "delta", "table": "/t", "version": 3}))
    assert params == {"data.format": "delta", "data.table": "/t", "data.version": 3}
    assert tags == {"tensorspark.data": "/t@v3"}


def test_data_without_a_version_logs_nothing() -> None:
    assert data_params(_info({})) == ({}, {})
