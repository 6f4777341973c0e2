# Explicit [key, range_end) ranges: `get KEY END`, `del KEY END`.
for k in a a1 b b1 b2 c c1 d; do $ETCDCTL put "$k" "v-$k" >/dev/null || echo "setup put $k failed"; done
section 'get a c'
e get a c
e get a c -w json
section 'get b c (end exclusive, start inclusive)'
e get b c --keys-only
section 'get b b (empty range)'
e get b b -w json
section 'get c a (end before start)'
e get c a -w json
section 'get a c --rev before some keys existed'
e get a c --rev 4 -w json
section 'del b c'
e del b c
e get a e --keys-only
section 'del a1 c1 --prev-kv'
e del a1 c1 --prev-kv -w json
e get a z --keys-only
