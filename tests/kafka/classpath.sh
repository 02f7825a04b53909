#!/usr/bin/env bash
# Resolves the jars of a pom in this folder with Maven and prints the path of a file holding
# their classpath (tests/maven_classpath.sh: cached in ~/.m2 and ~/.cache/tensorspark, keyed
# by the pom).
#
# Usage: tests/kafka/classpath.sh pom-broker.xml|pom-spark.xml
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec bash "$here/../maven_classpath.sh" kafka "$here/$1" "" -DincludeScope=runtime
