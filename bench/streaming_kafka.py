"""Benchmark: freshness of training from Kafka (the companion of bench/streaming.py's files).

A single-node Kafka broker (KRaft, the jars of tests/kafka, from ~/.m2) on 127.0.0.1 and
Spark's Kafka source; the 784-128-10 MLP of bench/streaming.py. While a stream trains with
``trigger`` 2 s and 10 s, ``--rows`` Fashion-MNIST rows are produced as JSON every second
(Spark's Kafka sink, so producing shares ``local[2]`` with training). The lag of a record
is from its Kafka ``timestamp`` (``arrival_col``) to the end of the micro-batch that
trained it (the first model version that includes it): per micro-batch, its median record
and its oldest one; the JSON gives p50 of the medians and the largest of the oldest.

    python bench/streaming_kafka.py            # about 3 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

from bench.streaming import session  # noqa: E402
from tests.kafka.conftest import (  # noqa: E402
    classpath,
    free_port,
    java,
    server_properties,
    spark_kafka_jars,
    wait_ready,
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    out = Path(__file__).parent / "results" / "streaming_kafka.json"
    parser.add_argument("--out", default=str(out))
    return parser.parse_args()


def start_broker(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The broker of tests/kafka/conftest.py, outside pytest; (its process, host:port)."""
    cp = ":".join(classpath("pom-broker.xml"))
    port, controller = free_port(), free_port()
    props = server_properties(folder, port, controller)
    cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    jvm = [java(), "-Xmx512m", "-cp", cp]
    subprocess.run(
        [*jvm, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster}", "-c", str(props)],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    log = folder / "broker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*jvm, "kafka.Kafka", str(props)], stdout=out, stderr=out)
    wait_ready(proc, port, log)
    return proc, f"127.0.0.1:{port}"


def produce(spark: Any, bootstrap: str, topic: str, x: np.ndarray, y: np.ndarray) -> None:
    """``x``/``y`` as JSON records into ``topic`` (one Spark job)."""
    values = [
        (json.dumps({"pixels": row.tolist(), "label": int(label)}),)
        for row, label in zip(x, y, strict=True)
    ]
    (
        spark.createDataFrame(values, "value string").write.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap).option("topic", topic).save()
    )  # fmt: skip


def freshness(spark: Any, bootstrap: str, work: Path, data: Any, trigger: float, args: Any) -> dict:
    from pyspark.sql import functions as F

    topic = f"fresh-{int(trigger)}"
    produce(spark, bootstrap, topic, data.train_images[:1], data.train_labels[:1])  # the topic
    raw = (
        spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic).option("startingOffsets", "latest").load()
    )  # fmt: skip
    parsed = F.from_json(F.col("value").cast("string"), "pixels array<float>, label long")
    rows = raw.select(parsed.alias("r"), "timestamp").select("r.pixels", "r.label", "timestamp")
    records: list[dict] = []
    training = session(spark).fit_stream(
        rows, checkpoint_location=str(work / f"ckpt-{topic}"), trigger=f"{trigger} seconds",
        features_col="pixels", arrival_col="timestamp", on_batch=records.append,
    )  # fmt: skip
    produced = 0
    end = time.time() + args.seconds
    i = 0
    while time.time() < end:
        lo = (i * args.rows) % (len(data.train_labels) - args.rows)
        tick = time.time()
        produce(spark, bootstrap, topic, data.train_images[lo : lo + args.rows],
                data.train_labels[lo : lo + args.rows])  # fmt: skip
        produced += args.rows
        i += 1
        time.sleep(max(0.0, 1.0 - (time.time() - tick)))
    deadline = time.time() + 300
    while training.status["samples"] < produced and time.time() < deadline:
        if not training.query.isActive:  # failed: await_termination raises its error
            training.await_termination(0)
        time.sleep(0.5)
    training.stop()
    trained = [r for r in records if r["rows"] > 0 and r["arrival_min"] is not None]
    medians = [r["trained_at"] - r["arrival_median"] for r in trained]
    oldest = [r["trained_at"] - r["arrival_min"] for r in trained]
    return {
        "trigger_s": trigger,
        "rows_produced": produced,
        "rows_trained": training.status["samples"],
        "batches": len(trained),
        "lag_median_record_p50_s": round(float(np.percentile(medians, 50)), 2),
        "lag_oldest_record_max_s": round(float(max(oldest)), 2),
    }


def main() -> None:
    args = parse_args()
    record = run_record.begin("streaming_kafka")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the broker stops in finally
    from pyspark.sql import SparkSession as SQLSession

    from tensorspark.datasets.mnist import load_mnist
    from tensorspark.tfthreads import limit_tf_threads

    limit_tf_threads(1)
    data = load_mnist(args.data_dir, download=False)
    work = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    broker, bootstrap = start_broker(work)
    try:
        spark = (
            SQLSession.builder.master("local[2]")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.python.worker.reuse", "true")
            .config("spark.jars", spark_kafka_jars())
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        warm = spark.createDataFrame(
            [(r.tolist(), int(label)) for r, label in zip(data.train_images[:500],
                                                          data.train_labels[:500], strict=True)],
            "pixels array<float>, label long",
        )  # fmt: skip
        session(spark).fit(warm, features_col="pixels", progress=False)
        fresh = [freshness(spark, bootstrap, work, data, t, args) for t in (2.0, 10.0)]
        result = {
            "machine": f"{os.cpu_count()} cores, local[2]; other work shared the machine",
            "load_average_1m_at_end": os.getloadavg()[0],
            "model": "784-128-10 MLP, Adam, batch 64, sync_interval 10, async",
            "rows_per_second": args.rows,
            "seconds": args.seconds,
            "freshness": fresh,
        }
        print(json.dumps(result, indent=2))
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        run_record.write(Path(args.out), result, record)
        spark.stop()
    finally:
        broker.terminate()
        broker.wait(30)


if __name__ == "__main__":
    main()
