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
