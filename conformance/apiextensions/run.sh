#!/usr/bin/env bash
# End-to-end on Kubernetes 1.36: the API server for CustomResourceDefinitions
# (k8s.io/apiextensions-apiserver, Debian sid's golang-k8s-apiextensions-apiserver-dev, built
# by ../k8s-storage/build.sh from its unchanged main.go) keeps its objects in the store while
# kubectl 1.36 and curl drive it:
#
#   conformance/apiextensions/run.sh [sqlite|postgres|etcd]
#
#   sqlite    etcdsql on a fresh SQLite file (the default)
#   postgres  etcdsql on a fresh PostgreSQL database etcdsql_apiext_<pid> on $ETCDSQL_POSTGRES
#             (a server URL, default postgres://postgres@127.0.0.1:5432), dropped at the end
#   etcd      real etcd 3.5 (Debian sid's etcd-server) instead: the reference
#
# It runs on the 1.36 storage stack as kube-apiserver 1.36 does: watch cache, consistent lists
# from the cache after a watch progress request, WatchList streams, the compactor. The scenario:
# a CRD and its custom objects; watches in order; conflicts; hundreds of objects in pages; a
# sendInitialEvents watch; consistent lists served from the cache (its metrics); 410 after
# compaction; a restart of the store under the running server. Every wait is bounded; all
# started is stopped on exit. The last line is "apiextensions: N passed, M failed".
#
# Environment: ETCDSQL_BIN (default target/debug/etcdsql), ETCDSQL_POSTGRES, ETCD_BIN (default
# the sid etcd of build.sh), ETCDCTL_BIN, KEEP_WORK=1 (keep the temporary folder).
# See conformance/apiextensions/README.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BACKEND=${1:-sqlite}
case "$BACKEND" in
sqlite | postgres | mysql | etcd) ;;
*)
    echo "usage: $0 [sqlite|postgres|mysql|etcd]" >&2
    exit 2
    ;;
esac

