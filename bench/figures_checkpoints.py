"""The embeddings guide's table of full against incremental checkpoints, written from the
newest stored runs of ``bench/incremental_checkpoints.py`` (the server's snapshot and
write alone) and ``bench/stream_checkpoints.py`` (inside ``fit_stream`` micro-batches).

Part of ``bench/figures.py`` (through ``figures_tables.BLOCKS``).
"""

from __future__ import annotations

import figures_runs as fr

TARGETS = {"bytes": 20.0, "seconds": 10.0}


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _row(label: str, run: fr.Run, table_rows: int, changed: str, full: dict, incr: dict) -> str:
    nbytes = full["bytes"] / incr["bytes"]
    seconds = full["seconds"] / incr["seconds"]
    met = all((nbytes >= TARGETS["bytes"], seconds >= TARGETS["seconds"]))
    return (
        f"| {label} | {run.cite} | 2^{table_rows.bit_length() - 1} | {changed} | "
        f"{_mib(full['bytes'])} in {full['seconds']:.2f} s | "
        f"{_mib(incr['bytes'])} in {incr['seconds']:.3f} s | **{nbytes:.0f}x** | "
        f"**{seconds:.0f}x** | {'met' if met else '**missed**'} |"
    )


def stream_checkpoints_table() -> str:
    """Full against incremental checkpoints: the server alone, and inside a stream."""
    lines = [
        "| measured | run | table (rows x 32) | rows changed | full checkpoint | increment | "
        "fewer bytes | less time | bars (20x, 10x) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    try:
        alone = fr.runs("incremental_checkpoints")[0]
    except FileNotFoundError:
        alone = None
    if alone is not None:
        d = alone.data
        lines.append(
            _row(
                "the server's snapshot and write (`bench/incremental_checkpoints.py`)",
                alone, d["setup"]["rows"], f"{d['setup']['changed_fraction']:.2%}",
                d["full"], d["increment_mean"],
            )
        )  # fmt: skip
    try:
        stream = fr.runs("stream_checkpoints")[0]
    except FileNotFoundError:
        stream = None
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
