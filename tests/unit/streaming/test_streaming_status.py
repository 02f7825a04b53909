"""The stream's status counters and trigger parsing (no Spark)."""

from __future__ import annotations

import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.streaming.query import trigger_options
from tensorspark.streaming.status import BatchRecord, StreamStatus, percentile

pytestmark = pytest.mark.unit


def test_triggers() -> None:
    assert trigger_options("10 seconds") == {"processingTime": "10 seconds"}
    assert trigger_options(2) == {"processingTime": "2.0 seconds"}
    assert trigger_options("available_now") == {"availableNow": True}
    for bad in ("soon", 0, -1, True, "10 parsecs"):
        with pytest.raises(ConfigurationError, match="Received: trigger="):
            trigger_options(bad)  # type: ignore[arg-type]


def test_status_counts_trained_and_skipped_batches_and_lag() -> None:
    status = StreamStatus(batches_before=2, samples_before=100)
    status.trained(BatchRecord(2, 0, 0, 10.0, 10.0, 7, skipped=True))
    status.trained(BatchRecord(3, 50, 2, 20.0, 22.0, 12, arrival_min=15.0, arrival_median=18.0))
    snap = status.snapshot()
    assert (snap["batches"], snap["samples"], snap["skipped_batches"]) == (3, 150, 1)
    assert snap["bad_records"] == 2 and snap["version"] == 12 and snap["last_batch_id"] == 3
    assert snap["lag_max_s"] == 7.0 and snap["lag_s"] == 4.0  # from arrival to the version
    assert snap["trained_rows_per_sec"] == 25.0  # 50 rows over the batch's 2 s
    assert [r["batch_id"] for r in snap["recent"]] == [2, 3]


def test_lag_without_arrival_is_from_the_batch_start() -> None:
    status = StreamStatus()
    status.trained(BatchRecord(0, 10, 0, 5.0, 6.5, 1))
    assert status.snapshot()["lag_s"] == 1.5


def test_percentile() -> None:
    assert percentile([], 0.5) is None
    assert percentile([1.0, 2.0, 3.0], 0.5) == 2.0
    assert percentile([1.0, 2.0, 3.0], 0.99) == 3.0


def test_the_servers_status_page_shows_the_stream() -> None:
    import json
    import urllib.request

    import numpy as np

    from tensorspark.ps.server import ParameterServer

    with ParameterServer(
        {"w": np.zeros(3, np.float32)}, host="127.0.0.1", port=0, public_status=True
    ) as server:
        server.annotate("stream", {"batches": 3, "lag_s": 1.5})
        with urllib.request.urlopen(f"{server.url}/status", timeout=10) as answer:
            served = json.loads(answer.read())
    assert served["stream"] == {"batches": 3, "lag_s": 1.5}


def test_exports_show_in_the_snapshot() -> None:
    status = StreamStatus()
    snap = status.snapshot()
    assert snap["exports"] is None and snap["export_freshness_p50_s"] is None
    status.set_exports({"published": 2, "freshness_p50_s": 4.5, "freshness_p99_s": 9.0})
    snap = status.snapshot()
    assert snap["exports"]["published"] == 2
    assert (snap["export_freshness_p50_s"], snap["export_freshness_p99_s"]) == (4.5, 9.0)
