# syntax=docker/dockerfile:1.7
# The service image used by helm/spark-pod-allocator. Needs BuildKit (cache mounts):
#   docker build -t spark-pod-allocator:0.1.0 --build-arg REVISION=$(git rev-parse HEAD) .
# Without a registry, scripts/build-image.sh builds the same image with podman from this
# file: a runtime base made from Debian's packages and the binary built on the host
# (RUNTIME_IMAGE and BINARY_FROM below). CI builds and runs it (scripts/check-image.sh).

ARG RUST_IMAGE=rust:1.95.0-bookworm
# Debian 12 with glibc and libgcc only: no shell, no package manager, user 65532.
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot
# The stage the binary is copied from (/out/spark-pod-allocator): the build below, or an
# image holding a binary built elsewhere.
ARG BINARY_FROM=build

FROM ${RUST_IMAGE} AS build
WORKDIR /src
# Only what the build reads; .dockerignore keeps everything else out of the context.
# protoc is not needed: build.rs compiles the proto with protox.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY benches benches
COPY src src
COPY crates crates
# The registry and target/ live in cache mounts: a source change recompiles this crate
# only, never its dependencies. The release profile strips the binary.
RUN --mount=type=cache,id=spark-pod-allocator-registry,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,id=spark-pod-allocator-git,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,id=spark-pod-allocator-target,target=/src/target,sharing=locked \
    cargo build --release --locked --bin spark-pod-allocator \
 && install -D -m 0755 target/release/spark-pod-allocator /out/spark-pod-allocator

FROM ${BINARY_FROM} AS binary

FROM ${RUNTIME_IMAGE}
ARG RUNTIME_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="spark-pod-allocator" \
      org.opencontainers.image.description="Executor-pod allocation for Spark drivers on Kubernetes, as a shared gRPC service" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${RUNTIME_IMAGE}"
COPY --from=binary /out/spark-pod-allocator /usr/local/bin/spark-pod-allocator
# Reachable from outside the container (the built-in default is loopback). The environment
# wins over a configuration file; the Helm chart sets this variable to its own port.
ENV SPARK_POD_ALLOCATOR__LISTEN=0.0.0.0:50051
EXPOSE 50051
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/spark-pod-allocator"]
CMD ["serve"]
