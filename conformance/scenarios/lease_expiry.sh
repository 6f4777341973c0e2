# A lease that runs out deletes its keys like a revoke: every attached key in one revision,
# DELETE events with prev_kv for watchers, and afterwards the lease is gone everywhere.
# Timing is only checked with wide bounds (printed as yes/no): the keys must outlive the
# grant by at least 2 s (TTL 3 s, 1 s slack for servers with a coarser clock) and be gone
# within 15 s; etcd removes them 3.0-3.5 s after the grant. Both watches start at a future
# revision (replay or live, same output): `all` from the first put, `json` from the expiry's
# revision 5, which holds only the two deletes (one response).
watch_bg all --rev 2 --prev-kv --prefix e/
watch_bg json --rev 5 --prev-kv --prefix e/ -w json
section 'grant 3 s, attach e/a and e/b, e/c without lease'
us() { local t=$EPOCHREALTIME; echo "${t/[.,]/}"; }   # wall clock in microseconds
T0=$(us)
LID=$($ETCDCTL lease grant 3 | awk '{print $2}')
echo "granted: ${LID:+yes}"
e put e/a 1 --lease="$LID"                       # rev 2
e put e/b 2 --lease="$LID"                       # rev 3
e put e/c 3                                      # rev 4
e get --prefix e/ -w json
section 'poll until the leased keys are gone (bounded: 15 s)'
gone=no
while (($(us) - T0 < 15000000)); do
    if [ "$($ETCDCTL get --prefix e/ --keys-only 2>&1)" = "e/c" ]; then gone=yes; break; fi
    sleep 0.1
done
ELAPSED=$(($(us) - T0))
echo "e/a and e/b gone within 15 s of the grant: $gone"
echo "gone no earlier than 2 s after the grant: $( ((ELAPSED >= 2000000)) && echo yes || echo no)"
wait_lines all 19
wait_lines json 1
section 'watch --rev 2 --prev-kv --prefix e/ (three puts, then both deletes with their previous values)'
bg_stop all
section 'watch --rev 5 --prev-kv --prefix e/ -w json (both deletes in one response at revision 5)'
bg_stop json
section 'after expiry: one revision (5) for both deletes, e/c untouched'
e get --prefix e/ -w json
section 'the expired lease is gone'
e lease timetolive "$LID" --keys
e lease keep-alive --once "$LID"
e lease revoke "$LID"
e put e/d 4 --lease="$LID"
e lease list
