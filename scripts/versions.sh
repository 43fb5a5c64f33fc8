#!/usr/bin/env bash
# The release has one version, Cargo.toml's. Prints it, and fails (naming the file) when the
# Python client, the Spark plugin, the chart (version and appVersion) or the Dockerfile's
# default VERSION says another. scripts/dist.sh runs it first, so CI fails on a drift.
set -euo pipefail
cd "$(dirname "$0")/.."

# The first `version = "…"` of the file (the line, not a pipe into an early-exiting reader).
first() {
  local found
  found=$(sed -n "$1" "$2")
  printf '%s' "${found%%$'\n'*}"
}

version=$(first 's/^version = "\(.*\)"$/\1/p' Cargo.toml)
[ -n "$version" ] || { echo "no version in Cargo.toml" >&2; exit 1; }

# Each: file, its version.
declare -A found
found[clients/python/spark_pod_allocator/_version.py]=$(first 's/^__version__ = "\(.*\)"$/\1/p' clients/python/spark_pod_allocator/_version.py)
# The project's own <version>: the one right after its artifactId.
found[clients/spark/pom.xml]=$(sed -n '/<artifactId>spark-pod-allocator-spark<\/artifactId>/{n;s/^ *<version>\(.*\)<\/version> *$/\1/p;}' clients/spark/pom.xml)
found["helm/spark-pod-allocator/Chart.yaml (version)"]=$(first 's/^version: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' helm/spark-pod-allocator/Chart.yaml)
found["helm/spark-pod-allocator/Chart.yaml (appVersion)"]=$(first 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' helm/spark-pod-allocator/Chart.yaml)
found["Dockerfile (ARG VERSION)"]=$(first 's/^ARG VERSION=\(.*\)$/\1/p' Dockerfile)

drift=0
for file in "${!found[@]}"; do
  if [ "${found[$file]}" != "$version" ]; then
    echo "version drift: $file says '${found[$file]}', Cargo.toml says '$version'" >&2
    drift=1
  fi
done
[ "$drift" = 0 ] || exit 1
echo "$version"
