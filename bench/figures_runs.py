"""The stored runs of each headline benchmark, read from ``bench/results/``, and their bars.

``bench/figures.py`` writes the documentation's figures from what this module reads, so no
figure is typed by hand. A run is one JSON file. A benchmark's runs are the files whose
``"run"`` record (``bench/run_record.py``) names it, wherever under ``bench/results/`` they
are, plus the files stored before runs recorded themselves (:data:`EARLIER`), which carry a
``"stored"`` record instead: the commit that stored them and its date, from git history.
Runs are ordered newest first: by date, then (for one date) in :data:`EARLIER`'s order.
A ``--quick`` smoke run is never quoted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

#: The files each benchmark stored before runs recorded their commit, newest first.
EARLIER: dict[str, tuple[str, ...]] = {
    "keras_fit": ("keras_fit_spark43.json", "keras_fit_spark35.json", "keras_fit.json"),
    "inference": (
        "inference_spark43.json",
        "inference_spark35.json",
        "inference.json",
        "inference_mlp.json",
    ),
    "inference_first_call": ("inference_first_call.json",),
    "embeddings": (
        "embeddings.json",
        "embeddings_1m_two_rounds.json",
        "embeddings_1m_one_round.json",
        "embeddings_100k_0620.json",
        "embeddings_quiet.json",
        "embeddings_rerun.json",
    ),
    "streaming": ("streaming.json",),
    "tune_searches": ("tune_searches.json", "tune_searches_loaded.json"),
    "comm": ("comm.json",),
    "ps_capacity": ("ps_capacity.json",),
}


@dataclass(frozen=True)
class Run:
    """One stored run: its file, its data and where and when it came from."""

    path: Path
    data: dict[str, Any]
    results: Path = RESULTS

    @property
    def name(self) -> str:
        return self.path.relative_to(self.results).as_posix()

    @property
    def recorded(self) -> bool:
        """Whether the run recorded itself (``"run"``) rather than being dated afterwards."""
        return "run" in self.data

    @property
    def date(self) -> str:
        if self.recorded:
            return str(self.data["run"]["started"]).replace("T", " ").replace("Z", " UTC")
        return str(self.data["stored"]["date"])

    @property
    def commit(self) -> str:
        if self.recorded:
            run = self.data["run"]
            if not run.get("commit"):
                return "commit not recorded (no git checkout)"
            short = str(run["commit"])[:7]
            return f"`{short}`" + (" (uncommitted changes)" if run.get("dirty") else "")
        return f"stored in `{str(self.data['stored']['commit'])[:7]}`"

    @property
    def cite(self) -> str:
        """``(run of 2026-11-26, stored in `abc1234`, `x.json`)``: a quoted figure's source."""
        return f"(run of {self.date}, {self.commit}, `{self.name}`)"

    @property
    def load(self) -> str:
        """The 1-minute load average at the start and end, or what the run kept of it."""
        d = self.data
        if self.recorded:
            run = d["run"]
            start, end = run["load_average_start"][0], run["load_average_end"][0]
            return f"{start:.1f} to {end:.1f} ({run['cpus']} CPUs)"
        before = d.get("load_average_before") or d.get("loadavg_before")
        machine = d.get("machine") if isinstance(d.get("machine"), dict) else {}
        after = (
            d.get("load_average_after")
            or d.get("loadavg_after")
            or machine.get("load_average_after")
        )
        if after is None and "load_average_1m_at_end" in d:
            after = [d["load_average_1m_at_end"]]
        if before and after:
            return f"{before[0]:.1f} to {after[0]:.1f}"
        if after:
            return f"{after[0]:.1f} at the end"
        return "not recorded"

    @property
    def versions(self) -> str:
        found = self.data["run"]["versions"] if self.recorded else self.data.get("versions")
        if not found:
            return "not recorded"
        return f"pyspark {found['pyspark']}, TF {found['tensorflow']}, Python {found['python']}"


def runs(benchmark: str, results: Path = RESULTS) -> list[Run]:
    """Every stored run of ``benchmark``, newest first."""
    earlier = EARLIER.get(benchmark, ())
    found: list[Run] = []
    for path in sorted(results.rglob("*.json")):
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("quick") is True:
            continue  # a smoke run (``--quick``) measures nothing to quote
        mine = data.get("run", {}).get("benchmark") == benchmark
        if mine or (path.parent == results and path.name in earlier and "stored" in data):
            found.append(Run(path, data, results))

    def order(run: Run) -> int:
        return earlier.index(run.path.name) if run.path.name in earlier else -1

    found.sort(key=order)
    found.sort(key=lambda r: r.date, reverse=True)
    if not found:
        raise FileNotFoundError(f"no stored run of {benchmark} in {results}")
    return found


