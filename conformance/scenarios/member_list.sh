# member list -w json (ids, name and peer URLs normalized). A separate scenario so that the
# etcdsql override for it (no peerURLs: no raft peers) stays narrow; see README, Known differences.
$ETCDCTL put a 1 >/dev/null
$ETCDCTL put b 2 >/dev/null
section 'member list (etcd puts no revision in the MemberList header)'
e member list -w json
