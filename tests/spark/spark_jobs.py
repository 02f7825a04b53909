"""Counting the Spark jobs a call ran, for tests that assert a refusal or a cached check ran
none (or exactly one)."""

from __future__ import annotations

from pyspark import SparkContext

#: The job group every warm-up and keep-alive job runs in (tensorspark/warmup/runner.py):
#: a session's background thread, not the call under test.
WARMUP_GROUP = "tensorspark-warmup-"


def jobs_run(sc: SparkContext) -> int:
    """The jobs ``sc`` has run so far, leaving out the warm-up's and keep-alive's: a session
    another test left open keeps its workers alive with a job every 30 s, which may land
    inside the window a test counts."""
    jobs = sc._jsc.sc().statusStore().jobsList(None)  # noqa: SLF001
    count = 0
    for index in range(jobs.size()):
        group = jobs.apply(index).jobGroup()
        if not (group.isDefined() and str(group.get()).startswith(WARMUP_GROUP)):
            count += 1
    return count
