"""The guides' tables of figures, written from ``bench/results/*.json``.

Part of ``bench/figures.py`` (which rewrites the generated blocks and explains them): the
communication guide's table of settings (``comm.json``) and its table of server capacity
(``ps_capacity.json``), each from the newest stored run, with that run's date and commit.
"""

from __future__ import annotations

from collections.abc import Callable

import figures_checkpoints  # bench/figures_checkpoints.py: full against incremental
import figures_elastic  # bench/figures_elastic.py: elastic sync's runs
import figures_journal  # bench/figures_journal.py: the shard journal's cost
import figures_runs as fr
import figures_vocab  # bench/figures_vocab.py: the unbounded vocabularies' table

#: The comm.py configurations in the guide's order, and how the guide names them.
COMM_LABELS = {
    "default": "default: float32, `sync_interval=20`, DynSGD, async",
    "bf16": "`compression='bf16'`",
    "int8": "`compression='int8'`",
    "int8_pushonly": "int8 pushes, float32 pulls",
    "nesterov_200": "nesterov, `sync_interval=200`, sync",
    "nesterov_1000": "nesterov, `sync_interval=1000`, sync",
    "int8_nesterov_1000": "**int8 + nesterov, `sync_interval=1000`, sync**",
    "nesterov_1000_async": "nesterov, `sync_interval=1000`, async",
}


def comm_table() -> str:
    """Bytes per sample to the target, accuracy and time, per configuration; the bars."""
    run = fr.runs("comm")[0]
    configs, setup = run.data["configs"], run.data["setup"]
    base = configs["default"]
    target, seeds = setup["target"], setup["repeats"]
    lines = [
        f"Newest stored run {run.cite}, load {run.load}:",
        "",
        f"| configuration | bytes/sample to {target} | fewer than default | test accuracy "
        f"after {setup['epochs']} epochs | reached {target} (of {seeds}) | time to {target} |",
        "|---|---|---|---|---|---|",
    ]
    key, _ = fr.comm_bytes(run)  # to the target, or over the run if the default missed it
    for name, label in COMM_LABELS.items():
        if name not in configs:
            continue
        c = configs[name]
        # A configuration that never reached the target (the default did): over the run.
        mine = key if c[key] is not None else "bytes_per_sample_run"
        fewer = base[mine] / c[mine]
        ratio = "1x" if name == "default" else f"{fewer:.1f}x" if fewer < 50 else f"{fewer:.0f}x"
        if mine == "bytes_per_sample_run":
            ratio += " (over the run)"
        if c["bytes_per_sample_to_target"] is None:
            lines.append(
                f"| {label} | - | {ratio} ({c['bytes_per_sample_run']:.1f} B/sample over the "
                f"run) | {c['final_test_accuracy']:.4f} | {c['reached_target']} | never |"
            )
            continue
        time = f"{c['seconds_to_target']:.2f} s"
        if name != "default" and base["seconds_to_target"] is not None:
            time += f" ({c['seconds_to_target'] / base['seconds_to_target']:.2f}x)"
        lines.append(
            f"| {label} | {c['bytes_per_sample_to_target']:.1f} | {ratio} | "
            f"{c['final_test_accuracy']:.4f} | {c['reached_target']} | {time} |"
        )
    best = configs["int8_nesterov_1000"]
    text, checks = fr.comm(run)
    timing = (
        f", time to {target} "
        f"{best['seconds_to_target'] / base['seconds_to_target']:.2f}x the default's"
        if base["seconds_to_target"] is not None and best["seconds_to_target"] is not None
        else f"; the default's median seed did not reach {target}"
    )
    lines += [
        "",
        f"- **Bars ({fr.verdict(checks)}) in the medians:** {text}; accuracy "
        f"{best['final_test_accuracy'] - base['final_test_accuracy']:+.4f} from the default's "
        f"(bar: at most 0.01 below it){timing}.",
    ]
    return "\n".join(lines)


def _codec(row: dict) -> str:
    return row["compression"] or "float32"


