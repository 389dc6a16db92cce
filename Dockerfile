# The controller image, for a machine that reaches a container registry. scripts/image.sh builds
# the same image without one: it stages the files with scripts/image-rootfs.sh, as the build stage
# below does, and builds this file's final stage from them (`buildah bud --build-context
# build=DIR`). Both therefore ship the same files: the binary without debug info, the shared
# libraries it links, /etc/passwd and /etc/group with the nonroot user 65532, and the CA bundle.
# The interop tests image_built_by_the_script_holds_what_the_dockerfile_copies_and_no_debug_info
# (this file's final stage against the script's image) and
# image_runs_under_runc_as_65532_read_only_leads_drains_releases_and_hands_over run on that image.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --locked --release -p external-endpoints \
    && scripts/image-rootfs.sh target/release/external-endpoints /rootfs /external-endpoints.debug

FROM scratch
ARG VERSION=0.1.0
ARG REVISION=unknown
COPY --from=build /rootfs/ /
LABEL org.opencontainers.image.title="external-endpoints" \
      org.opencontainers.image.description="Publishes EndpointSlices for Services that select ExternalWorkloads, with Lease-based leader election" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
USER 65532:65532
EXPOSE 9990
ENTRYPOINT ["/usr/local/bin/external-endpoints"]
