#!/usr/bin/env bash
# Builds the `s3` test set's S3 server (main.go: gofakes3 over a folder of files, behind a
# Signature Version 4 check) from the Go module proxy, once per source version, and prints
# the binary's path. Cached under ~/.cache keyed by a hash of its .go files, go.mod and go.sum, like
# the compat environments; go's own module and build caches make a rebuild quick.
# Needs Go >= 1.24 (`go` on PATH, or /usr/local/go/bin).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export PATH="$PATH:/usr/local/go/bin"
if ! command -v go >/dev/null 2>&1; then
  echo "s3server build: no 'go' on PATH: install Go >= 1.24 (e.g. apt-get install golang-go)" >&2
  exit 2
fi
key="$(cat "$here"/*.go "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-16)"
out="${S3SERVER_CACHE:-$HOME/.cache/tensorspark-s3server}/$key"
if [ ! -x "$out/s3server" ]; then
  mkdir -p "$out"
  (cd "$here" && GOFLAGS=-mod=mod go build -trimpath -o "$out/s3server.tmp" .)
  mv "$out/s3server.tmp" "$out/s3server"
fi
echo "$out/s3server"
