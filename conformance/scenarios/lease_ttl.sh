# Granted TTLs. etcd raises a TTL below its minimum lease TTL to that minimum: 2 s with the
# default heartbeat (100 ms) and election timeout (1000 ms), ceil(1.5 x election timeout).
# That covers 0, 1 and a negative TTL (`--` keeps etcdctl from reading -1 as a flag); the
# raised TTL is what the lease stores (timetolive, keep-alive). Up to 9000000000 s
# (MaxLeaseTTL) is accepted, more is OutOfRange. No key is attached to any lease here, so the
# short leases expiring during the scenario change nothing that is printed; each short lease is
# inspected right after its grant (well inside its 2 s).
section 'below the minimum TTL: raised to 2 s'
for ttl in 0 1 2 -1; do
    e lease grant -- "$ttl"
done
e lease grant 1 -w json
section 'the first TTL above the minimum is kept'
e lease grant 3
section 'the raised TTL is the one stored: timetolive and keep-alive of a "grant 0" lease'
LID=$($ETCDCTL lease grant 0 | awk '{print $2}')
echo "granted: ${LID:+yes}"
e lease timetolive "$LID"
e lease keep-alive --once "$LID"
e lease revoke "$LID"
section 'largest TTL (9000000000 s) is accepted'
BIG=$($ETCDCTL lease grant 9000000000 | awk '{print $2}')
echo "granted: ${BIG:+yes}"
e lease timetolive "$BIG"
e lease keep-alive --once "$BIG"
e lease grant 9000000000 -w json
section 'too large TTL (9000000001 s) is OutOfRange'
e lease grant 9000000001
e lease grant 9000000001 -w json
e lease grant 90000000000000
section 'revoke the large lease'
e lease revoke "$BIG"
