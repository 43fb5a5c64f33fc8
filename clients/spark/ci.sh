#!/usr/bin/env bash
# Builds the Spark plugin's shaded jar and runs all its tests, for each Spark version it
# supports: unit tests, the client against the real service binary, and the Spark job on the
# simulated cluster (SparkOnServiceIT, through the shaded jar).
#
#   clients/spark/ci.sh [PATH-OF-spark-pod-allocator]    (default: $SPARK_POD_ALLOCATOR_BIN)
#   SPARK_VERSIONS="4.0.1" clients/spark/ci.sh ...       (default: 4.0.1 and 4.2.0)
#
# Maven's downloads land in ~/.m2 as usual, so a second run needs no network.
set -euo pipefail

bin=${1:-${SPARK_POD_ALLOCATOR_BIN:-}}
if [ -z "$bin" ]; then
  echo "usage: $0 PATH-OF-spark-pod-allocator (or set SPARK_POD_ALLOCATOR_BIN)" >&2
  exit 2
fi
if [ ! -x "$bin" ]; then
  echo "$bin is not an executable spark-pod-allocator binary" >&2
  exit 2
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
# The binary path is resolved from the caller's directory before moving to the project.
cd "$(dirname "$0")"

versions=${SPARK_VERSIONS:-"4.0.1 4.2.0"}
for version in $versions; do
  printf '\n==> clients/spark: Spark %s\n' "$version"
  started=$SECONDS
  # -ntp: no download progress; test results and failures are printed in full.
  mvn -B -ntp -Dstyle.color=never \
    -Dspark.version="$version" \
    -Dspark.pod.allocator.bin="$bin" \
    clean verify
  printf '==> clients/spark: Spark %s passed in %d s\n' "$version" $((SECONDS - started))
done
