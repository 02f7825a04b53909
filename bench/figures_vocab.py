"""The embeddings guide's table of unbounded vocabularies, written from the newest stored run
of ``bench/dynamic_embeddings.py`` with every arm (runs of fewer arms, e.g. repeats of the
``ttl`` arm, are listed after it: the TTL arm's gain over hashing in each stored run).

Part of ``bench/figures.py`` (through ``figures_tables.BLOCKS``): the dynamic table with
LFU and TTL eviction against the hashing trick at equal memory and a row per id, on the
drifting click log, and the issue's bars as the run recorded them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import figures_runs as fr

#: How the guide names each arm.
ARM_LABELS = {
    "hashing": "hashing trick, `RowEmbedding` (today's way)",
    "lfu": "**`DynamicEmbedding`, `policy='lfu'`**",
    "ttl": "**`DynamicEmbedding`, `policy='ttl'`**",
    "ceiling": "a row per id (the ceiling)",
}
#: The bars' names in the JSON and how the guide says them.
BAR_LABELS = {
    "auc_minus_hashing": "AUC over hashing",
    "stream_auc_minus_hashing": "AUC over hashing with `fit_stream`",
    "collisions": "collisions among admitted ids",
    "rows_in_use_max": "most rows in use",
    "map_ids_known": "share of the map's ids that are the log's (a check, not an issue bar)",
    "bytes_per_sample_vs_hashing": "bytes per sample vs hashing",
    "samples_per_s_cold_vs_hashing": "cold samples/s vs hashing",
    "export_max_difference": "SavedModel vs training model",
}
NO_RUN = (
    "No stored run of `bench/dynamic_embeddings.py` yet: `python bench/dynamic_embeddings.py` "
    "writes `bench/results/dynamic_embeddings.json` (about 6 minutes on 2 cores), and "
    "`python bench/figures.py` writes its table here."
)


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base else "-"


def _counters(row: dict[str, Any]) -> str:
    vocab = row.get("vocab") or {}
    if not vocab:
        return "-"
    most = row.get("rows_in_use_max")
    return (
        f"{vocab.get('vocab_rows_in_use', 0):,} ({'-' if most is None else f'{most:,}'}) / "
        f"{vocab.get('vocab_admitted', 0):,} / {vocab.get('vocab_evicted', 0):,} / "
        f"{_figure(row.get('collisions_max'))}"
    )


def _figure(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(_figure(v) for v in value)
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 0.01 else f"{value:.4f}"
    return "-" if value is None else f"{value:,}"


def dynamic_embeddings_table(results: Path = fr.RESULTS) -> str:
    """Per arm and training path: AUC on the later log, bytes, cold speed, the server's
    counters, the export's difference; then the bars, met or missed."""
    try:
        every = fr.runs("dynamic_embeddings", results)
    except FileNotFoundError:
        return NO_RUN
    whole = [r for r in every if set(ARM_LABELS) <= set(r.data.get("fit") or {})]
    run = whole[0] if whole else every[0]
    d = run.data
    args, log = d["args"], d["log"]
    lines = [
        f"Newest stored run with every arm {run.cite}, load {run.load}: {log['train']:,} "
        f"examples trained in time order, {log['test']:,} scored (the log's last "
        f"{args['test_fraction']:.0%}); {args['vocabulary']:,} ids, "
        f"{log['vocabulary_over_capacity']:.0f}x the {args['capacity']:,} rows x "
        f"{args['dim']} of each table but the ceiling; the true probabilities' AUC "
        f"{d['true_auc_of_test']:.4f}.",
        "",
        "| table | training | AUC, later log | vs hashing | bytes / sample | vs hashing | "
        "samples/s cold | vs hashing | rows in use at the end (most) / admitted / evicted / "
        "collisions (most) | export max difference |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in ("fit", "stream"):
        rows = d.get(mode) or {}
        base = rows.get("hashing")
        for arm, label in ARM_LABELS.items():
            r = rows.get(arm)
            if r is None:
                continue
            exported = r.get("export_max_difference")
            lines.append(
                f"| {label} | `{'fit' if mode == 'fit' else 'fit_stream'}` | {r['auc']:.4f} | "
                + (
                    f"{r['auc'] - base['auc']:+.4f} | {r['bytes_per_sample']:,.0f} | "
                    f"{_ratio(r['bytes_per_sample'], base['bytes_per_sample'])} | "
                    f"{r['samples_per_s_cold']:,.0f} | "
                    f"{_ratio(r['samples_per_s_cold'], base['samples_per_s_cold'])} | "
                    if base is not None
                    else f"- | {r['bytes_per_sample']:,.0f} | - | "
                    f"{r['samples_per_s_cold']:,.0f} | - | "
                )
                + f"{_counters(r)} | {'-' if exported is None else f'{exported:.2g}'} |"
            )
    for arm in ("lfu", "ttl"):
        checks = d.get("bars", {}).get(arm)
        if not checks:
            continue
        said = [
            f"{BAR_LABELS.get(name, name)} {_figure(c['value'])} (bar {c['bar']}): "
            f"**{c['verdict']}**"
            for name, c in checks.items()
        ]
        lines += ["", f"- **Bars, `policy='{arm}'`:** " + "; ".join(said) + "."]
    return "\n".join(lines + _ttl_runs(every))


def _ttl_runs(every: list[Any]) -> list[str]:
    """A line per stored run that trained the ``ttl`` arm beside hashing, newest first: its
    admission (``min_count``), ``ttl`` and AUC gain over hashing, its speed and bytes."""
    said = []
    for run in every:
        fits = run.data.get("fit") or {}
        ttl, base = fits.get("ttl"), fits.get("hashing")
        if ttl is None or base is None:
            continue
        args = run.data["args"]
        said.append(
            f"{run.cite}: `min_count={args.get('ttl_min_count', 1)}`, `ttl` {args['ttl']} s, "
            f"AUC {ttl['auc'] - base['auc']:+.4f} over hashing, cold samples/s "
            f"{_ratio(ttl['samples_per_s_cold'], base['samples_per_s_cold'])}, bytes "
            f"{_ratio(ttl['bytes_per_sample'], base['bytes_per_sample'])}"
        )
    if not said:
        return []
    return ["", "The `ttl` arm in every stored run, newest first:", ""] + [f"- {s}." for s in said]
