#!/usr/bin/env bash
# Runs every etcdsql test: unit and integration tests (real server, real SQLite file, the
# etcd-client crate), then the etcdctl conformance scenarios against a real etcd and against
# etcdsql; then the integration tests and the scenarios again on PostgreSQL, when a server is
# reachable at $ETCDSQL_TEST_POSTGRES (default postgres://postgres@127.0.0.1:5432, trust auth).
# Without one the PostgreSQL half is skipped and says so, unless ETCDSQL_REQUIRE_POSTGRES=1,
# which makes it a failure (CI sets it). Installs the Debian packages the tests need.
set -euo pipefail
cd "$(dirname "$0")"

need=()
command -v protoc >/dev/null || need+=(protobuf-compiler) # the etcd-client test crate builds its protos
command -v iptables >/dev/null || need+=(iptables)           # tests/failover.rs cuts a primary off
command -v pgbouncer >/dev/null || need+=(pgbouncer)         # tests/pooler.rs puts one in front
command -v etcd >/dev/null || need+=(etcd-server)          # the reference server
command -v etcdctl >/dev/null || need+=(etcd-client)       # drives the conformance scenarios
command -v psql >/dev/null || need+=(postgresql-client)     # checks and cleans the PostgreSQL server
command -v mariadb >/dev/null || need+=(mariadb-client)     # checks and cleans the MySQL server
# Validates docker-compose.yml (this machine has no Docker engine; the v1 client can still parse).
docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null ||
    need+=(docker-compose)
