#!/usr/bin/env bash
# Resolves the jars of Hadoop's mini cluster (tests/hdfs) with Maven and prints the path of a
# file holding their Java classpath. The jars are cached in ~/.m2 and the classpath file under
# ${XDG_CACHE_HOME:-~/.cache}/tensorspark, keyed by the pom, so after one run (CI does it while
# it has network) the tests start the cluster without Maven or network.
#
# TENSORSPARK_HADOOP_VERSION picks another Hadoop than the pom's (the one pyspark 4 bundles):
# scripts/compat.sh sets 3.3.4, the Hadoop of Spark 3.5's jars, for the oldest environment.
#
# Usage: tests/hdfs/minicluster/classpath.sh        (prints the classpath file's path)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${TENSORSPARK_MINICLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tensorspark}"
hadoop="${TENSORSPARK_HADOOP_VERSION:-}"
key="$(sha256sum "$here/pom.xml" | cut -c1-16)${hadoop:+-hadoop$hadoop}"
out="$cache/minicluster-$key.classpath"

complete() {
  [[ -s "$out" ]] || return 1
  local jar
  while IFS= read -r jar; do
    [[ -f "$jar" ]] || return 1
  done < <(tr ':' '\n' < "$out")
}

if ! complete; then
  mkdir -p "$cache"
  tmp="$(mktemp "$out.XXXXXX")"
  trap 'rm -f "$tmp"' EXIT
  mvn -q -B -Dstyle.color=never -f "$here/pom.xml" ${hadoop:+"-Dhadoop.version=$hadoop"} \
    dependency:build-classpath -Dmdep.outputFile="$tmp" >&2
  mv "$tmp" "$out"
fi
echo "$out"
