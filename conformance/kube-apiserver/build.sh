#!/usr/bin/env bash
# Obtains the kube-apiserver and kubectl that the end-to-end scenario (run.sh) drives, from
# Debian's packages only:
#
#   kube-apiserver  built from bookworm's source package `kubernetes` (1.20.2, upstream source
#                   with its vendored dependencies) with golang-1.19-go, in GOPATH mode
#                   (GO111MODULE=off): `make gen_openapi`, then hack/make-rules/build.sh
#   kubectl         taken from the binary package `kubernetes-client` built from that same source
#
# Both land in a cache outside the repository, one folder per Debian package version and Go
# version, so a changed source rebuilds and a repeat run costs nothing:
#
#   ${ETCDSQL_CACHE_DIR:-~/.cache/etcdsql}/kube-apiserver/<version>+golang-<go version>/
#
# Prints that folder (holding `kube-apiserver` and `kubectl`) as the last line on stdout;
# progress goes to stderr. A cold build takes about 4 minutes on 2 cores.
#
# `apt-get source` needs deb-src entries, which the machine's sources do not have. They are
# written to a private sources list next to a private lists folder, both passed to apt with -o,
# so the system's apt configuration is left as it is. The deb-src entry points at the archive
# the machine already installs `kubernetes-client` from.
set -euo pipefail

SOURCE_PACKAGE=kubernetes
CLIENT_PACKAGE=kubernetes-client
GO_PACKAGE=golang-1.19-go
GO_BIN=/usr/lib/go-1.19/bin
CACHE_ROOT=${ETCDSQL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/etcdsql}/kube-apiserver

log() { echo "build.sh: $*" >&2; }
die() {
    echo "build.sh: error: $*" >&2
    exit 1
}

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
# As root apt downloads as the `_apt` user, which cannot write into a private folder: download
# as root instead of printing a warning per file.
apt_sandbox=()
[ "$(id -u)" -ne 0 ] || apt_sandbox=(-o APT::Sandbox::User=root)

# candidate PACKAGE: the version apt would install, from the system's package lists.
candidate() {
    apt-cache policy "$1" 2>/dev/null | sed -n 's/^ *Candidate: *//p' | grep -v '^(none)$' || true
}

apt_updated=0
apt_update_once() {
    if [ "$apt_updated" = 0 ]; then
        log "apt-get update"
        $sudo apt-get update -qq >&2
        apt_updated=1
    fi
}

client_version=$(candidate "$CLIENT_PACKAGE")
go_version=$(candidate "$GO_PACKAGE")
if [ -z "$client_version" ] || [ -z "$go_version" ]; then
    apt_update_once
    client_version=$(candidate "$CLIENT_PACKAGE")
    go_version=$(candidate "$GO_PACKAGE")
fi
[ -n "$client_version" ] || die "apt knows no $CLIENT_PACKAGE package (is this Debian bookworm?)"
[ -n "$go_version" ] || die "apt knows no $GO_PACKAGE package (is this Debian bookworm?)"

key="$client_version+golang-$go_version"
dest="$CACHE_ROOT/$key"
if [ -x "$dest/kube-apiserver" ] && [ -x "$dest/kubectl" ] && [ -f "$dest/complete" ]; then
    log "cached: $dest"
    echo "$dest"
    exit 0
fi

mkdir -p "$CACHE_ROOT"
# One build at a time; whoever waited finds the finished cache entry.
exec 9>"$CACHE_ROOT/lock"
flock -w 1800 9 || die "timed out waiting for another build (lock $CACHE_ROOT/lock)"
if [ -f "$dest/complete" ]; then
    log "cached (built meanwhile): $dest"
    echo "$dest"
    exit 0
fi

rm -rf "$CACHE_ROOT"/.staging.* # left by an interrupted build
log "building kube-apiserver from $SOURCE_PACKAGE $client_version with $GO_PACKAGE $go_version"
t0=$SECONDS

