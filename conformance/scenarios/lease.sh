# Leases as seen through etcdctl (ids normalized; no timing-dependent output).
section 'grant'
LID=$($ETCDCTL lease grant 600 | awk '{print $2}')
echo "granted: ${LID:+yes}"
section 'attach keys'
e put l/1 a --lease="$LID"
e put l/2 b --lease="$LID"
e put plain c
e get --prefix "" -w json
section 'grant -w json'
$ETCDCTL lease grant 300 -w json >"$SCENARIO_TMP/grant.json" 2>&1; echo "exit=$?"
cat "$SCENARIO_TMP/grant.json"; echo
LID2=$(python3 -c 'import json,sys; print("%016x" % json.load(open(sys.argv[1]))["ID"])' "$SCENARIO_TMP/grant.json")
section 'lease list (order is not defined; sorted after mapping ids)'
$ETCDCTL lease list >"$SCENARIO_TMP/list" 2>&1; echo "exit=$?"
head -n 1 "$SCENARIO_TMP/list"
tail -n +2 "$SCENARIO_TMP/list" | sed -e "s/^0*${LID#"${LID%%[!0]*}"}\$/first (600s)/" -e "s/^0*${LID2#"${LID2%%[!0]*}"}\$/second (300s)/" | LC_ALL=C sort
section 'timetolive with keys (remaining ttl normalized)'
e lease timetolive "$LID" --keys
e lease timetolive "$LID2"
section 'revoke deletes every attached key in one revision'
e lease revoke "$LID"
e get --prefix "" -w json
section 'revoked lease is gone'
e lease timetolive "$LID"
e lease revoke "$LID"
e put l/3 x --lease="$LID"
section 'unknown lease'
e lease revoke 1234abcd
e put l/4 x --lease=1234abcd
section 'lease list after revoke'
$ETCDCTL lease list 2>&1 | head -n 1
