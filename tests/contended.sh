#!/usr/bin/env bash
# Runs concurrency tests round after round while a CPU hog keeps one of the machine's cores
# busy: races that a quiet machine hides (a task preempted between two steps) show up here.
# Every round must pass. Bounded: a fixed number of rounds, each under a time limit.
#
#   tests/contended.sh ROUNDS TEST [TEST...]
#
# TESTs are integration test targets (tests/NAME.rs). The backend and its settings come from
# the environment, as for `cargo test` (ETCDSQL_TEST_BACKEND, ETCDSQL_TEST_POSTGRES, ...).
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=$1
shift
# Far above a contended round's few seconds to a minute, far below CI's limit.
round_limit=${ETCDSQL_ROUND_LIMIT:-240}
backend=${ETCDSQL_TEST_BACKEND:-sqlite}

# Built once, before the clock starts; the rounds then only run them.
cargo test --locked --no-run "${@/#/--test=}" >/dev/null 2>&1 ||
    cargo test --locked --no-run "${@/#/--test=}"

log=$(mktemp)
yes >/dev/null &
hog=$!
trap 'kill "$hog" 2>/dev/null || true; rm -f "$log"' EXIT
for test in "$@"; do
    started=$SECONDS
    for round in $(seq 1 "$rounds"); do
        status=0
        timeout -k 10 "$round_limit" cargo test --locked -q --test "$test" >"$log" 2>&1 ||
            status=$?
        if [ "$status" -ne 0 ]; then
            cat "$log"
            # timeout's own codes: the limit passed (124), or the round then had to be killed (137).
            if [ "$status" = 124 ] || [ "$status" = 137 ]; then
                echo "contended $test on $backend: round $round of $rounds did not finish" \
                    "within $round_limit s" >&2
            else
                echo "contended $test on $backend: round $round of $rounds failed" >&2
            fi
            exit 1
        fi
    done
    echo "contended $test on $backend: all $rounds rounds passed in $((SECONDS - started)) s"
done