ETCDSQL_BIN=${ETCDSQL_BIN:-$REPO/target/debug/etcdsql}
ETCDCTL_BIN=${ETCDCTL_BIN:-etcdctl}
PG_SERVER=${ETCDSQL_POSTGRES:-${ETCDSQL_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432}}
MY_SERVER=${ETCDSQL_MYSQL:-${ETCDSQL_TEST_MYSQL:-mysql://root@127.0.0.1:3306}}
COMPACTION_INTERVAL=20 # seconds: the server's --etcd-compaction-interval
BULK=300               # widgets listed page by page
CHUNK=40               # kubectl --chunk-size for them: 8 pages
GROUP=e2e.etcdsql.io
PREFIX=/registry/apiextensions.kubernetes.io # the server's default --etcd-prefix

# Only loopback traffic: no proxies, no inherited etcd/etcdctl configuration.
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY grpc_proxy GRPC_PROXY
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost
while IFS= read -r v; do unset "$v"; done < <(compgen -e | grep -E '^(ETCD_|ETCDCTL_)' || true)
export ETCDCTL_API=3

for tool in python3 curl openssl timeout "$ETCDCTL_BIN"; do
    command -v "$tool" >/dev/null 2>&1 || { echo "run.sh: missing tool: $tool" >&2; exit 2; }
done
if [ "$BACKEND" != etcd ] && [ ! -x "$ETCDSQL_BIN" ]; then
    echo "run.sh: no etcdsql binary at $ETCDSQL_BIN (cargo build, or set ETCDSQL_BIN)" >&2
    exit 2
fi
if [ "$BACKEND" = postgres ]; then
    command -v psql >/dev/null 2>&1 || { echo "run.sh: missing psql (apt-get install postgresql-client)" >&2; exit 2; }
    psql "$PG_SERVER/postgres" -Atqc 'SELECT 1' >/dev/null 2>&1 ||
        { echo "run.sh: no PostgreSQL server answers at $PG_SERVER" >&2; exit 1; }
fi
if [ "$BACKEND" = mysql ]; then
    command -v mariadb >/dev/null 2>&1 || { echo "run.sh: missing mariadb (apt-get install mariadb-client)" >&2; exit 2; }
    # shellcheck source=../mysql.sh
    source "$REPO/conformance/mysql.sh"
    mysql_exec "$MY_SERVER" 'SELECT 1' >/dev/null 2>&1 ||
        { echo "run.sh: no MySQL server answers at $MY_SERVER" >&2; exit 1; }
fi

echo "apiextensions-apiserver end-to-end on $BACKEND"
BUILT=$(bash "$REPO/conformance/k8s-storage/build.sh" | tail -n1)
APISERVER=$BUILT/apiextensions-apiserver
ETCD_BIN=${ETCD_BIN:-$BUILT/etcd}
echo "versions: $(grep -E '^(golang-k8s-apiextensions-apiserver-dev|etcd-server)_' "$BUILT/versions.txt" | cut -d_ -f1,2 | tr '\n' ' ')"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/etcdsql-apiext-e2e.XXXXXX")
E2E_NAME=apiextensions
PG_PREFIX=etcdsql_apiext_
# shellcheck source=../e2e-lib.sh
source "$HERE/../e2e-lib.sh"

# The client: a certificate of group system:masters, which the server's delegated authorizer
# always allows, signed by the CA it is given with --client-ca-file.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=e2e-ca \
    -keyout "$WORK/ca.key" -out "$WORK/ca.crt" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=e2e-admin" \
    -keyout "$WORK/admin.key" -out "$WORK/admin.csr" 2>/dev/null
openssl x509 -req -in "$WORK/admin.csr" -CA "$WORK/ca.crt" -CAkey "$WORK/ca.key" \
    -CAcreateserial -days 2 -out "$WORK/admin.crt" 2>/dev/null
# A standalone apiextensions-apiserver delegates authentication, authorization and its core
# informers to a kube-apiserver. There is none here: the way Kubernetes' own integration tests
# run this server, they get a kubeconfig naming an address where nothing listens (loopback), and
# the admission plugins that need the core API are off.
read -r NOWHERE_PORT <<<"$(free_ports 1)"
cat >"$WORK/nowhere.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: nowhere
  cluster: {server: "https://127.0.0.1:$NOWHERE_PORT", insecure-skip-tls-verify: true}
users:
- name: nobody
  user: {token: none}
contexts:
- name: nowhere
  context: {cluster: nowhere, user: nobody}
current-context: nowhere
EOF

# curl_api PATH [CURL ARGS...]: prints the HTTP status; the body goes to $WORK/body.
curl_api() {
    local path=$1
    shift
    curl -sk --max-time 20 --cert "$WORK/admin.crt" --key "$WORK/admin.key" \
        -o "$WORK/body" -w '%{http_code}' "$@" "$API_URL$path" || true
}
# api METHOD PATH [CONTENT-TYPE BODY]: a request, as curl_api.
api() {
    local method=$1 path=$2
    shift 2
    if [ $# -ge 2 ]; then
        curl_api "$path" -X "$method" -H "Content-Type: $1" --data-binary "$2"
    else
        curl_api "$path" -X "$method"
    fi
}
# expect_api DESCRIPTION STATUS METHOD PATH [CONTENT-TYPE BODY]: the request answers STATUS.
expect_api() {
    local desc=$1 want=$2 code
    shift 2
    code=$(api "$@")
    if [ "$code" = "$want" ]; then
        ok "$desc"
    else
        bad "$desc"
        echo "       want HTTP $want, got $code: $(head -c 300 "$WORK/body")"
    fi
}
# The server's own view of its store (the informer-sync check never passes without a core API).
store_ready() { [ "$(curl_api /readyz/etcd)" = 200 ]; }
wait_store_ready() { # wait_store_ready SECONDS
    local deadline=$((SECONDS + $1))
    until store_ready; do
        kill -0 "$API_PID" 2>/dev/null || return 1
        ((SECONDS < deadline)) || return 1
        sleep 0.5
    done
}
# consistent_reads SUCCESS FALLBACK: the server's count of consistent widget lists served from
# its watch cache with those labels.
consistent_reads() {
    [ "$(curl_api /metrics)" = 200 ] || { echo "none: /metrics failed"; return 0; }
    python3 "$HERE/client.py" metric "$WORK/body" apiserver_watch_cache_consistent_read_total \
        "group=$GROUP" resource=widgets "success=$1" "fallback=$2"
}

W=/apis/$GROUP/v1/namespaces # widgets' paths: $W/NAMESPACE/widgets[/NAME]
JSON=application/json
MERGE=application/merge-patch+json
# widget NAMESPACE NAME SIZE: a widget as JSON.
widget() {
    printf '{"apiVersion":"%s/v1","kind":"Widget","metadata":{"name":"%s","namespace":"%s"},"spec":{"size":%s}}' \
        "$GROUP" "$2" "$1" "$3"
}
# create NAMESPACE NAME SIZE: creates a widget; a failure is a failed check.
create() {
    local code
    code=$(api POST "$W/$1/widgets" "$JSON" "$(widget "$@")")
    [ "$code" = 201 ] || bad "create widget $1/$2: HTTP $code $(head -c 300 "$WORK/body")"
}
# patch NAMESPACE NAME JSON [SUBRESOURCE]: a merge patch; a failure is a failed check.
patch() {
    local code
    code=$(api PATCH "$W/$1/widgets/$2${4:+/$4}" "$MERGE" "$3")
    [ "$code" = 200 ] || bad "patch widget $1/$2: HTTP $code $(head -c 300 "$WORK/body")"
}
# list_pages NAMESPACE LIMIT: walks a paginated list; prints one line per page,
# "remainingItemCount-or-- name...".
list_pages() {
    local cont="" pages=0 code
    while :; do
        code=$(curl_api "$W/$1/widgets?limit=$2${cont:+&continue=$cont}")
        [ "$code" = 200 ] || { echo "HTTP $code"; return; }
        json '" ".join([str(d["metadata"].get("remainingItemCount", "-"))] + [i["metadata"]["name"] for i in d["items"]])' <"$WORK/body"
        cont=$(json 'd["metadata"].get("continue", "")' <"$WORK/body")
        pages=$((pages + 1))
        if [ -z "$cont" ] || ((pages > 50)); then break; fi
    done
}
# names NAMESPACE: every widget's name in NAMESPACE, sorted, from one list.
names() {
    curl_api "$W/$1/widgets" >/dev/null
    json '"\n".join(sorted(i["metadata"]["name"] for i in d["items"]))' <"$WORK/body"
}
# watch_start NAME NAMESPACE: a watch of the namespace's widgets from the revision of a list
# made now (the events after it, as a client's list-then-watch sees them; bookmarks left out).
watch_start() {
    local rv
    curl_api "$W/$2/widgets" >/dev/null
    rv=$(json 'd["metadata"]["resourceVersion"]' <"$WORK/body")
    python3 "$HERE/client.py" watch "$API_URL" "$W/$2/widgets?watch=1&resourceVersion=$rv" \
        "$WORK/admin.crt" "$WORK/admin.key" >"$WORK/watch.$1" 2>"$WORK/watch.$1.err" </dev/null &
    BG_PIDS+=($!)
    eval "WATCH_PID_$1=$!"
}

# ---------------------------------------------------------------------------------------------
step "start $BACKEND and apiextensions-apiserver"
start_store
"$APISERVER" \
    --etcd-servers="$STORE_URL" \
    --etcd-compaction-interval="${COMPACTION_INTERVAL}s" \
    --bind-address=127.0.0.1 --secure-port="$API_PORT" --cert-dir="$WORK/apiserver-certs" \
    --client-ca-file="$WORK/ca.crt" \
    --authentication-skip-lookup \
    --authentication-kubeconfig="$WORK/nowhere.kubeconfig" \
    --authorization-kubeconfig="$WORK/nowhere.kubeconfig" \
    --kubeconfig="$WORK/nowhere.kubeconfig" \
    --disable-admission-plugins=NamespaceLifecycle,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,MutatingAdmissionPolicy \
    --profiling=false \
    >"$API_LOG" 2>&1 </dev/null &
API_PID=$!
API_START=$SECONDS
wait_store_ready 90 || die "apiextensions-apiserver's /readyz/etcd not ok within 90 s"
ok "apiextensions-apiserver /readyz/etcd after $((SECONDS - API_START)) s"
startup_to=$(wc -l <"$API_LOG")
curl_api /version >/dev/null
expect_match "it is Kubernetes 1.36" '^v1\.36\.' "$(json 'd["gitVersion"]' <"$WORK/body")"

step "CustomResourceDefinitions"
# crd PLURAL KIND SCOPE: creates a CRD of the group and waits until it is Established and served.
crd() {
    local name=$1.$GROUP path deadline
    expect_api "the CRD $name is created" 201 POST /apis/apiextensions.k8s.io/v1/customresourcedefinitions \
        application/yaml "$(cat <<EOF
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: $name}
spec:
  group: $GROUP
  scope: $3
  names: {plural: $1, singular: ${2,,}, kind: $2, listKind: ${2}List}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer, minimum: 0}
              colour: {type: string}
          status:
            type: object
            properties:
              phase: {type: string}
EOF
)"
    deadline=$((SECONDS + 60))
    until [ "$(curl_api "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/$name")" = 200 ] &&
        [ "$(json '[c["status"] for c in d.get("status", {}).get("conditions", []) if c["type"] == "Established"]' <"$WORK/body")" = "['True']" ]; do
        ((SECONDS < deadline)) || die "the CRD $name was not Established within 60 s"
        sleep 0.5
    done
    ok "the CRD $name is Established"
    path=/apis/$GROUP/v1/$1
    [ "$3" = Cluster ] || path=$W/e2e-a/$1
    deadline=$((SECONDS + 30))
    until [ "$(curl_api "$path")" = 200 ]; do
        ((SECONDS < deadline)) || die "$1 not served within 30 s of the CRD: $(head -c 300 "$WORK/body")"
        sleep 0.5
    done
    ok "$1 are served"
}
crd widgets Widget Namespaced
crd gadgets Gadget Cluster
expect_eq "the CRDs are stored under the server's prefix" \
    "$(printf '%s\n' "$PREFIX/apiextensions.k8s.io/customresourcedefinitions/gadgets.$GROUP" "$PREFIX/apiextensions.k8s.io/customresourcedefinitions/widgets.$GROUP")" \
    "$(etcd_keys "$PREFIX/apiextensions.k8s.io/customresourcedefinitions/" | cut -d' ' -f1)"
