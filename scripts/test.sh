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
#
# Every phase is timed; the table is printed at the end, also when a phase fails
# (scripts/phases.sh). The compat and import-check environments are built once per machine
# and pin set (under ~/.cache, keyed by a hash of their pins and pyproject.toml), in the
# background while the jars resolve and the code is linted and type-checked: on a machine
# that has them, that phase only checks their keys.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/phases.sh
source scripts/phases.sh
full=0
[ $# -eq 0 ] && full=1
logs=test-artifacts
mkdir -p "$logs"

phase "setup (.venv, Debian packages)"
bash scripts/setup.sh
if [ "$full" = 1 ]; then
  # The oldest environment's Spark Connect jar, resolved here before the background job
  # (whose compat.sh then finds it in ~/.m2): Maven does not lock its local repository, so
  # no two mvn may run at once, and the jar phase below runs mvn in the foreground.
  bash tests/connect/server_jar.sh >/dev/null
  # One job, so the environments' editable installs of this checkout never run at once.
  build_envs() {
    COMPAT_BUILD_ONLY=1 bash scripts/compat.sh both
    IMPORT_CHECK_DIR="${IMPORT_CHECK_DIR:-$HOME/.cache/tensorspark-import-check}" \
      IMPORT_CHECK_BUILD_ONLY=1 bash scripts/import_check.sh
  }
  phase_background "compat and import-check environments" "$logs/environments.log" build_envs
fi

phase "jar resolution (Maven: mini clusters, Kafka)"
# Resolve the Hadoop mini clusters' jars (HDFS, and YARN for the yarn set) from Maven Central
# once (cached in ~/.m2).
bash tests/hdfs/minicluster/classpath.sh >/dev/null
# Kafka's broker and Spark's Kafka source for the kafka set, the same way.
bash tests/kafka/classpath.sh pom-broker.xml >/dev/null
bash tests/kafka/classpath.sh pom-spark.xml >/dev/null
# Spark's s3a connector (hadoop-aws and the AWS SDK bundle) for the s3 set, the same way.
bash tests/s3/s3a_classpath.sh pom-s3a.xml >/dev/null
# The s3 set's S3 server (gofakes3 from the Go module proxy; cached under ~/.cache).
bash tests/s3/server/build.sh >/dev/null
export PYSPARK_PYTHON="$PWD/.venv/bin/python" SPARK_LOCAL_IP=127.0.0.1 TF_CPP_MIN_LOG_LEVEL=2

phase "lint and type check (ruff, mypy)"
.venv/bin/ruff format --check tensorspark tests bench examples
.venv/bin/ruff check tensorspark tests bench examples
.venv/bin/mypy tensorspark
phase_end

rc=0
if [ "$full" = 1 ]; then
  # The newest compat environment is also the "other" environment the ML save/load test
  # loads this one's saves in (and back). The oldest's Keras 3.9 cannot read Keras 3.15's
  # files; docs/support.md.
  phase_wait "compat and import-check environments" || {
    cat "$logs/environments.log"
    exit 1
  }
  TENSORSPARK_OTHER_PYTHON="$(bash scripts/compat.sh python newest)"
  export TENSORSPARK_OTHER_PYTHON
fi

phase "main pytest run"
rm -f "$logs/main-junit.xml"  # never an older run's, should this one write none
.venv/bin/python -m pytest -p no:cacheprovider -q -ra --durations=25 \
  --junitxml="$logs/main-junit.xml" "$@" || rc=$?
main_rc=$rc
phase_end "$([ "$rc" = 0 ] || echo "failed (exit $rc)")"
# Where its minutes went: per test set and the slowest modules (from the JUnit XML).
[ ! -f "$logs/main-junit.xml" ] || .venv/bin/python scripts/durations.py "$logs/main-junit.xml" || true

if [ "$full" = 1 ]; then
  # pyspark 4.0/4.1/4.2 install and import (pip and one small local job each), beside the
  # compat runs, which keep the cores busy.
  phase_background "import check (pyspark 4.0-4.2)" "$logs/import-check.log" \
    env IMPORT_CHECK_DIR="${IMPORT_CHECK_DIR:-$HOME/.cache/tensorspark-import-check}" \
    bash scripts/import_check.sh
  for env in oldest newest; do
    phase "compat run: $env"
    crc=0
    bash scripts/compat.sh "$env" || crc=$?
    phase_end "$([ "$crc" = 0 ] || echo "failed (exit $crc)")"
    [ "$crc" = 0 ] || rc=$crc
  done
  phase_wait "import check (pyspark 4.0-4.2)" || { rc=1; echo "import check failed:"; }
  cat "$logs/import-check.log"
fi
# The main run's failures again, after the compat runs (only the phase table follows), where
# a log's tail shows them.
if [ "$main_rc" != 0 ] && [ -f "$logs/main-junit.xml" ]; then
  .venv/bin/python scripts/durations.py "$logs/main-junit.xml" --failures || true
fi
exit "$rc"
