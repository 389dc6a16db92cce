# Multi-stage build of the controller image. `.ci/run` builds it when a container engine answers;
# without one, the interop test image_binary_runs_as_non_root_with_a_read_only_root_filesystem runs
# the package's binary as 65532 with a read-only root, as the runtime stage and the Deployment do.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --locked --release -p external-endpoints \
    && cp target/release/external-endpoints /external-endpoints

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /external-endpoints /usr/local/bin/external-endpoints
USER 65532:65532
EXPOSE 9990
ENTRYPOINT ["/usr/local/bin/external-endpoints"]
