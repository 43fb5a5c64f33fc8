# Builds the service image used by helm/spark-pod-allocator.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin spark-pod-allocator

FROM debian:bookworm-slim
COPY --from=build /src/target/release/spark-pod-allocator /usr/local/bin/spark-pod-allocator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/spark-pod-allocator"]
CMD ["serve"]
