# --limit with count and more, --keys-only.
# (etcdctl 3.4 has no --count-only flag; count is asserted through -w json.)
for i in 1 2 3 4 5; do $ETCDCTL put "p/$i" "value-$i" >/dev/null || echo "setup put failed"; done
$ETCDCTL put q x >/dev/null
section 'limit 2 of 5'
e get --prefix p/ --limit 2 -w json
section 'limit equal to count'
e get --prefix p/ --limit 5 -w json
section 'limit above count'
e get --prefix p/ --limit 10 -w json
section 'limit 0 = unlimited'
e get --prefix p/ --limit 0 -w json
section 'count is counted from the continue key, not from the prefix start'
e get p/3 p0 --limit 1 -w json
e get p/5 p0 --limit 1 -w json
section 'limit with keys-only'
e get --prefix p/ --limit 2 --keys-only -w json
e get --prefix p/ --limit 2 --keys-only
section 'count with limit 1 and keys-only'
e get --prefix zz --limit 1 --keys-only -w json
e get p/1 --limit 1 --keys-only -w json
section 'limit at an older revision'
$ETCDCTL del p/1 >/dev/null
e get --prefix p/ --limit 2 --rev 6 -w json
e get --prefix p/ --limit 2 -w json
section 'limit 1 on the whole keyspace (kube-apiserver reads header.revision this way)'
e get --prefix "" --limit 1 -w json