if [ ${#need[@]} -gt 0 ]; then
    echo "installing ${need[*]}"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

if docker compose version >/dev/null 2>&1; then
    docker compose -f docker-compose.yml config --quiet
else
    docker-compose -f docker-compose.yml config --quiet
fi

export ETCDSQL_BIN="$PWD/target/debug/etcdsql"
# Each test that starts a server is bounded by its own watchdog (tests/common); this is the net
# under them, for everything else in a test binary.
bounded() {
    local limit=$1 status=0
    shift
    timeout -k 10 "$limit" "$@" || status=$?
    # timeout's own codes: 124 when the limit passed, 137 when the command then had to be killed.
    if [ "$status" = 124 ] || [ "$status" = 137 ]; then
        echo "timed out after $limit s: $*" >&2
    fi
    return "$status"
}
# Marks where each part of the run starts, with the time so far: CI's limit is 90 minutes, and
# a run that nears it shows here which part grew.
phase() {
    echo "=== $1 (at $((SECONDS / 60)) min $((SECONDS % 60)) s)"
}
# Rounds of the concurrency tests beside a CPU hog (tests/contended.sh). Four keep the whole run
# near an hour of CI's 90 minutes on a 2-core machine (ten took 70 on CI, 82 on a slower one);
# set more when hunting a race.
rounds=${ETCDSQL_CONTENDED_ROUNDS:-4}
phase "SQLite: build and cargo test"
cargo build --locked
# tests/server.rs fills a disk of its own, a tmpfs it mounts: root only, required where root.
if [ "$(id -u)" -eq 0 ]; then
    export ETCDSQL_TEST_DISK_FULL=1
fi
bounded 2400 cargo test --locked
phase "SQLite: contended rounds, tests against etcd, bench smoke runs"
bash tests/contended.sh "$rounds" watch_guarantees reads lock_election
# The tests that state etcd's behaviour, run against real etcd 3.5 itself.
bash tests/against_etcd.sh lock_election downgrade auth
# `import --from-etcd` copies bookworm's etcd 3.4 in the runs above; here the newest etcd too.
ETCDSQL_ETCD_BIN="$(bash conformance/k8s-storage/build.sh | tail -n1)/etcd" \
    cargo test --locked --test import_etcd
# The benchmark harness in its smoke size: proves it runs against etcd and etcdsql (no timings
# are asserted); its tables go to a temporary folder.
cargo test --locked --bench vs_etcd -- --smoke
cargo test --locked --bench scale -- --smoke --backends sqlite
cargo test --locked --bench import -- --smoke --backends sqlite
phase "SQLite: conformance and Kubernetes suites"
bash conformance/run.sh etcd
bash conformance/run.sh etcdsql
bash conformance/kube-apiserver/run.sh sqlite
# A cut-over under a running kube-apiserver: etcd, then its data moved into etcdsql mid-run.
bash conformance/kube-apiserver/run.sh etcd-to-sqlite
# Kubernetes 1.36's own storage test suite, against real etcd 3.5 and etcdsql; then a 1.36 API
# server (apiextensions-apiserver) end to end, on both.
bash conformance/k8s-storage/run.sh etcd
bash conformance/k8s-storage/run.sh sqlite
bash conformance/apiextensions/run.sh etcd
bash conformance/apiextensions/run.sh sqlite

postgres=${ETCDSQL_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432}
# Drops the databases earlier test runs left (test-only names, never anything else).
drop_test_databases() {
    psql "$postgres/postgres" -Atqc "SELECT datname FROM pg_database \
        WHERE datname LIKE 'etcdsql\_test\_%' OR datname LIKE 'etcdsql\_conf\_%'" |
        while read -r db; do
            psql "$postgres/postgres" -qc "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)"
        done
}
if psql "$postgres/postgres" -Atqc 'SELECT 1' >/dev/null 2>&1; then
    drop_test_databases
    # tests/outage.rs stops and starts the server with pg_ctlcluster: only a local one.
    outage=0
    if command -v pg_ctlcluster >/dev/null && [[ $postgres == *@127.0.0.1:* ]]; then
        outage=1
    fi
    # tests/failover.rs makes clusters of its own with pg_createcluster and pg_basebackup: root
    # and the local server's Debian tools.
    failover=0
    if [ "$outage" = 1 ] && [ "$(id -u)" -eq 0 ] && command -v pg_createcluster >/dev/null &&
        command -v pg_basebackup >/dev/null; then
        failover=1
    fi
    export ETCDSQL_TEST_BACKEND=postgres ETCDSQL_TEST_OUTAGE=$outage ETCDSQL_TEST_POSTGRES="$postgres"
    export ETCDSQL_TEST_FAILOVER=$failover
    # tests/pooler.rs starts pgbouncer as postgres in front of the local server.
    pooler=0
    if [ "$outage" = 1 ] && [ "$(id -u)" -eq 0 ] && command -v pgbouncer >/dev/null; then
        pooler=1
    fi
    export ETCDSQL_TEST_POOLER=$pooler
    if [ "$failover" = 1 ]; then
        # Clusters a killed earlier run left behind (the test drops its own when it ends).
        pg_lsclusters -h | awk '$2 ~ /^etcdsql_fo_/ {print $1, $2}' | while read -r v name; do
            pg_dropcluster --stop "$v" "$name"
        done
    fi
    phase "PostgreSQL: cargo test"
    bounded 2400 cargo test --locked
    phase "PostgreSQL: contended rounds"
    # The guarantee checker runs over three instances here.
    contended=(watch_guarantees multi_instance reads lock_election)
    if [ "$outage" = 1 ]; then contended+=(outage); fi
    bash tests/contended.sh "$rounds" "${contended[@]}"
    # A failover round takes a minute beside the hog: fewer rounds.
    if [ "$failover" = 1 ]; then bash tests/contended.sh 2 failover; fi
    unset ETCDSQL_TEST_BACKEND ETCDSQL_TEST_OUTAGE ETCDSQL_TEST_POSTGRES ETCDSQL_TEST_FAILOVER \
        ETCDSQL_TEST_POOLER
    phase "PostgreSQL: conformance and Kubernetes suites"
    ETCDSQL_POSTGRES="$postgres" bash conformance/run.sh etcdsql
    ETCDSQL_POSTGRES="$postgres" bash conformance/kube-apiserver/run.sh postgres
    ETCDSQL_POSTGRES="$postgres" bash conformance/k8s-storage/run.sh postgres
    ETCDSQL_POSTGRES="$postgres" bash conformance/apiextensions/run.sh postgres
    cargo test --locked --bench scale -- --smoke --backends postgres --postgres-url "$postgres"
    drop_test_databases
elif [ "${ETCDSQL_REQUIRE_POSTGRES:-0}" = 1 ]; then
    echo "PostgreSQL is required (ETCDSQL_REQUIRE_POSTGRES=1) but $postgres is unreachable" >&2
    exit 1
else
    echo "skipped: the PostgreSQL tests (no server at $postgres; set ETCDSQL_TEST_POSTGRES)"
fi

mysql=${ETCDSQL_TEST_MYSQL:-mysql://root@127.0.0.1:3306}
# shellcheck source=conformance/mysql.sh
source conformance/mysql.sh
drop_mysql_test_databases() {
    mysql_exec "$mysql" "SELECT schema_name FROM information_schema.schemata \
        WHERE schema_name LIKE 'etcdsql\\_test\\_%' OR schema_name LIKE 'etcdsql\\_conf\\_%'" |
        while read -r db; do
            mysql_exec "$mysql" "DROP DATABASE IF EXISTS \`$db\`"
        done
}
if mysql_exec "$mysql" 'SELECT 1' >/dev/null 2>&1; then
    drop_mysql_test_databases
    # tests/outage.rs stops a local MariaDB with mariadb-admin and starts /usr/sbin/mariadbd
    # again (this machine runs it with no init system): only a local server it can restart.
    outage=0
    if [[ $mysql == *@127.0.0.1:* ]] && [ -x /usr/sbin/mariadbd ] && pgrep -x mariadbd >/dev/null; then
        outage=1
    fi
    export ETCDSQL_TEST_BACKEND=mysql ETCDSQL_TEST_OUTAGE=$outage ETCDSQL_TEST_MYSQL="$mysql"
    phase "MySQL: cargo test"
    bounded 2400 cargo test --locked
    phase "MySQL: contended rounds"
    contended=(watch_guarantees multi_instance reads lock_election)
    if [ "$outage" = 1 ]; then contended+=(outage); fi
    bash tests/contended.sh "$rounds" "${contended[@]}"
    unset ETCDSQL_TEST_BACKEND ETCDSQL_TEST_OUTAGE ETCDSQL_TEST_MYSQL
    phase "MySQL: conformance and Kubernetes suites"
    ETCDSQL_MYSQL="$mysql" bash conformance/run.sh etcdsql
    ETCDSQL_MYSQL="$mysql" bash conformance/kube-apiserver/run.sh mysql
    ETCDSQL_MYSQL="$mysql" bash conformance/k8s-storage/run.sh mysql
    ETCDSQL_MYSQL="$mysql" bash conformance/apiextensions/run.sh mysql
    drop_mysql_test_databases
elif [ "${ETCDSQL_REQUIRE_MYSQL:-0}" = 1 ]; then
    echo "MySQL is required (ETCDSQL_REQUIRE_MYSQL=1) but $mysql is unreachable" >&2
    exit 1
else
    echo "skipped: the MySQL tests (no server at $mysql; set ETCDSQL_TEST_MYSQL)"
fi
phase "all passed"
