# etcd-version: 3.5
# `etcdctl snapshot save`: the stream ends with the SHA-256 of what came before it (etcd's
# integrity trailer), so the file is whole pages plus 32 bytes. (The pages are a bbolt file
# from etcd and a SQLite file from etcdsql: `etcdsql restore` reads the latter.)
cd "$SCENARIO_TMP" || exit 1
$ETCDCTL put a 1 >/dev/null
$ETCDCTL put b 2 >/dev/null
section 'save'
x $ETCDCTL snapshot save snap.db 2>/dev/null
section 'the file: pages and a checksum'
python3 - snap.db <<'PY'
import hashlib, sys
data = open(sys.argv[1], "rb").read()
body, trailer = data[:-32], data[-32:]
print("size % 512 =", len(data) % 512)
print("checksum matches:", hashlib.sha256(body).digest() == trailer)
PY
section 'auth: only root may take a snapshot'
$ETCDCTL user add root:rootpw >/dev/null
$ETCDCTL user add alice:alicepw >/dev/null
$ETCDCTL auth enable >/dev/null 2>&1
x $ETCDCTL --user=alice:alicepw snapshot save denied.db 2>&1 | grep -v '^{"level"'
x $ETCDCTL --user=root:rootpw snapshot save root.db 2>/dev/null