for g in g1 g2 g3; do
    expect_api "cluster-scoped gadget $g is created" 201 POST "/apis/$GROUP/v1/gadgets" "$JSON" \
        "{\"apiVersion\":\"$GROUP/v1\",\"kind\":\"Gadget\",\"metadata\":{\"name\":\"$g\"},\"spec\":{\"size\":1}}"
done
curl_api "/apis/$GROUP/v1/gadgets" >/dev/null
expect_eq "the gadgets are listed" "g1 g2 g3" "$(json '" ".join(i["metadata"]["name"] for i in d["items"])' <"$WORK/body")"
expect_eq "... and stored without a namespace in their keys" \
    "$(printf "$PREFIX/$GROUP/gadgets/%s\n" g1 g2 g3)" "$(etcd_keys "$PREFIX/$GROUP/gadgets/" | cut -d' ' -f1)"
code=$(api POST "$W/e2e-a/widgets" "$JSON" "$(widget e2e-a invalid -1)")
expect_eq "a widget that breaks the schema is 422 Invalid" "422 Invalid" "$code $(json 'd["reason"]' <"$WORK/body")"

step "watches"
create e2e-watch sentinel 0
watch_start w e2e-watch
create e2e-watch w1 1
patch e2e-watch w1 '{"metadata":{"labels":{"step":"labelled"}}}'
patch e2e-watch w1 '{"spec":{"size":2}}'
patch e2e-watch w1 '{"status":{"phase":"Ready"}}' status
expect_api "delete a widget" 200 DELETE "$W/e2e-watch/widgets/w1"
watch_expect w "a watch sees ADDED, MODIFIED x3 (label, spec, status), DELETED in order" \
    "ADDED w1" "MODIFIED w1" "MODIFIED w1" "MODIFIED w1" "DELETED w1"
