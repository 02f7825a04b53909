"""The training-modes guide's table of elastic sync runs, written from the newest stored run
of ``bench/elastic.py``.

Part of ``bench/figures.py`` (through ``figures_tables.BLOCKS``): the Keras MLP on
Fashion-MNIST in sync mode on a standalone cluster, uninterrupted and losing one executor
at 30 % and at 60 % of its pushes, beside today's fail-fast barrier stage that is resumed
by hand, and the issue's bars checked on each loss.
"""

from __future__ import annotations

from typing import Any

import figures_runs as fr

#: How the guide names each run.
RUN_LABELS = {
    "uninterrupted": "uninterrupted (elastic)",
    "lost_at_30": "**executor lost at 30 %** (elastic)",
    "lost_at_60": "**executor lost at 60 %** (elastic)",
    "barrier_resume": "executor lost at 30 %, barrier stage: fails, then `resume=True`",
    "uninterrupted_again": "uninterrupted again (elastic)",
}
NO_RUN = (
    "No stored run of `bench/elastic.py` yet: `python bench/elastic.py --out "
    "bench/results/elastic.json` writes one (about 8 minutes on 2 cores), and "
    "`python bench/figures.py` writes its table here."
)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _row(label: str, run: dict[str, Any]) -> str:
    ratios = run.get("ratios") or {}
    vs = f"{ratios['wall_over_uninterrupted']:.2f}x" if ratios else "1x (baseline)"
    if ratios:
        vs += f", {ratios['overhead_s']:+.1f} s ({ratios['overhead_in_rounds']:+.1f} rounds)"
    replaced = run.get("replacement_registered_s")
    if "waited_for_executor_s" in run:
        replaced = run["waited_for_executor_s"]
    short = run.get("short_rounds", "-")
    rejoined = run.get("partitions_rejoined", "-")
    lost = run.get("seconds_lost")
    return (
        f"| {label} | {run['wall_s']:.1f} s | {vs} | {_seconds(replaced)} | {short} | "
        f"{rejoined} | {_seconds(lost)} | {run['pushes_applied']}/{run['pushes_expected']} | "
        f"{run['test_accuracy']:.4f} |"
    )


def bars(data: dict[str, Any]) -> dict[str, bool]:
    """The issue's bars on each elastic loss: it completed on its own with exactly the
    pushes and samples the data implies; test accuracy within 0.005 of the uninterrupted
    runs; overhead at most the executor's replacement time plus 2 rounds."""
    out: dict[str, bool] = {}
    runs = data["runs"]
    base = runs["uninterrupted"]
    round_s = base["wall_s"] / max(1, base["rounds"])
    for name, run in runs.items():
        if not name.startswith("lost_at_") or "_seed_" in name:
            continue
        at = name.removeprefix("lost_at_")
        out[f"{at} %: completed, pushes and samples exact"] = (
            run["pushes_applied"] == run["pushes_expected"]
            and run["samples_applied"] == run["samples_expected"]
        )
        out[f"{at} %: accuracy within 0.005"] = (
            abs(run["ratios"]["accuracy_minus_uninterrupted"]) <= 0.005
        )
        replaced = run.get("replacement_registered_s")
        allowed = (replaced if replaced is not None else data["lost_after"]) + 2 * round_s
        out[f"{at} %: overhead ≤ replacement + 2 rounds"] = run["ratios"]["overhead_s"] <= allowed
    return out


def _loss(run: dict[str, Any] | None) -> str:
    if run is None:
        return "- | - | -"
    ratios = run["ratios"]
    return (
        f"+{ratios['overhead_s']:.1f} s | {_seconds(run.get('seconds_lost'))} | "
        f"{ratios['accuracy_minus_uninterrupted']:+.4f}"
    )


