#!/usr/bin/env bash
# Resolves the jars of a pom with Maven and prints the path of a file holding their
# classpath. The jars are cached in ~/.m2 and the classpath file under
# ${XDG_CACHE_HOME:-~/.cache}/tensorspark as <name>-<pom hash><key suffix>.classpath, so
# after one run with network the tests start without Maven or network. The one resolver
# behind tests/kafka/classpath.sh, tests/s3/s3a_classpath.sh and
# tests/hdfs/minicluster/classpath.sh.
#
# Usage: tests/maven_classpath.sh NAME /path/to/pom.xml [KEY_SUFFIX [MAVEN_ARG...]]
#   KEY_SUFFIX: added to the cache key when MAVEN_ARGs change what resolves (e.g.
#   "-hadoop3.3.4" beside -Dhadoop.version=3.3.4); MAVEN_ARGs go to dependency:build-classpath.
set -euo pipefail

name="$1"
pom="$2"
suffix="${3:-}"
shift "$(( $# < 3 ? $# : 3 ))"
cache="${TENSORSPARK_MINICLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tensorspark}"
key="$(sha256sum "$pom" | cut -c1-16)$suffix"
out="$cache/$name-$key.classpath"

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
  mvn -q -B -Dstyle.color=never -f "$pom" "$@" dependency:build-classpath \
    -Dmdep.outputFile="$tmp" >&2
  mv "$tmp" "$out"
fi
echo "$out"
