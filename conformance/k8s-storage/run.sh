#!/usr/bin/env bash
# Runs Kubernetes' own storage test suite (built by build.sh) against one server, a fresh server
# process and database per test:
#
#   conformance/k8s-storage/run.sh etcd       real etcd 3.5 from Debian sid, the reference
#   conformance/k8s-storage/run.sh sqlite     etcdsql on a fresh SQLite file per test
#   conformance/k8s-storage/run.sh postgres   etcdsql on a fresh PostgreSQL database per test
#                                             ($ETCDSQL_POSTGRES, default postgres://postgres@127.0.0.1:5432)
#   conformance/k8s-storage/run.sh mysql      etcdsql on a fresh MySQL database per test
#                                             ($ETCDSQL_MYSQL, default mysql://root@127.0.0.1:3306)
#
# etcdsql is $ETCDSQL_BIN (default target/debug/etcdsql). Every test must pass; none is skipped
# here. Prints the package versions, each failing test's output, and a count per server.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
target=${1:?usage: run.sh etcd|sqlite|postgres|mysql}
# The suite takes one to two minutes; the bound is for a server that stops answering.
limit=${ETCDSQL_SUITE_LIMIT:-900}

built=$(bash "$HERE/build.sh" | tail -n1)
suite_version=$(grep -m1 '^golang-k8s-apiserver-dev_' "$built/versions.txt" | cut -d_ -f2)
etcd_version=$(grep -m1 '^etcd-server_' "$built/versions.txt" | cut -d_ -f2)
echo "k8s-storage: golang-k8s-apiserver-dev $suite_version (Kubernetes 1.${suite_version#0.}), etcd-server $etcd_version; all versions in $built/versions.txt"

unset ETCDSQL_SUITE_POSTGRES
case "$target" in
etcd)
    export ETCDSQL_SUITE_SERVER=etcd ETCDSQL_SUITE_BIN=$built/etcd
    ;;
sqlite | postgres | mysql)
    export ETCDSQL_SUITE_SERVER=etcdsql ETCDSQL_SUITE_BIN=${ETCDSQL_BIN:-$REPO/target/debug/etcdsql}
    [ -x "$ETCDSQL_SUITE_BIN" ] || { echo "run.sh: no etcdsql at $ETCDSQL_SUITE_BIN (cargo build)" >&2; exit 2; }
    # The harness appends a fresh database's name to this server URL, whatever its scheme.
    if [ "$target" = postgres ]; then
        export ETCDSQL_SUITE_POSTGRES=${ETCDSQL_POSTGRES:-postgres://postgres@127.0.0.1:5432}
    elif [ "$target" = mysql ]; then
        export ETCDSQL_SUITE_POSTGRES=${ETCDSQL_MYSQL:-mysql://root@127.0.0.1:3306}
    fi
    ;;
*)
    echo "run.sh: unknown target $target (etcd, sqlite, postgres or mysql)" >&2
    exit 2
    ;;
esac

out=$(mktemp)
trap 'rm -f "$out"' EXIT
work=$(mktemp -d)
status=0
(cd "$work" && timeout -k 10 "$limit" "$built/etcd3.test" -test.v -test.timeout "$((limit - 30))s" \
    >"$out" 2>&1) || status=$?
rm -rf "$work"
# Top-level results only: subtests' lines are indented.
passed=$(grep -a -c '^--- PASS: ' "$out" || true)
failed=$(grep -a -c '^--- FAIL: ' "$out" || true)
skipped=$(grep -a -c '^--- SKIP: ' "$out" || true)
if [ "$failed" -gt 0 ]; then
    for test in $(grep -a '^--- FAIL: ' "$out" | awk '{print $3}'); do
        echo "=== $test"
        sed -n "/^=== RUN   $test\$/,/^--- FAIL: $test /p" "$out" | grep -a -v '^=== RUN' | head -60
    done
fi
if [ "$skipped" -gt 0 ]; then
    grep -a '^--- SKIP: ' "$out"
fi
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
    # A timeout or crash names no failing test: show where it stopped.
    tail -40 "$out"
    if [ "$status" = 124 ] || [ "$status" = 137 ]; then
        echo "k8s-storage on $target: the suite did not finish within $limit s"
    fi
fi
echo "k8s-storage on $target: $passed tests passed, $failed failed, $skipped skipped"
[ "$status" -eq 0 ] && [ "$failed" -eq 0 ] && [ "$skipped" -eq 0 ] && [ "$passed" -gt 0 ]
