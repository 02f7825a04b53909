"""The embeddings guide's table of full against incremental checkpoints, written from the
newest stored runs of ``bench/incremental_checkpoints.py`` (the server's snapshot and
write alone) and ``bench/stream_checkpoints.py`` (inside ``fit_stream`` micro-batches).

Part of ``bench/figures.py`` (through ``figures_tables.BLOCKS``).
"""

from __future__ import annotations

import figures_runs as fr


def _newest(benchmark: str) -> fr.Run | None:
    try:
        return fr.runs(benchmark)[0]
    except FileNotFoundError:
        return None


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _row(label: str, run: fr.Run, table_rows: int, changed: str, full: dict, incr: dict) -> str:
    """One run's row; its bars are the ones the run recorded (``targets``)."""
    targets = run.data["targets"]
    nbytes = full["bytes"] / incr["bytes"]
    seconds = full["seconds"] / incr["seconds"]
    met = nbytes >= targets["bytes"] and seconds >= targets["seconds"]
    bars = f"{targets['bytes']:.0f}x, {targets['seconds']:.0f}x"
    return (
        f"| {label} | {run.cite} | 2^{table_rows.bit_length() - 1} | {changed} | "
        f"{_mib(full['bytes'])} in {full['seconds']:.2f} s | "
        f"{_mib(incr['bytes'])} in {incr['seconds']:.3f} s | **{nbytes:.0f}x** | "
        f"**{seconds:.0f}x** | {'met' if met else '**missed**'} ({bars}) |"
    )


def stream_checkpoints_table() -> str:
    """Full against incremental checkpoints: the server alone, and inside a stream."""
    lines = [
        "| measured | run | table (rows x 32) | rows changed | full checkpoint | increment | "
        "fewer bytes | less time | bars (bytes, time) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    alone = _newest("incremental_checkpoints")
    if alone is not None:
        d = alone.data
        lines.append(
            _row(
                "the server's snapshot and write (`bench/incremental_checkpoints.py`)",
                alone, d["setup"]["rows"], f"{d['setup']['changed_fraction']:.2%}",
                d["full"], d["increment_mean"],
            )
        )  # fmt: skip
    stream = _newest("stream_checkpoints")
    if stream is not None and "ratios" in stream.data:  # a run with both kinds
        d = stream.data
        kinds = d["kinds"]
        lines.append(
            _row(
                f"`fit_stream`, one file of {d['setup']['rows_per_file']:,} examples a "
                f"micro-batch, means over {kinds['full']['count']} full and "
                f"{kinds['increment']['count']} incremental checkpoints "
                "(`bench/stream_checkpoints.py`)",
                stream, d["setup"]["rows"], f"at most {d['changed_fraction_max']:.2%}",
                kinds["full"], kinds["increment"],
            )
        )  # fmt: skip
    if alone is None and stream is None:
        return (
            "No stored run of `bench/incremental_checkpoints.py` or "
            "`bench/stream_checkpoints.py` yet; `python bench/figures.py` writes the table "
            "here after one."
        )
    return "\n".join(lines)
