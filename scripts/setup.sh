#!/usr/bin/env bash
# Set up everything tensorspark needs on a fresh machine (Python 3.11, a JDK 17, Maven):
# a virtual environment in .venv with the package and its test tools, and, when run as
# root, the Debian packages for the data (Fashion-MNIST), the browser tests, and the netns
# tests' network namespaces and link faults (iproute2's ip, iptables).
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if ! command -v java >/dev/null 2>&1; then
  echo "tensorspark needs Java 17 for Spark: install a JDK 17 (e.g. apt-get install openjdk-17-jdk-headless)" >&2
  exit 1
fi
if ! command -v javac >/dev/null 2>&1; then
  echo "setup: no javac: the yarn tests compile their Hadoop cluster launcher; install a JDK 17 (openjdk-17-jdk-headless)" >&2
fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  need=()
  [ -e /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ] || [ -e /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte ] || need+=(dataset-fashion-mnist)
  command -v ip >/dev/null 2>&1 || need+=(iproute2)
  command -v iptables >/dev/null 2>&1 || need+=(iptables)
  # Go >= 1.24 builds the s3 set's S3 server (tests/s3/server/build.sh).
  command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ] || need+=(golang-go)
  if [ "${TENSORSPARK_SKIP_BROWSER:-0}" != 1 ]; then
    command -v chromium >/dev/null 2>&1 || need+=(chromium)
    command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
  fi
  if [ ${#need[@]} -gt 0 ]; then
    echo "setup: apt-get install ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.tensorspark-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing tensorspark and its dependencies into .venv (first time: a few minutes)"
  .venv/bin/python -m pip install -q --upgrade pip "setuptools>=77" wheel
  # The lock: scripts/test.sh builds the compat environments meanwhile, whose editable
  # installs of this checkout would write its tensorspark.egg-info at the same time.
  flock .editable-install.lock .venv/bin/python -m pip install -q -e ".[test]"
  touch "$stamp"
fi
