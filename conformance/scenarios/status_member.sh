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
for path in ("/health", "/version"):
    with opener.open(base + path, timeout=5) as r:
        body = json.loads(r.read().decode())
        print(path, r.status, sorted(body.keys()))
        if path == "/health":
            print("  health =", body.get("health"))
PY
echo "exit=$?"