curl_api "$W/e2e-watch/widgets/w1" >/dev/null
expect_eq "a deleted widget is NotFound" "NotFound" "$(json 'd["reason"]' <"$WORK/body")"
expect_eq "... and its key is gone from the store" "" "$(etcd_keys "$PREFIX/$GROUP/widgets/e2e-watch/w1")"

step "updates and conflicts"
create e2e-a conf 1
curl_api "$W/e2e-a/widgets/conf" >/dev/null
cp "$WORK/body" "$WORK/stale.json"
stale_rv=$(json 'd["metadata"]["resourceVersion"]' <"$WORK/stale.json")
patch e2e-a conf '{"spec":{"size":2}}'
code=$(api PUT "$W/e2e-a/widgets/conf" "$JSON" "$(cat "$WORK/stale.json")")
expect_eq "replace with a stale resourceVersion is 409 Conflict" "409 Conflict" "$code $(json 'd["reason"]' <"$WORK/body")"
code=$(api DELETE "$W/e2e-a/widgets/conf" "$JSON" \
    "{\"kind\":\"DeleteOptions\",\"apiVersion\":\"v1\",\"preconditions\":{\"resourceVersion\":\"$stale_rv\"}}")
expect_eq "delete with a stale resourceVersion precondition is 409 Conflict" "409 Conflict" \
    "$code $(json 'd["reason"]' <"$WORK/body")"
