"""Write every benchmark figure the README and ``docs/`` quote from ``bench/results/*.json``.

The documents hold their figures inside generated blocks::

    <!-- figures:keras_fit -->
    ...text this script writes...
    <!-- /figures -->

Run from the repository root: ``python bench/figures.py`` rewrites every block from the
stored runs (``bench/figures_runs.py`` reads them); ``python bench/figures.py --check``
only says which files differ. ``tests/docs/test_figures.py`` renders the blocks in memory
and fails when a committed document differs, so a figure cannot drift from its run. Never
edit the text between the markers by hand: change the JSON (by running the benchmark) or
the wording here.

Each figure is the newest stored run of its benchmark, quoted with its date and commit;
the benchmarks page lists every stored run, the ones that missed a bar too.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import figures_runs as fr  # noqa: E402  (bench/figures_runs.py: the runs and their bars)
import figures_tables  # noqa: E402  (bench/figures_tables.py: the guides' tables)

logger = logging.getLogger(__name__)

ROOT = fr.ROOT
#: The documents that hold generated blocks.
DOCUMENTS = (
    "README.md",
    "docs/benchmarks.md",
    "docs/guide/embeddings.md",
    "docs/guide/cold-starts.md",
    "docs/guide/streaming.md",
    "docs/guide/training-modes.md",
    "docs/guide/inference.md",
    "docs/guide/communication.md",
    "docs/guide/optuna.md",
    "docs/support.md",
)
BLOCK = re.compile(
    r"^(?P<indent>[ ]*)(?P<open><!-- figures:(?P<name>[\w:.-]+) -->\n)(?P<body>.*?)"
    r"^(?P=indent)(?P<close><!-- /figures -->)",
    re.S | re.M,
)

#: What each headline benchmark measures, for its table on the benchmarks page.
METHODS = {
    "keras_fit": "`keras_fit.py`: MLP 784-128-10, batch 64, 3 epochs, 2 partitions vs "
    "single-process `model.fit`; the headline is **cold**: a fresh SparkContext whose Python "
    "workers import TensorFlow during the call (the session's background warm-up on, as by "
    "default); single-process runs bracket the Spark ones. Bars: cold ≥ 0.95x, test accuracy "
    "gap ≤ 0.01.",
    "inference": "`inference.py`: the MNIST images as stored (uint8 pixels), a CNN (or "
    "`--model mlp`), batch 512, local[2] vs `model.predict`, best of the warm rounds; "
    "predictions equal `model.predict`'s. Bar: ≥ 0.9x with a binary pixel column.",
    "inference_first_call": "`inference.py --first-call`: the first `predict` of a fresh "
    "context (binary DataFrame, CNN, 70,000 rows), each variant in fresh processes, against "
    "the best warm call after it. Bar: ≤ 2x.",
    "embeddings": "`embeddings.py`: a click-through-rate model (8 Zipf fields hashed into "
    "one 2**20 x 32 `RowEmbedding`, `Dense(64)`, `Dense(1)`), 3 epochs, 2 partitions, async, "
    "`sync_interval=20`: dense float32 sync, row-sparse, row-sparse + int8, single-process "
    "Keras; every measurement in a fresh process, Spark timed cold. Bars: ≥ 30x fewer bytes, "
    "≥ 100x with int8, epochs ≥ 5x faster, cold fit ≥ 0.8x single, AUC of row-sparse and "
    "int8 within 0.005 of dense and of single.",
    "streaming": "`streaming.py`: `fit_stream` from Parquet files in a folder vs `fit` over "
    "the same files (MLP); a checkpoint per micro-batch; freshness at triggers of 2 s and "
    "10 s. Bar: ≥ 0.8x.",
    "tune_searches": "`tune_searches.py`: grid, random, Optuna TPE, TPE + `MedianPruner` and "
    "TPE + `HyperbandPruner` on one space (5 learning rates x 4 widths) and budget (20 "
    "trials), 6,000 rows, 8 epochs per trial, `local[2]`. Bar: pruning saves ≥ 30 % of "
    "trial-seconds at an equal best score.",
    "comm": "`comm.py`: bytes per trained sample to 0.85 test accuracy (MLP, Fashion-MNIST, "
    "2 partitions, batch 64), medians of seeds. Bars: ≥ 50x fewer bytes, "
    f"{fr.COMM_ACCURACY_BAR}, time to 0.85 no worse.",
    "ps_capacity": "`ps_capacity.py`: workers one driver serves at one sync per second "
    "each, from the server's measured CPU per update, memory traffic and a 10 Gbit/s link. "
    "Bars: ≥ 100 at 1M parameters, ≥ 10 at 25M.",
}


def _short(checks: dict[str, bool]) -> str:
    """``met`` or ``**missed**``, for a sentence that has just named its bars."""
    return "met" if all(checks.values()) else "**missed**"


def _dated(run: fr.Run) -> str:
    """``(run of 2026-11-26, stored in `abc1234`, `x.json`)``: a quoted figure's source."""
    return run.cite


