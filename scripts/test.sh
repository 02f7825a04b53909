#!/usr/bin/env bash
# Quick start, command 2: set up, then check the formatting (ruff format, 100 columns),
# lint, type-check and run every test set:
# unit, spark (local mode), hdfs (Hadoop mini cluster), cluster (standalone Spark), yarn
# (Hadoop MiniYARNCluster + HDFS, spark-submit --master yarn), netns (a standalone cluster
# across network namespaces; root only), browser, docs (the documentation site: mkdocs
# build --strict, its runnable snippets on local Spark, its charts, the site in Chromium).
# Then, after a full run, the compat set on the oldest and newest supported environments
# (scripts/compat.sh: Python 3.10 with pyspark 3.5, Python 3.13 with pyspark 4.3, built
# from pyenv's interpreters) and the pyspark 4.0/4.1/4.2 import check
# (scripts/import_check.sh).
# Pass pytest arguments to narrow it, e.g. `scripts/test.sh -m unit` (then no compat run;
# `bash scripts/compat.sh oldest|newest|both` runs it alone).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Resolve the Hadoop mini clusters' jars (HDFS, and YARN for the yarn set) from Maven Central
# once (cached in ~/.m2).
bash tests/hdfs/minicluster/classpath.sh >/dev/null
# Kafka's broker and Spark's Kafka source for the kafka set, the same way.
bash tests/kafka/classpath.sh pom-broker.xml >/dev/null
bash tests/kafka/classpath.sh pom-spark.xml >/dev/null
export PYSPARK_PYTHON="$PWD/.venv/bin/python" SPARK_LOCAL_IP=127.0.0.1 TF_CPP_MIN_LOG_LEVEL=2
.venv/bin/ruff format --check tensorspark tests bench examples
.venv/bin/ruff check tensorspark tests bench examples
.venv/bin/mypy tensorspark
rc=0
if [ $# -eq 0 ]; then
  # The compat environments first (built once, then reused): the newest (Python 3.13) is
  # also the "other" environment the ML save/load test loads this one's saves in (and
  # back). The oldest's Keras 3.9 cannot read Keras 3.15's files; docs/support.md.
  COMPAT_BUILD_ONLY=1 bash scripts/compat.sh both
  TENSORSPARK_OTHER_PYTHON="$(bash scripts/compat.sh python newest)"
  export TENSORSPARK_OTHER_PYTHON
fi
.venv/bin/python -m pytest -p no:cacheprovider -q -ra --durations=25 "$@" || rc=$?
if [ $# -eq 0 ]; then
  # pyspark 4.0/4.1/4.2 install and import (pip and one small local job each), beside the
  # compat runs, which keep the cores busy.
  IMPORT_CHECK_DIR="${IMPORT_CHECK_DIR:-$HOME/.cache/tensorspark-import-check}" \
    bash scripts/import_check.sh > import-check.log 2>&1 &
  check=$!
  bash scripts/compat.sh both || rc=$?
  wait "$check" || { rc=1; echo "import check failed:"; }
  cat import-check.log
fi
exit "$rc"
