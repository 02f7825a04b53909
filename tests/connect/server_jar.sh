#!/usr/bin/env bash
# The Spark Connect server's jar for a pyspark that does not bundle it (pyspark 3.5), fetched
# with Maven into ~/.m2 and its path printed. pyspark 4 ships the jar; pyspark 3.5's wheel
# does not, and its server is Spark's own `org.apache.spark:spark-connect_2.12` (one shaded
# jar: gRPC, protobuf and Guava inside it, Spark itself from pyspark's jars).
#
# The version is 3.5.7, not the oldest environment's pyspark 3.5.9: the Maven mirror CI and
# these machines reach has spark-connect_2.12 3.5.7 but neither 3.5.8 nor 3.5.9. The Connect
# protocol and the server's use of Spark's internals do not change within the 3.5 line, and
# the connect set passes with 3.5.7's server on 3.5.9 (docs/support.md).
# TENSORSPARK_CONNECT_VERSION picks another 3.5.x (where the mirror has it).
#
# scripts/compat.sh runs this for the oldest environment (CI's setup); the connect fixture
# (tests/connect/server.py) runs it too when it finds no jar. After one run with network the
# jar is in ~/.m2 and this only checks it is there.
#
# Usage: tests/connect/server_jar.sh        (prints the jar's path)
set -euo pipefail

version="${TENSORSPARK_CONNECT_VERSION:-3.5.7}"
jar="$HOME/.m2/repository/org/apache/spark/spark-connect_2.12/$version/spark-connect_2.12-$version.jar"
if [[ ! -s "$jar" ]]; then
  mvn -q -B -Dstyle.color=never dependency:get -Dtransitive=false \
    "-Dartifact=org.apache.spark:spark-connect_2.12:$version" >&2
fi
[[ -s "$jar" ]] || { echo "server_jar.sh: Maven did not leave $jar" >&2; exit 1; }
echo "$jar"
