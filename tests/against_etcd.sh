#!/usr/bin/env bash
# Runs integration tests that state etcd's behaviour against real etcd 3.5 instead of etcdsql:
# the tests connect to $ETCDSQL_REFERENCE_ENDPOINT (tests/common's `Target`), one at a time, so
# an expectation that etcd itself does not meet fails here. Bounded: etcd must answer within 30 s, each test
# target has its own limit, and etcd is stopped on exit.
#
#   tests/against_etcd.sh TEST [TEST...]
#
# TESTs are integration test targets (tests/NAME.rs) built on `Target`. etcd comes from
# $ETCD35_BIN, else from conformance/k8s-storage/build.sh (cached).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${ETCD35_BIN:-}" ]; then
    ETCD35_BIN=$(bash conformance/k8s-storage/build.sh | tail -n1)/etcd
fi
cargo test --locked --no-run "${@/#/--test=}" >/dev/null 2>&1 ||
    cargo test --locked --no-run "${@/#/--test=}"

work=$(mktemp -d)
etcd_pid=""
cleanup() {
    if [ -n "$etcd_pid" ]; then
        kill "$etcd_pid" 2>/dev/null || true
        wait "$etcd_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# Two free loopback ports: the kernel picks them, then they are released for etcd.
read -r client peer < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
url="http://127.0.0.1:$client"
"$ETCD35_BIN" --name reference --data-dir "$work/data" \
    --listen-client-urls "$url" --advertise-client-urls "$url" \
    --listen-peer-urls "http://127.0.0.1:$peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "reference=http://127.0.0.1:$peer" \
    >"$work/etcd.log" 2>&1 </dev/null &
etcd_pid=$!
deadline=$((SECONDS + 30))
until etcdctl --endpoints="$url" --dial-timeout=1s --command-timeout=2s endpoint health \
    >/dev/null 2>&1; do
    if ((SECONDS >= deadline)) || ! kill -0 "$etcd_pid" 2>/dev/null; then
        echo "etcd 3.5 did not become healthy at $url; its log:" >&2
        cat "$work/etcd.log" >&2
        exit 1
    fi
    sleep 0.2
done
echo "reference: $("$ETCD35_BIN" --version | head -n1) at $url"

for test in "$@"; do
    # One test at a time: the tests assert revisions, which another test's writes would move.
    ETCDSQL_REFERENCE_ENDPOINT=$url timeout -k 10 600 \
        cargo test --locked --test "$test" -- --test-threads=1 || {
        status=$?
        echo "tests/$test.rs fails against real etcd (status $status)" >&2
        exit "$status"
    }
done
