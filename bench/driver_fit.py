"""What the driver holds, stage by stage, during a real Keras ``fit`` of a row-sparse table.

``bench/driver_memory.py --fit`` runs this: for each configuration (the worker row cache
on or off, ``ps_shards`` 1 or 2), a fresh process starts a ``local[2]`` SparkContext,
builds the click model of :mod:`tensorspark.examples.ctr_embeddings` (``RowAdagrad``,
a ``rows x width`` table) and fits it on a click log with ``embeddings='sparse'``. The
resident memory of this process (``VmRSS``, and its peak ``VmHWM``, reset before each
stage through ``/proc/self/clear_refs``) and of the shard processes is read at each
stage, as growth over the process with the user's model built, per byte of the table:

* ``setup``: after the Keras set-up (the ``.keras`` payload, the checked copy, the
  initial weights, the workers' payload), before the server;
* ``server``: the server started (the run's first listener hook);
* ``setup_peak``, ``server_peak``, ``job_peak``, ``end_peak``: the peak from
  ``SparkSession(...)`` to the set-up's end, from there to the server started, while the
  training job runs, and from its end to ``fit``'s return (``VmHWM`` reset at each start);
* ``job_end``: when the job ended (the run's last listener hook);
* ``after_fit`` / ``after_close``: when ``fit`` returned (the final weights assigned), and
  after ``SparkSession.close()``;
* ``fit_peak``: the largest of those, from ``SparkSession(...)`` to the end of ``fit``:
  what :func:`tensorspark.models.embeddings.held_bytes` must cover.
"""

from __future__ import annotations

import gc
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger("bench.driver_fit")

#: (name, row_cache, ps_shards) of each measured configuration.
CONFIGS = {
    "uncached_1": ("off", 1),
    "cached_1": (None, 1),
    "uncached_2": ("off", 2),
    "cached_2": (None, 2),
}


def proc_status(pid: int | str, field: str) -> int:
    """A ``/proc/<pid>/status`` field in bytes (``VmRSS``, ``VmHWM``)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for process {pid}")


def reset_peak(pid: int | str = "self") -> None:
    """Set the process's ``VmHWM`` back to its ``VmRSS``."""
    with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as f:
        f.write("5")


class Stages:
    """The driver's resident memory at named stages, over a base (bytes)."""

    def __init__(self) -> None:
        gc.collect()
        self.base = proc_status("self", "VmRSS")
        self.rss: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.shards: dict[str, list[int]] = {}
        self.pids: list[int] = []

    def mark(self, stage: str) -> None:
        self.rss[stage] = proc_status("self", "VmRSS") - self.base
        alive = [p for p in self.pids if Path(f"/proc/{p}/status").exists()]
        if alive:  # (the shard processes end with the run)
            self.shards[stage] = [proc_status(p, "VmRSS") for p in alive]

    def start_peak(self) -> None:
        reset_peak()

    def end_peak(self, stage: str) -> None:
        self.peak[stage] = proc_status("self", "VmHWM") - self.base


def child(name: str, rows: int, width: int, examples: int) -> dict[str, Any]:
    """One configuration in this (fresh) process."""
    import keras  # noqa: F401 - imported before the base, as in a user's shell
    from pyspark import SparkConf, SparkContext

    import tensorspark as sps
    from tensorspark.datasets.clicks import click_log
    from tensorspark.examples.ctr_embeddings import ctr_model
    from tensorspark.models.row_optimizers import RowAdagrad
    from tensorspark.training import keras_setup

    row_cache, shards = CONFIGS[name]
    conf = (
        SparkConf()
        .setMaster("local[2]")
        .setAppName("bench-driver-fit")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    log = click_log(examples, rows=rows, seed=0)
    train = sc.parallelize(list(zip(log.ids, log.labels, strict=True)), 2).cache()
    train._jrdd.count()  # noqa: SLF001  (in the JVM: no Python worker started here)
    del log
    stages = Stages()
    model = ctr_model(rows=rows, dim=width, optimizer=RowAdagrad(0.05))
    stages.mark("model")
    table = rows * width * 4

    of = keras_setup.KerasTraining.of.__func__  # type: ignore[attr-defined]

    def measured_of(cls: Any, *args: Any, **kwargs: Any) -> Any:
        out = of(cls, *args, **kwargs)
        gc.collect()
        stages.end_peak("setup_peak")
        stages.mark("setup")
        stages.start_peak()
        return out

    keras_setup.KerasTraining.of = classmethod(measured_of)  # type: ignore[method-assign]

    class Listener(sps.RunListener):
        def on_run_start(self, info: Any) -> None:
            server = session.server
            stages.pids = [p for p in getattr(server, "pids", []) if p is not None]
            stages.end_peak("server_peak")
            stages.mark("server")
            stages.start_peak()

        def on_run_end(self, result: Any) -> None:
            stages.end_peak("job_peak")
            stages.mark("job_end")
            stages.start_peak()

    cache = row_cache if row_cache is not None else max(20 * 256 * 8, rows // 16)
    stages.start_peak()
    session = sps.SparkSession(
        sc,
        model,
        sync_interval=20,
        batch_size=256,
        embeddings="sparse",
        row_cache=cache,
        ps_shards=shards,
        server_reusable=False,
        name=f"driver-fit-{name}",
    )
    history = session.fit(train, epochs=1, progress=False, listeners=[Listener()])
    stages.end_peak("end_peak")
    stages.peak["fit_peak"] = max(stages.peak.values())
    gc.collect()
    stages.mark("after_fit")
    session.close()
    gc.collect()
    stages.mark("after_close")
    cached = int(history.result.status.get("cache_misses", 0)) > 0
    sc.stop()
    return {
        "name": name,
        "row_cache": str(cache),
        "cache_used": cached,
        "ps_shards": shards,
        "table_bytes": table,
        "model_per_table_byte": stages.rss["model"] / table,
        "per_table_byte": {
            k: (v - stages.rss["model"]) / table for k, v in stages.rss.items() if k != "model"
        },
        "peak_per_table_byte": {
            k: (v - stages.rss["model"]) / table for k, v in stages.peak.items()
        },
        "shard_rss_bytes": stages.shards,
    }


def measure(rows: int, width: int, examples: int, names: list[str]) -> list[dict[str, Any]]:
    """Each configuration of ``names`` in a fresh process."""
    out = []
    for name in names:
        done = subprocess.run(
            [sys.executable, __file__, name, str(rows), str(width), str(examples)],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if done.returncode:
            raise RuntimeError(f"the {name} measurement failed:\n{done.stderr[-4000:]}")
        row = json.loads(done.stdout.strip().splitlines()[-1])
        logger.info("%s: %s", name, row)
        out.append(row)
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    name, rows_, width_, examples_ = sys.argv[1:5]
    print(json.dumps(child(name, int(rows_), int(width_), int(examples_))), flush=True)
