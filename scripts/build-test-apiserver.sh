#!/usr/bin/env bash
# Builds the test API server (tests/kube-apiserver: kube-apiserver and an embedded etcd, from
# the Go module proxy) once per source version and prints the binary's path on stdout.
# The binary and Go's caches live under ~/.cache/spark-pod-allocator (outside the checkout, so
# a fresh clone on the same machine reuses them); the key is a hash of go.mod, go.sum and the
# Go sources. A cold build takes tens of minutes on two cores; a cached one, none.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src="$root/tests/kube-apiserver"
cache="${SPARK_POD_ALLOCATOR_CACHE:-$HOME/.cache/spark-pod-allocator}"

key=$(cd "$src" && cat go.mod go.sum ./*.go | sha256sum)
key=${key%% *}
binary="$cache/test-apiserver/$key/test-apiserver"
if [ ! -x "$binary" ]; then
  echo "building the test API server (tests/kube-apiserver, key ${key:0:12}); a cold build takes a long time" >&2
  start=$(date +%s)
  mkdir -p "$cache/test-apiserver/$key"
  (
    cd "$src"
    export GOPATH="$cache/go" GOCACHE="$cache/go-build" GOFLAGS=-buildvcs=false
    go build -o "$binary.partial" .
  )
  mv "$binary.partial" "$binary"
  echo "built in $(( $(date +%s) - start )) s" >&2
  # Older builds of other source versions are not needed any more.
  for old in "$cache"/test-apiserver/*; do
    if [ "$old" != "$cache/test-apiserver/$key" ]; then
      rm -rf "$old"
    fi
  done
fi
printf '%s\n' "$binary"
