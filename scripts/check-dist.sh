#!/usr/bin/env bash
# Checks what scripts/dist.sh built in DIR (default dist/): the checksums verify; every
# artifact and its dependency list is there, at the one version; the image archive holds
# spark-pod-allocator:V labelled V, running as non-root; the wheel installs in a fresh venv and
# imports at V; the jar (manifest version V) holds the plugin class and only relocated
# gRPC/protobuf; the packaged chart lints and renders the image spark-pod-allocator:V.
# Loading the jar in a Spark driver is clients/spark's ShadedJarIT (the Spark step of CI, on
# the jar the same sources build); running the image is scripts/run-image.sh.
#
#   scripts/check-dist.sh [DIR]
#   HELM=PATH   as for scripts/dist.sh (default .tools/bin/helm, then helm on PATH)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(cd "${1:-$root/dist}" && pwd)
version=$(bash "$root/scripts/versions.sh")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "check-dist: $*" >&2; exit 1; }

echo "--- SHA256SUMS"
(cd "$out" && sha256sum --strict -c SHA256SUMS)

image="spark-pod-allocator-image-$version.oci.tar"
jar="spark-pod-allocator-spark-$version.jar"
wheel="spark_pod_allocator_client-$version-py3-none-any.whl"
sdist="spark_pod_allocator_client-$version.tar.gz"
chart="spark-pod-allocator-$version.tgz"
echo "--- every artifact at $version, with its dependency list, in SHA256SUMS"
for artifact in "$image" "$jar" "$wheel" "$sdist" "$chart"; do
  for file in "$artifact" "$artifact.deps.txt"; do
    [ "$file" = "$sdist.deps.txt" ] && continue # the sdist's are the wheel's
    [ -s "$out/$file" ] || fail "missing or empty: $file"
    sums=$(cat "$out/SHA256SUMS")
    case $'\n'"$sums"$'\n' in
      *"  $file"$'\n'*) ;;
      *) fail "$file is not in SHA256SUMS" ;;
    esac
  done
done
# Nothing else at another version (a leftover of an earlier release).
for file in "$out"/*; do
  name=$(basename "$file")
  case $name in
    SHA256SUMS | *"-$version"[.-]*) ;;
    *) fail "$name: not of release $version" ;;
  esac
done

echo "--- image archive"
python3 - "$out/$image" "$version" <<'PY'
import json, sys, tarfile
path, version = sys.argv[1], sys.argv[2]
with tarfile.open(path) as archive:
    def blob(digest):
        algorithm, hexdigest = digest.split(":")
        return json.load(archive.extractfile(f"blobs/{algorithm}/{hexdigest}"))
    index = json.load(archive.extractfile("index.json"))
    (entry,) = index["manifests"]
    ref = entry.get("annotations", {}).get("org.opencontainers.image.ref.name", "")
    assert ref.endswith(f"spark-pod-allocator:{version}") or ref == version, f"ref.name {ref!r}"
    config = blob(blob(entry["digest"])["config"]["digest"])["config"]
labels = config.get("Labels") or {}
assert labels.get("org.opencontainers.image.version") == version, labels
assert labels.get("org.opencontainers.image.licenses") == "Apache-2.0", labels
user = config.get("User", "")
assert user and user.split(":")[0] not in ("0", "root"), f"runs as {user!r}"
assert config.get("Entrypoint") == ["/usr/local/bin/spark-pod-allocator"], config.get("Entrypoint")
print(f"{ref}: version {version}, user {user}")
PY

echo "--- Spark plugin jar"
python3 - "$out/$jar" "$version" <<'PY'
import sys, zipfile
path, version = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(path) as jar:
    names = set(jar.namelist())
    plugin = "io/github/sparkpodallocator/spark/ServicePodsAllocator.class"
    assert plugin in names, f"no {plugin}"
    manifest = jar.read("META-INF/MANIFEST.MF").decode().splitlines()
    assert f"Implementation-Version: {version}" in manifest, manifest
# grpc-java and protobuf only relocated: they must never meet Spark's own copies.
shaded = "io/github/sparkpodallocator/spark/shaded/"
for prefix in ("io/grpc/", "com/google/protobuf/"):
    assert not any(n.startswith(prefix) for n in names), f"unrelocated {prefix} in the jar"
    assert any(n.startswith(shaded + prefix) for n in names), f"no relocated {prefix}"
print(f"{len(names)} entries; {plugin}; Implementation-Version: {version}")
PY

echo "--- Python wheel in a fresh venv, sdist metadata"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check "$out/$wheel"
# From an empty directory: only the installed package is importable.
mkdir "$work/run"
(cd "$work/run" && "$work/venv/bin/python" - "$version" <<'PY'
import importlib.metadata, sys
import spark_pod_allocator
from spark_pod_allocator import AllocatorClient, AsyncAllocatorClient  # noqa: F401
version = sys.argv[1]
assert spark_pod_allocator.__version__ == version, spark_pod_allocator.__version__
assert importlib.metadata.version("spark-pod-allocator-client") == version
print(f"spark_pod_allocator {spark_pod_allocator.__version__} from {spark_pod_allocator.__file__}")
PY
)
pkg_info=$(tar -xzOf "$out/$sdist" "spark_pod_allocator_client-$version/PKG-INFO")
case $'\n'"$pkg_info"$'\n' in
  *$'\n'"Version: $version"$'\n'*) echo "$sdist: Version $version" ;;
  *) fail "$sdist: PKG-INFO has no Version: $version" ;;
esac

echo "--- Helm chart"
helm=${HELM:-$root/.tools/bin/helm}
[ -x "$helm" ] || helm=$(command -v helm) || fail "no helm (bash helm/ci.sh builds it into .tools/bin)"
shown=$("$helm" show chart "$out/$chart")
for key in version appVersion; do
  case $'\n'"$shown"$'\n' in
    *$'\n'"$key: $version"$'\n'* | *$'\n'"$key: \"$version\""$'\n'*) ;;
    *) fail "$chart: $key is not $version" ;;
  esac
done
"$helm" lint --strict "$out/$chart" --set 'allowedNamespaces={spark}'
rendered=$("$helm" template release "$out/$chart" --namespace spark-system --set 'allowedNamespaces={spark}')
case $rendered in
  *"image: \"spark-pod-allocator:$version\""* | *"image: spark-pod-allocator:$version"*)
    echo "$chart renders image spark-pod-allocator:$version" ;;
  *) fail "$chart does not render image spark-pod-allocator:$version" ;;
esac
echo "--- dist $version: all checks passed"