def _newest(benchmark: str, keep: Callable[[fr.Run], bool] = lambda r: True) -> fr.Run:
    return next(r for r in fr.runs(benchmark) if keep(r))


def _full_size_embeddings(run: fr.Run) -> bool:
    return run.data["args"]["train"] >= 1_000_000 and "dense" in run.data["summary"]


def auc_tally() -> tuple[int, int]:
    """How many of the stored 1M-example embedding runs met the AUC bar, of how many."""
    full = [r for r in fr.runs("embeddings") if _full_size_embeddings(r)]
    return sum(bool(fr.embeddings_auc_ok(r)) for r in full), len(full)


def headline() -> str:
    """The README's headline sentence."""
    fit = _newest("keras_fit")
    _, fit_checks = fr.keras_fit(fit)
    cold = fit.data["spark"]["cold"]
    scoring = _newest("inference", lambda r: r.data["model"] == "cnn")
    _, scoring_checks = fr.inference(scoring)
    comm = _newest("comm")
    _, comm_checks = fr.comm(comm)
    _, fewer = fr.comm_bytes(comm)
    cap = _newest("ps_capacity")
    low, high = fr.ps_capacity_range(cap, 1_000_000)
    emb = _newest("embeddings", _full_size_embeddings)
    sp, i8 = emb.data["summary"]["sparse"], emb.data["summary"]["sparse_int8"]
    met, of = auc_tally()
    rows = scoring.data["rows"]
    return "\n".join(
        [
            "Headlines, on a 2-core VM, each from the newest stored run of its benchmark "
            "(every run, dated, the ones that missed a bar too, on the "
            "[Benchmarks](docs/benchmarks.md) page):",
            "",
            f"- a cold Keras `fit` at {cold['ratio_vs_single']:.2f}x the speed of "
            f"single-process `model.fit` ({cold['seconds']:.2f} s vs "
            f"{fit.data['single_process']['fit_s']:.2f} s), test accuracy "
            f"{cold['accuracy_gap']:.4f} below it; bars 0.95x and 0.01: "
            f"{_short(fit_checks)} {_dated(fit)};",
            f"- scoring {rows:,} rows from a binary DataFrame column at "
            f"{scoring.data['dataframe_binary']['ratio']:.2f}x `model.predict`'s rows/s; bar "
            f"0.9x: {_short(scoring_checks)} {_dated(scoring)};",
            f"- {fewer:.0f}x fewer bytes per sample with int8 and the outer optimizer, at the "
            f"same accuracy; bars 50x, {fr.COMM_ACCURACY_BAR}, time no worse: "
            f"{_short(comm_checks)} {_dated(comm)};",
            f"- one driver serving {low} to {high} workers of a 1M-parameter model at one "
            f"sync per second {_dated(cap)};",
            f"- a click-through-rate model with a 1M x 32 embedding table syncing "
            f"{sp['fewer_bytes_than_dense']:.0f}x fewer bytes than whole-model syncs "
            f"({i8['fewer_bytes_than_dense']:.0f}x with int8), its epochs "
            f"{sp['epoch_faster_than_dense']:.1f}x faster, its cold `fit` at "
            f"{sp['cold_samples_per_s_vs_single']:.2f}x single-process Keras "
            f"{_dated(emb)}; its AUC within 0.005 of dense and single-process training "
            f"in {met} of the {of} stored 1M-example runs.",
        ]
    )


def support() -> str:
    """The README's Spark 3.5 / 4.3 figures: the paired runs docs/support.md shows."""
    old, new = (figures_tables.named("keras_fit", n) for n in figures_tables.SUPPORT_FIT)
    score_old, score_new = (
        figures_tables.named("inference", n) for n in figures_tables.SUPPORT_INFERENCE
    )
    rows = score_old.data["dataframe"]["rows_per_s"] / score_new.data["dataframe"]["rows_per_s"]
    return (
        "Measured on both, one run each, one after the other "
        "([docs/support.md](docs/support.md)): a cold Keras `fit` at "
        f"{old.data['spark']['cold']['ratio_vs_single']:.2f}x single-process `model.fit` on "
        f"Spark 3.5 and {new.data['spark']['cold']['ratio_vs_single']:.2f}x on 4.3 "
        f"({old.date}, `{old.name}`, `{new.name}`); DataFrame scoring of `array<float>` "
        f"columns {rows:.2f}x as fast on 3.5's `pandas_udf` path as on 4.3's Arrow UDF "
        f"({score_old.date}, `{score_old.name}`, `{score_new.name}`)."
    )


