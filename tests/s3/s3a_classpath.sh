#!/usr/bin/env bash
# Resolves the jars of a pom in this folder (hadoop-aws and the AWS SDK) with Maven and prints
# the path of a file holding their classpath (tests/maven_classpath.sh: cached in ~/.m2 and
# ~/.cache/tensorspark, keyed by the pom).
#
# Usage: tests/s3/s3a_classpath.sh pom-s3a.xml
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec bash "$here/../maven_classpath.sh" s3a "$here/$1" "" -DincludeScope=runtime
