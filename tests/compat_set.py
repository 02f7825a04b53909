"""The ``compat`` set: what ``scripts/compat.sh`` runs on the oldest and newest environments.

Issue 31 asks for the unit and spark sets, the MNIST example, Keras fit/evaluate/predict on
an RDD, a DataFrame and Parquet files, ``tune``, the Spark ML pipeline save/load and a
standalone-cluster smoke test on both, plus YARN client mode on the oldest (and, there
only, the Spark Connect set on a Spark 3.5 Connect server). The whole spark set twice does
not fit CI's budget (docs/support.md has the figures), so the set is every unit test (but
the Chromium ones, whose page and scripts no Python version changes) plus the spark tests
below. The oldest environment runs the tests chosen to cover each item of that list and
each place where the Spark, TensorFlow, Keras or numpy version matters (inference's UDF,
DataFrame input through ``mapInArrow``, barrier stages, job groups and cancellation,
streaming). The newest environment has the default environment's libraries on another
Python (3.13), so it runs the unit set and a smoke of that Python on Spark's workers (the
MNIST example in local mode and on a standalone cluster); the default environment's full
run covers those libraries.
"""

from __future__ import annotations

#: Whole folders in the compat set.
FOLDERS = ("unit",)

#: Spark tests in both environments' compat set, and why. The newest environment has the
#: default environment's libraries (pyspark 4.3, TensorFlow 2.21, Keras 3.15, numpy 2.4) on
#: Python 3.13 instead of 3.11, so there the spark tests are a smoke of Python 3.13 on
#: Spark's workers (functions pickled to them, training in local mode and on a standalone
#: cluster); the default environment's full run covers its libraries. Test ids are relative
#: to ``tests/``: a file, or a file and a test name prefix (parametrized ids included).
TESTS = (
    # The MNIST example (examples/spark_mnist.py's train) in local mode.
    "spark/test_core.py::test_seed_example_trains_on_spark",
    # a standalone cluster started from the environment's own pyspark, MNIST trained on it.
    "cluster/test_cluster_smoke.py",
)

#: Only in the oldest environment (scripts/compat.sh sets TENSORSPARK_HADOOP_VERSION there),
#: whose libraries differ from the default environment's (pyspark 3.5, TensorFlow 2.16,
#: Keras 3.9, numpy 1.26, Python 3.10): each place where their versions matter.
OLDEST_ONLY = (
    # fit on RDD, DataFrame and Parquet files alike (mapInArrow).
    "spark/test_files.py::test_rdd_dataframe_and_files_train_the_same_model",
    # pyspark < 4.1 scores through pandas_udf: same predictions as the Arrow path.
    "spark/test_sparkcompat.py",
    # evaluate / predict on an RDD and a DataFrame (fit on each: test_files; the
    # accuracy-bar fits of test_keras, 80 s, stay in the default environment's run).
    "spark/test_keras.py::test_evaluate_dataframe_with_vectors_matches_keras",
    "spark/test_keras.py::test_predict_keeps_the_order_of_a_shuffled_dataframe",
    "spark/test_keras.py::test_predict_rdd_keeps_input_order",
    # predict writing Parquet; sync mode's barrier stage over files (mapInArrow(barrier=True)).
    "spark/test_files.py::test_predict_writes_parquet_read_back_in_input_order",
    "spark/test_files.py::test_sync_mode_reads_files_in_a_barrier_stage",
    # inference: RDD, array/binary columns, vectors with top-k.
    "spark/test_inference.py::test_rdd_matches_model_predict_in_input_order",
    "spark/test_inference.py::test_dataframe_matches_model_predict",
    "spark/test_inference.py::test_binary_column_of_uint8_pixels_matches_model_predict",
    "spark/test_inference.py::test_top_k_with_labels_on_vectors",
    "spark/test_inference.py::test_later_dataframe_row_that_does_not_fit_fails_the_job",
    # tune: parallel grid over an RDD, over DataFrames (mapInArrow trials).
    "spark/test_tuning.py::test_grid_runs_every_trial_in_parallel",
    "spark/test_tuning.py::test_best_model_carries_the_best_weights",
    "spark/test_tuning.py::test_dataframes_train_as_the_same_arrays_do",
    # Spark ML: pipeline fit, transform, save and load.
    "spark/test_ml.py::test_pipeline_fits_transforms_and_round_trips_bit_identically",
    # each training mode to its accuracy bar (sync is a barrier stage).
    "spark/test_modes.py::test_each_mode_trains_to_the_bar",
    # a driver-side failure cancels the job group.
    "spark/test_core.py::test_worker_exception_reaches_the_driver_and_the_server_stops",
    # Structured Streaming: training from a stream in each mode, files landing trained once
    # each and served (the UDF path), bad records named (the driver-crash test, about 50 s,
    # stays in the default run).
    "spark/test_streaming.py::test_every_training_mode_trains_a_stream",
    "spark/test_streaming.py::test_files_landing_are_trained_once_each_and_served",
    "spark/test_streaming.py::test_bad_records_stop_the_query_naming_column_and_batch",
    # YARN client mode on a MiniYARNCluster of the Hadoop that Spark 3.5 bundles, and the
    # whole connect set on a Spark 3.5 Connect server (fit/evaluate/predict, sync mode, tune,
    # the errors, cancelling by job tag; about 65 s). The newest environment's Connect server
    # is pyspark 4.3's, which the default environment's full run already covers.
    "yarn/test_yarn.py::test_client_mode_mnist_on_hdfs",
    "yarn/test_yarn.py::test_keras_fit_client_mode",
    "connect/test_connect.py",
)


def in_compat_set(test_id: str, *, oldest: bool) -> bool:
    """Whether the test ``test_id`` (relative to ``tests/``) is in the compat set."""
    if test_id.split("/", 1)[0] in FOLDERS:
        return True
    chosen = TESTS + OLDEST_ONLY if oldest else TESTS
    return any(test_id == t or test_id.startswith((t + "::", t + "[")) for t in chosen)