def stored_runs(every: list[fr.Run]) -> list[str]:
    """One line per stored run, newest first: what each loss cost, and the bars (the
    driver's reading of Spark's failed tasks arrived between two of them)."""
    lines = [
        "Every stored run, newest first (overhead, seconds lost and accuracy against the "
        "uninterrupted runs, at 30 % | at 60 %):",
        "",
        "| run | epochs, `lost_after` | overhead 30 % | seconds lost | accuracy | "
        "overhead 60 % | seconds lost | accuracy | bars |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in every:
        d = run.data
        lines.append(
            f"| {run.date}, {run.commit}, `{run.name}` | {d['epochs']}, {d['lost_after']:g} s | "
            f"{_loss(d['runs'].get('lost_at_30'))} | {_loss(d['runs'].get('lost_at_60'))} | "
            f"{'met' if all(bars(d).values()) else 'missed'} |"
        )
    return lines


def seeds_table(data: dict[str, Any]) -> list[str]:
    """With ``--seeds N``: each seed's uninterrupted run and its losses, each loss against
    the same seed's uninterrupted run, and the mean difference over the seeds (a single
    run's difference is one draw of how a perturbed trajectory ends)."""
    runs = data["runs"]
    shares = sorted(
        {n.removeprefix("lost_at_") for n in runs if n.startswith("lost_at_") and "_seed" not in n}
    )
    seeds = [0] + sorted(
        int(n.removeprefix("uninterrupted_seed_"))
        for n in runs
        if n.startswith("uninterrupted_seed_")
    )
    if len(seeds) < 2:
        return []

    def named(kind: str, seed: int) -> dict[str, Any] | None:
        return runs.get(kind if seed == 0 else f"{kind}_seed_{seed}")

    lines = [
        "Each seed (the model's initial weights and the shuffle) uninterrupted and losing an "
        "executor, each loss against the same seed's uninterrupted run:",
        "",
        "| seed | uninterrupted | "
        + " | ".join(f"lost at {at} % (difference)" for at in shares)
        + " |",
        "|---|---|" + "---|" * len(shares),
    ]
    diffs: dict[str, list[float]] = {at: [] for at in shares}
    for seed in seeds:
        base = named("uninterrupted", seed)
        if base is None:
            continue
        cells = []
        for at in shares:
            run = named(f"lost_at_{at}", seed)
            if run is None:
                cells.append("-")
                continue
            diff = run["ratios"]["accuracy_minus_uninterrupted"]
            diffs[at].append(diff)
            cells.append(f"{run['test_accuracy']:.4f} ({diff:+.4f})")
        lines.append(f"| {seed} | {base['test_accuracy']:.4f} | " + " | ".join(cells) + " |")
    accuracies = data.get("seed_accuracies") or []
    spread = max(accuracies) - min(accuracies) if accuracies else 0.0
    means = [f"{sum(d) / len(d):+.4f}" if d else "-" for d in (diffs[at] for at in shares)]
    lines.append(
        f"| mean over {len(seeds)} seeds | spread {spread:.4f} | " + " | ".join(means) + " |"
    )
    on_mean = [
        f"{at} %: {'met' if abs(sum(d) / len(d)) <= 0.005 else '**missed**'}"
        for at, d in diffs.items()
        if d
    ]
    lines += [
        "",
        "The accuracy bar (within 0.005) on the mean over the seeds: " + ", ".join(on_mean) + ".",
    ]
    return ["", *lines]


def shard_lines(run: fr.Run) -> list[str]:
    """A server shard SIGKILLed mid-run (sync mode over ``ps_shards=2``) against the same
    server uninterrupted, and the bars that apply to it."""
    d = run.data
    runs = d["runs"]
    base = runs["shards_uninterrupted"]
    lines = [
        "",
        f"A server shard killed instead {run.cite}, load {run.load}: sync mode over two "
        "shard processes (`ps_shards=2`; elastic sync runs on one server), shard 1's "
        "process SIGKILLed mid-run, against the same server uninterrupted:",
        "",
        "| run | wall | vs uninterrupted | shard restarts | pushes applied/expected | "
        "samples applied/expected | test accuracy |",
        "|---|---|---|---|---|---|---|",
    ]
    checks: dict[str, bool] = {}
    for name, run_ in runs.items():
        if name != "shards_uninterrupted" and not name.startswith("shard_lost_at_"):
            continue
        ratios = run_.get("ratios")
        vs = "1x (baseline)"
        label = "uninterrupted (2 shards)"
        if ratios:
            at = name.removeprefix("shard_lost_at_")
            label = f"**shard 1 killed at {at} %**"
            vs = f"{ratios['wall_over_uninterrupted']:.2f}x, {ratios['overhead_s']:+.1f} s"
            checks[f"shard {at} %: killed, completed, pushes and samples exact"] = (
                run_["shard_killed"]
                and run_["pushes_applied"] == run_["pushes_expected"]
                and run_["samples_applied"] == run_["samples_expected"]
            )
            checks[f"shard {at} %: accuracy within 0.005"] = (
                abs(run_["test_accuracy"] - base["test_accuracy"]) <= 0.005
            )
        restarts = run_.get("shard_restarts")
        lines.append(
            f"| {label} | {run_['wall_s']:.1f} s | {vs} | {restarts} | "
            f"{run_['pushes_applied']}/{run_['pushes_expected']} | "
            f"{run_['samples_applied']:,}/{run_['samples_expected']:,} | "
            f"{run_['test_accuracy']:.4f} |"
        )
    lines += ["", f"Bars: {fr.verdict(checks)}."]
    return lines


def optimizer_lines() -> list[str]:
    """The newest ``bench/elastic_optimizer.py`` run: the same loss in one process, the
    rerun's Adam new (as today) or kept, each against its seed's uninterrupted run."""
    try:
        run = fr.runs("elastic_optimizer")[0]
    except FileNotFoundError:
        return []
    d = run.data
    a = d["args"]
    by = {(r["seed"], r["kind"]): r["test_accuracy"] for r in d["runs"]}
    seeds = sorted({r["seed"] for r in d["runs"]})
    lines = [
        "",
        "The same loss in one process, without Spark: `bench/elastic_optimizer.py` "
        f"{run.cite}, load {run.load}; three Keras workers in sync rounds, partition 0 away "
        f"for {a['lost_rounds']} rounds after {a['lost_at'] * 100:.0f} % of its pushes, then "
        "rejoining "
        "with a new Adam (as a rerun task does today) or with its Adam kept:",
        "",
        "| seed | uninterrupted | rejoined with a new Adam (difference) | "
        "with its Adam kept (difference) |",
        "|---|---|---|---|",
    ]
    for seed in seeds:
        base = by[(seed, "uninterrupted")]
        cells = [f"{by[(seed, k)]:.4f} ({by[(seed, k)] - base:+.4f})" for k in ("fresh", "kept")]
        lines.append(f"| {seed} | {base:.4f} | " + " | ".join(cells) + " |")
    means = d["mean_differences"]
    lines.append(
        f"| mean over {len(seeds)} seeds | | {means['fresh']:+.4f} | {means['kept']:+.4f} |"
    )
    return lines


def elastic_table() -> str:
    """Each run of the newest stored ``bench/elastic.py`` run, and its bars; then a line
    for every stored run."""
    try:
        stored = fr.runs("elastic")
    except FileNotFoundError:
        return NO_RUN
    # The benchmark trains with Adam; runs with another optimizer are diagnoses.
    # The main table: the newest run that lost executors (a run may hold only shard runs).
    shards = [r for r in stored if "shards_uninterrupted" in r.data["runs"]]
    stored = [r for r in stored if any(n.startswith("lost_at_") for n in r.data["runs"])]
    every = [r for r in stored if r.data.get("optimizer", "adam") == "adam"]
    others = [r for r in stored if r.data.get("optimizer", "adam") != "adam"]
    if not every:
        return NO_RUN
    run = every[0]
    data = run.data
    lines = [
        f"Newest stored run {run.cite}, load {run.load}: {data['rows']:,} rows, "
        f"{data['epochs']} epochs, batch {data['batch_size']}, `sync_interval="
        f"{data['sync_interval']}`, `lost_after={data['lost_after']}`; cluster {data['cluster']}:",
        "",
        "| run | wall | vs uninterrupted | executor replaced after | short rounds | "
        "partitions rejoined | seconds lost | pushes applied/expected | test accuracy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, label in RUN_LABELS.items():
        if name in data["runs"]:
            killed = data["runs"][name].get("killed") or {}
            if "fraction" in killed:  # when the kill landed (the driver polls twice a second)
                label += f", killed at {killed['fraction']:.0%} of the pushes"
            lines.append(_row(label, data["runs"][name]))
    checks = bars(data)
    lines += ["", f"Bars: {fr.verdict(checks)}."]
    barrier = data["runs"].get("barrier_resume")
    if barrier is not None:
        lines.append(
            "The barrier stage's run failed after "
            f"{barrier['failed_after_s']:.1f} s, waited {barrier['waited_for_executor_s']:.1f} s "
            "for the replacement executor, and redid at least "
            f"{barrier['rounds_redone_at_least']} rounds from its last checkpoint when resumed "
            "(a user's step, counted here as if immediate)."
        )
    lines += seeds_table(data)
    for other in others:
        d = other.data
        lines += [
            "",
            f"With `--optimizer {d['optimizer']}` instead {other.cite}, load {other.load}: "
            f"{d['rows']:,} rows, {d['epochs']} epochs:",
            *seeds_table(d),
        ]
    if shards:
        lines += shard_lines(shards[0])
    lines += optimizer_lines()
    return "\n".join([*lines, "", *stored_runs(every)])
