# Error cases: exact texts and gRPC codes matter (clients map errors by message).
section 'empty key'
e put "" v
e get ""
e del ""
section 'future revision'
e get a --rev 2
e get a --rev 99 -w json
section 'duplicate key in a txn'
txn <<'TXN'

put d 1
put d 2


TXN
section 'put and del of the same key in a txn'
txn <<'TXN'

put d 1
del d


TXN
section 'put and get of the same key in a txn (allowed)'
txn <<'TXN'

put d 1
get d


TXN
section 'too many operations in one txn (129 > 128)'
{ echo; for i in $(seq 1 129); do echo "put t$i x"; done; echo; echo; } | $ETCDCTL txn 2>&1; echo "exit=$?"
section '128 operations in one txn is fine'
{ echo; for i in $(seq 1 128); do echo "put t$i x"; done; echo; echo; } | $ETCDCTL txn -w json >"$SCENARIO_TMP/txn128.json" 2>&1; echo "exit=$?"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("succeeded", r.get("succeeded"), "responses", len(r["responses"]), "revision", r["header"]["revision"])' "$SCENARIO_TMP/txn128.json"
e get t --prefix --limit 1 --keys-only -w json
section 'request too large (value of 1.6 MiB; limit 1.5 MiB)'
python3 -c 'import sys; sys.stdout.write("x" * (1600 * 1024))' >"$SCENARIO_TMP/big"
x $ETCDCTL put big <"$SCENARIO_TMP/big"
section 'value just under the limit (1.4 MiB) is fine'
python3 -c 'import sys; sys.stdout.write("y" * (1400 * 1024))' >"$SCENARIO_TMP/medium"
x $ETCDCTL put medium <"$SCENARIO_TMP/medium"
e get medium --keys-only -w json
section 'message above the gRPC receive limit (3 MiB)'
python3 -c 'import sys; sys.stdout.write("z" * (3 * 1024 * 1024))' >"$SCENARIO_TMP/huge"
x $ETCDCTL put huge <"$SCENARIO_TMP/huge"
section 'nothing above changed the revision except the successful writes'
e get --prefix "" --limit 1 --keys-only -w json
