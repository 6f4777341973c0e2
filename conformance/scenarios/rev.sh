# Reads at older revisions (--rev); header.revision is always the current revision.
$ETCDCTL put k v1 >/dev/null   # rev 2
$ETCDCTL put k v2 >/dev/null   # rev 3
$ETCDCTL put j j1 >/dev/null   # rev 4
$ETCDCTL del k >/dev/null      # rev 5
$ETCDCTL put k v3 >/dev/null   # rev 6
section 'get k at every revision'
for r in 1 2 3 4 5 6; do echo "-- rev $r"; e get k --rev "$r" -w json; done
section '--rev 0 means current'
e get k --rev 0 -w json
section 'range reads at old revisions'
e get --prefix "" --rev 3 -w json
e get --prefix "" --rev 5 -w json
e get --prefix "" --rev 4 --keys-only -w json
section 'future revision'
e get k --rev 7
e get k --rev 1000 -w json
section 'a read-only get does not bump the revision'
e get k -w json
