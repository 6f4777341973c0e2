# etcd-version: 3.5
# Maintenance beyond Status, and the HTTP probes of etcd 3.5: HashKV (the same number for the
# same history), Defragment, MoveLeader; /livez, /readyz, /health, and 404 for unknown paths.
$ETCDCTL put a 1 >/dev/null
$ETCDCTL put b 2 >/dev/null
$ETCDCTL put a 3 >/dev/null
$ETCDCTL del b >/dev/null
txn <<'TXN' >/dev/null

put c 4
put d 5
del a


TXN
$ETCDCTL put e 6 >/dev/null
section 'hashkv at the current revision, then at each earlier one'
e endpoint hashkv -w json
for rev in 2 3 4 5 6; do e endpoint hashkv -w json --rev=$rev; done
section 'hashkv of a future revision'
e endpoint hashkv -w json --rev=99
section 'compacted at 5: rows below it count only while live'
e compact 5
e endpoint hashkv -w json
e endpoint hashkv -w json --rev=6
e endpoint hashkv -w json --rev=4
section 'delete everything: nothing is live at the hashed revision'
$ETCDCTL del "" --from-key >/dev/null
e endpoint hashkv -w json
e compact 8
e endpoint hashkv -w json
section 'defragment keeps the data'
e defrag
e get "" --from-key
section 'move-leader: to this member, and to another'
id=$($ETCDCTL endpoint status -w json | python3 -c 'import json,sys; print("%x" % json.load(sys.stdin)[0]["Status"]["header"]["member_id"])')
e move-leader "$id"
e move-leader 1234
section 'HTTP probes (check lines sorted: etcd lists them in a Go map order)'
python3 - "$ENDPOINT" <<'PY'
import sys, urllib.request, urllib.error
base = sys.argv[1]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
def show(path, method="GET", body_shown=True):
    req = urllib.request.Request(base + path, method=method)
    try:
        with opener.open(req, timeout=10) as r:
            status, headers, body = r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        status, headers, body = e.code, e.headers, e.read().decode()
    lines = body.split("\n")
    checks = sorted(l for l in lines if l.startswith("[")) + [l for l in lines if not l.startswith("[")]
    print("%s %s -> %d %s%s" % (method, path, status, headers.get("Content-Type"),
          " allow=" + headers["Allow"] if headers.get("Allow") else ""))
    for l in checks if body_shown else []:
        if l:
            print("  |", l)
for path in ["/livez", "/livez?verbose", "/readyz", "/readyz?verbose",
             "/readyz?verbose&exclude=linearizable_read&exclude=no_such_check",
             "/readyz/linearizable_read", "/readyz/serializable_read?verbose",
             "/readyz/data_corruption", "/readyz/non_learner", "/livez/serializable_read",
             "/livez/linearizable_read", "/readyz/no_such_check", "/readyz/", "/health",
             "/health?serializable=true", "/health?exclude=NOSPACE",
             "/", "/no/such/path", "/v3/no/such/path", "/metricsx"]:
    show(path)
# Its body names the version, which differs.
show("/version", body_shown=False)
for path in ["/livez", "/readyz", "/health", "/version"]:
    show(path, "POST")
PY
echo "exit=$?"