def other_runs(results: Path = RESULTS) -> list[Run]:
    """Every stored run that no headline benchmark claims, by file name."""
    claimed = {r.path for name in EARLIER for r in runs(name, results)}
    found = []
    for path in sorted(results.rglob("*.json")):
        data = json.loads(path.read_text())
        if path not in claimed and isinstance(data, dict) and ("run" in data or "stored" in data):
            found.append(Run(path, data, results))
    return found


def rounds(n: int) -> str:
    """``1 round``, ``3 rounds``."""
    return f"{n} round{'s' if n > 1 else ''}"


def verdict(checks: dict[str, bool]) -> str:
    """``met`` when every bar is met, else which were missed, in bold."""
    missed = [name for name, ok in checks.items() if not ok]
    return "met" if not missed else "**missed**: " + ", ".join(missed)


# One summary per benchmark: the figures of a run as text, and its bars.


def keras_fit(run: Run) -> tuple[str, dict[str, bool]]:
    d = run.data
    cold, single = d["spark"]["cold"], d["single_process"]
    text = (
        f"cold `fit` {cold['seconds']:.2f} s vs {single['fit_s']:.2f} s = "
        f"**{cold['ratio_vs_single']:.2f}x**; accuracy gap {cold['accuracy_gap']:.4f}; "
        f"warm {d['spark']['warm']['ratio_vs_single']:.2f}x; cold without the warm-up "
        f"{d['spark']['cold_without_warm_up']['ratio_vs_single']:.2f}x; "
        f"{rounds(d['setup']['rounds'])}"
    )
    checks = {
        "cold ≥ 0.95x": cold["ratio_vs_single"] >= 0.95,
        "gap ≤ 0.01": cold["accuracy_gap"] <= 0.01,
    }
    return text, checks


def inference(run: Run) -> tuple[str, dict[str, bool]]:
    d = run.data
    binary, rdd, floats = d["dataframe_binary"], d["rdd"], d["dataframe"]
    text = (
        f"{d['model']}, {d['rows']:,} rows: single process "
        f"{d['single_process']['rows_per_s']:,.0f} rows/s; binary DataFrame "
        f"**{binary['ratio']:.2f}x**; RDD {rdd['ratio']:.2f}x; `array<float>` "
        f"{floats['ratio']:.2f}x; cold first call {binary['cold_seconds']:.1f} s"
    )
    return text, {"binary DataFrame ≥ 0.9x": binary["ratio"] >= 0.9}


def inference_first_call(run: Run) -> tuple[str, dict[str, bool]]:
    s = run.data["summary"]
    text = (
        f"first call at once {s['none']['first_s']:.1f} s vs {s['none']['warm_s']:.1f} s warm "
        f"= **{s['none']['ratio']:.2f}x**; `warm_up` then the call at once "
        f"{s['at_once']['ratio']:.2f}x; after a finished warm-up {s['after']['ratio']:.2f}x"
    )
    return text, {"first call ≤ 2x without a warm-up": s["none"]["ratio"] <= 2.0}


def embeddings_auc_ok(run: Run) -> bool | None:
    """Row-sparse and int8 AUC within 0.005 of dense and of single (None: not measured)."""
    s = run.data["summary"]
    diffs = [
        s.get(name, {}).get(key)
        for name in ("sparse", "sparse_int8")
        for key in ("auc_minus_dense", "auc_minus_single")
    ]
    if any(x is None for x in diffs):
        return None
    return all(abs(x) <= 0.005 for x in diffs)


