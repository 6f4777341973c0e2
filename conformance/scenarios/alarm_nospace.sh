# etcd-version: 3.5
# etcd-flags: --quota-backend-bytes=1048576
# etcdsql-flags: --quota-backend-bytes=1048576
# etcdsql-not-on-postgres: an empty PostgreSQL database is already larger than this quota (tests/alarm.rs covers PostgreSQL)
# The space quota: a write that would take the database past it raises NOSPACE; then writes
# that add data fail, everything else goes on, and `alarm disarm` lifts it.
$ETCDCTL put a 1 >/dev/null
$ETCDCTL put c 3 >/dev/null
section 'a put that would pass the quota fails and raises NOSPACE'
head -c 1200000 /dev/zero | tr '\0' x >big
x $ETCDCTL put big <big
e alarm list
section 'raised: puts, txns with a put and lease grants fail'
e put b 2
txn <<'TXN'

put b 2


TXN
txn <<'TXN'
value("a") = "nope"

get a
put b 2


TXN
e lease grant 10
section 'raised: reads, deletes, read-only txns and compaction go on'
e get a
e del c
txn <<'TXN'

get a


TXN
e compact 3
section 'raised: /health fails unless NOSPACE is excluded; the probes pass'
python3 - "$ENDPOINT" <<'PY'
import sys, urllib.request, urllib.error
base = sys.argv[1]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
for path in ["/health", "/health?exclude=NOSPACE", "/livez", "/readyz"]:
    try:
        with opener.open(base + path, timeout=10) as r:
            print(path, r.status, r.read().decode().strip())
    except urllib.error.HTTPError as e:
        print(path, e.code, e.read().decode().strip())
PY
section 'endpoint status lists the alarm'
$ETCDCTL endpoint status -w json | python3 -c '
import json, sys
status = json.load(sys.stdin)[0]["Status"]
member = str(status["header"]["member_id"])
print([e.replace(member, "<MEMBER_ID>") for e in status.get("errors", [])])'
section 'disarmed: writes go on'
e alarm disarm
e alarm list
e put b 2
e get b
