"""The change log gives the rows changed since a version exactly as the per-row scan does
(tensorspark.ps.rowlog, used by tensorspark.ps.sparse.RowTables)."""

from __future__ import annotations

import numpy as np
import pytest

from tensorspark.ps.combiners import get_combiner
from tensorspark.ps.rowlog import ChangeLog
from tensorspark.ps.sparse import RowTables


@pytest.mark.parametrize("seed", range(5))
def test_the_log_answers_as_the_scan_for_every_version_it_covers(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = 500
    versions = np.full(rows, 3, np.int64)
    log = ChangeLog(rows, 3)
    version, covered = 3, 0
    for _ in range(300):
        version += 1
        if rng.random() < 0.02:  # a whole push
            versions.fill(version)
            log.reset(version)
            continue
        ids = rng.choice(rows, int(rng.integers(0, 60)), replace=False)
        versions[ids] = version
        log.record(version, ids)
        for since in range(version + 1):
            logged = log.since(since)
            scanned = np.flatnonzero(versions > since)
            if logged is None:
                assert since < log.start
            else:
                covered += 1
                np.testing.assert_array_equal(logged, scanned)
    assert covered > 1000  # the log answered most of them, the scan the old ones


def test_the_log_keeps_at_most_the_table_s_rows_of_ids() -> None:
    log = ChangeLog(100, 0)
    for version in range(1, 40):
        log.record(version, np.arange(10) + version)
    assert log.since(38) is not None and log.since(0) is None
    assert log.start == 29  # the ten newest entries (100 ids) kept


def test_an_out_of_order_version_falls_back_to_the_scan() -> None:
    log = ChangeLog(100, 0)
    log.record(5, np.array([1, 2]))
    log.record(4, np.array([3]))
    assert log.since(4) is None and log.since(5) is not None


def test_row_tables_answer_pushes_from_the_log_as_from_the_scan() -> None:
    """Through RowTables as the store drives it: the ids the answers and the incremental
    checkpoints take equal a scan of the per-row versions."""
    from tensorspark.ps.combiners import PushInfo
    from tensorspark.ps.rows import rows_entry

    rng = np.random.default_rng(0)
    params = {"t": np.zeros((1000, 4), np.float32), "b": np.zeros(3, np.float32)}
    tables = RowTables(True, get_combiner("delta"))
    for version in range(50):
        ids = np.sort(rng.choice(1000, 30, replace=False))
        push = {"b": np.ones(3, np.float32), **rows_entry("t", ids, np.ones((30, 4), np.float32))}
        meta = {"rows": ["t"]}
        dense, rows = tables.split(params, push, meta, version)
        assert rows is not None
        info = PushInfo(0, 1, version, version, 1)
        tables.apply(params, dense, rows, info)
        assert tables._logs["t"].since(version) is not None  # answered from the log
        for since in range(version + 1):
            expected = np.flatnonzero(tables.versions["t"] > since)
            np.testing.assert_array_equal(tables.changed_ids("t", since), expected)
