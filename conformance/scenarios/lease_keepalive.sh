# lease keep-alive --once: the answer carries the granted TTL (not the remaining one), a renewal
# restarts the lease's clock, unknown and revoked leases are not found (a keep-alive is a
# stream, so etcdctl prints no retry warning; exit 2).
# The sleeps are the point here (elapsed time against the TTL), not synchronisation: a 3 s
# lease is renewed after 1.5 s and after 3 s; at 4.5 s it has outlived its first term by
# 1.5 s (etcd expires a lease at most ~0.5 s late) and is 1.5 s short of its renewed end.
section 'keep-alive --once answers the granted TTL'
LID=$($ETCDCTL lease grant 600 | awk '{print $2}')
echo "granted: ${LID:+yes}"
e lease keep-alive --once "$LID"
e lease keep-alive --once "$LID" -w json
e lease timetolive "$LID"
section 'keep-alive of an unknown lease'
e lease keep-alive --once 1234abcd
section 'keep-alive extends a 3 s lease past its first term'
SHORT=$($ETCDCTL lease grant 3 | awk '{print $2}')
echo "granted: ${SHORT:+yes}"
e put k/a v --lease="$SHORT"                     # rev 2
sleep 1.5
e lease keep-alive --once "$SHORT"
sleep 1.5
e lease keep-alive --once "$SHORT"
sleep 1.5
section 'at 4.5 s the key and the lease are still there'
e get --prefix k/ -w json
e lease timetolive "$SHORT" --keys
section 'revoke: the key goes, the lease is no longer kept alive'
e lease revoke "$SHORT"                          # rev 3
e get --prefix k/ -w json
e lease keep-alive --once "$SHORT"
e lease timetolive "$SHORT"
section 'the 600 s lease is untouched'
e lease timetolive "$LID"
$ETCDCTL lease list 2>&1 | head -n 1
