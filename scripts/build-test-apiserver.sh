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
mkdir -p "$cache/test-apiserver"
# One build at a time on this machine: a second caller (another checkout, a test run beside CI)
# waits for the first and then finds the binary, instead of writing the same output file.
exec 9>"$cache/test-apiserver/.lock"
flock 9
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
fi
# Binaries of other source versions not used for two days go (each is about 264 MB); a
# recent one stays, since checkouts of other branches on this machine may still use it.
touch "$binary" "$cache/test-apiserver/$key"
find "$cache/test-apiserver" -mindepth 1 -maxdepth 1 -type d ! -name "$key" \
  ! -newermt '-2 days' -exec rm -rf {} +
printf '%s\n' "$binary"