def runs_table(benchmark: str) -> str:
    """A benchmark's method and every stored run, newest first, with its bars."""
    lines = [
        METHODS[benchmark],
        "",
        "| run | date | commit | load | versions | figures | bars |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in fr.runs(benchmark):
        text, checks = fr.SUMMARIES[benchmark](run)
        lines.append(
            f"| `{run.name}` | {run.date} | {run.commit} | {run.load} | {run.versions} | "
            f"{text} | {fr.verdict(checks)} |"
        )
    if benchmark == "embeddings":
        met, of = auc_tally()
        lines += ["", f"AUC within 0.005 at 1,000,000 examples: met in {met} of {of} runs."]
    return "\n".join(lines)


def embeddings_targets() -> str:
    """The embeddings guide's summary of the newest full-size run against its bars."""
    run = _newest("embeddings", _full_size_embeddings)
    text, checks = fr.embeddings(run)
    met, of = auc_tally()
    return (
        f"- **Targets ({fr.verdict(checks)})**, newest 1M-example run {_dated(run)}: {text}. "
        f"The AUC bar (row-sparse and int8 within 0.005 of dense and of the single process) "
        f"was met in {met} of the {of} stored 1M-example runs; every run is on the "
        "[Benchmarks](../benchmarks.md#embeddings) page."
    )


def cold_starts() -> str:
    """The cold-starts guide's table of what a first call costs, from the newest runs."""
    fit = _newest("keras_fit")
    cold, single = fit.data["spark"]["cold"], fit.data["single_process"]
    no_warm_up = fit.data["spark"]["cold_without_warm_up"]["ratio_vs_single"]
    _, fit_checks = fr.keras_fit(fit)
    first = _newest("inference_first_call")
    calls = first.data["summary"]
    to_target = cold["seconds_to_target"]
    lines = [
        "| call | cold | against | ratio | target |",
        "|---|---|---|---|---|",
        f"| `fit`, MLP, 3 epochs, {fit.data['setup']['rows']:,} rows (`bench/keras_fit.py`, "
        f"{fr.rounds(fit.data['setup']['rounds'])}, {_dated(fit)[1:-1]}) | "
        f"{cold['seconds']:.2f} s | single-process `model.fit` {single['fit_s']:.2f} s | "
        f"**{cold['ratio_vs_single']:.2f}x** the speed ({no_warm_up:.2f}x with the warm-up "
        f"off); accuracy gap {cold['accuracy_gap']:.4f} | ≥ 0.95x, gap ≤ 0.01: "
        f"{_short(fit_checks)} |",
    ]
    if to_target is not None and single["seconds_to_target"] is not None:
        ratio = cold["time_to_target_vs_single"]
        lines.append(
            f"| time to {fit.data['setup']['target']} test accuracy (same run) | "
            f"{to_target:.2f} s | {single['seconds_to_target']:.2f} s "
            f"({single['seconds_to_target'] + single['import_s']:.2f} s counting the single "
            f"process's own import) | **{ratio:.2f}x** the time "
            f"({cold['time_to_target_vs_single_with_import']:.2f}x) | ≤ 1.5x: "
            f"{'met' if ratio <= 1.5 else '**not met**'} |"
        )
    lines += [
        f"| first `predict`, CNN, binary DataFrame (`bench/inference.py --first-call`, "
        f"{first.data['rounds']} fresh processes each, {_dated(first)[1:-1]}) | "
        f"{calls['none']['first_s']:.1f} s | a warm call, {calls['none']['warm_s']:.1f} s | "
        f"**{calls['none']['ratio']:.2f}x** | ≤ 2x: "
        f"{'met' if calls['none']['ratio'] <= 2 else '**not met**'} |",
        f'| the same, `sps.warm_up(sc, pools="dataframe")` and the call at once | '
        f"{calls['at_once']['first_s']:.1f} s | {calls['at_once']['warm_s']:.1f} s | "
        f"{calls['at_once']['ratio']:.2f}x | |",
        f"| the same, the call once the warm-up is done | {calls['after']['first_s']:.1f} s | "
        f"{calls['after']['warm_s']:.1f} s | **{calls['after']['ratio']:.2f}x** | "
        f"{'met' if calls['after']['ratio'] <= 2 else '**not met**'} when the warm-up ran "
        "ahead |",
    ]
    return "\n".join(lines)


def streaming_measured() -> str:
    """The streaming guide's measured bullet, from the newest run."""
    run = _newest("streaming")
    text, checks = fr.streaming(run)
    count = len(fr.runs("streaming"))
    return (
        f"- **Measured** (`bench/streaming.py`, the newest of {count} stored "
        f"run{'s' if count > 1 else ''}: {run.date}, {run.commit}, `{run.name}`, load "
        f"{run.load}): {run.data['rows']:,} rows in {run.data['files']} Parquet files, "
        f"{run.data['model']}, `local[2]`; {text}; target ≥ 0.8x: {_short(checks)}. Every "
        "run is on the [Benchmarks](../benchmarks.md#streaming) page; on a loaded machine "
        "treat the ratio as rough."
    )


def inference_formats() -> str:
    """The inference guide's binary-against-``array<float>`` figures, every CNN run."""
    parts = [
        f"{r.date} (`{r.name}`, {r.data['rows']:,} rows): binary "
        f"{r.data['dataframe_binary']['ratio']:.2f}x, `array<float>` "
        f"{r.data['dataframe']['ratio']:.2f}x"
        for r in fr.runs("inference")
        if r.data["model"] == "cnn"
    ]
    return (
        "The binary column against `array<float>` in every stored CNN run of "
        "`bench/inference.py`, as a share of `model.predict`'s rows/s: "
        + "; ".join(parts)
        + " ([Benchmarks](../benchmarks.md#inference) has the method and the loads)."
    )


def daemon() -> str:
    """The cold-starts guide's table: fit on PySpark's daemon against tensorspark's."""
    run = _newest("daemon")
    seconds, speedup = run.data["median_s"], run.data["speedup"]
    setup = run.data["setup"]
    names = {
        "cold": "cold: session and `fit` at once on a fresh context",
        "after_failure": "after a failed task ended both workers: a new session and `fit`",
        "warm": "warm: a third session and `fit` on the live workers",
    }
    lines = [
        f"`bench/daemon.py`: the MLP on {setup['rows']:,} rows, 1 epoch, 2 partitions on "
        f"`local[2]`, medians of {fr.rounds(setup['rounds'])}, each a fresh process "
        f"({_dated(run)[1:-1]}):",
        "",
        "| `fit` | PySpark's daemon | tensorspark's daemon | speed-up |",
        "|---|---|---|---|",
    ]
    for phase, name in names.items():
        lines.append(
            f"| {name} | {seconds['pyspark'][phase]:.2f} s | "
            f"{seconds['tensorspark'][phase]:.2f} s | **{speedup[phase]:.2f}x** |"
        )
    return "\n".join(lines)


def other_runs() -> str:
    """Every other stored run with its date, commit and load: the rows above cite them."""
    lines = ["| run | date | commit | load |", "|---|---|---|---|"]
    for run in fr.other_runs():
        lines.append(f"| `{run.name}` | {run.date} | {run.commit} | {run.load} |")
    return "\n".join(lines)


def blocks() -> dict[str, Callable[[], str]]:
    """Every block name and the function that writes its text."""
    found: dict[str, Callable[[], str]] = {
        "headline": headline,
        "support": support,
        "embeddings_targets": embeddings_targets,
        "cold_starts": cold_starts,
        "daemon": daemon,
        "streaming_measured": streaming_measured,
        "inference_formats": inference_formats,
        "other_runs": other_runs,
        **figures_tables.BLOCKS,
    }
    for name in METHODS:
        found[f"runs:{name}"] = lambda name=name: runs_table(name)
    return found


def render(text: str, known: dict[str, Callable[[], str]] | None = None) -> str:
    """``text`` with every generated block written afresh; an unknown block is an error."""
    known = blocks() if known is None else known

    def one(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in known:
            raise KeyError(f"unknown figures block {name!r}; known: {sorted(known)}")
        indent = match["indent"]
        body = "\n".join(indent + line if line else line for line in known[name]().split("\n"))
        return f"{indent}{match['open']}{body}\n{indent}{match['close']}"

    return BLOCK.sub(one, text)


def rendered(root: Path = ROOT) -> dict[Path, tuple[str, str]]:
    """Each document's committed text and its text with the blocks written afresh."""
    known = blocks()
    out = {}
    for name in DOCUMENTS:
        path = root / name
        text = path.read_text()
        out[path] = (text, render(text, known))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say which files differ")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    stale = 0
    for path, (old, new) in rendered().items():
        if old == new:
            continue
        stale += 1
        if args.check:
            logger.info("%s differs from bench/results", path.relative_to(ROOT))
        else:
            path.write_text(new)
            logger.info("rewrote %s", path.relative_to(ROOT))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
