#!/usr/bin/env bash
# pyspark 4.0, 4.1 and 4.2 (between the compat set's oldest and newest) install beside
# tensorspark and import it, and a local-mode SparkContext passes the version checks.
#
# For each line a venv of Python 3.11 gets that pyspark (pip resolves its newest patch
# release and its own dependencies) and tensorspark from this checkout with --no-deps;
# TensorFlow, Keras, numpy and the rest come from one base venv (built once, next to
# them) through a .pth file, so each venv's own pyspark is the one imported (its
# site-packages comes first on sys.path). pip's resolver then checks that tensorspark's own
# requirements (pyproject.toml) accept that pyspark (`pip install --dry-run`: nothing is
# downloaded, since the base's packages count as installed). Then, in each venv:
#   import tensorspark; tensorspark.SparkSession; tensorspark.predict; tensorspark.ml
#   versions.require_supported(); a local[1] SparkContext whose workers run the same
#   interpreter; versions.check_executors(sc); and a tiny RDD job.
#
# Usage: scripts/import_check.sh [4.0 4.1 4.2]
# Env:   IMPORT_CHECK_DIR (default ~/.cache/tensorspark-import-check): where the venvs live,
#        kept between runs and checkouts, each built once per key: the base's is a hash of
#        pyproject.toml and the interpreter's version, each line's of the line and the
#        interpreter's version (a changed key rebuilds it; else a run only re-checks);
#        PYTHON311: the interpreter; IMPORT_CHECK_BUILD_ONLY=1: build the venvs and stop.
# Exits non-zero naming the first pyspark line that fails, or a missing interpreter.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${IMPORT_CHECK_DIR:-$HOME/.cache/tensorspark-import-check}
LINES=("${@:-4.0 4.1 4.2}")
# shellcheck disable=SC2206
LINES=(${LINES[*]})

find_python() {
  if [[ -n "${PYTHON311:-}" ]]; then echo "$PYTHON311"; return; fi
  local root
  root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  local found
  found=$(ls -d "$root"/versions/3.11.*/bin/python3.11 2>/dev/null | sort -V | tail -1 || true)
  if [[ -z "$found" ]] && command -v python3.11 >/dev/null; then found=$(command -v python3.11); fi
  echo "$found"
}

PY=$(find_python)
if [[ -z "$PY" || ! -x "$PY" ]]; then
  echo "import_check: no Python 3.11 interpreter (pyenv install 3.11, or set PYTHON311)" >&2
  exit 2
fi
mkdir -p "$DIR"
started=$(date +%s)

PY_VERSION=$("$PY" -c 'import sys; print(sys.version.split()[0])')
key_of() { (echo "$PY_VERSION"; "$@") | sha256sum | cut -c1-16; }

BASE="$DIR/base"
base_stamp="$BASE/.tensorspark-base-$(key_of cat "$ROOT/pyproject.toml")"
if [[ ! -f "$base_stamp" ]]; then
  echo "import_check: base venv (tensorspark's dependencies) in $BASE"
  if [[ "$(readlink -f "$BASE/bin/python" 2>/dev/null)" != "$(readlink -f "$PY")" ]]; then
    rm -rf "$BASE"
    "$PY" -m venv "$BASE"
  fi
  rm -f "$BASE"/.tensorspark-base-*
  "$BASE/bin/pip" install -q --upgrade pip
  # pip adds only what a changed pyproject.toml asks for.
  # One editable install of this checkout at a time (scripts/test.sh sets up .venv meanwhile).
  flock "$ROOT/.editable-install.lock" "$BASE/bin/pip" install -q -e "$ROOT"
  touch "$base_stamp"
fi
BASE_SITE=$("$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

SMOKE='
import os, sys, time
import tensorspark
tensorspark.SparkSession, tensorspark.predict, tensorspark.KerasEstimator
import pyspark
from tensorspark import versions
here = versions.require_supported()
assert here.pyspark == pyspark.__version__, (here, pyspark.__version__)
assert pyspark.__file__.startswith(sys.prefix), pyspark.__file__  # this venv'"'"'s own pyspark
from pyspark import SparkConf, SparkContext
t = time.time()
sc = SparkContext(conf=SparkConf().setMaster("local[1]").setAppName("import-check")
                  .set("spark.ui.enabled", "false").set("spark.ui.showConsoleProgress", "false")
                  .set("spark.driver.host", "127.0.0.1"))
sc.setLogLevel("ERROR")
versions.check_executors(sc, what="the import check")
assert sc.parallelize(range(10), 2).map(lambda x: x * x).sum() == 285
sc.stop()
print(f"ok: {here.describe()} (context and checks {time.time() - t:.1f}s)")
'

for line in "${LINES[@]}"; do
  venv="$DIR/py311-pyspark$line"
  t0=$(date +%s)
  stamp="$venv/.tensorspark-line-$(key_of echo "$line")"
  if [[ ! -f "$stamp" ]]; then
    rm -rf "$venv"
    "$PY" -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    # pip's own resolver picks the newest $line.x and pyspark's dependencies (py4j).
    "$venv/bin/pip" install -q "pyspark==$line.*"
    flock "$ROOT/.editable-install.lock" "$venv/bin/pip" install -q --no-deps -e "$ROOT"
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$BASE_SITE" > "$site/_tensorspark_base.pth"
    touch "$stamp"
  fi
  if [[ "${IMPORT_CHECK_BUILD_ONLY:-0}" = 1 ]]; then
    echo "import_check: pyspark $line: venv ready in $(( $(date +%s) - t0 ))s"
    continue
  fi
  # The venvs are kept between runs (and checkouts): this checkout is the one checked.
  flock "$ROOT/.editable-install.lock" "$venv/bin/pip" install -q --no-deps -e "$ROOT"
  # Under the lock too: pip prepares the checkout's metadata (its egg-info) in place.
  if ! flock "$ROOT/.editable-install.lock" \
      "$venv/bin/pip" install -q --dry-run "$ROOT" "pyspark==$line.*"; then
    echo "import_check: tensorspark's requirements do not accept pyspark $line" >&2
    exit 1
  fi
  t1=$(date +%s)
  if ! (cd "$DIR" && PYSPARK_PYTHON="$venv/bin/python" SPARK_LOCAL_IP=127.0.0.1 \
        TF_CPP_MIN_LOG_LEVEL=2 PYTHONPATH= "$venv/bin/python" -c "$SMOKE"); then
    echo "import_check: pyspark $line FAILED (venv $venv)" >&2
    exit 1
  fi
  echo "import_check: pyspark $line: install and resolve $((t1 - t0))s, import+smoke $(( $(date +%s) - t1 ))s"
done
if [[ "${IMPORT_CHECK_BUILD_ONLY:-0}" = 1 ]]; then
  echo "import_check: venvs of ${LINES[*]} ready in $(( $(date +%s) - started ))s"
else
  echo "import_check: all of ${LINES[*]} passed in $(( $(date +%s) - started ))s"
fi
