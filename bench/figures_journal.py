"""The communication guide's table of what the shard journal costs, written from the
newest stored run of ``bench/journal_cost.py``.

Part of ``bench/figures.py`` (through ``figures_tables.BLOCKS``): push+pull through a
sharded server with the journal (``ps_shard_restarts=3``, the default) and without it
(``0``), per model size and client count, in ABBA pairs.
"""

from __future__ import annotations

import figures_runs as fr

NO_RUN = (
    "No stored run of `bench/journal_cost.py` yet: `python bench/journal_cost.py` writes "
    "one (about 6 minutes on 2 cores), and `python bench/figures.py` writes its table here."
)


def journal_cost_table() -> str:
    """Each size and client count of the newest stored ``bench/journal_cost.py`` run."""
    try:
        run = fr.runs("journal_cost")[0]
    except FileNotFoundError:
        return NO_RUN
    rows = run.data["rows"]
    first = rows[0]
    lines = [
        f"Newest stored run {run.cite}, load {run.load}: {first['shards']} shards, the model "
        f"pushed and pulled whole by each client process, {first['pairs']} pairs of "
        f"{first['seconds']:.0f} s windows in ABBA order (without, with, with, without, ...); "
        "the cost is the median over the pairs of `1 - with/without`:",
        "",
        "| parameters | clients | updates/s without / with (medians) | cost | "
        "server CPU per update | written per update with it |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        written = row["journal_bytes_per_update"]
        lines.append(
            f"| {row['size']} | {row['clients']} | {row['updates_per_s_off']:.1f} / "
            f"{row['updates_per_s_on']:.1f} | {row['throughput_cost']:.1%} | "
            f"{row['server_cpu_s_per_update_off'] * 1e3:.1f} -> "
            f"{row['server_cpu_s_per_update_on'] * 1e3:.1f} ms | {written / 1e6:.1f} MB "
            f"({written / row['model_bytes']:.2f}x the model) |"
        )
    return "\n".join(lines)
