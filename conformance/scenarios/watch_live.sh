# Live watches: single key vs --prefix vs range vs every key, running while the
# writes happen. Every watch starts at revision 2 (the first write on a fresh
# store), so an event written before etcdctl connected is replayed and the
# output does not depend on timing; the first write is awaited by every watch
# before the others, so those arrive live.
watch_bg key    --rev 2 l/a
watch_bg prefix --rev 2 --prefix l/
watch_bg range  --rev 2 l/a l/c
watch_bg all    --rev 2 --prefix ""
watch_bg json   --rev 2 --prefix l/ -w json
$ETCDCTL put l/a 1 >/dev/null                   # rev 2: every watch
for w in key prefix range all; do wait_lines $w 3; done
wait_lines json 1
$ETCDCTL put l/b 1 >/dev/null                   # rev 3: prefix, range, all
wait_lines json 2
$ETCDCTL put l/c 1 >/dev/null                   # rev 4: prefix, all (range end is exclusive)
wait_lines json 3
$ETCDCTL put l/ 0 >/dev/null                    # rev 5: prefix, all (the prefix itself)
wait_lines json 4
$ETCDCTL put l 0 >/dev/null                     # rev 6: all
$ETCDCTL put m 1 >/dev/null                     # rev 7: all
$ETCDCTL put l/a 2 >/dev/null                   # rev 8: every watch
wait_lines json 5
$ETCDCTL txn >/dev/null <<'TXN'                 # rev 9: two events in one revision

put l/b 2
put l/d 1


TXN
wait_lines json 6
$ETCDCTL del --prefix l/ >/dev/null             # rev 10: five deletes in one revision
wait_lines json 7
$ETCDCTL del l/a >/dev/null                     # no revision: nothing to delete
$ETCDCTL put l/z end >/dev/null                 # rev 11: last event of the prefix watches
wait_lines key 9
wait_lines range 18
wait_for prefix end
wait_for all end
wait_lines json 8
section 'watch l/a (single key)'
bg_stop key
section 'watch l/a l/c (range [l/a, l/c))'
bg_stop range
section 'watch --prefix l/'
bg_stop prefix
section 'watch --prefix "" (every key)'
bg_stop all
section 'watch --prefix l/ -w json (one response per revision, a revision is never split)'
bg_stop json
section 'watch l/c l/a (inverted range) is refused'
watch_lines 0 10 l/c l/a
