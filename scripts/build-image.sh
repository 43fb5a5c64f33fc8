#!/usr/bin/env bash
# Builds the chart's image, spark-pod-allocator:<version>, with podman on a machine that
# reaches no image registry, from the same Dockerfile users build with Docker:
# - the runtime base is made from Debian's packages (mmdebstrap extracts libc6 and
#   libgcc-s1, and the CA bundle of ca-certificates is added: what distroless's cc image
#   gives the binary; a nonroot user 65532 too);
# - the binary is this checkout's release build, handed to the Dockerfile as the stage it
#   copies from (BINARY_FROM), so its Rust build stage is skipped.
# Prints the image's size and packages. With --archive PATH, also saves it as an OCI archive.
# Installs podman, runc and mmdebstrap with apt when absent (CI runs as root).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
archive=""
if [ "${1:-}" = "--archive" ]; then
  archive=${2:?--archive needs a path}
fi

missing=()
for tool in podman runc mmdebstrap; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing ${missing[*]} (apt)" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc mmdebstrap >/dev/null
fi

cache="${SPARK_POD_ALLOCATOR_CACHE:-$HOME/.cache/spark-pod-allocator}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
mkdir -p "$cache/podman"
# Containers run here with the cgroupfs manager, no default ulimits and runc.
export CONTAINERS_CONF="$cache/podman/containers.conf"
cat >"$CONTAINERS_CONF" <<'EOF'
[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
EOF

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml)
version=${version%%$'\n'*}
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
image="spark-pod-allocator:$version"
base="localhost/spark-pod-allocator-base:bookworm"
binary_image="localhost/spark-pod-allocator-binary:$version"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "==> runtime base from Debian's packages ($base)"
packages=libc6,libgcc-s1
mmdebstrap --quiet --variant=extract --include="$packages" bookworm "$work/rootfs"
rootfs="$work/rootfs"
# The CA bundle the binary's TLS client loads (as distroless has it): the Mozilla
# certificates of Debian's ca-certificates, joined as its update-ca-certificates does (its
# dependencies, openssl and debconf, only serve that script).
(cd "$work" && apt-get download -qq ca-certificates >/dev/null)
dpkg-deb -x "$work"/ca-certificates_*.deb "$rootfs"
mkdir -p "$rootfs/etc/ssl/certs"
cat "$rootfs"/usr/share/ca-certificates/mozilla/*.crt >"$rootfs/etc/ssl/certs/ca-certificates.crt"
# What distroless adds beside the libraries: the nonroot user, a home, a writable /tmp.
mkdir -p "$rootfs/etc" "$rootfs/tmp" "$rootfs/home/nonroot"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
  >"$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
chmod 1777 "$rootfs/tmp"
chown 65532:65532 "$rootfs/home/nonroot"
tar -C "$rootfs" --numeric-owner -cf "$work/rootfs.tar" .
podman import --quiet "$work/rootfs.tar" "$base" >/dev/null

echo "==> release binary"
cargo build --release --locked --bin spark-pod-allocator
mkdir -p "$work/binary/out"
install -m 0755 "$CARGO_TARGET_DIR/release/spark-pod-allocator" "$work/binary/out/"
tar -C "$work/binary" --owner=0 --group=0 -cf "$work/binary.tar" ./out
podman import --quiet "$work/binary.tar" "$binary_image" >/dev/null

echo "==> $image (Dockerfile, RUNTIME_IMAGE=$base, BINARY_FROM=$binary_image)"
podman build --quiet \
  --build-arg RUNTIME_IMAGE="$base" \
  --build-arg BINARY_FROM="$binary_image" \
  --build-arg VERSION="$version" \
  --build-arg REVISION="$revision" \
  -t "$image" -f Dockerfile . >/dev/null
podman rmi --force "$binary_image" >/dev/null 2>&1 || true

size=$(podman image inspect --format '{{.Size}}' "$image")
echo "image $image: $((size / 1024 / 1024)) MiB, user $(podman image inspect --format '{{.Config.User}}' "$image")"
echo "packages in it (Debian bookworm):"
for package in $(ls "$rootfs/usr/share/doc"); do
  shown=$(apt-cache show --no-all-versions "$package" 2>/dev/null || true)
  package_version=$(printf '%s\n' "$shown" | sed -n 's/^Version: //p')
  echo "  $package ${package_version%%$'\n'*}"
done
if [ -n "$archive" ]; then
  mkdir -p "$(dirname "$archive")"
  rm -f "$archive"
  podman save --quiet --format oci-archive -o "$archive" "$image"
  echo "saved $archive ($(( $(stat -c %s "$archive") / 1024 / 1024 )) MiB)"
fi
