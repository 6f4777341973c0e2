# endpoint status / endpoint health (JSON normalized), /health, /version. (member list: member_list)
$ETCDCTL put a 1 >/dev/null
$ETCDCTL put b 2 >/dev/null
section 'endpoint status'
e endpoint status -w json
section 'endpoint health (text goes to stderr in etcdctl 3.4)'
e endpoint health
e endpoint health -w json
section 'header revision follows writes'
$ETCDCTL put c 3 >/dev/null
e endpoint status -w json
section 'HTTP endpoints on the client port'
python3 - "$ENDPOINT" <<'PY'
import sys, urllib.request, json
base = sys.argv[1]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# /health's other fields are etcd 3.5's (maintenance checks them against etcd 3.5).
for path in ("/health", "/version"):
    with opener.open(base + path, timeout=5) as r:
        body = json.loads(r.read().decode())
        if path == "/health":
            print(path, r.status, "health =", body.get("health"))
        else:
            print(path, r.status, sorted(body.keys()))
PY
echo "exit=$?"
