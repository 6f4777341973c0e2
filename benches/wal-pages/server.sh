#!/bin/bash
# Stands in for the etcdsql binary in `benches/vs_etcd` (`--etcdsql-bin`) to count which of
# SQLite's B-trees a workload's commits write. Once the server has created its database, a read
# transaction held by another connection pins the WAL: checkpoints cannot reset it, so every
# frame the workload commits stays in it. When the harness stops the server (SIGTERM), the
# database and its WAL are copied to $WAL_PAGES_OUT and the server is killed with SIGKILL, so
# that closing does not checkpoint the WAL away. Then: `python3 count.py $WAL_PAGES_OUT`.
set -u
out=${WAL_PAGES_OUT:?set WAL_PAGES_OUT to a folder for the copies}
bin=${WAL_PAGES_ETCDSQL:-$(dirname "$0")/../../target/release/etcdsql}
db=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    [[ ${args[i]} == --endpoint ]] && db=${args[i + 1]#sqlite://}
done
[[ -n $db ]] || { echo "server.sh: no --endpoint sqlite://PATH among the arguments" >&2; exit 2; }
mkdir -p "$out"
"$bin" "$@" &
server=$!
python3 - "$db" <<'PY' &
import sqlite3, sys, time
deadline = time.time() + 60
while True:
    try:
        c = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True, isolation_level=None)
        c.execute("BEGIN")
        c.execute("SELECT value FROM meta WHERE name = 'current_revision'").fetchall()
        break
    except sqlite3.Error:
        if time.time() > deadline:
            sys.exit("server.sh: the database never got its meta table")
        time.sleep(0.05)
time.sleep(24 * 3600)
PY
pin=$!
trap 'kill -STOP $server; cp "$db" "$out/db"; cp "$db-wal" "$out/db-wal"; kill -9 $server $pin; exit 0' TERM
wait $server