def ps_capacity_table() -> str:
    """Workers one driver serves, per model size, shard count and codec; the bars."""
    run = fr.runs("ps_capacity")[0]
    lines = [
        f"Newest stored run {run.cite}:",
        "",
        "| params | shards | codec | server CPU ms/update (all processes) | busiest process "
        "ms | KB in / out per update | loop CPU / memory / network ceiling (updates/s) | "
        "**workers** | ends it |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in run.data["rows"]:
        ceilings = r["ceilings_updates_per_s"]
        cpu, busiest = r["server_cpu_s_per_update"] * 1000, r["busiest_cpu_s_per_update"] * 1000
        digits = 2 if cpu < 20 else 1
        lines.append(
            f"| {r['size']} | {r['shards']} | {_codec(r)} | {cpu:.{digits}f} | "
            f"{busiest:.{digits}f} | {r['received_bytes_per_update'] / 1000:,.0f} / "
            f"{r['sent_bytes_per_update'] / 1000:,.0f} | "
            f"{ceilings['loop CPU']:,.0f} / {ceilings['memory bandwidth']:,.0f} / "
            f"{ceilings['network 10 Gbit/s']:,.0f} | **{r['workers_at_1_sync_per_s']}** | "
            f"{r['limited_by'].replace(' 10 Gbit/s', '').replace(' bandwidth', '')} |"
        )
    text, checks = fr.ps_capacity(run)
    lines += ["", f"- **Bars ({fr.verdict(checks)}):** {text} (≥ 100 at 1M, ≥ 10 at 25M)."]
    return "\n".join(lines)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _tune_row(label: str, first: dict, second: dict, saved: str) -> str:
    mean = (first["trial_s"] + second["trial_s"]) / 2
    return (
        f"| {label} | {first['trial_s']:.1f} / {second['trial_s']:.1f} ({mean:.1f}) | "
        f"{first['epochs_trained']} / {second['epochs_trained']} | {saved} | "
        f"{first['best_score']:.4f} / {second['best_score']:.4f} |"
    )


def tune_searches_measured() -> str:
    """The Optuna guide's measured searches: the newest run's table and every run's bars."""
    every = fr.runs("tune_searches")
    run = every[0]
    d = run.data
    found, again = d["searches"], d["second_runs"]
    grid, tpe = found["grid"], found["tpe"]
    lines = [
        f"Newest stored run {run.cite}, load {run.load}: {d['rows']:,} rows, "
        f"{d['epochs']} epochs per trial, a budget of {d['budget']} trials on "
        f"`{d['master']}`. The grid's best, {d['grid_best_score']:.3f}, came after "
        f"{grid['trials_to_grid_best']} of its {grid['trials']} trials "
        f"({grid['trial_s_to_grid_best']:.0f} trial-seconds, the executors' seconds summed); "
        f"random search's best {found['random']['best_score']:.3f}; TPE was within "
        f"{d['tolerance']} at its {_ordinal(tpe['trials_to_target'])} trial and "
        + (
            f"matched the grid's best at its {_ordinal(tpe['trials_to_grid_best'])}."
            if tpe["trials_to_grid_best"] is not None
            else f"did not match the grid's best in its {tpe['trials']} trials (its best "
            f"{tpe['best_score']:.4f})."
        ),
        "",
        "| search | trial-seconds, run 1 / run 2 (mean) | epochs trained, run 1 / run 2 | "
        "saved vs TPE (mean) | best score, run 1 / run 2 |",
        "|---|---|---|---|---|",
        _tune_row("TPE", tpe, again["tpe"], ""),
        _tune_row(
            "TPE + `MedianPruner`",
            found["tpe_median"],
            again["tpe_median"],
            f"**{d['pruning_saves_trial_s']:.1%}** ({d['pruning_saves_epochs']:.0%} of epochs)",
        ),
        _tune_row(
            "TPE + `HyperbandPruner`",
            found["tpe_hyperband"],
            again["tpe_hyperband"],
            f"**{d['hyperband_saves_trial_s']:.1%}** ({d['hyperband_saves_epochs']:.0%} of epochs)",
        ),
        "",
        f"A trial: **{d['trial_s_fixed']:.2f} s fixed + {d['trial_s_per_epoch']:.2f} s per "
        "epoch**, fitted over the pruned searches' trials. The bar, pruning saves at least "
        "30 % of trial-seconds at an equal best score, in every stored run: "
        + "; ".join(
            f"{r.date} `{r.name}` (load {r.load}): {fr.verdict(fr.tune_searches(r)[1])}"
            for r in every
        )
        + ".",
    ]
    return "\n".join(lines)


def named(benchmark: str, name: str) -> fr.Run:
    """The stored run of ``benchmark`` in the file ``name``."""
    return next(r for r in fr.runs(benchmark) if r.name == name)


def _env(run: fr.Run) -> str:
    v = run.data["versions"]
    python = ".".join(v["python"].split(".")[:2])
    return f"Spark {v['pyspark']}, TF {v['tensorflow']}, Python {python}"


#: The pair of runs docs/support.md compares (issue 31): the oldest and the default setup.
SUPPORT_FIT = ("keras_fit_spark35.json", "keras_fit_spark43.json")
SUPPORT_INFERENCE = ("inference_spark35.json", "inference_spark43.json")


def support_inference() -> str:
    """Scoring on Spark 3.5 and 4.3 (docs/support.md), from the named pair of runs."""
    old, new = (named("inference", n) for n in SUPPORT_INFERENCE)

    def cell(run: fr.Run, kind: str, bold: bool = False) -> str:
        rate, ratio = run.data[kind]["rows_per_s"], run.data[kind]["ratio"]
        text = f"{rate:,.0f} ({ratio:.2f}x)"
        return f"**{text}**" if bold else text

    def same(run: fr.Run) -> str:
        worst = max(run.data[f"{k}_max_abs_diff"] for k in ("rdd", "dataframe", "dataframe_binary"))
        return "identical (max abs diff 0)" if worst == 0 else f"max abs diff {worst:.1e}"

    floats = old.data["dataframe"]["rows_per_s"] / new.data["dataframe"]["rows_per_s"]
    binary = old.data["dataframe_binary"]["rows_per_s"] / new.data["dataframe_binary"]["rows_per_s"]
    single = old.data["single_process"]["rows_per_s"] / new.data["single_process"]["rows_per_s"]
    return "\n".join(
        [
            f"| rows/s (ratio to single-process `model.predict` in the same environment), "
            f"{old.data['rows']:,} rows | {_env(old)} | {_env(new)} |",
            "|---|---|---|",
            f"| single process `model.predict` | {old.data['single_process']['rows_per_s']:,.0f} "
            f"| {new.data['single_process']['rows_per_s']:,.0f} |",
            "| DataFrame, `binary` column (3.5: `pandas_udf`; 4.3: `arrow_udf`) | "
            f"{cell(old, 'dataframe_binary')} | {cell(new, 'dataframe_binary')} |",
            "| DataFrame, `array<float>` column (the same) | "
            f"{cell(old, 'dataframe', True)} | {cell(new, 'dataframe', True)} |",
            "| RDD (`mapPartitions`, the same on both) | "
            f"{cell(old, 'rdd')} | {cell(new, 'rdd')} |",
            f"| predictions vs `model.predict` | {same(old)} | {same(new)} |",
            "",
            "The `array<float>` column is where the pandas path costs most (every row becomes "
            "one numpy object on the way in and one on the way out): "
            f"{old.data['dataframe']['rows_per_s']:,.0f} rows/s on 3.5 against "
            f"{new.data['dataframe']['rows_per_s']:,.0f} on 4.3's Arrow path, {floats:.2f}x. "
            f"The binary column's bytes pass through pandas cheaply ({binary:.2f}x of 4.3). "
            f"TensorFlow {old.data['versions']['tensorflow']} is itself slower here than "
            f"{new.data['versions']['tensorflow']} (single process {single:.2f}x), which is in "
            "every row of the 3.5 column.",
        ]
    )


def support_fit() -> str:
    """Keras ``fit`` on Spark 3.5 and 4.3 (docs/support.md), from the named pair of runs."""
    old, new = (named("keras_fit", n) for n in SUPPORT_FIT)

    def single(run: fr.Run, first: bool) -> str:
        s = run.data["single_process"]
        acc = sum(r["final_test_accuracy"] for r in s["runs"]) / len(s["runs"])
        words = ("Keras import ", " apart), accuracy ") if first else ("import ", "), ")
        return f"{s['fit_s']:.2f} s ({words[0]}{s['import_s']:.1f} s{words[1]}{acc:.4f}"

    def spark(run: fr.Run, key: str) -> str:
        row = run.data["spark"][key]
        return f"{row['seconds']:.2f} s, {row['ratio_vs_single']:.2f}x"

    def cold(run: fr.Run, first: bool) -> str:
        row = run.data["spark"]["cold"]
        acc = (
            f"accuracy {row['final_test_accuracy']:.4f}"
            if first
            else (f"{row['final_test_accuracy']:.4f}")
        )
        return f"**{spark(run, 'cold')}**, {acc} (gap {row['accuracy_gap']:.4f})"

    return "\n".join(
        [
            f"| | {_env(old)} | {_env(new)} |",
            "|---|---|---|",
            f"| single-process `model.fit` | {single(old, True)} | {single(new, False)} |",
            "| **cold** `fit` (from `SparkSession(...)`, warm-up on) | "
            f"{cold(old, True)} | {cold(new, False)} |",
            "| cold without warm-up | "
            f"{spark(old, 'cold_without_warm_up')} | {spark(new, 'cold_without_warm_up')} |",
            "| cold, `fit` called once the warm-up is done | "
            f"{spark(old, 'cold_after_warm_up')} | {spark(new, 'cold_after_warm_up')} |",
            "| warm (a second session in the same application) | "
            f"{spark(old, 'warm')} | {spark(new, 'warm')} |",
        ]
    )


EMBEDDING_LABELS = {
    "dense": "dense float32 (`embeddings='dense'`)",
    "sparse": "**row-sparse** (default)",
    "sparse_int8": "**row-sparse + `compression='int8'`**",
    "single": "single-process Keras (`model.fit`)",
}


def embeddings_table() -> str:
    """The embeddings guide's table: the newest 1M-example run, per configuration."""
    run = next(
        r
        for r in fr.runs("embeddings")
        if r.data["args"]["train"] >= 1_000_000 and "dense" in r.data["summary"]
    )
    configs = run.data["configs"]
    dense, single = configs["dense"], configs["single"]
    lines = [
        f"Newest 1M-example run {run.cite}, load {run.load}, "
        f"{fr.rounds(run.data['args'].get('rounds') or 1)}:",
        "",
        "| configuration | test AUC (runs) | log loss | bytes / sample | fewer than dense | "
        "steady epoch | faster than dense | samples/s steady (vs single) | **cold fit** | "
        "**samples/s cold (vs single)** | worker peak RSS | driver RSS growth | rows per sync "
        "pushed / pulled |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, label in EMBEDDING_LABELS.items():
        c = configs[name]
        aucs = [r["auc"] for r in c.get("runs", [])]
        each = "every run" if len(set(aucs)) == 1 else ", ".join(f"{a:.4f}" for a in aucs)
        steady = f"{c['samples_per_s']:,.0f}"
        cold = f"{c['samples_per_s_cold']:,.0f}"
        if name == "single":
            cells = ["-", "-", f"{c['epoch_seconds']:.2f} s", "-", steady]
            cells += [f"{c['seconds_cold']:.1f} s", cold, "-"]
            cells += [f"{c['process_rss_growth_mib']:,.0f} MiB", "-"]
        else:
            fewer = dense["bytes_per_sample"] / c["bytes_per_sample"]
            faster = dense["epoch_seconds"] / c["epoch_seconds"]
            pushed = c["rows_pushed_per_sync"]
            rows = (
                "whole table" if not pushed else f"{pushed:,.0f} / {c['rows_pulled_per_sync']:,.0f}"
            )
            cells = [
                f"{c['bytes_per_sample']:,.0f}",
                "1x" if name == "dense" else f"{fewer:.1f}x" if fewer < 100 else f"{fewer:.0f}x",
                f"{c['epoch_seconds']:.2f} s" if faster > 1.5 else f"{c['epoch_seconds']:.1f} s",
                "1x" if name == "dense" else f"{faster:.1f}x",
                f"{steady} ({c['samples_per_s'] / single['samples_per_s']:.2f}x)",
                f"{c['seconds_cold']:.1f} s",
                f"{cold} ({c['samples_per_s_cold'] / single['samples_per_s_cold']:.2f}x)",
                f"{max(c['worker_peak_rss_mib']):,.0f} MiB",
                f"{c['driver_rss_growth_mib']:,.0f} MiB",
                rows,
            ]
        lines.append(
            f"| {label} | {c['auc']:.4f} ({each}) | {c['log_loss']:.4f} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def _cached_run(rows: int) -> fr.Run:
    """The newest stored run of ``bench/embeddings.py`` with the row cache on a table of
    ``rows`` rows."""
    for run in fr.runs("embeddings"):
        cached = run.data.get("configs", {}).get("sparse_cached")
        if cached is not None and cached["table"]["rows"] == rows:
            return run
    raise LookupError(f"no stored embeddings run with the row cache at {rows} rows")


def _combiner(run: fr.Run) -> str:
    """The weight combiner of a run's Spark configurations, as the tables name it."""
    return f"`weight_combiner='{fr.combiner(run)}'`"


def row_cache_table() -> str:
    """The worker row cache at 2^20 and 2^24 rows against the uncached path and single."""
    small, large = _cached_run(1 << 20), _cached_run(1 << 24)
    base = small.data["configs"]["sparse_cached"]
    uncached = small.data["configs"]["sparse"]
    base_rss = max(base["worker_peak_rss_mib"])
    lines = [
        f"2^20 rows: {small.cite}, load {small.load}, "
        f"{fr.rounds(small.data['args'].get('rounds') or 1)}, {_combiner(small)}; 2^24 rows: "
        f"{large.cite}, load {large.load}, "
        f"{fr.rounds(large.data['args'].get('rounds') or 1)}, {_combiner(large)}.",
        "",
        "| table (rows x 32) | configuration | worker peak RSS | vs cached at 2^20 | "
        "bytes / sample | vs uncached at 2^20 | test AUC | vs single | samples/s cold | "
        "vs single | cache hits / misses / evictions | driver RSS growth |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run, exp in ((small, 20), (large, 24)):
        single = run.data["configs"]["single"]
        names = ("sparse", "sparse_cached") if run is small else ("sparse_cached",)
        for name in names:
            c = run.data["configs"][name]
            rss = max(c["worker_peak_rss_mib"])
            label, cache = "uncached", "-"
            if name == "sparse_cached":
                label = f"cached, `row_cache={int(c['settings']['row_cache']):,}`"
                cache = (
                    f"{c['cache_hits'] / 1e6:.1f}M / {c['cache_misses'] / 1e6:.1f}M / "
                    f"{c['cache_evictions'] / 1e6:.1f}M"
                )
            lines.append(
                f"| 2^{exp} | {label} | {rss:,.0f} MiB | "
                f"{rss / base_rss:.2f}x | {c['bytes_per_sample']:,.0f} | "
                f"{c['bytes_per_sample'] / uncached['bytes_per_sample']:.2f}x | "
                f"{c['auc']:.4f} | {c['auc'] - single['auc']:+.4f} | "
                f"{c['samples_per_s_cold']:,.0f} | "
                f"{c['samples_per_s_cold'] / single['samples_per_s_cold']:.2f}x | {cache} | "
                f"{c['driver_rss_growth_mib']:,.0f} MiB |"
            )
        lines.append(
            f"| 2^{exp} | single-process Keras | - | - | - | - | {single['auc']:.4f} | - | "
            f"{single['samples_per_s_cold']:,.0f} | 1x | - | - |"
        )
    cached = small.data["configs"]["sparse_cached"]
    cap_small, cap_large = cached["capacity"], large.data["configs"]["sparse_cached"]["capacity"]
    lines += [
        "",
        f"- **Capacity** (workers one driver serves at one sync per second, `capacity` in each "
        f"run; the cached path adds one `POST /rows` answer for a sync's misses): "
        f"**{cap_small['workers']}** at 2^20 ({cap_small['server_ms_per_sync']:.1f} ms of "
        f"server CPU a sync), **{cap_large['workers']}** at 2^24 "
        f"({cap_large['server_ms_per_sync']:.1f} ms); what ends it: "
        f"{cap_small['ends_it']} at both sizes.",
    ]
    big = large.data["configs"]["sparse_cached"]
    single = small.data["configs"]["single"]
    rss = max(big["worker_peak_rss_mib"]) / base_rss
    nbytes = cached["bytes_per_sample"] / uncached["bytes_per_sample"]
    auc = cached["auc"] - single["auc"]
    cold = cached["samples_per_s_cold"] / single["samples_per_s_cold"]
    bars = [
        (f"worker peak RSS at 2^24 {rss:.2f}x its 2^20 figure (bar: at most 1.25x)", rss <= 1.25),
        (f"bytes per sample at 2^20 {nbytes:.2f}x the uncached path's (bar: 1.2x)", nbytes <= 1.2),
        (
            f"AUC at 2^20 {auc:+.4f} from single with {_combiner(small)} (bar: within 0.005)",
            abs(auc) <= 0.005,
        ),
        (f"cold samples/s at 2^20 {cold:.2f}x single (bar: at least 0.8x)", cold >= 0.8),
    ]
    lines.append(
        "- **Bars:** "
        + "; ".join(f"{text}: **{'met' if ok else 'missed'}**" for text, ok in bars)
        + "."
    )
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {
    "dynamic_embeddings_table": figures_vocab.dynamic_embeddings_table,
    "elastic_table": figures_elastic.elastic_table,
    "journal_cost_table": figures_journal.journal_cost_table,
    "row_cache_table": row_cache_table,
    "stream_checkpoints_table": figures_checkpoints.stream_checkpoints_table,
    "embeddings_table": embeddings_table,
    "support_inference": support_inference,
    "support_fit": support_fit,
    "tune_searches_measured": tune_searches_measured,
    "comm_table": comm_table,
    "ps_capacity_table": ps_capacity_table,
}
