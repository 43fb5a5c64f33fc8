#!/usr/bin/env bash
# Builds the Spark plugin's shaded jar and runs all its tests, for each Spark version it
# supports: unit tests, the client against the real service binary, and the Spark job on the
# simulated cluster (SparkOnServiceIT, through the shaded jar) and, with TEST_APISERVER_BIN set,
# on the real control plane (SparkOnControlPlaneIT: kube-apiserver, kube-scheduler,
# kube-controller-manager, a kwok node and a process node; docs/process-runtime.md).
#
#   clients/spark/ci.sh [PATH-OF-spark-pod-allocator]    (default: $SPARK_POD_ALLOCATOR_BIN)
#   SPARK_VERSIONS="4.0.1" clients/spark/ci.sh ...       (default: 4.0.1 and 4.2.0)
#   TEST_APISERVER_BIN=$(bash scripts/build-test-apiserver.sh) clients/spark/ci.sh ...
#   CONTROL_PLANE_SPARK_VERSIONS="..."                   (the versions that also run on the
#                                                         control plane; default: all of them)
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
apiserver=${TEST_APISERVER_BIN:-}
if [ -n "$apiserver" ] && [ ! -x "$apiserver" ]; then
  echo "TEST_APISERVER_BIN=$apiserver is not an executable file" >&2
  exit 2
fi
control_plane_versions=${CONTROL_PLANE_SPARK_VERSIONS:-$versions}
for version in $versions; do
  # Without the property SparkOnControlPlaneIT is skipped (and says why).
  on_control_plane=()
  case " $control_plane_versions " in
    *" $version "*) [ -n "$apiserver" ] && on_control_plane=(-Dtest.apiserver.bin="$apiserver") ;;
  esac
  printf '\n==> clients/spark: Spark %s%s\n' "$version" \
    "${on_control_plane:+ (also on the real control plane)}"
  started=$SECONDS
  # -ntp: no download progress; test results and failures are printed in full.
  mvn -B -ntp -Dstyle.color=never \
    -Dspark.version="$version" \
    -Dspark.pod.allocator.bin="$bin" \
    "${on_control_plane[@]}" \
    clean verify
  printf '==> clients/spark: Spark %s passed in %d s\n' "$version" $((SECONDS - started))
done
