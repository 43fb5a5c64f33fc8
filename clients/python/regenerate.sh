#!/usr/bin/env bash
# Regenerates the Python stubs from proto/ into spark_pod_allocator/v1 (needs grpcio-tools).
# grpc_tools writes modules under the proto's package path (spark/allocator/v1) with absolute
# imports of it; they are moved into the package and their imports rewritten, so the wheel is
# self-contained and ships no top-level `spark` package.
# After regenerating, raise the floors in pyproject.toml to the versions the new code checks:
# protobuf >= the ValidateProtobufRuntimeVersion arguments in allocator_pb2.py, grpcio >=
# GRPC_GENERATED_VERSION in allocator_pb2_grpc.py.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
proto_root="$here/../../proto"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python -m grpc_tools.protoc -I"$proto_root" --python_out="$out" --pyi_out="$out" \
  --grpc_python_out="$out" "$proto_root/spark/allocator/v1/allocator.proto"
dest="$here/spark_pod_allocator/v1"
mkdir -p "$dest"
for file in allocator_pb2.py allocator_pb2.pyi allocator_pb2_grpc.py; do
  sed -e 's/^from spark\.allocator\.v1 import /from spark_pod_allocator.v1 import /' \
    "$out/spark/allocator/v1/$file" >"$dest/$file"
done
# The package's own imports must not reach a `spark` package any more.
if grep -nE '^(from|import) spark([.]| )' "$dest"/*.py "$dest"/*.pyi; then
  echo "generated code still imports the top-level spark package (see above)" >&2
  exit 1
fi
