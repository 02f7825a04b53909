#!/usr/bin/env bash
# Resolves the jars of a pom in this folder with Maven and prints the path of a file holding
# their classpath (as tests/kafka/classpath.sh does). The jars are cached in
# ~/.m2 and the classpath file under ${XDG_CACHE_HOME:-~/.cache}/tensorspark, keyed by the
# pom, so after one run with network the tests start without Maven or network.
#
# Usage: tests/s3/s3a_classpath.sh pom-s3a.xml
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
pom="$here/$1"
cache="${TENSORSPARK_MINICLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tensorspark}"
key="$(sha256sum "$pom" | cut -c1-16)"
out="$cache/s3a-$key.classpath"

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
  mvn -q -B -Dstyle.color=never -f "$pom" dependency:build-classpath -DincludeScope=runtime \
    -Dmdep.outputFile="$tmp" >&2
  mv "$tmp" "$out"
fi
echo "$out"
