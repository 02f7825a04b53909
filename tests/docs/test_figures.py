"""The figures the README and docs/ quote are written from bench/results/*.json, never typed.

``bench/figures.py`` writes the text between ``<!-- figures:NAME -->`` and
``<!-- /figures -->``; these tests write it again in memory and compare.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.docs.conftest import ROOT

pytestmark = pytest.mark.docs

BENCH = ROOT / "bench"


def _module(name: str) -> ModuleType:
    """A module of bench/ (a folder of scripts, not a package), imported from its file."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_documents_match_what_bench_figures_writes_from_the_results() -> None:
    figures = _module("figures")
    documents = figures.rendered()
    assert documents, "bench/figures.py names no document"
    for path, (committed, written) in documents.items():
        assert committed == written, (
            f"{path.relative_to(ROOT)} differs from what bench/figures.py writes from "
            "bench/results: run `python bench/figures.py` and commit the result"
        )


def test_every_block_is_quoted_and_every_quoted_block_is_known() -> None:
    figures = _module("figures")
    text = "".join((ROOT / name).read_text() for name in figures.DOCUMENTS)
    quoted = re.findall(r"<!-- figures:([\w:.-]+) -->", text)
    assert sorted(set(quoted)) == sorted(figures.blocks()), quoted
    assert text.count("<!-- /figures -->") == len(quoted)


def test_every_headline_benchmark_is_on_the_benchmarks_page() -> None:
    figures = _module("figures")
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    for name in ("keras_fit", "inference", "embeddings", "streaming", "tune_searches", "comm"):
        assert f"<!-- figures:runs:{name} -->" in page, name
        assert name in figures.METHODS


def test_a_recorded_run_carries_commit_versions_load_and_is_quoted_first(
    tmp_path: Path,
) -> None:
    run_record = _module("run_record")
    runs = _module("figures_runs")
    stored = json.loads((BENCH / "results" / "streaming.json").read_text())
    stored.pop("stored")
    record = run_record.begin("streaming")
    run_record.write(tmp_path / "later" / "streaming_again.json", stored, record)
    data = json.loads((tmp_path / "later" / "streaming_again.json").read_text())
    run = data["run"]
    assert run["benchmark"] == "streaming"
    assert re.fullmatch(r"[0-9a-f]{40}", run["commit"]), run["commit"]
    assert isinstance(run["dirty"], bool)
    assert {"tensorspark", "pyspark", "tensorflow", "keras", "python"} <= set(run["versions"])
    assert run["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert len(run["load_average_start"]) == 3 and len(run["load_average_end"]) == 3
    assert run["cpus"] >= 1 and run["started"] <= run["ended"]
    # A run that records itself is found wherever it lies and quoted before older ones.
    (tmp_path / "streaming.json").write_text((BENCH / "results" / "streaming.json").read_text())
    found = runs.runs("streaming", tmp_path)
    assert [r.name for r in found] == ["later/streaming_again.json", "streaming.json"]
    assert found[0].commit.startswith(f"`{run['commit'][:7]}`")
    assert found[1].commit.startswith("stored in `")


def test_a_missed_bar_is_reported_as_missed() -> None:
    runs = _module("figures_runs")
    by_name = {r.name: r for r in runs.runs("tune_searches")}
    _, checks = runs.tune_searches(by_name["tune_searches_loaded.json"])
    assert runs.verdict(checks).startswith("**missed**")
    met, of = _module("figures").auc_tally()
    assert of >= 3 and met < of


def test_the_elastic_seeds_table_pairs_each_loss_with_its_own_seed() -> None:
    """``bench/elastic.py --seeds N``: a loss of seed s is measured against seed s's
    uninterrupted run (not seed 0's), and the table's mean is the mean of those pairs."""
    elastic = _module("figures_elastic")
    runs = _module("figures_runs")
    seeded = [r for r in runs.runs("elastic") if len(r.data.get("seed_accuracies", ())) >= 2]
    assert seeded, "no stored bench/elastic.py run with --seeds"
    data = seeded[0].data
    table = elastic.seeds_table(data)
    diffs = []
    for name, run in data["runs"].items():
        if name.startswith("lost_at_60"):
            seed = run["seed"]
            if seed == 0:  # the baseline: the uninterrupted runs before and after the others
                first, again = data["runs"]["uninterrupted"], data["runs"]["uninterrupted_again"]
                base = (first["test_accuracy"] + again["test_accuracy"]) / 2
            else:
                base = data["runs"][f"uninterrupted_seed_{seed}"]["test_accuracy"]
            diff = round(run["test_accuracy"] - base, 4)
            assert abs(run["ratios"]["accuracy_minus_uninterrupted"] - diff) < 1e-9, name
            diffs.append(diff)
    assert len(diffs) == len(data["seed_accuracies"]) >= 2
    (mean_row,) = [line for line in table if line.startswith("| mean over")]
    assert mean_row.startswith(f"| mean over {len(diffs)} seeds |")
    assert mean_row.rstrip(" |").endswith(f"{sum(diffs) / len(diffs):+.4f}")


def test_the_stream_checkpoint_summary_means_each_kind_against_the_bars() -> None:
    """``bench/stream_checkpoints.py``: each kind's bytes and seconds are the means over the
    micro-batches of that kind, the ratios full over increment, and a ratio under its bar
    is reported missed."""
    stream = _module("stream_checkpoints")
    args = stream.parse_args(["--rows", "1000"])
    records = [
        {"checkpoint_kind": "full", "checkpoint_bytes": 1000, "checkpoint_s": 2.0},
        {"checkpoint_kind": "increment", "checkpoint_bytes": 10, "checkpoint_s": 0.1},
        {"checkpoint_kind": "increment", "checkpoint_bytes": 30, "checkpoint_s": 0.3},
        {"checkpoint_kind": "full", "checkpoint_bytes": 3000, "checkpoint_s": 4.0},
    ]
    out = stream.summary(records, [5, 9, 7, 3], args)
    assert out["kinds"]["full"] == {"count": 2, "bytes": 2000.0, "seconds": 3.0}
    assert out["kinds"]["increment"]["count"] == 2
    assert out["ratios"]["bytes"] == pytest.approx(100.0)
    assert out["ratios"]["seconds"] == pytest.approx(15.0)
    assert out["targets_met"] == {"bytes": True, "seconds": True}
    assert out["changed_fraction_max"] == pytest.approx(0.009)
    records[1]["checkpoint_s"] = records[2]["checkpoint_s"] = 1.0  # 3x less time: missed
    assert stream.summary(records, [5, 9, 7, 3], args)["targets_met"]["seconds"] is False