curl_api "$W/e2e-a/widgets/conf" >/dev/null
expect_eq "the widget kept the patched size" "2" "$(json 'd["spec"]["size"]' <"$WORK/body")"
code=$(api POST "$W/e2e-a/widgets" "$JSON" "$(widget e2e-a conf 3)")
expect_eq "creating an existing widget is 409 AlreadyExists" "409 AlreadyExists" "$code $(json 'd["reason"]' <"$WORK/body")"
for doc in '{size: 1}' '{size: 1, colour: blue}'; do
    api PATCH "$W/e2e-a/widgets/applied?fieldManager=e2e" application/apply-patch+yaml \
        "$(printf 'apiVersion: %s/v1\nkind: Widget\nmetadata: {name: applied, namespace: e2e-a}\nspec: %s\n' "$GROUP" "$doc")" >/dev/null
done
curl_api "$W/e2e-a/widgets/applied" >/dev/null
expect_eq "server-side apply twice" "1 blue" "$(json 'str(d["spec"]["size"]) + " " + d["spec"]["colour"]' <"$WORK/body")"
# Eight writers patch one object at once: the server's compare-and-swap on the key's mod
# revision fails for all but one of each race and retries; every patch must land.
create e2e-a hot 0
pids=()
for i in 1 2 3 4 5 6 7 8; do
    curl -sk --max-time 30 --cert "$WORK/admin.crt" --key "$WORK/admin.key" -o /dev/null -w '%{http_code}\n' \
        -X PATCH -H "Content-Type: $MERGE" --data-binary "{\"metadata\":{\"labels\":{\"k$i\":\"$i\"}}}" \
        "$API_URL$W/e2e-a/widgets/hot" >"$WORK/hot.$i" &
    pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || true; done
expect_eq "8 concurrent patches of one widget all answer 200" "$(printf '200\n%.0s' 1 2 3 4 5 6 7 8)" "$(cat "$WORK"/hot.*)"
curl_api "$W/e2e-a/widgets/hot" >/dev/null
expect_eq "... and all 8 labels are there" "k1 k2 k3 k4 k5 k6 k7 k8" \
    "$(json '" ".join(sorted(d["metadata"]["labels"]))' <"$WORK/body")"

step "$BULK widgets, listed in pages"
# One client, one connection, $BULK creates.
python3 "$HERE/client.py" create "$API_URL" "$W/e2e-bulk/widgets" "$WORK/admin.crt" "$WORK/admin.key" \
    "$GROUP" "$BULK" >"$WORK/bulk.codes"
expect_eq "created $BULK widgets" "201 x$BULK" "$(sort "$WORK/bulk.codes" | uniq -c | awk '{print $2 " x" $1}')"
seq -f 'bulk-%03g' 1 "$BULK" >"$WORK/bulk.want"
pages=$(list_pages e2e-bulk "$CHUNK")
expect_eq "pages of $CHUNK: $(((BULK + CHUNK - 1) / CHUNK)) of them, remainingItemCount counting down" \
    "260 220 180 140 100 60 20 -" "$(cut -d' ' -f1 <<<"$pages" | tr '\n' ' ' | sed 's/ $//')"
expect_eq "... returning each widget once" "$(cat "$WORK/bulk.want")" \
    "$(cut -d' ' -f2- <<<"$pages" | tr ' ' '\n' | LC_ALL=C sort)"
pages=$(list_pages e2e-bulk 100)
expect_eq "pages of 100: remainingItemCount per page" "200 100 -" "$(cut -d' ' -f1 <<<"$pages" | tr '\n' ' ' | sed 's/ $//')"
curl_api "$W/e2e-bulk/widgets?limit=10" >/dev/null
first_continue=$(json 'd["metadata"]["continue"]' <"$WORK/body")

