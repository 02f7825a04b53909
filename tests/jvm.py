"""How the test suite starts its JVMs: the short-lived ones with the client compiler only
and the serial collector (:data:`FAST_START`).

Most JVMs the tests start live seconds to minutes: the executors of the cluster sets'
applications, the standalone Master and Workers, Hadoop's mini clusters, the Kafka
broker, the Spark Connect server, YARN's containers. On 2 cores, HotSpot's optimising
compiler (C2) and the parallel collector's threads spend more CPU than such a JVM gets
back: a local-mode driver running five small DataFrame and RDD jobs took 47 CPU-seconds
with the defaults and 20 with these flags (29 s of wall clock against 19).

The JVM of a pytest process (one per test lane, the driver of every SparkContext the lane
makes, and in local mode its executors too) lives for the whole lane, where C2 pays for
itself; it keeps it, with the serial collector (:data:`LONG_LIVED`, in
``PYSPARK_SUBMIT_ARGS``). Measured in two fresh-clone CI runs an hour apart: the spark set
took 28:36 with the client compiler everywhere and 28:50 this way, so for that set the
choice made no difference that this VM's drift (the same set took 24:47 the day before)
would not hide. The drivers the tests start as processes (the SIGKILL and fresh-process
tests' scripts, a minute or two each) are short-lived and take :data:`FAST_START` like the
others (:func:`driver_process_env`): run alone one after the other on 2 December 2026,
``test_stream_replay`` and ``test_crash_resume`` (five driver processes) used 288 busy
core-seconds so, their JVMs about 70 of them, against 332 and about 153 with the
inherited ``LONG_LIVED``; the wall clock was the same (218 s and 216 s). Production
JVMs keep the defaults; nothing of tensorspark sets these.

Spark's other JVMs read :data:`FAST_START` from ``tests/spark-conf/spark-defaults.conf``
(the tests' conftest points ``SPARK_CONF_DIR`` there); the others take it on their command
lines. A unit test keeps the two the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

#: The flags (see the module docstring).
FAST_START: tuple[str, ...] = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")

#: ``spark-submit``'s arguments for the long-lived driver JVM of a pytest process.
LONG_LIVED = "--driver-java-options -XX:+UseSerialGC"


def driver_process_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a Python process that starts its own Spark driver (a script run by a
    test): a copy whose ``PYSPARK_SUBMIT_ARGS`` (the pytest process's, or the caller's own)
    lose :data:`LONG_LIVED`, so the driver's JVM takes :data:`FAST_START` from the tests'
    ``spark-defaults.conf``; every other argument is kept."""
    driver = dict(env)
    if "PYSPARK_SUBMIT_ARGS" in driver:
        driver["PYSPARK_SUBMIT_ARGS"] = " ".join(
            driver["PYSPARK_SUBMIT_ARGS"].replace(LONG_LIVED, " ").split()
        )
    return driver


#: The ``SPARK_CONF_DIR`` of the tests: its ``spark-defaults.conf`` gives Spark's driver and
#: executors :data:`FAST_START`.
SPARK_CONF_DIR = Path(__file__).resolve().parent / "spark-conf"
