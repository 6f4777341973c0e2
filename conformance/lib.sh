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
# N=0 waits for the watch to exit on its own: a canceled watch prints its
# lines before it exits, so counting lines would race with the exit.
watch_lines() {
    local n=$1 t=$2 out pid i rc
    shift 2
    out=$(mktemp "$SCENARIO_TMP/watch.XXXXXX")
    # shellcheck disable=SC2086
    $ETCDCTL watch "$@" >"$out" 2>&1 &
    pid=$!
    for ((i = 0; i < t * 20; i++)); do
        if [ "$n" -gt 0 ] && [ "$(wc -l <"$out")" -ge "$n" ]; then break; fi
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

# ---------------------------------------------------------------------------
# Live watches. A live watch is made deterministic by starting it at the next
# revision (--rev=NEXT; a fresh store is at revision 1): an event written before
# etcdctl got connected is then replayed, one written later arrives live, and
# the output is the same either way. Waiting for the first event before writing
# the others makes sure those others take the live path. Never sleep to
# synchronise: wait_lines / wait_for poll, bounded by WAIT_TIMEOUT seconds.
#
#   watch_bg NAME ETCDCTL_WATCH_ARGS...   start `etcdctl watch ARGS` in the background
#   watch_i NAME [ETCDCTL_WATCH_ARGS...]  start `etcdctl watch -i ARGS` (interactive),
#                                         reading its commands from a FIFO
#   send NAME LINE...                     write command lines to an interactive watch
#   wait_lines NAME N                     wait until NAME's output has >= N lines
#   wait_for NAME LINE [COUNT]            wait until COUNT (1) lines of NAME's output equal LINE
#   bg_stop NAME                          stop NAME, print its output and how it ended
#   close_stdin NAME                      close an interactive watch's stdin (EOF), let it
#                                         exit by itself, print its output and exit code
#
# Output (stdout and stderr) goes to $SCENARIO_TMP/NAME.out; nothing is printed
# before bg_stop / close_stdin, except "wait: ..." when a wait gave up. Whatever
# is still running when the scenario ends is stopped.
WAIT_TIMEOUT=${WAIT_TIMEOUT:-10}
declare -A _BG_PID=()  # NAME -> pid of its etcdctl
declare -A _BG_FD=()   # NAME -> fd of its stdin FIFO (interactive watches only)

# _close_bg_fds: in a child, close the FIFO write ends this shell holds, so
# that an interactive watch sees EOF when its own stdin is closed.
_close_bg_fds() {
    local fd
    for fd in "${_BG_FD[@]}"; do
        eval "exec $fd>&-"
    done
}

watch_bg() {
    local name=$1
    shift
    : >"$SCENARIO_TMP/$name.out"   # exists before the first poll
    # shellcheck disable=SC2086
    (_close_bg_fds; exec $ETCDCTL watch "$@" >"$SCENARIO_TMP/$name.out" 2>&1 </dev/null) &
    _BG_PID[$name]=$!
}

watch_i() {
    local name=$1 fifo="$SCENARIO_TMP/$1.in" fd
    shift
    rm -f "$fifo"
    mkfifo "$fifo"
    : >"$SCENARIO_TMP/$name.out"
    # shellcheck disable=SC2086
    (_close_bg_fds; exec $ETCDCTL watch -i "$@" <"$fifo" >"$SCENARIO_TMP/$name.out" 2>&1) &
    _BG_PID[$name]=$!
    # Read-write open: never blocks, and etcdctl sees EOF once this fd is closed.
    exec {fd}<>"$fifo"
    _BG_FD[$name]=$fd
}

send() {
    local name=$1
    shift
    printf '%s\n' "$@" >&"${_BG_FD[$name]}"
}

# _wait NAME DESCRIPTION TEST...: poll TEST until it succeeds, NAME exits or
# WAIT_TIMEOUT passes; says so when it gives up.
_wait() {
    local name=$1 what=$2 i
    shift 2
    for ((i = 0; i < WAIT_TIMEOUT * 20; i++)); do
        if "$@"; then return 0; fi
        kill -0 "${_BG_PID[$name]}" 2>/dev/null || break
        sleep 0.05
    done
    if "$@"; then return 0; fi
    echo "wait: $name: gave up waiting for $what"
    return 1
}

_has_lines() {
    [ "$(wc -l <"$SCENARIO_TMP/$1.out")" -ge "$2" ]
}

_has_line() {
    [ "$(grep -cxF -e "$2" "$SCENARIO_TMP/$1.out")" -ge "$3" ]
}

wait_lines() {
    _wait "$1" "$2 lines" _has_lines "$1" "$2"
}

wait_for() {
    _wait "$1" "${3:-1} x '$2'" _has_line "$1" "$2" "${3:-1}"
}

bg_stop() {
    local name=$1 pid=${_BG_PID[$1]} rc
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        cat "$SCENARIO_TMP/$name.out"
        echo "watch: still running (stopped by harness)"
    else
        wait "$pid"
        rc=$?
        cat "$SCENARIO_TMP/$name.out"
        echo "watch: exited by itself, exit=$rc"
    fi
    _bg_forget "$name"
}

close_stdin() {
    local name=$1 pid=${_BG_PID[$1]} i
    eval "exec ${_BG_FD[$name]}>&-"
    unset "_BG_FD[$name]"
    for ((i = 0; i < WAIT_TIMEOUT * 20; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    bg_stop "$name"
}

_bg_forget() {
    local fd=${_BG_FD[$1]:-}
    if [ -n "$fd" ]; then
        eval "exec $fd>&-"
        unset "_BG_FD[$1]"
    fi
    unset "_BG_PID[$1]"
}

_bg_cleanup() {
    local name
    for name in "${!_BG_PID[@]}"; do
        kill -TERM "${_BG_PID[$name]}" 2>/dev/null
        wait "${_BG_PID[$name]}" 2>/dev/null
        echo "# harness: $name was still running at the end of the scenario"
        _bg_forget "$name"
    done
}
trap _bg_cleanup EXIT
