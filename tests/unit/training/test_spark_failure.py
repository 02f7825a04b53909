"""Spark job failures become tensorspark errors: executors lost under a task."""

from __future__ import annotations

from tensorspark.errors import ExecutorLostError, WorkerError
from tensorspark.jobs import failed_daemon, spark_failure
from tensorspark.training.sync import sync_executor_lost

# What Spark 4.3 reported when tests/netns SIGKILLed an executor under a sync run.
BARRIER = (
    "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Could not recover from a "
    "failed barrier ResultStage. Most recent failure reason: Stage failed because barrier task "
    "ResultTask(16, 1) finished unsuccessfully.\n"
    "ExecutorLostFailure (executor 4 exited caused by one of the running tasks) "
    "Reason: Command exited with code 137\n"
    "\tat org.apache.spark.scheduler.DAGScheduler.$anonfun$abortStage$3(DAGScheduler.scala:4568)\n"
)
# The same loss, the fourth time for one task of an ordinary stage.
RETRIED = (
    ": org.apache.spark.SparkException: Job aborted due to stage failure: "
    "Task 0 in stage 7.0 failed 4 "
    "times, most recent failure: Lost task 0.3 in stage 7.0 (TID 21) (10.213.56.11 executor 9): "
    "ExecutorLostFailure (executor 9 exited caused by one of the running tasks) "
    "Reason: Command exited with code 137\n"
)


class Py4JJavaError(Exception):
    """Named like py4j's, which is what jobs.is_spark_failure looks for."""


def test_a_lost_executor_is_named_with_its_partition() -> None:
    err = spark_failure(Py4JJavaError(BARRIER))
    assert isinstance(err, ExecutorLostError)
    assert (err.executors, err.partitions) == (["4"], [1])
    assert str(err) == (
        "executor 4 was lost while it ran the task of partition(s) [1] "
        "(exited caused by one of the running tasks; Reason: Command exited with code 137)"
    )
    retried = spark_failure(Py4JJavaError(RETRIED))
    assert isinstance(retried, ExecutorLostError)
    assert (retried.executors, retried.partitions) == (["9"], [0])


def test_a_sync_run_says_why_it_stopped_and_how_to_go_on() -> None:
    lost = spark_failure(Py4JJavaError(BARRIER))
    assert isinstance(lost, ExecutorLostError)
    status = {
        "round": 7,
        "version": 7,
        "workers": [{"partition": 0, "host": "10.0.0.11"}, {"partition": 1, "host": "10.0.0.12"}],
    }
    message = str(sync_executor_lost(lost, status))
    assert message.startswith(
        "mode='sync' lost executor 4 mid-run (partition 1 at 10.0.0.12): "
        "executor 4 was lost while it ran"
    )
    assert "Spark does not rerun a barrier stage whose task was lost" in message
    assert "The server had completed 7 rounds (version 7)" in message
    assert "run again with resume=True" in message and "mode='async'" in message


def test_other_failures_stay_worker_errors() -> None:
    err = spark_failure(
        Py4JJavaError(
            "Job aborted due to stage failure: Task 0 in stage 1.0 failed 1 times: OutOfMemoryError"
        )
    )
    assert type(err) is WorkerError


def test_a_daemon_that_never_wrote_its_port_is_named() -> None:
    # Spark's words (PythonWorkerFactory; the same in 3.5 and 4.x) when the module
    # spark.python.daemon.module names exits before it writes its port.
    said = (
        "org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage "
        "0.0 failed 1 times, most recent failure: Lost task 0.0 in stage 0.0 (TID 0) "
        "(localhost executor driver): org.apache.spark.SparkException: EOFException occurred "
        "while reading the port number from {module}'s stdout.\n\tat org.apache.spark.api."
        "python.PythonWorkerFactory.startDaemon(PythonWorkerFactory.scala:382)"
    )
    ours = "tensorspark.warmup.daemon"
    assert failed_daemon(RuntimeError(said.format(module=ours))) == ours
    # PySpark's own daemon failing is another matter (a broken Python, not a setting).
    assert failed_daemon(RuntimeError(said.format(module="pyspark.daemon"))) is None
    assert failed_daemon(RuntimeError("Task failed: ZeroDivisionError")) is None
