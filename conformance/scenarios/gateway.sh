# etcd-version: 3.5
# The HTTP/JSON gateway (POST /v3/...), driven with curl: protobuf's JSON mapping (64-bit
# integers as strings, bytes as base64, the protos' field names), grpc-gateway's errors and
# HTTP statuses, and the streams (watch, lease keep-alive). Answers are re-printed with sorted
# keys (Go's JSON spaces vary on purpose) and without the ids that differ between servers, and
# without HashKV's hash_revision (an etcd 3.6 field: etcdsql answers as 3.6, the recording is 3.5).
show() {
    python3 -c '
import json, sys
status = sys.argv[1]
def clean(o):
    if isinstance(o, dict):
        return {k: clean(v) for k, v in o.items()
                if k not in ("cluster_id", "member_id", "raft_term", "token", "hash_revision")}
    if isinstance(o, list):
        return [clean(v) for v in o]
    return o
text = sys.stdin.read()
for line in text.splitlines() or [""]:
    if not line.strip():
        continue
    try:
        print(json.dumps(clean(json.loads(line)), sort_keys=True))
    except ValueError:
        print("not JSON:", line[:80])
if status:
    print("http", status)
' "$1"
}
# post PATH JSON [CURL ARGS...]: one unary call; prints the answer and the HTTP status. Each
# call is bounded (-m 20): one that hangs shows as `http 000` instead of timing the whole
# scenario out.
post() {
    local path=$1 body=$2 out status
    shift 2
    out=$(mktemp)
    status=$(curl -s -m 20 -o "$out" -w '%{http_code}' -X POST "$ENDPOINT$path" -d "$body" "$@")
    show "$status" <"$out"
    rm -f "$out"
}
# stream PATH JSON SECONDS: a streaming call, cut after SECONDS; prints every line.
stream() {
    curl -s -N -m "$3" -X POST "$ENDPOINT$1" -d "$2" | show ""
}
section 'kv'
post /v3/kv/put '{"key":"YQ==","value":"MQ=="}'
post /v3/kv/put '{"key":"Yg==","value":"Mg==","prev_kv":true}'
post /v3/kv/put '{"key":"Yg==","value":"Mw==","prev_kv":true}'
post /v3/kv/range '{"key":"YQ=="}'
post /v3/kv/range '{"key":"YQ==","range_end":"Yw==","keys_only":true}'
post /v3/kv/range '{"key":"YQ==","range_end":"Yw==","countOnly":true,"bogus":1}'
post /v3/kv/range '{"key":"YQ==","range_end":"Yw==","limit":"1","sort_order":"DESCEND","sort_target":"KEY"}'
post /v3/kv/range '{"key":"YQ==","revision":"2"}'
post /v3/kv/txn '{"compare":[{"target":"VALUE","key":"YQ==","value":"MQ=="}],"success":[{"request_range":{"key":"YQ=="}}],"failure":[{"request_put":{"key":"YQ==","value":"Mg=="}}]}'
post /v3/kv/txn '{"compare":[{"target":"MOD","result":"GREATER","key":"YQ==","mod_revision":"100"}],"success":[{"request_range":{"key":"YQ=="}}],"failure":[{"request_put":{"key":"Yw==","value":"NA=="}},{"request_delete_range":{"key":"Yg==","prev_kv":true}}]}'
post /v3/kv/deleterange '{"key":"YQ==","range_end":"AA==","prev_kv":true}'
section 'watch: history from revision 1, then the stream stays open until cut'
stream /v3/watch '{"create_request":{"key":"YQ==","range_end":"ZA==","start_revision":"1","prev_kv":true}}' 2
post /v3/kv/compaction '{"revision":"3"}'
section 'watch: a compacted start revision'
stream /v3/watch '{"create_request":{"key":"YQ==","start_revision":"2"}}' 2
section 'kv errors'
post /v3/kv/range '{"key":""}'
post /v3/kv/range ''
post /v3/kv/range '{"key":"YQ==","revision":"2"}'
post /v3/kv/range '{"key":"YQ==","revision":"100"}'
post /v3/kv/put '{"key":"YQ==","lease":"12345"}'
curl -s -m 20 -o /dev/null -w 'http %{http_code}\n' -X POST "$ENDPOINT/v3/kv/range" -d 'not json'
out=$(mktemp)
status=$(curl -s -m 20 -o "$out" -w '%{http_code}' "$ENDPOINT/v3/kv/range")
show "$status" <"$out"
post /v3/nowhere '{}'
section 'leases'
post /v3/lease/grant '{"ID":"77","TTL":"30"}'
post /v3/kv/put '{"key":"bA==","value":"eA==","lease":"77"}'
post /v3/kv/lease/timetolive '{"ID":"77","keys":true}'
post /v3/lease/leases '{}'
stream /v3/lease/keepalive '{"ID":"77"}{"ID":"77"}' 5
post /v3/lease/revoke '{"ID":"77"}'
post /v3/kv/lease/revoke '{"ID":"77"}'
post /v3/kv/range '{"key":"bA=="}'
section 'maintenance and cluster'
post /v3/maintenance/alarm '{"action":"GET"}'
post /v3/maintenance/hashkv '{"revision":"5"}'
post /v3/maintenance/transfer-leadership '{"targetID":"1"}'
post /v3/maintenance/downgrade '{"action":"VALIDATE","version":"3.3"}'
section 'locks and elections'
post /v3/lease/grant '{"ID":"88","TTL":"30"}'
post /v3/lock/lock '{"name":"bG9jaw==","lease":"88"}'
post /v3/lock/unlock '{"key":"bG9jay81OA=="}'
post /v3/election/leader '{"name":"ZQ=="}'
post /v3/election/campaign '{"name":"ZQ==","lease":"88","value":"djE="}'
post /v3/election/leader '{"name":"ZQ=="}'
post /v3/election/proclaim '{"leader":{"name":"ZQ==","key":"ZS81OA==","rev":"11","lease":"88"},"value":"djI="}'
post /v3/election/proclaim '{"value":"djI="}'
post /v3/election/resign '{"leader":{"name":"ZQ==","key":"ZS81OA==","rev":"11","lease":"88"}}'
section 'auth'
post /v3/auth/user/add '{"name":"root","password":"rootpw"}'
post /v3/auth/user/grant '{"user":"root","role":"root"}'
post /v3/auth/enable '{}'
post /v3/kv/range '{"key":"Yw=="}'
token=$(curl -s -m 20 -X POST "$ENDPOINT/v3/auth/authenticate" -d '{"name":"root","password":"rootpw"}' |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
post /v3/kv/range '{"key":"Yw=="}' -H "Authorization: $token"
post /v3/auth/status '{}' -H "Authorization: $token"
post /v3/kv/range '{"key":"Yw=="}' -H "Authorization: nonsense"
post /v3/auth/authenticate '{"name":"root","password":"wrong"}'
post /v3/auth/disable '{}' -H "Authorization: $token"
post /v3/auth/status '{}'