need=()
[ -x "$GO_BIN/go" ] || need+=("$GO_PACKAGE")
command -v rsync >/dev/null || need+=(rsync)            # make gen_openapi copies with it
command -v make >/dev/null || need+=(make)
command -v dpkg-source >/dev/null || need+=(dpkg-dev)   # apt-get source unpacks with it
if [ ${#need[@]} -gt 0 ]; then
    apt_update_once
    log "installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >&2
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/etcdsql-kube-build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The archive (URI, suite, component) that offers kubernetes-client at that version, e.g.
# "URI bookworm/main amd64 Packages"; its sources live in the same suite.
origin=$(apt-cache madison "$CLIENT_PACKAGE" |
    awk -F' [|] ' -v v="$client_version" '$2 == v { print $3; exit }')
read -r uri suite_component _ <<<"$origin"
[[ -n $uri && $suite_component == */* ]] ||
    die "cannot tell which archive offers $CLIENT_PACKAGE $client_version (apt-cache madison said: '$origin')"
suite=${suite_component%%/*}
component=${suite_component#*/}

mkdir -p "$work/apt/lists/partial"
echo "deb-src $uri $suite $component" >"$work/apt/sources.list"
apt_private=(
    -o "Dir::Etc::SourceList=$work/apt/sources.list"
    -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$work/apt/lists"
    -o "Dir::Cache::pkgcache="
    -o "Dir::Cache::srcpkgcache="
    "${apt_sandbox[@]}"
)
log "fetching the $SOURCE_PACKAGE source package ($suite $component)"
apt-get "${apt_private[@]}" update -qq >&2 ||
    die "apt-get update with the private deb-src list failed (deb-src $uri $suite $component)"
mkdir -p "$work/src"
(cd "$work/src" && apt-get "${apt_private[@]}" source -qq "$SOURCE_PACKAGE=$client_version" >&2) ||
    die "apt-get source $SOURCE_PACKAGE=$client_version failed (deb-src $uri $suite $component)"
(cd "$work" && apt-get "${apt_sandbox[@]}" download -qq "$CLIENT_PACKAGE=$client_version" >&2) ||
    die "apt-get download $CLIENT_PACKAGE=$client_version failed"

upstream=${client_version#*:}
upstream=${upstream%-*}
upstream=${upstream##*really} # 1.20.5+really1.20.2 is 1.20.2
tree=$(find "$work/src" -mindepth 1 -maxdepth 1 -type d -name "$SOURCE_PACKAGE-*" | head -n1)
[ -n "$tree" ] || die "apt-get source left no $SOURCE_PACKAGE-* folder"

# Kubernetes 1.20 builds in GOPATH mode: the tree must sit at $GOPATH/src/k8s.io/kubernetes.
gopath="$work/gopath"
mkdir -p "$gopath/src/k8s.io"
mv "$tree" "$gopath/src/k8s.io/kubernetes"
log "compiling (log: $work/build.log; about 4 minutes)"
if ! (
    cd "$gopath/src/k8s.io/kubernetes"
    unset GOROOT GOFLAGS GOBIN
    export PATH="$GO_BIN:$PATH" GOPATH="$gopath" GO111MODULE=off CGO_ENABLED=0
    export GOCACHE="$work/gocache" HOME="$work/home"
    export KUBE_GIT_VERSION="v$upstream" KUBE_GIT_TREE_STATE=archive
    make gen_openapi
    hack/make-rules/build.sh cmd/kube-apiserver
) >"$work/build.log" 2>&1; then
    tail -n 40 "$work/build.log" >&2
    die "the kube-apiserver build failed (last lines above)"
fi

staging="$CACHE_ROOT/.staging.$$"
rm -rf "$staging"
mkdir -p "$staging"
cp "$gopath/src/k8s.io/kubernetes/_output/bin/kube-apiserver" "$staging/"
dpkg-deb -x "$work/${CLIENT_PACKAGE}_"*.deb "$work/client"
cp "$work/client/usr/bin/kubectl" "$staging/"
version=$("$staging/kube-apiserver" --version)
[ "$version" = "Kubernetes v$upstream" ] || die "built kube-apiserver says '$version', expected 'Kubernetes v$upstream'"
echo "$key built in $((SECONDS - t0))s" >"$staging/complete"
rm -rf "$dest"
mv "$staging" "$dest"
# Older entries (another package or Go version) are never used again.
find "$CACHE_ROOT" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +
log "built in $((SECONDS - t0))s: $dest"
echo "$dest"
