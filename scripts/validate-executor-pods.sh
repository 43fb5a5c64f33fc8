#!/usr/bin/env bash
# Checks executor pods built by the service against the Kubernetes OpenAPI schema, offline
# (kubernetes-validate ships the schemas), strictly (no unknown fields). Needs Python 3 and,
# once, network access to install kubernetes-validate into ./.venv-validate.
set -euo pipefail
cd "$(dirname "$0")/.."
versions=("${@:-1.33.0}")
if [ ! -x .venv-validate/bin/kubernetes-validate ]; then
  python3 -m venv .venv-validate
  .venv-validate/bin/pip install --quiet kubernetes-validate
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cargo run --quiet --example executor_pods -- "$out" >/dev/null
for version in "${versions[@]}"; do
  .venv-validate/bin/kubernetes-validate --strict -k "$version" "$out"/*.json
done
