#!/usr/bin/env bash
# End-to-end: a real kube-apiserver (1.20.2, see build.sh) stores its objects in etcdsql.
#
#   conformance/kube-apiserver/run.sh [sqlite|postgres|mysql|etcd|etcd-to-sqlite]
#
#   sqlite    etcdsql on a fresh SQLite file (the default)
#   postgres  etcdsql on a fresh PostgreSQL database etcdsql_kube_<pid> on $ETCDSQL_POSTGRES
#             (a server URL, default postgres://postgres@127.0.0.1:5432), dropped at the end
#   etcd      real etcd (Debian's etcd-server) instead: the same scenario as a reference, to
#             tell an etcdsql bug from a scenario bug
#   etcd-to-sqlite  a cut-over: real etcd until the store restart, where its data moves into
#             etcdsql (`import --from-etcd --with-history`, on SQLite), which then serves the
#             same running kube-apiserver in etcd's place for the rest of the scenario
#
# Starts the store and kube-apiserver on free 127.0.0.1 ports (no other traffic), then drives
# kube-apiserver with kubectl: namespaces, configmaps, secrets, deployments and events; updates,
# patches and conflicts; paginated lists over hundreds of objects; watch streams; leases;
# kube-apiserver's own compaction and 410 Gone for compacted resource versions; a restart of
# the store under the running apiserver. Finally kube-apiserver's log must hold no storage error
# that allowed-log-errors.txt does not list with a reason. Every wait is bounded; everything
# started is stopped on exit. The last line is "kube-apiserver: N passed, M failed".
#
# Environment: ETCDSQL_BIN (default target/debug/etcdsql), ETCDSQL_POSTGRES, ETCD_BIN,
# ETCDCTL_BIN, KUBE_BIN_DIR (a folder with kube-apiserver and kubectl to use instead of
# build.sh's), KEEP_WORK=1 (keep the temporary folder with the logs even on success).
# See conformance/kube-apiserver/README.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BACKEND=${1:-sqlite}
case "$BACKEND" in
sqlite | postgres | mysql | etcd | etcd-to-sqlite) ;;
*)
    echo "usage: $0 [sqlite|postgres|mysql|etcd|etcd-to-sqlite]" >&2
    exit 2
    ;;
esac

