# Builds etcdsql in a Rust image and runs it from a small Debian image as a non-root user.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY migrations migrations
COPY src src
COPY benches benches
RUN cargo build --release --locked --bin etcdsql

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/etcdsql --create-home etcdsql
COPY --from=build /src/target/release/etcdsql /usr/local/bin/etcdsql
USER etcdsql
WORKDIR /var/lib/etcdsql
EXPOSE 2379
ENV ETCDSQL_LISTEN_CLIENT_URLS=http://0.0.0.0:2379 \
    ETCDSQL_ENDPOINT=sqlite:///var/lib/etcdsql/db/state.db
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
    CMD curl -fsS http://127.0.0.1:2379/health || exit 1
ENTRYPOINT ["/usr/local/bin/etcdsql"]
