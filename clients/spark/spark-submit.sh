#!/usr/bin/env bash
# `spark-submit` of a Spark distribution, from Maven's jars (no distribution is downloaded
# here): what its bin/spark-submit runs, `java -cp <Spark's jars> SparkSubmit ARGS`, with the
# JVM options Spark's launcher adds on Java 17 and SPARK_SUBMIT_OPTS as bin/spark-class reads
# them. The process node runs it as the Spark driver pod's image in
# tests/real_apiserver/chart_pod.rs.
#
#   clients/spark/spark-submit.sh --prepare
#       resolves Spark's jars (target/spark-submit-V/classpath, Maven's test scope, as
#       own-allocator-driver.sh) and builds target/spark-submit-V/example-job.jar (ExampleJob),
#       once
#   clients/spark/spark-submit.sh ARGS...
#       as spark-submit ARGS...
#
# SPARK_VERSION picks the Spark version (default 4.2.0); SPARK_DRIVER_MEMORY the driver's heap
# (default 512m).
set -euo pipefail
cd "$(dirname "$0")"
version=${SPARK_VERSION:-4.2.0}
out="target/spark-submit-$version"
job=src/test/java/io/github/sparkpodallocator/spark/ExampleJob.java

prepare() {
  mkdir -p "$out"
  if [ ! -f "$out/classpath" ] || [ pom.xml -nt "$out/classpath" ]; then
    # One Maven run for both: each run's start costs seconds.
    mvn -B -ntp -q -Dstyle.color=never -Dspark.version="$version" \
      dependency:build-classpath -Dmdep.includeScope=test -Dmdep.outputFile="$out/classpath" \
      help:evaluate -Dexpression=spark.java17.opens -Doutput="$out/jvm-options"
  fi
  if [ ! -f "$out/example-job.jar" ] || [ "$job" -nt "$out/example-job.jar" ]; then
    rm -rf "$out/example-job"
    javac -nowarn -d "$out/example-job" -cp "$(cat "$out/classpath")" "$job"
    jar cf "$out/example-job.jar" -C "$out/example-job" .
  fi
}

if [ "${1:-}" = "--prepare" ]; then
  prepare
  exit 0
fi
[ -f "$out/example-job.jar" ] || prepare
# help:evaluate writes the options without a final newline, so read reports EOF.
read -r -a opens < "$out/jvm-options" || [ "${#opens[@]}" -gt 0 ]
read -r -a submit_opts <<< "${SPARK_SUBMIT_OPTS:-}" || true
exec java "${opens[@]}" "${submit_opts[@]}" "-Xmx${SPARK_DRIVER_MEMORY:-512m}" \
  -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
  -cp "src/test/resources:$(cat "$out/classpath")" org.apache.spark.deploy.SparkSubmit "$@"
