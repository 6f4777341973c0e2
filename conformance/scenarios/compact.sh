# Compaction: reads below the compact revision fail, at/after it work; re-compacting errors.
for i in 1 2 3 4 5; do $ETCDCTL put k "v$i" >/dev/null || echo "setup put failed"; done   # revs 2..6
$ETCDCTL put other o >/dev/null   # rev 7
$ETCDCTL del other >/dev/null     # rev 8
section 'before compaction every revision is readable'
e get k --rev 2 -w json
section 'compact 4'
e compact 4
section 'get --rev below the compact revision'
e get k --rev 3
e get k --rev 1 -w json
e get --prefix "" --rev 2 -w json
section 'get --rev at the compact revision works'
e get k --rev 4 -w json
e get k --rev 5 -w json
section 'current reads are unaffected'
e get --prefix "" -w json
section 'compacting again at the same or a lower revision'
e compact 4
e compact 3
section 'compacting a future revision'
e compact 9
e compact 100
section 'compacting at the current revision works'
e compact 8
e get k --rev 7
e get k --rev 8 -w json
section 'compaction does not bump the revision'
e get k -w json
section 'deleted key history is gone after compaction'
e get other --rev 7
e get other --rev 8 -w json
section '--physical'
$ETCDCTL put k v6 >/dev/null   # rev 9
e compact 9 --physical
e get k --rev 9 -w json
e get --prefix "" --keys-only -w json
