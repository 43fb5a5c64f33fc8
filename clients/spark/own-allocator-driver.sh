#!/usr/bin/env bash
# A Spark driver with Spark's own executor allocator (OwnAllocatorDriver), or with the
# plugin given a service address, for `spark-pod-allocator-bench control-plane` and
# `api-load`.
#
#   clients/spark/own-allocator-driver.sh --prepare
#       resolves Spark's jars (Maven), compiles the plugin and the driver, once per Spark
#       version
#   clients/spark/own-allocator-driver.sh URL CA_FILE TOKEN NAMESPACE EXECUTORS APP [SERVICE]
#       runs one driver until its stdin closes (SERVICE: host:port of the service's gRPC,
#       the plugin then allocates through it with only its two required settings)
#
# SPARK_VERSION picks the Spark version (default 4.2.0); DRIVER_HEAP its heap (default 512m).
set -euo pipefail
cd "$(dirname "$0")"
version=${SPARK_VERSION:-4.2.0}
out="target/own-allocator-$version"

prepare() {
  mkdir -p "$out/classes"
  mvn -B -ntp -q -Dstyle.color=never -Dspark.version="$version" dependency:build-classpath \
    -Dmdep.includeScope=test -Dmdep.outputFile="$out/classpath"
  mvn -B -ntp -q -Dstyle.color=never -Dspark.version="$version" help:evaluate \
    -Dexpression=spark.java17.opens -Doutput="$out/jvm-options"
  # The plugin's classes and its generated gRPC stubs, kept beside the driver's.
  mvn -B -ntp -q -Dstyle.color=never -Dspark.version="$version" compile
  rm -rf "$out/plugin-classes"
  cp -r target/classes "$out/plugin-classes"
  javac -nowarn -d "$out/classes" -cp "$out/plugin-classes:$(cat "$out/classpath")" \
    src/test/java/io/github/sparkpodallocator/spark/OwnAllocatorDriver.java
  touch "$out/ready"
}

if [ "${1:-}" = "--prepare" ]; then
  prepare
  exit 0
fi
if [ "$#" -ne 6 ] && [ "$#" -ne 7 ]; then
  echo "usage: $0 --prepare | URL CA_FILE TOKEN NAMESPACE EXECUTORS APP [SERVICE]" >&2
  exit 2
fi
[ -f "$out/ready" ] || prepare
# help:evaluate writes the options without a final newline, so read reports EOF.
read -r -a opens < "$out/jvm-options" || [ "${#opens[@]}" -gt 0 ]
exec java "${opens[@]}" "-Xmx${DRIVER_HEAP:-512m}" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
  -cp "$out/classes:$out/plugin-classes:src/test/resources:$(cat "$out/classpath")" io.github.sparkpodallocator.spark.OwnAllocatorDriver "$@"