step "consistent lists from the watch cache"
# A list without resourceVersion must reflect every write before it. The 1.36 cache serves it
# once it has caught up with the store's current revision, which it learns by asking for a
# watch progress notification; without one it falls back to reading the store.
served_before=$(consistent_reads true false)
fallback_before=$(consistent_reads true true)
failed_before="$(consistent_reads false false) $(consistent_reads false true)"
for i in 1 2 3 4 5; do
    create e2e-bulk "consistent-$i" "$i"
    expect_match "a list right after create $i has it" "^consistent-$i\$" "$(names e2e-bulk)"
done
served_after=$(consistent_reads true false)
fallback_after=$(consistent_reads true true)
if [[ $served_before =~ ^[0-9]+$ && $served_after =~ ^[0-9]+$ ]] && ((served_after - served_before >= 5)); then
    ok "the cache served the consistent lists (apiserver_watch_cache_consistent_read_total: $served_before -> $served_after)"
else
    bad "the cache served the consistent lists (apiserver_watch_cache_consistent_read_total, fallback=false: $served_before -> $served_after)"
fi
expect_eq "... with no fallback to the store" "$fallback_before" "$fallback_after"
expect_eq "... and none failed" "$failed_before" "$(consistent_reads false false) $(consistent_reads false true)"

step "a sendInitialEvents watch"
# WatchList: the state as ADDED events, a bookmark marked initial-events-end, then live events.
curl -sk -N --max-time 30 --cert "$WORK/admin.crt" --key "$WORK/admin.key" \
    "$API_URL$W/e2e-bulk/widgets?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=10" \
    >"$WORK/watchlist" 2>"$WORK/watchlist.err" &
watchlist_pid=$!
BG_PIDS+=($watchlist_pid)
deadline=$((SECONDS + 20))
until grep -q '"BOOKMARK"' "$WORK/watchlist"; do
    if ! kill -0 "$watchlist_pid" 2>/dev/null || ((SECONDS >= deadline)); then break; fi
    sleep 0.2
done
create e2e-bulk after-bookmark 1
wait "$watchlist_pid" || true
# Later bookmarks (about one a minute) print as "=None".
summary=$(python3 "$HERE/client.py" summary "$WORK/watchlist")
expect_eq "all $((BULK + 5)) widgets, the initial-events-end bookmark, then the new widget" \
    "$(printf '%s\n' "ADDED x$((BULK + 5))" "BOOKMARK initial-events-end=true" "ADDED after-bookmark")" \
    "$(grep -v '^BOOKMARK initial-events-end=None$' <<<"$summary")"

step "compaction by the server"
wait_compacted $((API_START + 3 * COMPACTION_INTERVAL + 30 - SECONDS)) ||
    die "the server did not compact within $((3 * COMPACTION_INTERVAL + 30)) s of its start (compact_rev_key: '$COMPACTED')"
compacted=$COMPACTED
ok "the server compacted at revision $compacted, $((SECONDS - API_START)) s after its start"
expect_match "reading below the compact revision is refused" "required revision has been compacted" \
    "$("${ETCDCTL[@]}" get compact_rev_key --rev=$((compacted - 1)) 2>&1)"
