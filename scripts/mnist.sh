#!/usr/bin/env bash
# Quick start, command 1: set up, then train the seed's MNIST model on local Spark.
# Extra arguments go to examples/spark_mnist.py (e.g. --epochs 3 --partitions 2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYSPARK_PYTHON="$PWD/.venv/bin/python" SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
exec .venv/bin/python examples/spark_mnist.py --server-host "${SPARK_LOCAL_IP}" "$@"
