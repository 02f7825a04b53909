#!/usr/bin/env bash
# Resolves the jars of Hadoop's mini cluster (tests/hdfs) with Maven and prints the path of a
# file holding their Java classpath (tests/maven_classpath.sh: cached in ~/.m2 and
# ${XDG_CACHE_HOME:-~/.cache}/tensorspark, keyed by the pom), so after one run (CI does it
# while it has network) the tests start the cluster without Maven or network.
#
# TENSORSPARK_HADOOP_VERSION picks another Hadoop than the pom's (the one pyspark 4 bundles):
# scripts/compat.sh sets 3.3.4, the Hadoop of Spark 3.5's jars, for the oldest environment.
#
# Usage: tests/hdfs/minicluster/classpath.sh        (prints the classpath file's path)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
hadoop="${TENSORSPARK_HADOOP_VERSION:-}"
exec bash "$here/../../maven_classpath.sh" minicluster "$here/pom.xml" \
  "${hadoop:+-hadoop$hadoop}" ${hadoop:+"-Dhadoop.version=$hadoop"}
