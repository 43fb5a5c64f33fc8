#!/usr/bin/env bash
# Regenerates the Python stubs from proto/ (needs grpcio-tools).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python -m grpc_tools.protoc -I"$here/../../proto" --python_out="$here" --pyi_out="$here" \
  --grpc_python_out="$here" "$here/../../proto/spark/allocator/v1/allocator.proto"
