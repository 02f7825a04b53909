#!/usr/bin/env bash
# Runs one benchmark on Spark 3.5 (scripts/compat.sh's oldest environment: Python 3.10,
# pyspark 3.5.9, TensorFlow 2.16.2) and then on the default environment (.venv: pyspark
# 4.3), one after the other on the same machine, writing
# bench/results/<name>_spark35.json and bench/results/<name>_spark43.json.
#
#   bash bench/on_versions.sh keras_fit --rounds 1
#   bash bench/on_versions.sh inference --rows 20000 --repeats 2
#
# The oldest environment is built by scripts/compat.sh if it is missing (minutes, once).
set -euo pipefail
cd "$(dirname "$0")/.."
name="${1:?a benchmark under bench/, e.g. keras_fit}"
shift
[ -f "bench/$name.py" ] || { echo "no bench/$name.py" >&2; exit 2; }
COMPAT_BUILD_ONLY=1 bash scripts/compat.sh oldest >/dev/null
for side in spark35 spark43; do
  if [ "$side" = spark35 ]; then
    py="$(bash scripts/compat.sh python oldest)"
  else
    py="$PWD/.venv/bin/python"
  fi
  echo "== $name on $side ($("$py" -c 'import pyspark, sys; print("pyspark", pyspark.__version__, "python", sys.version.split()[0])'))"
  out="bench/results/${name}_$side.json"
  PYTHONPATH="$PWD" PYSPARK_PYTHON="$py" PYSPARK_DRIVER_PYTHON="$py" SPARK_LOCAL_IP=127.0.0.1 \
    TF_CPP_MIN_LOG_LEVEL=2 "$py" "bench/$name.py" "$@" --out "$out"
  # The versions that ran, into the result.
  TF_CPP_MIN_LOG_LEVEL=3 "$py" - "$out" <<'PY' 2>/dev/null
import json, sys
import keras, pyspark, tensorflow
path = sys.argv[1]
data = json.load(open(path))
data["versions"] = {"pyspark": pyspark.__version__, "python": sys.version.split()[0],
                    "tensorflow": tensorflow.__version__, "keras": keras.__version__}
json.dump(data, open(path, "w"), indent=2)
PY
done
