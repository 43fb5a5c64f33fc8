#!/usr/bin/env bash
# The release command: builds every artifact with the one version (Cargo.toml's; see
# scripts/versions.sh) into DIR (default dist/):
#   spark-pod-allocator-image-V.oci.tar       the image (scripts/build-image.sh), an OCI archive
#   spark-pod-allocator-spark-V.jar           the Spark plugin's shaded jar (clients/spark)
#   spark_pod_allocator_client-V-*.whl, .tar.gz  the Python client's wheel and sdist
#   spark-pod-allocator-V.tgz                 the packaged Helm chart (appVersion V: image tag V)
#   <artifact>.deps.txt                       the dependency list of each (what it ships)
#   SHA256SUMS                                over all of the above
# scripts/check-dist.sh DIR checks them. The image stays in podman's store as
# spark-pod-allocator:V (scripts/run-image.sh runs it).
#
#   scripts/dist.sh [--out DIR]
#   HELM=PATH   the helm to package with (default: .tools/bin/helm, which helm/ci.sh builds,
#               then helm on PATH, else built the way helm/ci.sh does, at its version)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=dist
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    *) echo "usage: $0 [--out DIR]" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)

version=$(bash scripts/versions.sh)
echo "==> release $version into $out"
# Only this release's files: a stale artifact would end up in SHA256SUMS.
rm -f "$out"/spark-pod-allocator* "$out"/spark_pod_allocator* "$out"/SHA256SUMS
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
started=$SECONDS
lap() { echo "    ($((SECONDS - started)) s so far)"; }

echo "==> image"
image_archive="$out/spark-pod-allocator-image-$version.oci.tar"
bash scripts/build-image.sh --archive "$image_archive" | tee "$work/image.log"
{
  echo "# spark-pod-allocator-image-$version.oci.tar: spark-pod-allocator:$version"
  echo "# Debian bookworm packages in the image (name version)"
  # build-image.sh lists them indented under "packages in it".
  sed -n '/^packages in it/,/^[^ ]/{s/^  //p;}' "$work/image.log"
  echo "# Rust crates linked into /usr/local/bin/spark-pod-allocator (name version)"
  cargo tree --locked -e normal --prefix none --format '{p}' -p spark-pod-allocator \
    | sed 's/ (.*)$//; s/ v/ /; s/ (\*)$//' | sort -u | grep -v '^spark-pod-allocator '
} >"$image_archive.deps.txt"
lap

echo "==> Spark plugin jar"
jar="spark-pod-allocator-spark-$version.jar"
# The jar's contents are its compile and runtime dependencies, shaded; Spark's are `provided`.
(cd clients/spark && mvn -B -ntp -q -Dstyle.color=never -DskipTests \
  -DincludeScope=runtime -DoutputFile="$work/maven-deps.txt" -DoutputAbsoluteArtifactFilename=false \
  clean package dependency:list)
cp "clients/spark/target/$jar" "$out/$jar"
{
  echo "# $jar: shaded into it, relocated under io.github.sparkpodallocator.spark.shaded (groupId:artifactId:type:version:scope)"
  sed -n 's/^ *\([^ :]*:[^ :]*:jar:[^ ]*\).*/\1/p' "$work/maven-deps.txt" | sort -u
} >"$out/$jar.deps.txt"
lap

echo "==> Python client wheel and sdist"
# From a copy of the sources, so the build leaves nothing in the tree; the sdist is built
# first and the wheel from it (python -m build), so the sdist is known to build.
mkdir "$work/python"
cp -r clients/python/pyproject.toml clients/python/README.md clients/python/spark_pod_allocator \
  "$work/python/"
cp LICENSE "$work/python/"
python3 -m venv "$work/build-venv"
"$work/build-venv/bin/pip" install --quiet --disable-pip-version-check build
"$work/build-venv/bin/python" -m build --outdir "$work/python-dist" "$work/python" >"$work/python-build.log" 2>&1 \
  || { cat "$work/python-build.log" >&2; exit 1; }
cp "$work"/python-dist/*.whl "$work"/python-dist/*.tar.gz "$out/"
for wheel in "$out"/*.whl; do
  {
    echo "# $(basename "$wheel"): Requires-Dist of the wheel"
    unzip -p "$wheel" '*.dist-info/METADATA' | sed -n 's/^Requires-Dist: //p'
  } >"$wheel.deps.txt"
done
lap

echo "==> Helm chart"
helm=${HELM:-$root/.tools/bin/helm}
if [ ! -x "$helm" ]; then
  if command -v helm >/dev/null 2>&1; then
    helm=$(command -v helm)
  else
    helm_version=$(sed -n 's/^helm_version=\([^ ]*\).*/\1/p' helm/ci.sh)
    echo "building helm $helm_version (as helm/ci.sh does) into .tools/bin"
    GOBIN="$root/.tools/bin" GOFLAGS=-buildvcs=false go install "helm.sh/helm/v3/cmd/helm@$helm_version"
    helm=$root/.tools/bin/helm
  fi
fi
"$helm" package helm/spark-pod-allocator --destination "$out" >/dev/null
chart="spark-pod-allocator-$version.tgz"
[ -f "$out/$chart" ] || { echo "helm package made no $chart" >&2; exit 1; }
{
  echo "# $chart: chart dependencies (none) and the image it deploys by default"
  echo "image spark-pod-allocator:$version (spark-pod-allocator-image-$version.oci.tar)"
} >"$out/$chart.deps.txt"

(cd "$out" && sha256sum -- spark-pod-allocator* spark_pod_allocator* >SHA256SUMS)
echo "==> $out ($((SECONDS - started)) s)"
(cd "$out" && ls -l --block-size=K -- *)
