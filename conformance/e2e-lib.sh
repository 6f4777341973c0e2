# The harness shared by the API-server end-to-end scenarios (kube-apiserver/run.sh, the 1.20
# release, and apiextensions/run.sh, 1.36): reporting, the store under test and its clean-up.
# Sourced by a script running with `set -euo pipefail`.
#
# The script sets before sourcing:
#   E2E_NAME     the scenario's name in its last line ("NAME: N passed, M failed")
#   BACKEND      sqlite, postgres, mysql or etcd; or etcd-to-sqlite: etcd until the store's
#                first restart, which moves the data into etcdsql (`import --from-etcd
#                --with-history`) and starts etcdsql on SQLite in etcd's place
#   WORK         its temporary folder (kept when anything failed)
#   ETCDSQL_BIN, ETCD_BIN, ETCDCTL_BIN, PG_SERVER (a PostgreSQL server URL, for postgres),
#   MY_SERVER (a MySQL server URL, for mysql; conformance/mysql.sh sourced)
#   PG_PREFIX    the prefix of its databases (one per run: PREFIX<pid>)
# and gets:
#   STORE_URL, API_URL (https, on API_PORT), ETCDCTL (an array), start_store, stop_store, the
#   API server's log in API_LOG, API_PID and BG_PIDS for what it starts (stopped on exit),
#   step/ok/bad/die/expect_*, watch_expect.

STORE_LOG=$WORK/store.log
API_LOG=$WORK/apiserver.log
STORE_PID=""
API_PID=""
BG_PIDS=() # client watches
PG_DB=""
PASSED=0
FAILED=0
FAILED_CHECKS=()
T0=$SECONDS

# ---------------------------------------------------------------------------------------------
# Reporting

step() { echo "== $* (t=$((SECONDS - T0))s)"; }
ok() {
    PASSED=$((PASSED + 1))
    echo "   ok   $*"
}
bad() {
    FAILED=$((FAILED + 1))
    FAILED_CHECKS+=("$1")
    echo "   FAIL $*"
}
# die MESSAGE: a failure the scenario cannot go on from.
die() {
    bad "$*"
    exit 1
}
# expect_eq DESCRIPTION WANT GOT
expect_eq() {
    if [ "$2" = "$3" ]; then
        ok "$1"
    else
        bad "$1"
        diff <(printf '%s\n' "$2") <(printf '%s\n' "$3") | sed -n 's/^</       want:/p; s/^>/       got: /p' | head -n 20 || true
    fi
}
# expect_match DESCRIPTION ERE TEXT
expect_match() {
    if grep -Eq -- "$2" <<<"$3"; then
        ok "$1"
    else
        bad "$1"
        echo "       want a match for: $2"
        printf '%s\n' "$3" | head -n 10 | sed 's/^/       got: /' || true
    fi
}

# json EXPR: evaluates the Python expression EXPR over the JSON document `d` on stdin.
json() { python3 -c 'import json, sys; d = json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"; }

stop_pid() { # stop_pid PID SECONDS [quiet]: SIGTERM, then SIGKILL after SECONDS
    local pid=$1 i
    [ -n "$pid" ] || return 0
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < $2 * 10; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            [ "${3:-}" = quiet ] || echo "   (pid $pid still running $2 s after SIGTERM: SIGKILL)"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    wait "$pid" 2>/dev/null || true
}

e2e_cleanup() {
    local rc=$? pid
    trap - EXIT
    for pid in ${BG_PIDS[@]+"${BG_PIDS[@]}"}; do stop_pid "$pid" 5 quiet; done
    # The API server's shutdown is not under test (kube-apiserver 1.20 keeps trying to remove
    # itself from the `kubernetes` Endpoints through its own closed port for 20 s or more).
    stop_pid "$API_PID" 5 quiet
    stop_pid "$STORE_PID" 20
    if [ -n "$PG_DB" ] && [ "$BACKEND" = postgres ]; then
        psql "$PG_SERVER/postgres" -qc "DROP DATABASE IF EXISTS \"$PG_DB\" WITH (FORCE)" >/dev/null 2>&1 ||
            echo "$E2E_NAME: could not drop database $PG_DB" >&2
    fi
    if [ -n "$PG_DB" ] && [ "$BACKEND" = mysql ]; then
        mysql_exec "$MY_SERVER" "DROP DATABASE IF EXISTS \`$PG_DB\`" >/dev/null 2>&1 ||
            echo "$E2E_NAME: could not drop database $PG_DB" >&2
    fi
    if [ "$FAILED" -gt 0 ] || [ "$rc" != 0 ]; then
        [ "$FAILED" -gt 0 ] || bad "the scenario exited with status $rc"
        for f in "$API_LOG" "$STORE_LOG"; do
            [ -f "$f" ] || continue
            echo "--- last lines of ${f##*/}:"
            tail -n 40 "$f" | cut -c1-400 | sed 's/^/   | /'
        done
        echo "failed checks:"
        printf '   %s\n' "${FAILED_CHECKS[@]}"
        echo "logs kept in $WORK"
    elif [ "${KEEP_WORK:-0}" = 1 ]; then
        echo "logs kept in $WORK"
    else
        rm -rf "$WORK"
    fi
    echo "elapsed: $((SECONDS - T0))s"
    echo "$E2E_NAME: $PASSED passed, $FAILED failed"
    [ "$FAILED" -eq 0 ] && [ "$rc" = 0 ] || exit 1
}
trap e2e_cleanup EXIT
trap 'exit 130' INT TERM
trap 'echo "$E2E_NAME: line $LINENO: a command failed (status $?)" >&2' ERR

# ---------------------------------------------------------------------------------------------
# The store

free_ports() { # free_ports N: N distinct free TCP ports on 127.0.0.1
    python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}
read -r STORE_PORT PEER_PORT API_PORT <<<"$(free_ports 3)"
STORE_URL=http://127.0.0.1:$STORE_PORT
API_URL=https://127.0.0.1:$API_PORT
ETCDCTL=("$ETCDCTL_BIN" --endpoints="$STORE_URL" --dial-timeout=2s --command-timeout=10s)

SWITCH_TO=""
if [ "$BACKEND" = etcd-to-sqlite ]; then
    BACKEND=etcd
    SWITCH_TO=sqlite
    ENDPOINT="sqlite://$WORK/db/state.db"
fi
case "$BACKEND" in
sqlite) ENDPOINT="sqlite://$WORK/db/state.db" ;;
postgres)
    # Databases left by runs that were killed (their pid is gone).
    psql "$PG_SERVER/postgres" -Atqc "SELECT datname FROM pg_database WHERE datname LIKE '${PG_PREFIX//_/\\_}%'" |
        while read -r db; do
            kill -0 "${db##*_}" 2>/dev/null ||
                psql "$PG_SERVER/postgres" -qc "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null
        done
    PG_DB=$PG_PREFIX$$
    ENDPOINT="$PG_SERVER/$PG_DB"
    ;;
