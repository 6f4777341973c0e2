#!/usr/bin/env bash
# Runs every etcdsql test: unit and integration tests (real server, real SQLite file, the
# etcd-client crate), then the etcdctl conformance scenarios against a real etcd and against
# etcdsql. Installs the Debian packages the tests need when they are missing.
set -euo pipefail
cd "$(dirname "$0")"

need=()
command -v protoc >/dev/null || need+=(protobuf-compiler) # the etcd-client test crate builds its protos
command -v etcd >/dev/null || need+=(etcd-server)          # the reference server
command -v etcdctl >/dev/null || need+=(etcd-client)       # drives the conformance scenarios
if [ ${#need[@]} -gt 0 ]; then
    echo "installing ${need[*]}"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

cargo build --locked
cargo test --locked
ETCDSQL_BIN="$PWD/target/debug/etcdsql" bash conformance/run.sh etcd
ETCDSQL_BIN="$PWD/target/debug/etcdsql" bash conformance/run.sh etcdsql