def embeddings(run: Run) -> tuple[str, dict[str, bool]]:
    d = run.data
    s, args = d["summary"], d["args"]
    head = f"{args['train']:,} examples, {rounds(args.get('rounds') or 1)}: "
    if "sparse_cached" in s:
        return cached_embeddings(run, head)
    if "dense" not in s:
        sparse = s["sparse"]
        text = head + (
            f"configurations {args['configs']} only; row-sparse steady "
            f"{sparse['samples_per_s_vs_single']:.2f}x single, AUC "
            f"{sparse['auc_minus_single']:+.4f} from single"
        )
        return text, {"AUC within 0.005 of single": abs(sparse["auc_minus_single"]) <= 0.005}
    sp, i8 = s["sparse"], s["sparse_int8"]
    cold = "cold_samples_per_s_vs_single"
    if cold not in sp:
        cold = "whole_fit_samples_per_s_vs_single"
    text = head + (
        f"row-sparse **{sp['fewer_bytes_than_dense']:.1f}x** fewer bytes than dense, int8 "
        f"**{i8['fewer_bytes_than_dense']:.0f}x**; epoch {sp['epoch_faster_than_dense']:.1f}x "
        f"faster; cold fit **{sp[cold]:.2f}x** single (int8 {i8[cold]:.2f}x), steady epochs "
        f"{sp['samples_per_s_vs_single']:.2f}x; AUC row-sparse "
        f"{sp['auc_minus_dense']:+.4f} from dense, {sp['auc_minus_single']:+.4f} from single; "
        f"int8 {i8['auc_minus_dense']:+.4f}, {i8['auc_minus_single']:+.4f}"
    )
    checks = {
        "≥ 30x bytes": sp["fewer_bytes_than_dense"] >= 30,
        "≥ 100x int8": i8["fewer_bytes_than_dense"] >= 100,
        "≥ 5x epoch": sp["epoch_faster_than_dense"] >= 5,
        "cold ≥ 0.8x": sp[cold] >= 0.8 and i8[cold] >= 0.8,
        "AUC within 0.005": bool(embeddings_auc_ok(run)),
    }
    return text, checks


def combiner(run: Run) -> str:
    """The weight combiner of an embeddings run's Spark configurations (runs before
    ``--combiner``: the default, DynSGD)."""
    return str(run.data["args"].get("combiner") or "dynsgd")


def cached_embeddings(run: Run, head: str) -> tuple[str, dict[str, bool]]:
    """A run with the worker row cache (``sparse_cached``): its table, the worker's peak
    RSS, bytes per sample and cold speed against the uncached path and single."""
    d = run.data
    c, row = d["summary"]["sparse_cached"], d["configs"]["sparse_cached"]
    table = row["table"]
    rss = max(row["worker_peak_rss_mib"], default=0.0)
    if combiner(run) != "dynsgd":
        head += f"`weight_combiner='{combiner(run)}'`, "
    text = head + (
        f"row cache of {int(row['settings']['row_cache']):,} rows on a {table['rows']:,} x "
        f"{table['dim']} table ({table['mib']:,.0f} MiB): worker peak RSS **{rss:,.0f} MiB**, "
        f"cold fit **{c['cold_samples_per_s_vs_single']:.2f}x** single, steady epochs "
        f"{c['samples_per_s_vs_single']:.2f}x, AUC {c['auc_minus_single']:+.4f} from single"
    )
    checks = {"AUC within 0.005 of single": abs(c["auc_minus_single"]) <= 0.005}
    if "bytes_per_sample_vs_sparse" in c:
        text += (
            f"; against the uncached path: bytes per sample "
            f"**{c['bytes_per_sample_vs_sparse']:.2f}x**, worker RSS "
            f"{c['worker_peak_rss_vs_sparse']:.2f}x"
        )
        checks["bytes ≤ 1.2x uncached"] = c["bytes_per_sample_vs_sparse"] <= 1.2
        checks["cold ≥ 0.8x"] = c["cold_samples_per_s_vs_single"] >= 0.8
    return text, checks


def streaming(run: Run) -> tuple[str, dict[str, bool]]:
    d = run.data
    stream, fit = d["stream"], d["fit"]
    fresh = "; ".join(
        f"freshness p50/p99 {f['lag_p50_s']:.1f} / {f['lag_p99_s']:.1f} s at trigger "
        f"{f['trigger_s']:.0f} s"
        for f in d["freshness"]
    )
    text = (
        f"stream {stream['rows_per_s']:,.0f} vs `fit` {fit['rows_per_s']:,.0f} rows/s = "
        f"**{stream['ratio_to_fit']:.2f}x**; checkpoint "
        f"{d['exactly_once']['checkpoint_s_mean'] * 1000:.1f} ms = "
        f"{d['exactly_once']['share_of_batch']:.2%} of a batch; {fresh}"
    )
    return text, {"≥ 0.8x": stream["ratio_to_fit"] >= 0.8}


