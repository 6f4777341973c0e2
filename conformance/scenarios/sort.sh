# --sort-by KEY|CREATE|MODIFY|VERSION|VALUE with --order ASCEND|DESCEND (no ties).
# create order: c a b   mod order: b c a   version: b=1 c=2 a=3   value: b(2) c(4) a(6)
$ETCDCTL put c 1 >/dev/null   # rev 2
$ETCDCTL put a 3 >/dev/null   # rev 3
$ETCDCTL put b 2 >/dev/null   # rev 4
$ETCDCTL put c 4 >/dev/null   # rev 5
$ETCDCTL put a 5 >/dev/null   # rev 6
$ETCDCTL put a 6 >/dev/null   # rev 7
for by in KEY CREATE MODIFY VERSION VALUE; do
  for order in ASCEND DESCEND; do
    section "sort-by=$by order=$order"
    e get --prefix "" --sort-by="$by" --order="$order"
  done
done
section 'only --order (sort target defaults to key)'
e get --prefix "" --order=DESCEND --keys-only
section 'only --sort-by'
e get --prefix "" --sort-by=MODIFY --keys-only
section 'sort then limit (sorting applies before the limit)'
e get --prefix "" --sort-by=VALUE --order=DESCEND --limit 2 -w json
e get --prefix "" --sort-by=CREATE --order=ASCEND --limit 1 -w json
section 'sort on a range at an older revision (a and b tie at version 1: etcd keeps ascending key order among ties, also for DESCEND)'
e get a z --sort-by=VERSION --order=DESCEND --rev 5 -w json
e get a z --sort-by=VERSION --order=ASCEND --rev 5 --keys-only
section 'invalid sort target'
e get --prefix "" --sort-by=BOGUS
