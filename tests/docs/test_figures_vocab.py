"""The unbounded vocabularies' table (bench/figures_vocab.py) and the bars of
bench/dynamic_embeddings.py: met, missed, and "not counted" where the run's counters
lacked the figure; a quick run is never quoted."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tests.docs.test_figures import _module

pytestmark = pytest.mark.docs


def _row(arm: str, auc: float, **more: object) -> dict:
    row = {
        "arm": arm,
        "auc": auc,
        "bytes_per_sample": 100.0,
        "samples_per_s_cold": 1000.0,
        "vocab": {},
        "rows_in_use_max": None,
        "collisions_max": None,
        "map_ids_known": None,
        "export_max_difference": None,
    }
    row.update(more)
    return row


def _result(bench, quick: bool = False) -> dict:
    counters = {"vocab_rows_in_use": 512, "vocab_admitted": 900, "vocab_evicted": 388}
    fits = {
        "hashing": _row("hashing", 0.68),
        "lfu": _row(
            "lfu", 0.70, vocab={**counters, "vocab_collisions": 0}, rows_in_use_max=512,
            collisions_max=0, map_ids_known=1.0,
            export_max_difference=3e-7, bytes_per_sample=120.0, samples_per_s_cold=700.0,
        ),
        "ttl": _row("ttl", 0.682, vocab=counters, export_max_difference=2e-5),
        "ceiling": _row("ceiling", 0.72),
    }  # fmt: skip
    args = bench.parse_args(["--quick"] if quick else [])
    return {
        "args": vars(args),
        "quick": quick,
        "log": {"train": 800, "test": 200, "vocabulary_over_capacity": 32.0},
        "true_auc_of_test": 0.77,
        "fit": fits,
        "stream": {},
        "bars": bench.bars(fits, {}, args.capacity),
    }


def test_the_bars_say_met_missed_or_not_counted() -> None:
    bench = _module("dynamic_embeddings")
    bars = _result(bench)["bars"]
    lfu, ttl = bars["lfu"], bars["ttl"]
    assert lfu["auc_minus_hashing"]["verdict"] == "met"
    assert lfu["collisions"]["verdict"] == "met"
    assert lfu["rows_in_use_max"]["verdict"] == "met"
    assert lfu["bytes_per_sample_vs_hashing"]["verdict"] == "met"
    assert lfu["samples_per_s_cold_vs_hashing"]["verdict"] == "missed"  # 0.7x < 0.8x
    assert lfu["export_max_difference"]["verdict"] == "met"
    assert ttl["auc_minus_hashing"]["verdict"] == "missed"  # +0.002 < 0.005
    assert ttl["collisions"]["verdict"] == "not counted"  # the run's status had no counter
    assert ttl["rows_in_use_max"]["verdict"] == "not counted"
    assert ttl["export_max_difference"]["verdict"] == "missed"
    assert lfu["map_ids_known"]["verdict"] == "met"
    assert ttl["map_ids_known"]["verdict"] == "not counted"
    assert bars["hashing_minus_ceiling_auc"] == pytest.approx(-0.04)


def test_the_table_quotes_the_newest_full_run_and_never_a_quick_one(tmp_path: Path) -> None:
    bench, run_record = _module("dynamic_embeddings"), _module("run_record")
    table = _module("figures_vocab")
    assert table.dynamic_embeddings_table(tmp_path) == table.NO_RUN
    record = run_record.begin("dynamic_embeddings")
    run_record.write(tmp_path / "quick.json", _result(bench, quick=True), record)
    assert table.dynamic_embeddings_table(tmp_path) == table.NO_RUN
    run_record.write(tmp_path / "full.json", _result(bench), record)
    text = table.dynamic_embeddings_table(tmp_path)
    assert "`full.json`" in text and "quick.json" not in text
    assert (
        "| **`DynamicEmbedding`, `policy='lfu'`** | `fit` | 0.7000 | +0.0200 | 120 | 1.20x" in text
    )
    assert "512 (512) / 900 / 388 / 0 | 3e-07 |" in text
    assert "cold samples/s vs hashing 0.7000 (bar >= 0.8x): **missed**" in text
    assert "collisions among admitted ids - (bar 0 over every run): **not counted**" in text


def test_the_bench_refuses_a_vocabulary_under_20x_the_capacity(capsys) -> None:  # type: ignore[no-untyped-def]
    bench = _module("dynamic_embeddings")
    with pytest.raises(SystemExit):
        bench.parse_args(["--capacity", "1024", "--vocabulary", "20000"])
    assert "at least 20x" in capsys.readouterr().err
    args = bench.parse_args(["--quick"])
    assert args.vocabulary >= 20 * args.capacity
    assert isinstance(args, argparse.Namespace) and json.dumps(vars(args))
