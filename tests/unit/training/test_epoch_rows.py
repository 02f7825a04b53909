"""History.epoch_rows: per epoch, the table rows per row-sparse sync, from the running
counts read at each epoch's end."""

from __future__ import annotations

import pytest

from tensorspark.training.result import epoch_rows, worker_traffic

pytestmark = pytest.mark.unit


def test_each_epoch_counts_its_own_syncs() -> None:
    first = worker_traffic({"row_pushes": 4, "rows_pushed": 40, "rows_pulled": 100})
    second = worker_traffic({"row_pushes": 10, "rows_pushed": 100, "rows_pulled": 160})
    assert epoch_rows([first, second]) == [
        {"row_syncs": 4.0, "rows_pushed_per_sync": 10.0, "rows_pulled_per_sync": 25.0},
        {"row_syncs": 6.0, "rows_pushed_per_sync": 10.0, "rows_pulled_per_sync": 10.0},
    ]
    # An epoch whose counts are missing: it and the next (whose start is unknown) are None.
    assert epoch_rows([first, None, second, second])[1:] == [
        None,
        None,
        {"row_syncs": 0.0, "rows_pushed_per_sync": 0.0, "rows_pulled_per_sync": 0.0},
    ]


def test_a_model_without_row_sparse_tables_has_zero_rows() -> None:
    dense = worker_traffic({"workers": [{"bytes_received": 5, "bytes_sent": 7}], "samples": 3})
    assert dense["bytes_received"] == 5 and dense["rows_pushed"] == 0
    assert epoch_rows([dense]) == [
        {"row_syncs": 0.0, "rows_pushed_per_sync": 0.0, "rows_pulled_per_sync": 0.0}
    ]


def test_a_worker_row_cache_s_counters_per_epoch_and_in_mlflow_s_metrics() -> None:
    from tensorspark.tracking.fit import status_metrics

    base = {"row_pushes": 4, "rows_pushed": 40, "rows_pulled": 100}
    cache = {"cache_hits": 50, "cache_misses": 20, "cache_evictions": 5}
    first = worker_traffic({**base, **cache, "cache_rows_pulled": 20, "worker_peak_rss_bytes": 9})
    second = worker_traffic(
        {**base, "row_pushes": 8, "cache_hits": 150, "cache_misses": 30, "cache_evictions": 15,
         "cache_rows_pulled": 30, "worker_peak_rss_bytes": 11}
    )  # fmt: skip
    rows = epoch_rows([first, second])
    assert rows[1]["cache_hits"] == 100.0 and rows[1]["cache_misses"] == 10.0
    assert rows[1]["cache_evictions"] == 10.0 and rows[1]["cache_rows_pulled"] == 10.0
    assert rows[0]["worker_peak_rss_bytes"] == 9.0 and rows[1]["worker_peak_rss_bytes"] == 11.0
    assert "cache_hits" not in epoch_rows([worker_traffic(base)])[0]  # no cache: no keys
    metrics = status_metrics({**base, **cache})
    assert metrics["cache_hits"] == 50.0 and metrics["cache_evictions"] == 5.0
    assert "cache_hits" not in status_metrics(base)