mysql)
    # Databases left by runs that were killed (their pid is gone).
    mysql_exec "$MY_SERVER" "SELECT schema_name FROM information_schema.schemata \
        WHERE schema_name LIKE '${PG_PREFIX//_/\\_}%'" |
        while read -r db; do
            kill -0 "${db##*_}" 2>/dev/null || mysql_exec "$MY_SERVER" "DROP DATABASE IF EXISTS \`$db\`"
        done
    PG_DB=$PG_PREFIX$$
    ENDPOINT="$MY_SERVER/$PG_DB"
    ;;
esac

# start_store: etcdsql (or etcd) on STORE_PORT; the same data on every start.
start_store() {
    echo "--- start $(date +%T)" >>"$STORE_LOG"
    if [ -n "$SWITCH_TO" ] && [ -d "$WORK/etcd-data" ]; then
        switch_store
    fi
    if [ "$BACKEND" = etcd ]; then
        start_etcd "$STORE_URL"
    else
        "$ETCDSQL_BIN" --endpoint "$ENDPOINT" --listen-client-urls "$STORE_URL" \
            >>"$STORE_LOG" 2>&1 </dev/null &
    fi
    STORE_PID=$!
    local deadline=$((SECONDS + 30))
    until "${ETCDCTL[@]}" endpoint health >/dev/null 2>&1; do
        kill -0 "$STORE_PID" 2>/dev/null || die "the store exited while starting"
        ((SECONDS < deadline)) || die "the store was not healthy within 30 s"
        sleep 0.2
    done
}
stop_store() {
    stop_pid "$STORE_PID" 20
    STORE_PID=""
}
# start_etcd URL: etcd in the background on its data folder, serving clients at URL.
start_etcd() {
    "$ETCD_BIN" --name default --data-dir "$WORK/etcd-data" \
        --listen-client-urls "$1" --advertise-client-urls "$1" \
        --listen-peer-urls "http://127.0.0.1:$PEER_PORT" \
        --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" \
        --initial-cluster "default=http://127.0.0.1:$PEER_PORT" \
        >>"$STORE_LOG" 2>&1 </dev/null &
}
# switch_store: while the store is down, copies etcd's data into etcdsql and makes etcdsql the
# store from now on. etcd runs on a spare port meanwhile, where the API server cannot write.
switch_store() {
    local port url pid status
    read -r port <<<"$(free_ports 1)"
    url=http://127.0.0.1:$port
    start_etcd "$url"
    pid=$!
    local deadline=$((SECONDS + 30))
    until "$ETCDCTL_BIN" --endpoints="$url" --dial-timeout=1s endpoint health >/dev/null 2>&1; do
        kill -0 "$pid" 2>/dev/null || die "etcd exited while starting for the import"
        ((SECONDS < deadline)) || die "etcd was not healthy for the import within 30 s"
        sleep 0.2
    done
    status=0
    timeout 120 "$ETCDSQL_BIN" --endpoint "$ENDPOINT" import --from-etcd "$url" --with-history \
        >"$WORK/import.log" 2>&1 || status=$?
    cat "$WORK/import.log" >>"$STORE_LOG"
    stop_pid "$pid" 20
    ((status == 0)) || die "import --from-etcd failed (status $status): $(tail -n3 "$WORK/import.log")"
    ok "etcd's data moved into etcdsql on $SWITCH_TO: $(grep -o 'Imported [0-9]* rows' "$WORK/import.log")"
    BACKEND=$SWITCH_TO
    SWITCH_TO=""
}

