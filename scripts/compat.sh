#!/usr/bin/env bash
# The compat set on the oldest and the newest supported environment (issue 31).
#
#   bash scripts/compat.sh oldest|newest|both [pytest args...]
#
# Builds the environments "oldest" and "newest" under $TENSORSPARK_COMPAT_HOME (default
# ~/.cache/tensorspark-compat: built once per pin table and pyproject.toml, then reused by
# every checkout, each run pointing the environment's editable tensorspark at this checkout)
# from pyenv's interpreter and the pinned
# versions in the table below, installs tensorspark (editable) and its test tools there, and
# runs the tests marked `compat` (not the `browser` ones) with PYSPARK_PYTHON pointing at that
# environment. scripts/test.sh runs it beside the main run's cluster sets. The pins are installed first and tensorspark after them
# without constraints, then the versions are checked: that proves `pip install tensorspark`
# keeps a pyspark 3.5.x the user already has. pip's cache is used; a fresh machine builds the
# environments from PyPI alone (and Maven Central for the oldest's Hadoop 3.3.4 YARN jars).
#
# A missing interpreter is an error that names it, never a skip.
# COMPAT_BUILD_ONLY=1 builds (or checks) the environment and stops.
# COMPAT_PATHS="tests/yarn" runs the compat tests of those folders only.
# `bash scripts/compat.sh python oldest` prints the environment's interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
# The environments are installed with --no-compile: each module is compiled by its first
# import and kept in __pycache__, which PYTHONDONTWRITEBYTECODE (set in some CI images) would
# forbid, and then every test process and Spark worker compiled TensorFlow again (31 s an
# import instead of 10 s); scripts/test.sh says the same.
unset PYTHONDONTWRITEBYTECODE
HOME_DIR="${TENSORSPARK_COMPAT_HOME:-$HOME/.cache/tensorspark-compat}"
venv_of() { echo "$HOME_DIR/$1"; }

# name | interpreter | pins (pip requirement specifiers)
# oldest: Spark 3.5 LTS (its last patch), Python 3.10, the first TensorFlow with Keras 3 (2.16),
#         numpy 1.26, and the floor of every other range in pyproject.toml that installs there.
# newest: Python 3.13, pyspark 4.3, the current TensorFlow (2.21 has 3.13 wheels).
pins() {
  case "$1" in
    # Keras 3.9 is pyproject's floor (older ones import a class from the module a .keras
    # file names instead of refusing it; CVE-2025-1550). TensorFlow 2.16 needs protobuf < 5;
    # MLflow 3 (a test tool) needs opentelemetry-proto, whose releases after 1.27 need
    # protobuf >= 5: that one is held back.
    oldest) echo "pyspark[connect]==3.5.9 tensorflow==2.16.2 keras==3.9.2 numpy==1.26.4" \
                 "pandas==2.1.4 pyarrow==15.0.2 tensorboard==2.16.2 opentelemetry-proto==1.27.0" ;;
    newest) echo "pyspark[connect]==4.3.0 tensorflow==2.21.0 keras==3.15.1 numpy==2.4.6" \
                 "pandas==2.3.3 pyarrow==25.0.1" ;;
    *) return 1 ;;
  esac
}
interpreter() {
  local root="${PYENV_ROOT:-/root/.pyenv}"
  case "$1" in
    oldest) echo "$root/versions/3.10.13/bin/python" ;;
    newest) echo "$root/versions/3.13.0/bin/python" ;;
  esac
}
# The Hadoop of Spark 3.5's own jars (pyspark 3.5.x ships hadoop-client-api 3.3.4): the oldest
# environment's YARN test runs a MiniYARNCluster of that version.
hadoop_version() {
  case "$1" in
    oldest) echo "3.3.4" ;;
    *) echo "" ;;
  esac
}

build() {
  local env="$1" venv py stamp key
  venv="$(venv_of "$1")"
  mkdir -p "$HOME_DIR"
  py="$(interpreter "$env")"
  if [ ! -x "$py" ]; then
    echo "compat: the $env environment needs the interpreter $py, which is missing" \
         "(install it with 'pyenv install $(basename "$(dirname "$(dirname "$py")")")' or set PYENV_ROOT)" >&2
    exit 2
  fi
  key="$( (pins "$env"; cat pyproject.toml) | sha256sum | cut -c1-16)"
  stamp="$venv/.tensorspark-installed-$key"
  if [ -f "$stamp" ]; then
    return 0
  fi
  echo "compat: building $venv with $py: $(pins "$env")"
  # A venv of another interpreter (or a broken one) is rebuilt; else pip only adds what a
  # changed pyproject.toml or pin asks for.
  if [ "$(readlink -f "$venv/bin/python" 2>/dev/null)" != "$(readlink -f "$py")" ]; then
    rm -rf "$venv"
    "$py" -m venv "$venv"
  fi
  rm -f "$venv"/.tensorspark-installed-*
  "$venv/bin/python" -m pip install -q --upgrade pip "setuptools>=77" wheel
  # --no-compile: Python compiles what the tests import, not all of TensorFlow (minutes).
  # shellcheck disable=SC2046  # the pins are words on purpose
  "$venv/bin/python" -m pip install -q --no-compile $(pins "$env")
  # No constraints here: pip must keep what the user (here: the pins) already has.
  # The lock: one editable install of this checkout at a time (scripts/setup.sh's may run).
  flock .editable-install.lock "$venv/bin/python" -m pip install -q --no-compile -e ".[test]"
  check_pins "$env"
  touch "$stamp"
}