ETCDSQL_BIN=${ETCDSQL_BIN:-$REPO/target/debug/etcdsql}
ETCD_BIN=${ETCD_BIN:-etcd}
ETCDCTL_BIN=${ETCDCTL_BIN:-etcdctl}
PG_SERVER=${ETCDSQL_POSTGRES:-${ETCDSQL_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432}}
MY_SERVER=${ETCDSQL_MYSQL:-${ETCDSQL_TEST_MYSQL:-mysql://root@127.0.0.1:3306}}
COMPACTION_INTERVAL=30 # seconds: kube-apiserver's --etcd-compaction-interval
BULK=300               # configmaps listed page by page
CHUNK=40               # kubectl --chunk-size for them: 8 pages
UA=etcdsql-e2e         # curl's own user agent makes this kube-apiserver build crash (README)

# Only loopback traffic: no proxies, no inherited etcd/etcdctl configuration.
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY grpc_proxy GRPC_PROXY
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost
while IFS= read -r v; do unset "$v"; done < <(compgen -e | grep -E '^(ETCD_|ETCDCTL_)' || true)
export ETCDCTL_API=3

need=()
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
if [ ${#need[@]} -gt 0 ]; then
    echo "installing ${need[*]}"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
for tool in python3 curl openssl timeout flock "$ETCDCTL_BIN"; do
    command -v "$tool" >/dev/null 2>&1 || { echo "run.sh: missing tool: $tool" >&2; exit 2; }
done
case "$BACKEND" in
etcd | etcd-to-sqlite) command -v "$ETCD_BIN" >/dev/null 2>&1 || { echo "run.sh: missing $ETCD_BIN (apt-get install etcd-server)" >&2; exit 2; } ;;&
etcd) ;;
*) [ -x "$ETCDSQL_BIN" ] || { echo "run.sh: no etcdsql binary at $ETCDSQL_BIN (cargo build, or set ETCDSQL_BIN)" >&2; exit 2; } ;;
esac
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

echo "kube-apiserver end-to-end on $BACKEND"
KUBE_DIR=${KUBE_BIN_DIR:-}
[ -n "$KUBE_DIR" ] || KUBE_DIR=$(bash "$HERE/build.sh" | tail -n1)
KUBE_APISERVER=$KUBE_DIR/kube-apiserver
KUBECTL=$KUBE_DIR/kubectl

WORK=$(mktemp -d "${TMPDIR:-/tmp}/etcdsql-kube-e2e.XXXXXX")
E2E_NAME=kube-apiserver
PG_PREFIX=etcdsql_kube_
# shellcheck source=../e2e-lib.sh
source "$HERE/../e2e-lib.sh"

TOKEN=$(openssl rand -hex 16)
# curl_api PATH [CURL ARGS...]: prints the HTTP status; the body goes to $WORK/body.
curl_api() {
    local path=$1
    shift
    curl -sk -A "$UA" --max-time 20 -H "Authorization: Bearer $TOKEN" \
        -o "$WORK/body" -w '%{http_code}' "$@" "$API_URL$path" || true
}
ready() { [ "$(curl_api /readyz)" = 200 ]; }
wait_ready() { # wait_ready SECONDS
    local deadline=$((SECONDS + $1))
    until ready; do
        kill -0 "$API_PID" 2>/dev/null || return 1
        ((SECONDS < deadline)) || return 1
        sleep 0.5
    done
}

# kubectl config set-* crashes in this kubectl build (the same vendored JSON library as the
# pretty-printing crash in README), so the kubeconfig is written by hand.
cat >"$WORK/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: $API_URL
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: $TOKEN
contexts:
- name: e2e
  context: {cluster: e2e, user: admin}
current-context: e2e
EOF
kc() { "$KUBECTL" --kubeconfig="$WORK/kubeconfig" --cache-dir="$WORK/kube-cache" "$@"; }
k() { kc --request-timeout=60s "$@"; }

# Watches: watch_start NAME NAMESPACE RESOURCE runs `kubectl get -w --output-watch-events` in the
# background, one "TYPE NAME" line per event in $WORK/watch.NAME; the objects that exist when
# it starts come first as ADDED.
watch_start() {
    kc get "$3" -n "$2" -w --output-watch-events \
        -o jsonpath='{.type} {.object.metadata.name}{"\n"}' \
        >"$WORK/watch.$1" 2>"$WORK/watch.$1.err" </dev/null &
    BG_PIDS+=($!)
    eval "WATCH_PID_$1=$!"
}
# e2e_objects: every configmap, secret and deployment in the e2e namespaces with its resourceVersion.
e2e_objects() {
    k get configmaps,secrets,deployments -A --chunk-size=100 \
        -o jsonpath='{range .items[*]}{.kind} {.metadata.namespace}/{.metadata.name} {.metadata.resourceVersion}{"\n"}{end}' |
        { grep ' e2e-' || true; } | LC_ALL=C sort
}

# ---------------------------------------------------------------------------------------------
step "start ${BACKEND} and kube-apiserver $("$KUBE_APISERVER" --version | cut -d' ' -f2)"
start_store
openssl genrsa -out "$WORK/sa.key" 2048 2>/dev/null
openssl rsa -in "$WORK/sa.key" -pubout -out "$WORK/sa.pub" 2>/dev/null
echo "$TOKEN,admin,admin,system:masters" >"$WORK/tokens.csv"
# --watch-cache-sizes=secrets#0: secrets skip the watch cache, so their lists and watches go
# straight to the store, each kubectl watch being an etcd watch of its own.
# --advertise-address 127.0.0.1 keeps everything on loopback (kube-apiserver refuses to put
# it into the `kubernetes` Endpoints, which allowed-log-errors.txt explains).
"$KUBE_APISERVER" \
    --etcd-servers="$STORE_URL" \
    --etcd-compaction-interval="${COMPACTION_INTERVAL}s" \
    --watch-cache-sizes='secrets#0' \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 \
    --secure-port="$API_PORT" --insecure-port=0 \
    --cert-dir="$WORK/apiserver-certs" \
    --service-account-issuer=https://kubernetes.default.svc \
    --service-account-key-file="$WORK/sa.pub" \
    --service-account-signing-key-file="$WORK/sa.key" \
    --token-auth-file="$WORK/tokens.csv" \
    --authorization-mode=AlwaysAllow --anonymous-auth=false \
    --service-cluster-ip-range=10.0.0.0/24 \
    --profiling=false \
    >"$API_LOG" 2>&1 </dev/null &
API_PID=$!
API_START=$SECONDS
wait_ready 90 || die "kube-apiserver not ready within 90 s"
startup_to=$(wc -l <"$API_LOG")
ok "kube-apiserver /readyz after $((SECONDS - API_START)) s"

step "namespaces"
for ns in e2e-a e2e-watch e2e-bulk e2e-gone; do
    k create namespace "$ns" >/dev/null
done
expect_eq "namespaces are Active" "Active Active Active Active" \
    "$(k get ns e2e-a e2e-watch e2e-bulk e2e-gone -o jsonpath='{.items[*].status.phase}')"
expect_eq "creating an existing namespace is AlreadyExists" "AlreadyExists" \
    "$(k create namespace e2e-a 2>&1 | sed -n 's/^Error from server (\([A-Za-z]*\)).*/\1/p')"

step "watches"
k -n e2e-watch create configmap sentinel --from-literal=k=v >/dev/null
k -n e2e-watch create secret generic sentinel --from-literal=k=v >/dev/null
k -n e2e-watch create deployment sentinel --image=registry.invalid/e2e/sentinel:1 >/dev/null
# cm goes through the watch cache, sec straight to the store; both stay open across the restart.
watch_start cm e2e-watch configmaps
watch_start sec e2e-watch secrets
watch_start deploy e2e-watch deployments
watch_expect cm "configmap watch lists the existing object" "ADDED sentinel"
watch_expect sec "secret watch lists the existing object" "ADDED sentinel"
watch_expect deploy "deployment watch lists the existing object" "ADDED sentinel"

k -n e2e-watch create configmap w1 --from-literal=k=1 >/dev/null
k -n e2e-watch label configmap w1 step=labelled >/dev/null
k -n e2e-watch patch configmap w1 -p '{"data":{"k":"2"}}' >/dev/null
k -n e2e-watch delete configmap w1 >/dev/null
watch_expect cm "configmap watch: ADDED, MODIFIED, MODIFIED, DELETED in order" \
    "ADDED sentinel" "ADDED w1" "MODIFIED w1" "MODIFIED w1" "DELETED w1"

k -n e2e-watch create secret generic creds --from-literal=password=hunter2 >/dev/null
expect_eq "secret value read back" "hunter2" \
    "$(k -n e2e-watch get secret creds -o jsonpath='{.data.password}' | base64 -d)"
k -n e2e-watch patch secret creds -p '{"stringData":{"password":"hunter3"}}' >/dev/null
expect_eq "patched secret value read back" "hunter3" \
    "$(k -n e2e-watch get secret creds -o jsonpath='{.data.password}' | base64 -d)"
k -n e2e-watch delete secret creds >/dev/null
watch_expect sec "secret watch (no watch cache): ADDED, MODIFIED, DELETED in order" \
    "ADDED sentinel" "ADDED creds" "MODIFIED creds" "DELETED creds"

k -n e2e-watch create deployment web --image=registry.invalid/e2e/web:1 >/dev/null
k -n e2e-watch scale deployment web --replicas=3 >/dev/null
k -n e2e-watch set image deployment/web web=registry.invalid/e2e/web:2 >/dev/null
k -n e2e-watch patch deployment web -p '{"metadata":{"labels":{"tier":"e2e"}}}' >/dev/null
expect_eq "deployment spec after scale, set image and patch (no controllers run)" \
    "3 registry.invalid/e2e/web:2 3 e2e" \
    "$(k -n e2e-watch get deployment web -o jsonpath='{.spec.replicas} {.spec.template.spec.containers[0].image} {.metadata.generation} {.metadata.labels.tier}')"
k -n e2e-watch delete deployment web >/dev/null
watch_expect deploy "deployment watch: ADDED, MODIFIED x3, DELETED in order" \
    "ADDED sentinel" "ADDED web" "MODIFIED web" "MODIFIED web" "MODIFIED web" "DELETED web"

step "updates and conflicts"
k -n e2e-a create configmap conf --from-literal=v=1 >/dev/null
k -n e2e-a get configmap conf -o yaml >"$WORK/stale.yaml"
stale_rv=$(k -n e2e-a get configmap conf -o jsonpath='{.metadata.resourceVersion}')
k -n e2e-a patch configmap conf -p '{"data":{"v":"2"}}' >/dev/null
if out=$(k -n e2e-a replace -f "$WORK/stale.yaml" 2>&1); then
    bad "replace with a stale resourceVersion succeeded"
else
    expect_match "replace with a stale resourceVersion is a Conflict" \
        '^Error from server \(Conflict\).*the object has been modified' "$out"
fi
code=$(curl_api "/api/v1/namespaces/e2e-a/configmaps/conf" -X DELETE -H 'Content-Type: application/json' \
    -d "{\"kind\":\"DeleteOptions\",\"apiVersion\":\"v1\",\"preconditions\":{\"resourceVersion\":\"$stale_rv\"}}")
expect_eq "delete with a stale resourceVersion precondition is 409" "409 Conflict" \
    "$code $(json 'd["reason"]' <"$WORK/body")"
expect_eq "the configmap kept the patched value" "2" \
    "$(k -n e2e-a get configmap conf -o jsonpath='{.data.v}')"
if out=$(k -n e2e-a create configmap conf --from-literal=v=3 2>&1); then
    bad "creating an existing configmap succeeded"
else
    expect_match "creating an existing configmap is AlreadyExists" '^Error from server \(AlreadyExists\)' "$out"
fi
k -n e2e-a apply --server-side --field-manager=e2e -f - >/dev/null <<'EOF'
apiVersion: v1
kind: ConfigMap
metadata: {name: applied, namespace: e2e-a}
data: {a: "1"}
EOF
k -n e2e-a apply --server-side --field-manager=e2e -f - >/dev/null <<'EOF'
apiVersion: v1
kind: ConfigMap
metadata: {name: applied, namespace: e2e-a}
data: {a: "1", b: "2"}
EOF
expect_eq "server-side apply twice" '1 2' "$(k -n e2e-a get configmap applied -o jsonpath='{.data.a} {.data.b}')"
# Eight writers patch one object at once: kube-apiserver's compare-and-swap on the key's
# mod revision fails for all but one of each race and retries; every patch must land.
k -n e2e-a create configmap hot >/dev/null
pids=()
for i in 1 2 3 4 5 6 7 8; do
    k -n e2e-a patch configmap hot --type=merge -p "{\"data\":{\"k$i\":\"$i\"}}" >/dev/null &
    pids+=($!)
done
patch_failures=0
for pid in "${pids[@]}"; do wait "$pid" || patch_failures=$((patch_failures + 1)); done
expect_eq "8 concurrent patches of one configmap all succeed" 0 "$patch_failures"
expect_eq "... and all 8 keys are there" "k1 k2 k3 k4 k5 k6 k7 k8" \
    "$(k -n e2e-a get configmap hot -o json | json '" ".join(sorted(d["data"]))')"

step "$BULK configmaps, listed in pages"
{
    echo "apiVersion: v1"
    echo "kind: List"
    echo "items:"
    for i in $(seq -w 1 "$BULK"); do
        printf -- '- {apiVersion: v1, kind: ConfigMap, metadata: {name: bulk-%s}, data: {index: "%s"}}\n' "$i" "$i"
    done
} >"$WORK/bulk.yaml"
created=$(k -n e2e-bulk create -f "$WORK/bulk.yaml" -o name | wc -l)
expect_eq "created $BULK configmaps" "$BULK" "$created"
seq -f 'configmap/bulk-%03g' 1 "$BULK" >"$WORK/bulk.want"
k -n e2e-bulk get configmaps --chunk-size="$CHUNK" -o name -v=6 >"$WORK/bulk.got" 2>"$WORK/bulk.trace"
expect_eq "kubectl --chunk-size=$CHUNK lists exactly the $BULK configmaps" \
    "$(cat "$WORK/bulk.want")" "$(LC_ALL=C sort "$WORK/bulk.got")"
expect_eq "... in $(((BULK + CHUNK - 1) / CHUNK)) pages" "$(((BULK + CHUNK - 1) / CHUNK))" \
    "$(grep -c "configmaps?.*limit=$CHUNK" "$WORK/bulk.trace" || true)"
# Walk the pages by hand: every page's remainingItemCount comes from the store's count.
names=""
cont=""
pages=0
remaining=""
while :; do
    page=$(k get --raw "/api/v1/namespaces/e2e-bulk/configmaps?limit=100${cont:+&continue=$cont}")
    pages=$((pages + 1))
    names+=$(json '"".join(i["metadata"]["name"] + "\n" for i in d["items"])' <<<"$page")$'\n'
    remaining+="$(json 'd["metadata"].get("remainingItemCount", "-")' <<<"$page") "
    cont=$(json 'd["metadata"].get("continue", "")' <<<"$page")
    if [ -z "$cont" ] || ((pages >= 10)); then break; fi
done
expect_eq "raw pages of 100: remainingItemCount per page" "200 100 - " "$remaining"
expect_eq "raw pages of 100 return each configmap once" "$(sed 's|configmap/||' "$WORK/bulk.want")" \
    "$(sed '/^$/d' <<<"$names" | LC_ALL=C sort)"
first_page=$(k get --raw "/api/v1/namespaces/e2e-bulk/configmaps?limit=10")
first_continue=$(json 'd["metadata"]["continue"]' <<<"$first_page")

step "events carry a lease"
k -n e2e-a create -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Event
metadata: {name: conf.e2e, namespace: e2e-a}
involvedObject: {apiVersion: v1, kind: ConfigMap, namespace: e2e-a, name: conf}
reason: E2E
message: created by the etcdsql end-to-end test
type: Normal
count: 1
source: {component: etcdsql-e2e}
EOF
expect_eq "event listed" "E2E" "$(k -n e2e-a get events conf.e2e -o jsonpath='{.reason}')"
event_lease=$(etcd_keys /registry/events/e2e-a/conf.e2e | awk '{print $4}')
if [ -n "$event_lease" ] && [ "$event_lease" != 0 ]; then
    ok "the event's key has a lease ($event_lease)"
else
    bad "the event's key has a lease (got '$event_lease')"
fi
event_lease_hex=$(printf '%016x' "${event_lease:-0}") # as etcdctl prints lease ids
expect_match "etcdctl lease list shows it" "^$event_lease_hex\$" "$("${ETCDCTL[@]}" lease list)"
expect_match "granted TTL is event-ttl (1 h) + 60 s" "granted with TTL\(3660s\)" \
    "$("${ETCDCTL[@]}" lease timetolive "$event_lease_hex")"
expect_eq "a configmap's key has no lease" 0 "$(etcd_keys /registry/configmaps/e2e-a/conf | awk '{print $4}')"
expect_match "kube-apiserver's master lease key has a lease" '^/registry/masterleases/127.0.0.1 [0-9]+ [0-9]+ [1-9][0-9]*$' \
    "$(etcd_keys /registry/masterleases/)"

step "deletes"
k -n e2e-a delete configmap applied >/dev/null
if out=$(k -n e2e-a get configmap applied 2>&1); then
    bad "a deleted configmap is still there"
else
    expect_match "a deleted configmap is NotFound" '^Error from server \(NotFound\)' "$out"
fi
expect_eq "... and its key is gone from the store" "" "$(etcd_keys /registry/configmaps/e2e-a/applied)"
k delete namespace e2e-gone --wait=false >/dev/null
expect_eq "a deleted namespace is Terminating (no namespace controller runs)" "Terminating" \
    "$(k get namespace e2e-gone -o jsonpath='{.status.phase}')"

step "compaction by kube-apiserver"
wait_compacted $((API_START + 3 * COMPACTION_INTERVAL + 30 - SECONDS)) ||
    die "kube-apiserver did not compact within $((3 * COMPACTION_INTERVAL + 30)) s of its start (compact_rev_key: '$COMPACTED')"
compacted=$COMPACTED
ok "kube-apiserver compacted at revision $compacted, $((SECONDS - API_START)) s after its start"
expect_match "reading below the compact revision is refused" "required revision has been compacted" \
    "$("${ETCDCTL[@]}" get compact_rev_key --rev=$((compacted - 1)) 2>&1)"
expect_match "reading at the compact revision works" "^compact_rev_key$" \
    "$("${ETCDCTL[@]}" get compact_rev_key --rev="$compacted" --keys-only 2>&1)"
old=$((compacted - 2))
compaction_from=$(wc -l <"$API_LOG")
code=$(curl_api "/api/v1/namespaces/e2e-bulk/configmaps?limit=10&resourceVersion=$old&resourceVersionMatch=Exact")
expect_eq "a list at a compacted resourceVersion is 410 Expired" "410 Expired" \
    "$code $(json 'd["reason"]' <"$WORK/body")"
# A continue token is base64 JSON naming the revision of the list it continues; the same token
# rewritten to a compacted revision is what a client paging slowly across a compaction holds.
old_continue=$(python3 -c '
import base64, json, sys
t = json.loads(base64.urlsafe_b64decode(sys.argv[1] + "=" * (-len(sys.argv[1]) % 4)))
t["rv"] = int(sys.argv[2])
print(base64.urlsafe_b64encode(json.dumps(t).encode()).decode().rstrip("="))' "$first_continue" "$old")
code=$(curl_api "/api/v1/namespaces/e2e-bulk/configmaps?limit=10&continue=$old_continue")
expect_eq "continuing a list at a compacted revision is 410 Expired" "410 Expired" \
    "$code $(json 'd["reason"]' <"$WORK/body")"
# Secrets have no watch cache: this is an etcd watch from a compacted revision, which etcd
# cancels; kube-apiserver turns that into an ERROR event with a 410 status and ends the watch.
code=$(curl_api "/api/v1/namespaces/e2e-watch/secrets?watch=1&resourceVersion=$old")
expect_eq "a watch from a compacted resourceVersion ends with ERROR 410" "200 ERROR 410" \
    "$code $(head -n1 "$WORK/body" | json 'd["type"] + " " + str(d["object"]["code"])')"
code=$(curl_api "/api/v1/namespaces/e2e-bulk/configmaps?limit=10&resourceVersion=$compacted&resourceVersionMatch=Exact")
expect_eq "a list at the compact revision works" "200 10" "$code $(json 'len(d["items"])' <"$WORK/body")"
expect_eq "a fresh paginated list works after compaction" "$BULK" \
    "$(k -n e2e-bulk get configmaps --chunk-size="$CHUNK" -o name | wc -l)"
fresh_rv=$(k -n e2e-watch get secrets -o jsonpath='{.metadata.resourceVersion}')
k -n e2e-watch create secret generic after-compaction --from-literal=k=v >/dev/null
code=$(curl_api "/api/v1/namespaces/e2e-watch/secrets?watch=1&resourceVersion=$fresh_rv&timeoutSeconds=2")
expect_eq "a watch from a fresh resourceVersion gets the new secret" "200 ADDED after-compaction" \
    "$code $(head -n1 "$WORK/body" | json 'd["type"] + " " + d["object"]["metadata"]["name"]')"

compaction_to=$(wc -l <"$API_LOG")

step "restart $BACKEND under the running kube-apiserver"
# On reconnecting, the etcd client resumes each watch after the last revision it delivered.
# kube-apiserver's watch cache of a resource that has not changed since before the compaction
# therefore resumes below the compact revision: the store cancels that watch as compacted (so
# does etcd), the cache relists and ends its clients' watches, which then list again. A
# configmap written now keeps the configmap cache above the compact revision, so the kubectl
# watch on it must come through the restart.
k -n e2e-watch create configmap before-restart --from-literal=k=v >/dev/null
watch_expect cm "configmap watch before the restart" \
    "ADDED sentinel" "ADDED w1" "MODIFIED w1" "MODIFIED w1" "DELETED w1" "ADDED before-restart"
# e2e_keys: the store's keys of the e2e objects, with mod revision, version and lease.
e2e_keys() {
    local p
    for p in configmaps secrets deployments namespaces; do etcd_keys "/registry/$p/"; done |
        { grep -E '^/registry/[a-z]+/e2e-' || true; }
}
restart_store ready /readyz
restart_from=$RESTART_FROM
expect_match "the event's lease is still there" "^$event_lease_hex\$" "$("${ETCDCTL[@]}" lease list)"

step "watches and writes after the restart"
# Writes right after the restart can still meet a reconnecting client: retry them for a while.
retry() {
    local deadline=$((SECONDS + 30))
    until "$@" >/dev/null 2>"$WORK/retry.err"; do
        ((SECONDS < deadline)) || { cat "$WORK/retry.err"; return 1; }
        sleep 1
    done
}
retry k -n e2e-watch create configmap after-restart --from-literal=k=v || bad "create a configmap after the restart"
retry k -n e2e-watch create secret generic after-restart --from-literal=k=v || bad "create a secret after the restart"
watch_expect cm "configmap watch opened before the restart sees the new configmap" \
    "ADDED sentinel" "ADDED w1" "MODIFIED w1" "MODIFIED w1" "DELETED w1" "ADDED before-restart" \
    "ADDED after-restart"
watch_expect sec "secret watch opened before the restart sees the new secret" \
    "ADDED sentinel" "ADDED creds" "MODIFIED creds" "DELETED creds" "ADDED after-compaction" \
    "ADDED after-restart"
restart_to=$(wc -l <"$API_LOG")
watch_start cm2 e2e-watch configmaps
watch_start sec2 e2e-watch secrets
watch_expect cm2 "configmap watch opened after the restart lists the objects" \
    "ADDED after-restart" "ADDED before-restart" "ADDED sentinel"
watch_expect sec2 "secret watch opened after the restart lists the objects" \
    "ADDED after-compaction" "ADDED after-restart" "ADDED sentinel"
k -n e2e-watch patch configmap after-restart -p '{"data":{"k":"w"}}' >/dev/null
k -n e2e-watch delete secret after-restart >/dev/null
watch_expect cm2 "... and then its changes" \
    "ADDED after-restart" "ADDED before-restart" "ADDED sentinel" "MODIFIED after-restart"
watch_expect sec2 "... and then its changes" \
    "ADDED after-compaction" "ADDED after-restart" "ADDED sentinel" "DELETED after-restart"

step "delete the $BULK configmaps at once"
# DELETE on the collection: kube-apiserver lists and deletes them itself (kubectl delete --all
# would send one request per object and then wait on each).
expect_eq "deletecollection answers 200 with the $BULK deleted configmaps" "200 $BULK" \
    "$(curl_api /api/v1/namespaces/e2e-bulk/configmaps -X DELETE --max-time 60) $(json 'len(d["items"])' <"$WORK/body")"
expect_eq "none listed afterwards" 0 "$(k -n e2e-bulk get configmaps --chunk-size="$CHUNK" -o name | wc -l)"
expect_eq "... and no key left in the store" 0 \
    "$("${ETCDCTL[@]}" get /registry/configmaps/e2e-bulk/ --prefix --limit=1 -w json | json 'd.get("count", 0)')"

step "kube-apiserver's log"
if ! kill -0 "$API_PID" 2>/dev/null; then die "kube-apiserver is no longer running"; fi
if python3 "$HERE/check_log.py" "$HERE/allowed-log-errors.txt" "$API_LOG" "startup=0:$startup_to" \
    "compaction=$compaction_from:$compaction_to" "restart=$restart_from:$restart_to" \
    "after-restart=$restart_from:" >"$WORK/log-check" 2>&1; then
    ok "no storage error in kube-apiserver's log outside allowed-log-errors.txt"
else
    bad "kube-apiserver's log has storage errors that allowed-log-errors.txt does not list"
fi
sed 's/^/   /' "$WORK/log-check"