store_revision() { "${ETCDCTL[@]}" endpoint status -w json | json 'd[0]["Status"]["header"]["revision"]'; }
# etcd_keys PREFIX: "key mod_revision version lease" per key under PREFIX, straight from the store.
etcd_keys() {
    "${ETCDCTL[@]}" get "$1" --prefix -w json | json '"\n".join(
        "%s %s %s %s" % (__import__("base64").b64decode(kv["key"]).decode(), kv["mod_revision"],
                         kv["version"], kv.get("lease", 0)) for kv in d.get("kvs", []))'
}
# wait_compacted SECONDS: waits until the API server's compactor has compacted (it records the
# current revision on its first tick and compacts to it on the second, then every interval)
# and sets COMPACTED to the revision compact_rev_key holds.
wait_compacted() {
    local deadline=$((SECONDS + $1))
    COMPACTED=0
    while ((SECONDS < deadline)); do
        COMPACTED=$("${ETCDCTL[@]}" get compact_rev_key --print-value-only 2>/dev/null || true)
        [ -n "$COMPACTED" ] && [ "$COMPACTED" != 0 ] && return 0
        sleep 1
    done
    return 1
}

# restart_store PROBE PROBE_NAME: restarts the store under the running API server and checks
# that nothing changed. PROBE is a command that succeeds while the server sees its store (its
# /readyz, say), PROBE_NAME its name in the checks; the script defines e2e_objects (objects with
# their resourceVersion, through the server) and e2e_keys (their keys, straight from the store)
# and sets COMPACTED. Sets RESTART_FROM to the line of the server's log where the store stopped.
restart_store() {
    local probe=$1 name=$2 before_objects before_keys before_rev after_rev down_at deadline
    before_objects=$(e2e_objects)
    before_keys=$(e2e_keys)
    before_rev=$(store_revision)
    if (($(wc -l <<<"$before_objects") > BULK && $(wc -l <<<"$before_keys") > BULK)); then
        ok "snapshot before the restart: $(wc -l <<<"$before_objects") objects, $(wc -l <<<"$before_keys") keys"
    else
        bad "snapshot before the restart has too few objects or keys"
    fi
    RESTART_FROM=$(wc -l <"$API_LOG")
    stop_store
    down_at=$SECONDS
    while "$probe" && ((SECONDS < down_at + 30)); do sleep 0.5; done
    if "$probe"; then bad "$name still ok 30 s after the store stopped"; else ok "$name fails while the store is down"; fi
    start_store
    deadline=$((SECONDS + 90))
    until "$probe"; do
        kill -0 "$API_PID" 2>/dev/null || die "the API server exited while the store was restarting"
        ((SECONDS < deadline)) || die "$name not ok within 90 s of the store's restart"
        sleep 0.5
    done
    ok "$name ok again $((SECONDS - down_at)) s after the store stopped"
    after_rev=$(store_revision)
    if ((after_rev >= before_rev)); then
        ok "revision kept across the restart ($before_rev -> $after_rev)"
    else
        bad "revision went back across the restart ($before_rev -> $after_rev)"
    fi
    expect_match "the compact revision is kept" "required revision has been compacted" \
        "$("${ETCDCTL[@]}" get compact_rev_key --rev=$((COMPACTED - 1)) 2>&1)"
    expect_eq "no object lost or changed (through the API server)" "$before_objects" "$(e2e_objects)"
    expect_eq "no key lost or changed (etcdctl)" "$before_keys" "$(e2e_keys)"
}

# ---------------------------------------------------------------------------------------------
# Client watches: a background process writes one "TYPE NAME" line per event to $WORK/watch.NAME
# and its pid is in WATCH_PID_NAME.

# watch_expect NAME DESCRIPTION LINE...: waits (20 s at most) until the watch printed as many
# lines as given, then checks that it printed exactly those, in that order.
watch_expect() {
    local name=$1 desc=$2 pidvar="WATCH_PID_$1" deadline=$((SECONDS + 20))
    shift 2
    local want
    want=$(printf '%s\n' "$@")
    while (($(wc -l <"$WORK/watch.$name") < $#)) && ((SECONDS < deadline)); do
        kill -0 "${!pidvar}" 2>/dev/null || break
        sleep 0.2
    done
    expect_eq "$desc" "$want" "$(cat "$WORK/watch.$name")"
    if ! kill -0 "${!pidvar}" 2>/dev/null; then
        bad "watch $name is no longer running"
        sed 's/^/       stderr: /' "$WORK/watch.$name.err" | head -n 5 || true
    fi
}
