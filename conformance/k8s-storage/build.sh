#!/usr/bin/env bash
# Builds Kubernetes 1.36's storage layer in two forms, and fetches the etcd they are checked
# against, from Debian's unstable suite ("sid") only:
#
#   golang-k8s-apiserver-dev   Kubernetes' own storage test suite (k8s.io/apiserver/pkg/storage/
#                              etcd3, with the shared tests of pkg/storage/testing; 0.36.x =
#                              Kubernetes 1.36.x), compiled into etcd3.test
#   golang-k8s-apiextensions-apiserver-dev
#                              the API server for CustomResourceDefinitions (its main.go,
#                              unchanged), compiled into apiextensions-apiserver; both with their
#                              whole closure of golang-*-dev packages (about 300)
#   golang-1.26-go/-src        the Go that compiles them, in GOPATH mode (no module downloads)
#   etcd-server                real etcd 3.5, the reference server
#
# The test binary is compiled with `go test -overlay`, which swaps the suite's test-server helper
# for test_server.go beside this script (each test gets a fresh external server process); the
# packaged files stay as they are.
#
# Packages come through a private apt configuration (its own sources list, lists, cache and an
# empty status file, all passed with -o), so the system's apt sources are left untouched. The
# result is cached, keyed by every package file's name (so by every version) and the overlay:
#
#   ${ETCDSQL_CACHE_DIR:-~/.cache/etcdsql}/k8s-storage/<key>/
#       {etcd3.test,apiextensions-apiserver,etcd,versions.txt}
#
# Prints that folder as the last line on stdout; progress goes to stderr. Cold: about 6 minutes
# on 2 cores (download 15 s, unpack 40 s, compile 5 min); warm: seconds.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SUITE=k8s.io/apiserver/pkg/storage/etcd3
SUITE_PACKAGE=golang-k8s-apiserver-dev
SERVER=k8s.io/apiextensions-apiserver
SERVER_PACKAGE=golang-k8s-apiextensions-apiserver-dev
GO_VERSION=1.26
MIRROR=${ETCDSQL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
ROOT=${ETCDSQL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/etcdsql}/k8s-storage

log() { echo "k8s-storage/build.sh: $*" >&2; }
die() {
    echo "k8s-storage/build.sh: error: $*" >&2
    exit 1
}
for tool in apt-get apt-cache dpkg-deb sha256sum flock; do
    command -v "$tool" >/dev/null || die "missing tool: $tool"
done

apt_dir=$ROOT/apt
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
: >"$apt_dir/status"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR sid main" \
    >"$apt_dir/sources.list"
apt_opts=(
    -o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::State::Status=$apt_dir/status"
    -o "Dir::Cache=$apt_dir/cache" -o Dir::Etc::Preferences=/dev/null
    -o Dir::Etc::PreferencesParts=/dev/null
)
# As root apt downloads as `_apt`, which cannot write into these folders.
[ "$(id -u)" -ne 0 ] || apt_opts+=(-o APT::Sandbox::User=root)

mkdir -p "$ROOT"
exec 9>"$ROOT/lock"
flock -w 1800 9 || die "timed out waiting for another build (lock $ROOT/lock)"

log "apt-get update (sid, private lists)"
apt-get "${apt_opts[@]}" update -qq >&2 || die "cannot read sid's package lists from $MIRROR"

# The dependency closure: every Go source package the two need, and the toolchain.
closure=$(apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests \
    --no-conflicts --no-breaks --no-replaces --no-enhances "$SUITE_PACKAGE" "$SERVER_PACKAGE" |
    grep -E '^golang-.*-dev$' | sort -u) || die "sid has no $SUITE_PACKAGE or no $SERVER_PACKAGE"
packages=($closure "golang-$GO_VERSION-go" "golang-$GO_VERSION-src" etcd-server)

# One line per package file: name_version_arch.deb. Their list is the cache key.
uris=$(apt-get "${apt_opts[@]}" download --print-uris "${packages[@]}" 2>&1) ||
    die "sid cannot supply a consistent package set: $(grep -m1 '^E:' <<<"$uris")"
files=$(sed -n "s/^'[^']*' \([^ ]*\.deb\) .*/\1/p" <<<"$uris" | sort)
[ "$(wc -l <<<"$files")" -eq "${#packages[@]}" ] ||
    die "apt found $(wc -l <<<"$files") of ${#packages[@]} packages"
key=$( (echo "$files"; cat "$HERE/test_server.go") | sha256sum | cut -c1-16)
dest=$ROOT/$key
if [ -f "$dest/complete" ]; then
    log "cached: $dest"
    echo "$dest"
    exit 0
fi

# Always the same folder, so Go's build cache recognises the sources of an earlier build.
work=$ROOT/unpacked
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
log "downloading ${#packages[@]} packages"
(cd "$work" && apt-get "${apt_opts[@]}" download -q "${packages[@]}" >/dev/null 2>"$work/download.log") ||
    die "download failed: $(grep -m1 '^E:' "$work/download.log" || tail -1 "$work/download.log")"
log "unpacking"
for deb in "$work"/*.deb; do
    dpkg-deb -x "$deb" "$work/root" || die "cannot unpack $(basename "$deb")"
done
rm -f "$work"/*.deb

export GOROOT=$work/root/usr/lib/go-$GO_VERSION GOPATH=$work/root/usr/share/gocode
export GO111MODULE=off GOPROXY=off GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
export GOCACHE=$ROOT/gocache
helper=$GOPATH/src/$SUITE/testserver/test_server.go
[ -f "$helper" ] || die "$SUITE_PACKAGE has no $SUITE/testserver/test_server.go to replace"
printf '{"Replace":{"%s":"%s"}}\n' "$helper" "$HERE/test_server.go" >"$work/overlay.json"
log "compiling the $SUITE tests (about 5 minutes cold)"
mkdir -p "$dest.tmp"
(cd "$work" && "$GOROOT/bin/go" test -c -overlay "$work/overlay.json" -o "$dest.tmp/etcd3.test" "$SUITE") >&2 ||
    die "compiling the suite failed"
# It reports its version (/version) from these, as a release build does: 0.36.4 is v1.36.4.
server_version=$(sed -n "s/^${SERVER_PACKAGE}_0\.\([0-9]*\)\.\([0-9]*\)-.*/1 \1 \2/p" <<<"$files")
read -r major minor patch <<<"$server_version"
[ -n "$patch" ] || die "cannot tell the Kubernetes version of $SERVER_PACKAGE"
version_pkg=k8s.io/component-base/version
log "compiling $SERVER (v$major.$minor.$patch)"
(cd "$work" && "$GOROOT/bin/go" build -o "$dest.tmp/apiextensions-apiserver" \
    -ldflags "-X $version_pkg.gitVersion=v$major.$minor.$patch -X $version_pkg.gitMajor=$major -X $version_pkg.gitMinor=$minor" \
    "$SERVER") >&2 || die "compiling $SERVER failed"
cp "$work/root/usr/bin/etcd" "$dest.tmp/"
echo "$files" >"$dest.tmp/versions.txt"
touch "$dest.tmp/complete"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
log "built: $dest"
echo "$dest"