old=$((compacted - 2))
compaction_from=$(wc -l <"$API_LOG")
# A continue token is base64 JSON naming the revision of the list it continues; the same token
# rewritten to a compacted revision is what a client paging slowly across a compaction holds.
old_continue=$(python3 -c '
import base64, json, sys
t = json.loads(base64.urlsafe_b64decode(sys.argv[1] + "=" * (-len(sys.argv[1]) % 4)))
t["rv"] = int(sys.argv[2])
print(base64.urlsafe_b64encode(json.dumps(t).encode()).decode().rstrip("="))' "$first_continue" "$old")
# The watch cache serves lists at older revisions from its snapshots until it learns of the
# compaction: its own compactor reads the store compactor's revision (which that one follows
# by watching compact_rev_key) every 15 s and drops the older snapshots. After that, both are
# the store's 410.
# expect_expired DESCRIPTION PATH: PATH answers 410 Expired within 45 s.
expect_expired() {
    local deadline=$((SECONDS + 45)) code
    while :; do
        code=$(curl_api "$2")
        [ "$code" != 410 ] || break
        ((SECONDS < deadline)) || break
        sleep 1
    done
    expect_eq "$1" "410 Expired" "$code $(json 'd.get("reason", "")' <"$WORK/body")"
}
expect_expired "continuing a list at a compacted revision is 410 Expired" \
    "$W/e2e-bulk/widgets?limit=10&continue=$old_continue"
expect_expired "a list at a compacted resourceVersion is 410 Expired" \
    "$W/e2e-bulk/widgets?limit=10&resourceVersion=$old&resourceVersionMatch=Exact"
code=$(curl_api "$W/e2e-bulk/widgets?limit=10&resourceVersion=$compacted&resourceVersionMatch=Exact")
expect_eq "a list at the compact revision works" "200 10" "$code $(json 'len(d.get("items", []))' <"$WORK/body")"
expect_eq "a fresh paginated list works after compaction" "$((BULK + 6))" \
    "$(list_pages e2e-bulk "$CHUNK" | cut -d' ' -f2- | wc -w)"

compaction_to=$(wc -l <"$API_LOG")

step "restart $BACKEND under the running server"
create e2e-watch before-restart 1
watch_expect w "the watch before the restart" \
    "ADDED w1" "MODIFIED w1" "MODIFIED w1" "MODIFIED w1" "DELETED w1" "ADDED before-restart"
# e2e_objects: every widget with its resourceVersion, through the server; e2e_keys: their keys.
e2e_objects() {
    curl_api "/apis/$GROUP/v1/widgets" >/dev/null
    json '"\n".join(sorted("%s/%s %s" % (i["metadata"]["namespace"], i["metadata"]["name"],
        i["metadata"]["resourceVersion"]) for i in d["items"]))' <"$WORK/body"
}
e2e_keys() { etcd_keys "$PREFIX/$GROUP/widgets/"; }
restart_store store_ready /readyz/etcd
restart_from=$RESTART_FROM

step "watches and writes after the restart"
# A write right after the restart can still meet a reconnecting client: retry for a while.
deadline=$((SECONDS + 30))
until [ "$(api POST "$W/e2e-watch/widgets" "$JSON" "$(widget e2e-watch after-restart 1)")" = 201 ]; do
    ((SECONDS < deadline)) || { bad "create a widget after the restart: $(head -c 300 "$WORK/body")"; break; }
    sleep 1
done
watch_expect w "the watch opened before the restart sees the new widget" \
    "ADDED w1" "MODIFIED w1" "MODIFIED w1" "MODIFIED w1" "DELETED w1" "ADDED before-restart" "ADDED after-restart"
restart_to=$(wc -l <"$API_LOG")
watch_start w2 e2e-watch
patch e2e-watch after-restart '{"spec":{"size":5}}'
expect_api "delete a widget after the restart" 200 DELETE "$W/e2e-watch/widgets/before-restart"
watch_expect w2 "a watch opened after the restart sees the changes" "MODIFIED after-restart" "DELETED before-restart"
expect_eq "a list after the restart" "$(printf '%s\n' after-restart sentinel)" "$(names e2e-watch)"

step "delete the bulk widgets at once"
expect_eq "deletecollection answers 200 with the $((BULK + 6)) deleted widgets" "200 $((BULK + 6))" \
    "$(curl_api "$W/e2e-bulk/widgets" -X DELETE --max-time 60) $(json 'len(d["items"])' <"$WORK/body")"
expect_eq "none listed afterwards" "" "$(names e2e-bulk)"
expect_eq "... and no key left in the store" 0 \
    "$("${ETCDCTL[@]}" get "$PREFIX/$GROUP/widgets/e2e-bulk/" --prefix --limit=1 -w json | json 'd.get("count", 0)')"

step "the server's log"
if ! kill -0 "$API_PID" 2>/dev/null; then die "apiextensions-apiserver is no longer running"; fi
if python3 "$REPO/conformance/kube-apiserver/check_log.py" "$HERE/allowed-log-errors.txt" "$API_LOG" \
    "startup=0:$startup_to" "compaction=$compaction_from:$compaction_to" \
    "restart=$restart_from:$restart_to" "after-restart=$restart_from:" >"$WORK/log-check" 2>&1; then
    ok "no storage error in the server's log outside allowed-log-errors.txt"
else
    bad "the server's log has storage errors that allowed-log-errors.txt does not list"
fi
sed 's/^/   /' "$WORK/log-check"