# Every pin is what the environment holds after tensorspark's install.
check_pins() {
  local env="$1" venv spec name want have bad=0
  venv="$(venv_of "$1")"
  for spec in $(pins "$env"); do
    name="${spec%%==*}"
    name="${name%%\[*}"
    want="${spec##*==}"
    have="$("$venv/bin/python" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')"
    if [ "$have" != "$want" ]; then
      echo "compat: installing tensorspark changed $name in $venv: $want -> ${have:-none}" >&2
      bad=1
    fi
  done
  [ "$bad" = 0 ] || exit 3
}

run() {
  local env="$1" venv hadoop
  venv="$(venv_of "$1")"
  shift
  build "$env"
  # The environment may have been built from another checkout: this one's code is tested.
  flock .editable-install.lock "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e .
  # pyspark 3.5 does not bundle the Spark Connect server: its jar comes from Maven into
  # ~/.m2 (spark-connect_2.12 3.5.7, what the mirror has; tests/connect/server_jar.sh).
  if ! compgen -G "$venv/lib/python*/site-packages/pyspark/jars/spark-connect_*" >/dev/null; then
    bash tests/connect/server_jar.sh >/dev/null
  fi
  if [ "${COMPAT_BUILD_ONLY:-0}" = 1 ]; then
    return 0
  fi
  hadoop="$(hadoop_version "$env")"
  if [ -n "$hadoop" ]; then
    TENSORSPARK_HADOOP_VERSION="$hadoop" bash tests/hdfs/minicluster/classpath.sh >/dev/null
  fi
  echo "compat: $env: $("$venv/bin/python" -c 'import sys, pyspark, tensorflow, numpy, keras
print("python", sys.version.split()[0], "pyspark", pyspark.__version__, "tensorflow",
      tensorflow.__version__, "keras", keras.__version__, "numpy", numpy.__version__)' 2>/dev/null)"
  # The folders holding the compat set, in testpaths' order (local mode before the clusters).
  # The oldest environment also runs YARN client mode on a MiniYARNCluster of its Hadoop.
  # COMPAT_PATHS (folders, space-separated) runs only those, e.g. COMPAT_PATHS=tests/yarn.
  local paths=(tests/spark tests/unit tests/cluster)
  # The oldest only: YARN client mode on its Hadoop's MiniYARNCluster, and the connect set
  # (a Spark 3.5 Connect server; newest runs 4.3's, as the default environment does), last,
  # as its fixture stops the classic context.
  if [ -n "$hadoop" ]; then
    paths+=(tests/yarn tests/connect)
  fi
  if [ -n "${COMPAT_PATHS:-}" ]; then
    read -r -a paths <<< "$COMPAT_PATHS"
  fi
  local start=$SECONDS rc=0
  PYSPARK_PYTHON="$venv/bin/python" PYSPARK_DRIVER_PYTHON="$venv/bin/python" \
    SPARK_LOCAL_IP=127.0.0.1 TF_CPP_MIN_LOG_LEVEL=2 TENSORSPARK_HADOOP_VERSION="$hadoop" \
    "$venv/bin/python" -m pytest -p no:cacheprovider -q -ra -m "compat and not browser" \
    "${paths[@]}" "$@" || rc=$?
  echo "compat: $env took $((SECONDS - start)) s (rc=$rc)"
  return "$rc"
}

case "${1:-}" in
  python)
    echo "$(venv_of "${2:?oldest or newest}")/bin/python"
    ;;
  oldest | newest)
    env="$1"
    shift
    run "$env" "$@"
    ;;
  both)
    shift
    rc=0
    run oldest "$@" || rc=$?
    run newest "$@" || rc=$?
    exit "$rc"
    ;;
  *)
    echo "usage: bash scripts/compat.sh oldest|newest|both [pytest args...]" >&2
    exit 2
    ;;
esac
