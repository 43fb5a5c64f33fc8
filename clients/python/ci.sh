#!/usr/bin/env bash
# Builds the client's wheel, installs it into fresh venvs and runs the tests against the
# installed package (not the source tree) at the newest dependency versions and at the floors
# the wheel declares. Usage: clients/python/ci.sh PATH_TO_SPARK_POD_ALLOCATOR_BINARY
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
binary=$(cd "$(dirname "${1:?usage: ci.sh PATH_TO_SPARK_POD_ALLOCATOR_BINARY}")" && pwd)/$(basename "$1")
[ -x "$binary" ] || { echo "not an executable: $binary" >&2; exit 1; }
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pip_quiet=(--quiet --disable-pip-version-check)

echo "--- wheel"
# A copy of the sources, so the build leaves nothing (build/, *.egg-info) in the tree.
mkdir "$work/src"
cp -r "$here/pyproject.toml" "$here/README.md" "$here/spark_pod_allocator" "$work/src/"
"$python" -m venv "$work/build"
"$work/build/bin/pip" wheel "${pip_quiet[@]}" --no-deps --wheel-dir "$work/dist" "$work/src"
wheels=("$work"/dist/*.whl)
wheel=${wheels[0]}
echo "$(basename "$wheel")"

run_tests() { # venv label
  local venv=$1
  # From an empty directory: only the installed package is importable.
  mkdir -p "$work/run"
  (cd "$work/run" && "$venv/bin/python" - <<'PY'
import pathlib, sys
import google.protobuf, grpc, spark_pod_allocator
where = pathlib.Path(spark_pod_allocator.__file__).resolve()
assert "site-packages" in where.parts, f"imported from {where}, not the installed wheel"
print(f"spark_pod_allocator {spark_pod_allocator.__version__} from {where.parent}; "
      f"grpcio {grpc.__version__}, protobuf {google.protobuf.__version__}")
PY
  )
  (cd "$work/run" && SPARK_POD_ALLOCATOR_BIN="$binary" "$venv/bin/python" -m pytest -q \
    -p no:cacheprovider --rootdir "$here/tests" "$here/tests")
}

echo "--- newest dependencies"
"$python" -m venv "$work/newest"
"$work/newest/bin/pip" install "${pip_quiet[@]}" --upgrade "${wheel}[test]"
run_tests "$work/newest"
# py.typed: a typed caller of the installed package type-checks against it.
"$work/newest/bin/pip" install "${pip_quiet[@]}" mypy types-protobuf grpc-stubs
cat >"$work/run/caller.py" <<'PY'
from spark_pod_allocator import AllocatorClient, AsyncAllocatorClient, NotFound, pb


def running(client: AllocatorClient, application_id: str) -> int:
    status: pb.ApplicationStatus = client.get_status(application_id)
    return sum(p.running for p in status.profiles)


async def stop(client: AsyncAllocatorClient, application_id: str) -> int:
    try:
        return await client.stop(application_id)
    except NotFound as err:
        print(err.code, err.details)
        return 0
PY
(cd "$work/run" && "$work/newest/bin/mypy" --strict --no-incremental caller.py)

echo "--- dependency floors"
"$python" -m venv "$work/floor"
"$work/floor/bin/pip" install "${pip_quiet[@]}" "${wheel}[test]"
# The floors as the wheel declares them (name>=version), pinned exactly.
floors=$("$work/floor/bin/python" - <<'PY'
import importlib.metadata, re
pins = []
for requirement in importlib.metadata.requires("spark-pod-allocator-client") or []:
    if "extra ==" in requirement:
        continue
    match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)\s*", requirement)
    if not match:
        raise SystemExit(f"dependency without a plain floor: {requirement}")
    pins.append(f"{match[1]}=={match[2]}")
print(" ".join(pins))
PY
)
read -r -a floor_pins <<<"$floors"
echo "pinning ${floor_pins[*]}"
# grpcio-health-checking (test only) follows grpcio down to the same version.
grpcio_floor=""
for pin in "${floor_pins[@]}"; do
  case $pin in grpcio==*) grpcio_floor=${pin#grpcio==} ;; esac
done
"$work/floor/bin/pip" install "${pip_quiet[@]}" "${floor_pins[@]}" \
  ${grpcio_floor:+"grpcio-health-checking==$grpcio_floor"}
run_tests "$work/floor"