def tune_searches(run: Run) -> tuple[str, dict[str, bool]]:
    d = run.data
    tpe = d["searches"].get("tpe", {})
    text = (
        f"grid's best {d['grid_best_score']:.3f}; `MedianPruner` saves "
        f"**{d['pruning_saves_trial_s']:.1%}** of TPE's trial-seconds (best equal: "
        f"{'yes' if d['pruning_equal_best'] else 'no'}), `HyperbandPruner` "
        f"**{d['hyperband_saves_trial_s']:.1%}** (best equal: "
        f"{'yes' if d['hyperband_equal_best'] else 'no'})"
    )
    if "trial_s" in tpe:
        text += f"; TPE {tpe['trial_s']:.1f} trial-s"
    checks = {
        "median ≥ 30 % at an equal best": d["pruning_saves_trial_s"] >= 0.3
        and bool(d["pruning_equal_best"]),
        "Hyperband ≥ 30 % at an equal best": d["hyperband_saves_trial_s"] >= 0.3
        and bool(d["hyperband_equal_best"]),
    }
    return text, checks


def comm_bytes(run: Run) -> tuple[str, float]:
    """Which bytes per sample :func:`comm` compares, and how many times fewer int8 + nesterov
    sent than the default: to the target (medians over the seeds), or over the whole run
    when the default's median seed never reached the target (then "to the target" has no
    value for it; the run's bytes per sample are what both sent for the same epochs)."""
    configs = run.data["configs"]
    base, best = configs["default"], configs["int8_nesterov_1000"]
    reached = base["bytes_per_sample_to_target"] is not None
    key = "bytes_per_sample_to_target" if reached else "bytes_per_sample_run"
    return key, base[key] / best[key]


#: comm's accuracy bar, one-sided (the check in :func:`comm`), as every page words it.
COMM_ACCURACY_BAR = "accuracy at most 0.01 below the default's"


def comm(run: Run) -> tuple[str, dict[str, bool]]:
    configs = run.data["configs"]
    setup = run.data["setup"]
    base, best = configs["default"], configs["int8_nesterov_1000"]
    target, repeats = setup["target"], setup["repeats"]
    key, fewer = comm_bytes(run)
    reached = key == "bytes_per_sample_to_target"
    text = (
        f"int8 + nesterov at `sync_interval=1000`: {best[key]:.1f} vs {base[key]:.0f} "
        f"B/sample{'' if reached else ' over the run'} = **{fewer:.0f}x fewer**; final "
        f"accuracy {best['final_test_accuracy']:.4f} vs {base['final_test_accuracy']:.4f}; "
    )
    if reached and best["seconds_to_target"] is not None:
        text += (
            f"time to {target} {best['seconds_to_target']:.2f} vs "
            f"{base['seconds_to_target']:.2f} s ({repeats} seeds, medians)"
        )
        faster = best["seconds_to_target"] <= base["seconds_to_target"]
    else:
        text += (
            f"{target} reached in {best['reached_target']} of {repeats} seeds vs "
            f"{base['reached_target']} of {repeats} for the default (medians)"
        )
        faster = best["reached_target"] >= base["reached_target"]
    checks = {
        "≥ 50x": fewer >= 50,
        COMM_ACCURACY_BAR: best["final_test_accuracy"] >= base["final_test_accuracy"] - 0.01,
        "time no worse": faster,
    }
    return text, checks


def ps_capacity_range(run: Run, params: int) -> tuple[int, int]:
    """The fewest and most workers at one sync per second for a model of ``params``."""
    found = [r["workers_at_1_sync_per_s"] for r in run.data["rows"] if r["params"] == params]
    return min(found), max(found)


def ps_capacity(run: Run) -> tuple[str, dict[str, bool]]:
    small, large = ps_capacity_range(run, 1_000_000), ps_capacity_range(run, 25_000_000)
    text = (
        f"1M parameters: **{small[0]}** to **{small[1]}** workers at one sync per second; "
        f"25M: **{large[0]}** to **{large[1]}**"
    )
    return text, {"≥ 100 at 1M": small[0] >= 100, "≥ 10 at 25M": large[0] >= 10}


SUMMARIES = {
    "keras_fit": keras_fit,
    "inference": inference,
    "inference_first_call": inference_first_call,
    "embeddings": embeddings,
    "streaming": streaming,
    "tune_searches": tune_searches,
    "comm": comm,
    "ps_capacity": ps_capacity,
}
