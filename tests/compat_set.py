"""The ``compat`` set: what ``scripts/compat.sh`` runs on the oldest and newest environments.

Issue 31 asks for the unit and spark sets, the MNIST example, Keras fit/evaluate/predict on
an RDD, a DataFrame and Parquet files, ``tune``, the Spark ML pipeline save/load and a
standalone-cluster smoke test on both, plus YARN client mode on the oldest (and, there
only, the Spark Connect set on a Spark 3.5 Connect server). The whole spark
set twice does not fit CI's budget for the two environments (docs/support.md has the
figures), so the set is every unit test plus the spark tests below, chosen to cover each
item of that list and each place where the Spark version matters (inference's UDF,
DataFrame input through ``mapInArrow``, barrier stages, job groups and cancellation,
streaming). Entries are test ids relative to ``tests/``: a file, or a file and a test name
prefix (parametrized ids included).
"""

from __future__ import annotations

#: Whole folders in the compat set.
FOLDERS = ("unit",)

#: Test ids (``path`` or ``path::name``) in the compat set, and why.
TESTS = (
    # pyspark < 4.1 scores through pandas_udf: same predictions as the Arrow path.
    "spark/test_sparkcompat.py",
    # The MNIST example (examples/spark_mnist.py's train) in local mode.
    "spark/test_core.py::test_seed_example_trains_on_spark",
    # evaluate / predict on an RDD and a DataFrame (fit on each: test_files below; the
    # accuracy-bar fits of test_keras, 80 s, stay in the default environment's run).
    "spark/test_keras.py::test_evaluate_dataframe_with_vectors_matches_keras",
    "spark/test_keras.py::test_predict_keeps_the_order_of_a_shuffled_dataframe",
    "spark/test_keras.py::test_predict_rdd_keeps_input_order",
    # fit on RDD, DataFrame and Parquet files alike; predict writing Parquet; sync mode's
    # barrier stage over files (mapInArrow(barrier=True)).
    "spark/test_files.py::test_rdd_dataframe_and_files_train_the_same_model",
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
    # each training mode (sync is a barrier stage).
    "spark/test_modes.py::test_each_mode_trains_to_the_bar",
    # a driver-side failure cancels the job group.
    "spark/test_core.py::test_worker_exception_reaches_the_driver_and_the_server_stops",
    # Structured Streaming: training from a stream in each mode, scoring it (the UDF path),
    # bad records named (the driver-crash test, about 50 s, stays in the default run).
    "spark/test_streaming.py::test_files_landing_are_trained_once_each_and_served",
    "spark/test_streaming.py::test_every_training_mode_trains_a_stream",
    "spark/test_streaming.py::test_bad_records_stop_the_query_naming_column_and_batch",
    # a standalone cluster started from the environment's own pyspark.
    "cluster/test_cluster_smoke.py",
)

#: Only in the oldest environment (scripts/compat.sh sets TENSORSPARK_HADOOP_VERSION there):
#: YARN client mode on a MiniYARNCluster of the Hadoop that Spark 3.5 bundles, and the whole
#: connect set on a Spark 3.5 Connect server (fit/evaluate/predict, sync mode, tune, the
#: errors, cancelling by job tag; about 65 s). The newest environment's Connect server is
#: pyspark 4.3's, which the default environment's full run already covers.
OLDEST_ONLY = (
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
