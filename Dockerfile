# Multi-stage build of the controller image. Not built by CI here (no container engine); provided
# for users.
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
