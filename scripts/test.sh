#!/usr/bin/env bash
# Quick start, command 2: set up, then check the formatting (ruff format, 100 columns),
# lint, type-check and run every test set:
# unit, spark (local mode), hdfs (Hadoop mini cluster), cluster (standalone Spark), yarn
# (Hadoop MiniYARNCluster + HDFS, spark-submit --master yarn), netns (a standalone cluster
# across network namespaces; root only), browser, docs (the documentation site: mkdocs
# build --strict, its runnable snippets on local Spark, its charts, the site in Chromium).
# A full run also runs the compat set on the oldest and newest supported environments
# (scripts/compat.sh: Python 3.10 with pyspark 3.5, Python 3.13 with pyspark 4.3, built
# from pyenv's interpreters) and the pyspark 4.0/4.1/4.2 import check
# (scripts/import_check.sh), in two lanes on the 2 cores (the order below the lint).
# Pass pytest arguments to narrow it, e.g. `scripts/test.sh -m unit` (then one pytest run, no
# compat run; `bash scripts/compat.sh oldest|newest|both` runs it alone).
#
# Every phase is timed; the table is printed at the end, also when a phase fails
# (scripts/phases.sh). The compat and import-check environments are built once per machine
# and pin set (under ~/.cache, keyed by a hash of their pins and pyproject.toml): the compat
# ones in the background from the start, beside .venv's set-up, the jars, the lint and the
# unit set; the import check's in its own job, beside the spark set at the lowest CPU and
# I/O priority. On a machine that has them, building them only checks their keys.
set -euo pipefail
cd "$(dirname "$0")/.."
# Python writes the bytecode of what it imports (__pycache__), so TensorFlow and Keras are
# compiled once per environment, not in every test process, Spark worker and driver: where
# PYTHONDONTWRITEBYTECODE is set (some CI images set it) and an environment was installed
# without its .pyc files (the compat environments: pip --no-compile), every import of
# TensorFlow 2.21 and Keras compiled them from source: 31 s instead of 10 s on the 2-core VM.
unset PYTHONDONTWRITEBYTECODE
# shellcheck source=scripts/phases.sh
source scripts/phases.sh
full=0
[ $# -eq 0 ] && full=1
logs=test-artifacts
mkdir -p "$logs"

if [ "$full" = 1 ]; then
  phase "Spark Connect 3.5 jar (Maven)"
  # The oldest environment's Spark Connect jar, resolved here before the background job
  # (whose compat.sh then finds it in ~/.m2): Maven does not lock its local repository, so
  # no two mvn may run at once, and the jar phase below runs mvn in the foreground.
  bash tests/connect/server_jar.sh >/dev/null
  # First, beside the .venv's set-up: both mostly download (pip's cache is shared), and each
  # editable install of this checkout holds .editable-install.lock (flock) in turn. The
  # spark set needs the newest one (TENSORSPARK_OTHER_PYTHON, below) and the compat runs
  # both. The import check builds its own (a base venv and three pyspark lines) where it
  # runs, beside the spark set: on a bare machine they were a third of this phase's 9
  # minutes, which the spark set waited for.
  phase_background "compat environments" "$logs/environments.log" \
    env COMPAT_BUILD_ONLY=1 bash scripts/compat.sh both
fi

phase "setup (.venv, Debian packages)"
bash scripts/setup.sh
if [ "$full" = 1 ]; then
  # The unit set needs only .venv: it runs here, beside the jars, the lint and the builds,
  # as two pytest processes (each single-threaded, one per core): the server's tests
  # (tests/unit/ps, and the tuning, training and export folders) and the rest, about half
  # of its minutes each. The spark set waits for both.
  rm -f "$logs"/unit-*junit.xml
  unit_set() {
    local ps_part=(tests/unit/ps tests/unit/tuning tests/unit/training tests/unit/export)
    local rest=() path a_rc=0 b_rc=0
    for path in tests/unit/*; do
      case " ${ps_part[*]} " in *" $path "*) continue ;; esac
      # Folders and test modules (not the helpers beside them, nor __pycache__).
      if [ "$path" != tests/unit/__pycache__ ] && [ -d "$path" ]; then
        rest+=("$path")
      elif [[ "$path" == tests/unit/test_*.py ]]; then
        rest+=("$path")
      fi
    done
    unit_part() {  # NAME PATHS...: one pytest process, its log and JUnit file named NAME
      local name="$1"
      shift
      env PYSPARK_PYTHON="$PWD/.venv/bin/python" SPARK_LOCAL_IP=127.0.0.1 \
        TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/python -m pytest -p no:cacheprovider -q -ra \
        --durations=10 --junitxml="$logs/unit-$name-junit.xml" "$@" \
        >"$logs/unit-$name.log" 2>&1
    }
    unit_part server "${ps_part[@]}" &
    local server=$!
    unit_part rest "${rest[@]}" || b_rc=$?
    wait "$server" || a_rc=$?
    for name in server rest; do
      echo "== unit set, part $name:"
      tail -n 5 "$logs/unit-$name.log"
    done
    [ "$a_rc" = 0 ] || return "$a_rc"
    return "$b_rc"
  }
  phase_background "unit set" "$logs/unit.log" unit_set
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
if [ "$full" = 0 ]; then
  phase "main pytest run"
  rm -f "$logs/main-junit.xml"  # never an older run's, should this one write none
  .venv/bin/python -m pytest -p no:cacheprovider -q -ra --durations=25 \
    --junitxml="$logs/main-junit.xml" "$@" || rc=$?
  phase_end "$([ "$rc" = 0 ] || echo "failed (exit $rc)")"
  # Where its minutes went: per test set and the slowest modules (from the JUnit XML).
  [ ! -f "$logs/main-junit.xml" ] || .venv/bin/python scripts/durations.py "$logs/main-junit.xml" || true
  if [ "$rc" != 0 ] && [ -f "$logs/main-junit.xml" ]; then
    .venv/bin/python scripts/durations.py "$logs/main-junit.xml" --failures || true
  fi
  exit "$rc"
fi

# The full run. Its parts by what they need of the 2 cores:
#  - the unit set is two single-threaded pytest processes: they ran above, beside the jar
#    resolution, the lint and the environments' builds;
#  - the spark set (local mode) runs alone: its async training tests (accuracy bars, a task
#    killed mid-epoch) ran flaky beside other JVMs at the same priority;
#  - then the cluster sets and the docs' browser test in two lanes, one per core: the
#    HDFS, S3, YARN and Kafka sets in one pytest process, the standalone, netns and
#    Connect sets and the browser test in the other, followed by the compat runs;
#  - the import check and the rest of the docs set (the site, the snippets, the generated
#    figures and charts: no wait shorter than 5 minutes in it) run beside the spark set at
#    the lowest priority, CPU and I/O, in the cores' idle time (below).
# Each pytest process writes its JUnit XML; the minutes per set and every failure are read
# from them at the end.
phase_wait "compat environments" || {
  cat "$logs/environments.log"
  exit 1
}
unit_rc=0
phase_wait "unit set" || unit_rc=$?
echo "unit set (tests/unit), beside the set-up:"
cat "$logs/unit.log"
# The newest compat environment is also the "other" environment the ML save/load test loads
# this one's saves in (and back). The oldest's Keras 3.9 cannot read Keras 3.15's files;
# docs/support.md.
TENSORSPARK_OTHER_PYTHON="$(bash scripts/compat.sh python newest)"
export TENSORSPARK_OTHER_PYTHON

main_junit=("$logs/unit-server-junit.xml" "$logs/unit-rest-junit.xml" "$logs/main-spark-junit.xml"
  "$logs/main-docs-junit.xml" "$logs/main-clusters-a-junit.xml" "$logs/main-clusters-b-junit.xml")
rm -f "${main_junit[@]:2}"  # never an older run's, should this one write none
# The pyspark 4.0/4.1/4.2 import check (its venvs' builds where they are missing, then
# pip's resolver and a tiny local job each, no timing in it) runs beside the spark set at
# the lowest priority, CPU and I/O: it takes only the cores' idle time (the spark set
# leaves about a fifth of it), never theirs.
idle_io=()
if command -v ionice >/dev/null; then idle_io=(ionice -c 3); fi
phase_background "import check (pyspark 4.0-4.2), beside the spark set at nice 19" \
  "$logs/import-check.log" env IMPORT_CHECK_DIR="${IMPORT_CHECK_DIR:-$HOME/.cache/tensorspark-import-check}" \
  "${idle_io[@]}" nice -n 19 bash scripts/import_check.sh
# The docs set but its browser test (a 30 s wait for the page: in the cluster lane below),
# likewise: about 3.5 of the cluster lane's minutes moved into the spark set's idle time.
phase_background "docs set, beside the spark set at nice 19" "$logs/docs.log" \
  "${idle_io[@]}" nice -n 19 .venv/bin/python -m pytest -p no:cacheprovider -q -ra \
  --durations=10 --junitxml="$logs/main-docs-junit.xml" -m "not browser" tests/docs
phase "main pytest run: spark (local mode)"
spark_rc=0
.venv/bin/python -m pytest -p no:cacheprovider -q -ra --durations=15 \
  --junitxml="$logs/main-spark-junit.xml" tests/spark || spark_rc=$?
phase_end "$([ "$spark_rc" = 0 ] || echo "failed (exit $spark_rc)")"

# The cluster sets then run in two pytest processes side by side, one per core: alone, in
# one process, they kept the cores 75 % busy (32:11 for 2,874 busy core-seconds of 3,812,
# 2 December 2026: a set's fixtures and each driver's start-up are single-threaded
# stretches). The HDFS, S3, YARN and Kafka sets run in the background; the standalone,
# netns and Connect sets and the docs' browser test in the foreground, then the compat runs
# (one after the other), so that no more than two JVM-heavy processes share the cores, as
# the cluster sets and the compat runs did before. In the fresh-clone run of 8e6ac89 the
# background process took 28:24, the foreground one 23:40 and the compat runs after it
# 2:00 and 2:14 (the cluster sets and the smokes beside them: 36:01 in one process before).
# CI's 90 minutes do not hold the whole compat set on the 2-core VM beside the main run (its
# sets are CPU-bound), so here each environment runs a smoke: the MNIST example in local
# mode and the standalone-cluster smoke test (which trains it on a cluster started from the
# environment's own pyspark). `bash scripts/compat.sh oldest|newest` runs the whole compat
# set.
second_lane_name="main pytest run: hdfs, s3, yarn, kafka (beside the next two)"
phase_background "$second_lane_name" "$logs/clusters-b.log" \
  .venv/bin/python -m pytest -p no:cacheprovider -q -ra --durations=15 \
  --junitxml="$logs/main-clusters-b-junit.xml" tests/hdfs tests/s3 tests/yarn tests/kafka

phase "main pytest run: standalone, netns, connect and the docs' browser test"
clusters_rc=0
.venv/bin/python -m pytest -p no:cacheprovider -q -ra --durations=15 \
  --junitxml="$logs/main-clusters-a-junit.xml" tests/docs/test_browser.py \
  tests/cluster tests/netns tests/connect || clusters_rc=$?
phase_end "$([ "$clusters_rc" = 0 ] || echo "failed (exit $clusters_rc)")"

smoke="tests/spark/test_core.py::test_seed_example_trains_on_spark tests/cluster/test_cluster_smoke.py"
lane_rc=0
for env in oldest newest; do
  phase "compat run: $env"
  crc=0
  rm -f "$logs/compat-$env-junit.xml"
  COMPAT_PATHS="$smoke" bash scripts/compat.sh "$env" \
    --junitxml="$logs/compat-$env-junit.xml" >"$logs/compat-$env.log" 2>&1 || crc=$?
  phase_end "$([ "$crc" = 0 ] || echo "failed (exit $crc)")"
  [ "$crc" = 0 ] || lane_rc=$crc
done
second_rc=0
phase_wait "$second_lane_name" || second_rc=$?
echo "== the HDFS, S3, YARN and Kafka sets ($logs/clusters-b.log):"
tail -n 30 "$logs/clusters-b.log"
docs_rc=0
phase_wait "docs set, beside the spark set at nice 19" || docs_rc=$?
echo "== docs set, beside the spark set ($logs/docs.log):"
tail -n 20 "$logs/docs.log"
import_rc=0
phase_wait "import check (pyspark 4.0-4.2), beside the spark set at nice 19" || import_rc=$?

# Where the main run's minutes went: per test set and the slowest modules.
.venv/bin/python scripts/durations.py "${main_junit[@]}" || true
for env in oldest newest; do
  echo "== compat run: $env (the end of $logs/compat-$env.log)"
  tail -n 6 "$logs/compat-$env.log"
done
echo "== import check ($logs/import-check.log)"
if [ "$import_rc" = 0 ]; then
  grep -E '^(import_check|ok):' "$logs/import-check.log" || true
else
  tail -n 40 "$logs/import-check.log"
fi
# Every failure again, last (only the phase table follows), where a log's tail shows them.
for rc_part in "$unit_rc" "$spark_rc" "$docs_rc" "$clusters_rc" "$second_rc" "$lane_rc" \
  "$import_rc"; do
  [ "$rc_part" = 0 ] || rc=$rc_part
done
if [ "$rc" != 0 ]; then
  .venv/bin/python scripts/durations.py "${main_junit[@]}" --failures || true
  for env in oldest newest; do
    .venv/bin/python scripts/durations.py "$logs/compat-$env-junit.xml" --failures \
      --label "compat run: $env" || true
  done
fi
exit "$rc"
