# Helpers available to every scenario (sourced by run.sh before the scenario).
# Scenarios run under plain bash without `set -e`: a failing etcdctl call is
# expected output, not a harness error.
#
# Environment provided by run.sh:
#   ETCDCTL      "etcdctl --endpoints=http://127.0.0.1:$PORT"   (ETCDCTL_API=3)
#   ENDPOINT     "http://127.0.0.1:$PORT"
#   SCENARIO_TMP a scratch directory for this scenario

# x CMD...   run CMD with stderr folded into stdout, then print its exit code.
x() {
    "$@" 2>&1
    echo "exit=$?"
}

# e ARGS...  shorthand for `x $ETCDCTL ARGS...`.
e() {
    # shellcheck disable=SC2086
    x $ETCDCTL "$@"
}

# txn [ETCDCTL TXN FLAGS...] <<'EOF' ... EOF
# Feeds stdin to `etcdctl txn` (non-interactive: compares, blank line,
# success ops, blank line, failure ops, blank line) and prints the exit code.
txn() {
    # shellcheck disable=SC2086
    $ETCDCTL txn "$@" 2>&1
    echo "exit=$?"
}

# section TITLE  prints a marker so diffs are easy to locate.
section() {
    echo "=== $*"
}

# watch_lines N TIMEOUT_S ETCDCTL_WATCH_ARGS...
# Runs `etcdctl watch ARGS` in the background until its output has at least N
# lines (or it exits on its own, or TIMEOUT_S seconds pass), then stops it and
# prints the output. Use only with a start revision so that
# every expected event is replayed from history (no timing dependence).
watch_lines() {
    local n=$1 t=$2 out pid i rc
    shift 2
    out=$(mktemp "$SCENARIO_TMP/watch.XXXXXX")
    # shellcheck disable=SC2086
    $ETCDCTL watch "$@" >"$out" 2>&1 &
    pid=$!
    for ((i = 0; i < t * 20; i++)); do
        if [ "$(wc -l <"$out")" -ge "$n" ]; then break; fi
        if ! kill -0 "$pid" 2>/dev/null; then break; fi
        sleep 0.05
    done
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        cat "$out"
        echo "watch: still running (stopped by harness)"
    else
        wait "$pid"
        rc=$?
        cat "$out"
        echo "watch: exited by itself, exit=$rc"
    fi
}
