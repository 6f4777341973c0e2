# `etcdctl lock` and `etcdctl elect`: etcdctl runs etcd's lock and election recipes itself,
# over leases, txns and watches, so this checks that those behave as etcd's do under them: a
# second locker waits until the first lets go, a second candidate until the leader resigns.
# Keys hold lease ids, so only their names before the "/" are printed.
# bg NAME CMD...: runs CMD in the background with its output in NAME's file (for wait_for).
bg() {
    local name=$1
    shift
    : >"$SCENARIO_TMP/$name.out"
    (_close_bg_fds; exec "$@" >"$SCENARIO_TMP/$name.out" 2>&1 </dev/null) &
    _BG_PID[$name]=$!
}
# holders PREFIX: how many keys are under PREFIX.
holders() {
    $ETCDCTL get "$1" --prefix --keys-only | grep -c .
}
section 'lock: a command runs while the lock is held'
# shellcheck disable=SC2016
x $ETCDCTL lock job -- sh -c 'echo "running with ${ETCD_LOCK_KEY%%/*}"'
holders job/
section 'lock: the second locker waits for the first'
# shellcheck disable=SC2086
bg first $ETCDCTL lock job
for ((i = 0; i < 200 && $(grep -c . "$SCENARIO_TMP/first.out") < 1; i++)); do sleep 0.05; done
echo "first holds: $(sed -n '1s|/.*||p' "$SCENARIO_TMP/first.out")"
# shellcheck disable=SC2086
bg second $ETCDCTL lock job -- echo second ran
for ((i = 0; i < 200 && $(holders job/) < 2; i++)); do sleep 0.05; done
echo "holders while both wait: $(holders job/)"
echo "second's output meanwhile: $(grep -c . "$SCENARIO_TMP/second.out") lines"
kill -INT "${_BG_PID[first]}"
wait_for second "second ran"
cat "$SCENARIO_TMP/second.out"
bg_stop first >/dev/null
bg_stop second >/dev/null
echo "holders after both: $(holders job/)"
section 'elect: the leader proclaims, a second candidate waits'
# shellcheck disable=SC2086
bg observer $ETCDCTL elect -l vote
# shellcheck disable=SC2086
bg leader $ETCDCTL elect vote alice
for ((i = 0; i < 200 && $(grep -c . "$SCENARIO_TMP/leader.out") < 2; i++)); do sleep 0.05; done
sed 's|/.*||' "$SCENARIO_TMP/leader.out"
# shellcheck disable=SC2086
bg candidate $ETCDCTL elect vote bob
for ((i = 0; i < 200 && $(holders vote/) < 2; i++)); do sleep 0.05; done
echo "candidates: $(holders vote/)"
echo "bob's output before alice resigns: $(grep -c . "$SCENARIO_TMP/candidate.out") lines"
kill -INT "${_BG_PID[leader]}"
for ((i = 0; i < 200 && $(grep -c . "$SCENARIO_TMP/candidate.out") < 2; i++)); do sleep 0.05; done
sed 's|/.*||' "$SCENARIO_TMP/candidate.out"
for ((i = 0; i < 200 && $(grep -cx bob "$SCENARIO_TMP/observer.out") < 1; i++)); do sleep 0.05; done
echo "observer saw:"
sed 's|/.*||' "$SCENARIO_TMP/observer.out"
bg_stop candidate >/dev/null
bg_stop leader >/dev/null
bg_stop observer >/dev/null
