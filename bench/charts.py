"""Draw the documentation site's benchmark charts from ``bench/results/*.json``.

Run from the repository root: ``python bench/charts.py`` (writes ``docs/img/*.svg``), or
``python bench/charts.py --out DIR`` to draw them elsewhere. The output is byte-stable: the
same JSON gives the same files (a fixed SVG hash salt, no date in the metadata, the font
matplotlib ships, glyphs drawn as paths), so ``tests/docs/test_charts.py`` regenerates them
and compares them with the committed ones. Never edit the SVGs by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import figures_runs as fr  # noqa: E402  (bench/figures_runs.py: the stored runs, newest first)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
OUT = ROOT / "docs" / "img"

STYLE = {
    "svg.hashsalt": "tensorspark-docs",
    "svg.fonttype": "path",
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "figure.dpi": 100,
}
BLUE, ORANGE, GREY = "#1f77b4", "#ff7f0e", "#7f7f7f"


def _load(name: str) -> Any:
    """The newest stored run of the benchmark ``name`` names (``comm.json``: ``comm``), as
    ``bench/figures.py`` quotes it, so a chart and the tables beside it show one run; the
    file itself for a benchmark whose runs do not record themselves yet."""
    try:
        return fr.runs(name.removesuffix(".json"), RESULTS)[0].data
    except FileNotFoundError:
        return json.loads((RESULTS / name).read_text())


def comm(plt: Any) -> Any:
    """Bytes per trained sample to 0.85 test accuracy, per configuration (``comm.json``)."""
    labels = {
        "default": "default: float32, sync_interval=20, async",
        "bf16": "compression='bf16'",
        "int8": "compression='int8'",
        "int8_pushonly": "int8 pushes, float32 pulls",
        "nesterov_200": "nesterov, sync_interval=200, sync",
        "nesterov_1000": "nesterov, sync_interval=1000, sync",
        "int8_nesterov_1000": "int8 + nesterov, sync_interval=1000, sync",
    }
    configs = _load("comm.json")["configs"]
    names = [n for n in labels if configs[n]["bytes_per_sample_to_target"] is not None]
    values = [configs[n]["bytes_per_sample_to_target"] for n in names]
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    ax.barh(range(len(names)), values, color=BLUE)
    ax.set_yticks(range(len(names)), [labels[n] for n in names])
    ax.invert_yaxis()
    ax.set_xscale("log")
    for i, (n, v) in enumerate(zip(names, values)):
        acc = configs[n]["final_test_accuracy"]
        ax.text(v * 1.08, i, f"{v:,.1f} B  (acc. {acc:.4f})", va="center", fontsize=8)
    ax.set_xlim(1, 40_000)
    ax.set_xlabel("bytes per sample (log scale; median of 3 seeds)")
    ax.set_title("bench/comm.py: bytes per sample to 0.85 test accuracy")
    return fig


def ps_capacity(plt: Any) -> Any:
    """Workers one driver serves at one sync per second each (``ps_capacity.json``)."""
    rows = _load("ps_capacity.json")["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(7.5, 3.0))
    for ax, params in zip(axes, (1_000_000, 25_000_000)):
        mine = [r for r in rows if r["params"] == params]
        shards = sorted({r["shards"] for r in mine})
        for k, (codec, color) in enumerate(((None, BLUE), ("int8", ORANGE))):
            ys = [
                next(r for r in mine if r["shards"] == s and r["compression"] == codec)[
                    "workers_at_1_sync_per_s"
                ]
                for s in shards
            ]
            xs = [i + (k - 0.5) * 0.38 for i in range(len(shards))]
            ax.bar(xs, ys, width=0.38, color=color, label=codec or "float32")
            for x, y in zip(xs, ys):
                ax.text(x, y, f"{y:.0f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(shards)), [f"{s} shard{'s' if s > 1 else ''}" for s in shards])
        ax.set_title(f"{params // 1_000_000}M parameters")
        ax.set_ylabel("workers at 1 sync/s")
    axes[0].legend(frameon=False)
    fig.suptitle("bench/ps_capacity.py: workers one driver serves", fontsize=10)
    return fig


def files(plt: Any) -> Any:
    """Training samples/s from files, a DataFrame and an RDD, cold and warm (``files.json``)."""
    labels = {
        "parquet_files": "Parquet on HDFS,\nsps.files",
        "dataframe": "spark.read.parquet\n(DataFrame)",
        "tfrecord_files": "TFRecord on HDFS,\nsps.files",
        "rdd": "RDD of numpy rows\n(cached)",
        "s3_parquet_files": "Parquet on S3,\nsps.files",
    }
    runs = _load("files.json")["runs"]
    names = [n for n in labels if n in runs]
    fig, ax = plt.subplots(figsize=(7.5, 3.0))
    for k, (phase, color) in enumerate((("cold", BLUE), ("warm", ORANGE))):
        ys = [sum(r[phase]["samples_per_s"] for r in runs[n]) / len(runs[n]) for n in names]
        xs = [i + (k - 0.5) * 0.38 for i in range(len(names))]
        ax.bar(xs, ys, width=0.38, color=color, label=phase)
        for x, y in zip(xs, ys):
            ax.text(x, y, f"{y:,.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), [labels[n] for n in names])
    ax.set_ylabel("samples/s (mean of 2 rounds)")
    ax.legend(frameon=False)
    ax.set_title("bench/files.py: Keras MLP, 60,000 rows, 3 epochs, 2 partitions")
    return fig


def modes(plt: Any) -> Any:
    """Seconds per epoch and test accuracy per training mode (``modes.json``)."""
    results = _load("modes.json")["results"]
    names = [r["config"] for r in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(7.5, 2.8), sharey=True)
    left.barh(range(len(names)), [r["seconds_per_epoch"] for r in results], color=BLUE)
    right.barh(range(len(names)), [r["test_accuracy"] for r in results], color=ORANGE)
    left.set_yticks(range(len(names)), names)
    left.invert_yaxis()
    left.set_xlabel("s/epoch (start-up included)")
    right.set_xlabel("test accuracy")
    right.set_xlim(0.78, 0.83)
    fig.suptitle("bench/modes.py: the TF1 softmax model, 2 partitions, 2 epochs", fontsize=10)
    return fig


def cold_start(plt: Any) -> Any:
    """The pieces of a first call, medians of fresh contexts (``cold_start.json``)."""
    labels = {
        "import_s": "TensorFlow import in a worker",
        "dataframe_first_job_s": "first DataFrame job",
        "rdd_first_job_s": "first RDD job",
        "driver_first_row_check_s": "first-row check",
        "first_trace_s": "train-function trace",
        "dataframe_job_s": "a later DataFrame job",
        "rdd_job_s": "a later RDD job",
        "deserialise_s": "model deserialise",
        "driver_model_payload_s": "model payload (driver)",
    }
    median = _load("cold_start.json")["median"]
    names = [n for n in labels if n in median]
    fig, ax = plt.subplots(figsize=(7.5, 3.0))
    values = [median[n] for n in names]
    ax.barh(range(len(names)), values, color=[ORANGE if v > 1 else GREY for v in values])
    ax.set_yticks(range(len(names)), [labels[n] for n in names])
    ax.invert_yaxis()
    for i, v in enumerate(values):
        ax.text(v + 0.03, i, f"{v:.2f} s", va="center", fontsize=8)
    ax.set_xlabel("seconds (median of fresh contexts)")
    ax.set_title("bench/cold_start.py: what a first call pays, local[2]")
    return fig


CHARTS: dict[str, Callable[[Any], Any]] = {
    "comm": comm,
    "ps_capacity": ps_capacity,
    "files": files,
    "modes": modes,
    "cold_start": cold_start,
}


def draw(out: Path) -> list[Path]:
    """Write every chart as ``out/<name>.svg`` and return the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    with plt.rc_context(STYLE):
        for name, chart in CHARTS.items():
            fig = chart(plt)
            fig.tight_layout()
            path = out / f"{name}.svg"
            fig.savefig(path, format="svg", metadata={"Date": None, "Creator": None})
            plt.close(fig)
            written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder for the SVGs")
    for path in draw(parser.parse_args().out):
        print(path)


if __name__ == "__main__":
    main()
