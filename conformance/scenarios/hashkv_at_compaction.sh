# etcd-version: 3.5
# HashKV at exactly the revision of a compaction. etcd answers it with the hash it took while
# compacting (from the previous compaction up), kept in memory until it restarts; etcdsql
# computes it from the store as it is, as etcd does after a restart (see README, Known
# differences).
$ETCDCTL put a 1 >/dev/null
$ETCDCTL put b 2 >/dev/null
$ETCDCTL put a 3 >/dev/null
$ETCDCTL del b >/dev/null
e endpoint hashkv -w json --rev=4
e compact 4
e endpoint hashkv -w json --rev=4
e endpoint hashkv -w json
