#!/usr/bin/env bash
# Conformance harness: etcdctl-driven scenarios run against real etcd or etcdsql.
#
#   conformance/run.sh etcd     [SCENARIO...]   check against real etcd
#   conformance/run.sh etcdsql  [SCENARIO...]   check against etcdsql ($ETCDSQL_BIN)
#   conformance/run.sh --record [SCENARIO...]   re-record *.expected from real etcd
#
# Every scenario gets a fresh server on free 127.0.0.1 ports and a fresh data
# directory. Scenarios listed in conformance/pending-etcdsql (features etcdsql
# does not have yet) are skipped for the etcdsql target unless RUN_PENDING=1.
# A scenario's "# etcd-flags: ..." / "# etcdsql-flags: ..." lines add server flags; one marked
# "# etcd-version: 3.5" (features etcd 3.4 lacks) is recorded from, and checked against, etcd
# 3.5 ($ETCD35_BIN, by default the one conformance/k8s-storage/build.sh fetches from sid); one
# with "# etcdsql-not-on-postgres: REASON" is skipped, saying why, on PostgreSQL.
# See conformance/README.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
SCEN_DIR="$HERE/scenarios"
README="$HERE/README.md"
PENDING_FILE="$HERE/pending-etcdsql"

ETCD_BIN=${ETCD_BIN:-etcd}
ETCD35_BIN=${ETCD35_BIN:-} # resolved when a scenario first needs it
ETCDCTL_BIN=${ETCDCTL_BIN:-etcdctl}
ETCDSQL_BIN=${ETCDSQL_BIN:-$REPO/target/release/etcdsql}
READY_TIMEOUT=${READY_TIMEOUT:-30}       # seconds for a server to become healthy
SCENARIO_TIMEOUT=${SCENARIO_TIMEOUT:-90} # seconds per scenario script
STOP_TIMEOUT=${STOP_TIMEOUT:-10}         # seconds between SIGTERM and SIGKILL
RUN_PENDING=${RUN_PENDING:-0}            # 1: run pending-etcdsql scenarios against etcdsql too

usage() {
    echo "usage: $0 etcd|etcdsql [SCENARIO...]" >&2
    echo "       $0 --record [SCENARIO...]      (records from real etcd only)" >&2
    exit 2
}

RECORD=0
TARGET=""
# The database server each etcdsql scenario gets a fresh database on (none: a SQLite file).
DB_SERVER=${ETCDSQL_POSTGRES:-${ETCDSQL_MYSQL:-}}
case "${1:-}" in
--record)
    RECORD=1
    TARGET=etcd
    shift
    if [ "${1:-}" = etcd ]; then shift; fi
    if [ "${1:-}" = etcdsql ]; then
        echo "run.sh: expectations are only ever recorded from real etcd" >&2
        exit 2
    fi
    ;;
etcd | etcdsql)
    TARGET=$1
    shift
    ;;
*) usage ;;
esac

# Only loopback traffic: no proxies, no inherited etcd/etcdctl configuration.
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY grpc_proxy GRPC_PROXY
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost
while IFS= read -r v; do unset "$v"; done < <(compgen -e | grep -E '^(ETCD_|ETCDCTL_)' || true)
export ETCDCTL_API=3
case "$(uname -m)" in
x86_64 | amd64) ;;
*) export ETCD_UNSUPPORTED_ARCH="$(uname -m | sed 's/aarch64/arm64/')" ;;
esac

for tool in python3 timeout diff "$ETCDCTL_BIN"; do
    command -v "$tool" >/dev/null 2>&1 || { echo "run.sh: missing tool: $tool" >&2; exit 2; }
done
if [ "$TARGET" = etcd ]; then
    command -v "$ETCD_BIN" >/dev/null 2>&1 || { echo "run.sh: missing etcd binary ($ETCD_BIN); apt-get install etcd-server" >&2; exit 2; }
else
    [ -x "$ETCDSQL_BIN" ] || { echo "run.sh: etcdsql binary not found at $ETCDSQL_BIN (set ETCDSQL_BIN or cargo build --release)" >&2; exit 2; }
