"""How the test suite starts its JVMs: with the client compiler only and the serial
collector (:data:`FAST_START`).

Every JVM the tests start lives seconds to minutes: Spark drivers and executors, the
standalone Master and Workers, Hadoop's mini clusters, the Kafka broker, the Spark Connect
server. On 2 cores, HotSpot's optimising compiler (C2) and the parallel collector's threads
spend more CPU than such a JVM ever gets back: a local-mode driver running five small
DataFrame and RDD jobs took 47 CPU-seconds with the defaults and 20 with these flags (29 s
of wall clock against 19). Production JVMs live long and keep the defaults; nothing of
tensorspark sets them.

Spark's JVMs read them from ``tests/spark-conf/spark-defaults.conf`` (the tests' conftest
points ``SPARK_CONF_DIR`` there, so every driver, subprocess drivers and the Connect
server included, and every executor, on any cluster manager, gets them); the others take
:data:`FAST_START` on their command lines. A unit test keeps the two the same.
"""

from __future__ import annotations

from pathlib import Path

#: The flags (see the module docstring).
FAST_START: tuple[str, ...] = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")

#: The ``SPARK_CONF_DIR`` of the tests: its ``spark-defaults.conf`` gives Spark's driver and
#: executors :data:`FAST_START`.
SPARK_CONF_DIR = Path(__file__).resolve().parent / "spark-conf"