fi

# The servers' state goes to memory where the machine has a tmpfs: the scenarios test behaviour,
# not durability (the crash and full-disk tests do that on a real disk), and a shared disk that
# stalls fsync for seconds made the reference etcd time out whole scenarios in CI.
work_root=${TMPDIR:-/tmp}
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then
    work_root=/dev/shm
fi
WORK=$(mktemp -d "$work_root/etcdsql-conformance.XXXXXX")
SERVER_PID=""
SERVER_FLAGS=()

stop_server() {
    local pid=$SERVER_PID i
    [ -n "$pid" ] || return 0
    SERVER_PID=""
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < STOP_TIMEOUT * 20; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        if kill -0 "$pid" 2>/dev/null; then
            echo "    (server pid $pid ignored SIGTERM for ${STOP_TIMEOUT}s; sending SIGKILL)" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    stop_server
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# free_ports N: print N distinct currently-free TCP ports on 127.0.0.1.
free_ports() {
    python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
EOF
}

# scenario_flags FILE: sets SERVER_FLAGS to the extra server flags the scenario
# asks for on its "# etcd-flags: ..." / "# etcdsql-flags: ..." lines (the ones for
# $TARGET; split on whitespace, several lines add up).
scenario_flags() {
    local line words
    SERVER_FLAGS=()
    while IFS= read -r line; do
        read -ra words <<<"$line"
        SERVER_FLAGS+=("${words[@]}")
    done < <(sed -n "s/^# $TARGET-flags:[[:space:]]*//p" "$1")
}

# scenario_etcd FILE: sets SCENARIO_ETCD to the etcd the scenario is recorded from: etcd 3.5
# when it says "# etcd-version: 3.5", else $ETCD_BIN.
scenario_etcd() {
    SCENARIO_ETCD=$ETCD_BIN
    grep -q '^# etcd-version: 3\.5$' "$1" || return 0
    if [ -z "$ETCD35_BIN" ]; then
        local dir
        dir=$(bash "$HERE/k8s-storage/build.sh" | tail -n1) || return 1
        ETCD35_BIN=$dir/etcd
    fi
    SCENARIO_ETCD=$ETCD35_BIN
}

# start_server DIR: starts $TARGET with its state in DIR, plus SERVER_FLAGS;
# sets SERVER_PID, PORT.
start_server() {
    local dir=$1 ports pp
    if [ "$TARGET" = etcd ]; then
        ports=$(free_ports 2)
        PORT=${ports% *}
        pp=${ports#* }
        "$SCENARIO_ETCD" --name default \
            --data-dir "$dir/data" \
            --listen-client-urls "http://127.0.0.1:$PORT" \
            --advertise-client-urls "http://127.0.0.1:$PORT" \
            --listen-peer-urls "http://127.0.0.1:$pp" \
            --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
            --initial-cluster "default=http://127.0.0.1:$pp" \
            --initial-cluster-state new \
            ${SERVER_FLAGS[@]+"${SERVER_FLAGS[@]}"} \
            >"$dir/server.log" 2>&1 </dev/null &
        SERVER_PID=$!
    else
        PORT=$(free_ports 1)
        # With ETCDSQL_POSTGRES or ETCDSQL_MYSQL (a server URL such as
        # postgres://postgres@127.0.0.1:5432) each scenario gets a fresh database on that server,
        # which etcdsql creates.
        local endpoint="sqlite://$dir/state.db"
        if [ -n "$DB_SERVER" ]; then
            endpoint="$DB_SERVER/etcdsql_conf_$$_$(basename "$dir")"
        fi
        "$ETCDSQL_BIN" \
            --listen-client-urls "http://127.0.0.1:$PORT" \
            --advertise-client-urls "http://127.0.0.1:$PORT" \
            --endpoint "$endpoint" \
            ${SERVER_FLAGS[@]+"${SERVER_FLAGS[@]}"} \
            >"$dir/server.log" 2>&1 </dev/null &
        SERVER_PID=$!
    fi
}

# wait_ready: poll `etcdctl endpoint health` until it succeeds (bounded).
wait_ready() {
    local deadline=$((SECONDS + READY_TIMEOUT))
    while ((SECONDS < deadline)); do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "    server exited before becoming healthy" >&2
            return 1
        fi
        if timeout -k 1 5 "$ETCDCTL_BIN" --endpoints="http://127.0.0.1:$PORT" \
            --dial-timeout=1s --command-timeout=2s endpoint health >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.1
    done
    echo "    server not healthy after ${READY_TIMEOUT}s" >&2
    return 1
}

# Scenario selection.
SCENARIOS=()
if [ $# -gt 0 ]; then
    for s in "$@"; do
        s=${s%.sh}
        s=${s##*/}
        [ -f "$SCEN_DIR/$s.sh" ] || { echo "run.sh: no such scenario: $s" >&2; exit 2; }
        SCENARIOS+=("$s")
    done
else
    while IFS= read -r f; do
        s=${f##*/}
        SCENARIOS+=("${s%.sh}")
    done < <(find "$SCEN_DIR" -maxdepth 1 -name '*.sh' | LC_ALL=C sort)
fi
[ ${#SCENARIOS[@]} -gt 0 ] || { echo "run.sh: no scenarios found in $SCEN_DIR" >&2; exit 2; }

# Pending scenarios (etcdsql only): "SCENARIO  reason" per line; blank lines and
# lines starting with '#' are ignored. Validated on every run, whatever the target,
# so that a stale entry (renamed scenario, missing issue reference) is noticed.
declare -A PENDING=()
if [ -f "$PENDING_FILE" ]; then
    lineno=0
    while IFS= read -r line || [ -n "$line" ]; do
        lineno=$((lineno + 1))
        line=${line#"${line%%[![:space:]]*}"}
        line=${line%"${line##*[![:space:]]}"}
        case "$line" in "" | "#"*) continue ;; esac
        pname=${line%%[[:space:]]*}
        preason=${line#"$pname"}
        preason=${preason#"${preason%%[![:space:]]*}"}
        where="${PENDING_FILE##*/}:$lineno"
        [ -f "$SCEN_DIR/$pname.sh" ] || { echo "run.sh: $where: no such scenario: $pname" >&2; exit 2; }
        [[ "$preason" =~ \#[0-9]+ ]] || { echo "run.sh: $where: reason for $pname must name its issue (#N)" >&2; exit 2; }
        [ -z "${PENDING[$pname]+x}" ] || { echo "run.sh: $where: $pname is listed twice" >&2; exit 2; }
        PENDING[$pname]=$preason
    done <"$PENDING_FILE"
fi

if [ "$RECORD" = 1 ]; then
    echo "recording expectations from $("$ETCD_BIN" --version | head -n1), $("$ETCDCTL_BIN" version | head -n1)"
else
    echo "target: $TARGET${ETCDSQL_POSTGRES:+ on PostgreSQL}${ETCDSQL_MYSQL:+ on MySQL}"
fi

PASSED=0
FAILED=0
SKIPPED=0
FAILED_NAMES=()
START_ALL=$SECONDS

fail() {
    FAILED=$((FAILED + 1))
    FAILED_NAMES+=("$1")
    echo "FAIL $1${2:+: $2}"
}

for name in "${SCENARIOS[@]}"; do
    pending=0
    if [ "$TARGET" = etcdsql ] && [ "$RECORD" = 0 ] && [ -n "${PENDING[$name]+x}" ]; then
        if [ "$RUN_PENDING" != 1 ]; then
            SKIPPED=$((SKIPPED + 1))
            echo "SKIP $name: ${PENDING[$name]}"
            continue
        fi
        pending=1
    fi
    not_on_postgres=$(sed -n 's/^# etcdsql-not-on-postgres:[[:space:]]*//p' "$SCEN_DIR/$name.sh")
    if [ "$TARGET" = etcdsql ] && [ -n "${ETCDSQL_POSTGRES:-}" ] && [ -n "$not_on_postgres" ]; then
        SKIPPED=$((SKIPPED + 1))
        echo "SKIP $name: on PostgreSQL: $not_on_postgres"
        continue
    fi
    sdir="$WORK/$name"
    mkdir -p "$sdir/tmp"
    t0=$SECONDS
    scenario_flags "$SCEN_DIR/$name.sh"
    if [ "$TARGET" = etcd ] && ! scenario_etcd "$SCEN_DIR/$name.sh"; then
        fail "$name" "no etcd 3.5 (conformance/k8s-storage/build.sh failed)"
        continue
    fi
    start_server "$sdir"
    if ! wait_ready; then
        stop_server
        fail "$name" "server did not start; last log lines:"
        tail -n 20 "$sdir/server.log" | sed 's/^/    | /'
        continue
    fi
    rc=0
    (
        cd "$sdir/tmp"
        export ETCDCTL="$ETCDCTL_BIN --endpoints=http://127.0.0.1:$PORT"
        export ENDPOINT="http://127.0.0.1:$PORT"
        export SCENARIO_TMP="$sdir/tmp"
        exec timeout -k 5 "$SCENARIO_TIMEOUT" bash --noprofile --norc -c \
            'source "$1"; source "$2"' _ "$HERE/lib.sh" "$SCEN_DIR/$name.sh"
    ) >"$sdir/raw.out" 2>&1 </dev/null || rc=$?
    if [ "$rc" != 0 ]; then
        echo "# harness: scenario script exited with status $rc" >>"$sdir/raw.out"
    fi
    server_alive=1
    kill -0 "$SERVER_PID" 2>/dev/null || server_alive=0
    stop_server
    if [ "$server_alive" = 0 ]; then
        echo "# harness: server died during the scenario" >>"$sdir/raw.out"
    fi
    python3 "$HERE/normalize.py" <"$sdir/raw.out" >"$sdir/actual.out"
    dt=$((SECONDS - t0))

    if [ "$RECORD" = 1 ]; then
        cp "$sdir/actual.out" "$SCEN_DIR/$name.expected"
        PASSED=$((PASSED + 1))
        echo "RECORDED $name (${dt}s)"
        if [ -f "$SCEN_DIR/$name.etcdsql.expected" ]; then
            echo "    note: $name.etcdsql.expected is not re-recorded; check it still equals $name.expected apart from the documented difference"
        fi
        continue
    fi

    expected="$SCEN_DIR/$name.expected"
    if [ "$TARGET" = etcdsql ] && [ -f "$SCEN_DIR/$name.etcdsql.expected" ]; then
        expected="$SCEN_DIR/$name.etcdsql.expected"
        if ! sed -n '/^## Known differences/,$p' "$README" | grep -qF "$name.etcdsql.expected"; then
            fail "$name" "$name.etcdsql.expected is not listed under 'Known differences' in conformance/README.md"
            continue
        fi
    fi
    if [ ! -f "$expected" ]; then
        fail "$name" "missing $expected (run: conformance/run.sh --record $name)"
        continue
    fi
    if diff -u --label "expected/${expected##*/}" --label "actual/$name ($TARGET)" \
        "$expected" "$sdir/actual.out" >"$sdir/diff.out"; then
        PASSED=$((PASSED + 1))
        echo "PASS $name (${dt}s)"
        if [ "$pending" = 1 ]; then
            echo "    note: $name passes but is listed in ${PENDING_FILE##*/}; remove it from there"
        fi
    else
        fail "$name" "(${dt}s)"
        sed 's/^/    /' "$sdir/diff.out"
        if [ "$TARGET" = etcdsql ]; then
            echo "    --- last server log lines:"
            tail -n 10 "$sdir/server.log" | sed 's/^/    | /'
        fi
    fi
done

echo "elapsed: $((SECONDS - START_ALL))s"
if [ "$FAILED" -gt 0 ]; then
    echo "failed scenarios: ${FAILED_NAMES[*]}"
fi
echo "conformance: $PASSED passed, $FAILED failed, $SKIPPED skipped"
[ "$FAILED" -eq 0 ]
