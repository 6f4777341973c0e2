# watch --rev: replay from past revisions across deletes and re-creations,
# multi-event revisions, and a start revision in the future.
$ETCDCTL put k/a 1 >/dev/null          # rev 2
$ETCDCTL put k/b 1 >/dev/null          # rev 3
$ETCDCTL put k/a 2 >/dev/null          # rev 4
$ETCDCTL del k/a >/dev/null            # rev 5
$ETCDCTL put k/a 3 >/dev/null          # rev 6: re-created
$ETCDCTL txn >/dev/null <<'TXN'

put k/b 2
put k/c 1


TXN
# rev 7: two events
$ETCDCTL del --prefix k/ >/dev/null    # rev 8: three deletes
$ETCDCTL put k/a 4 >/dev/null          # rev 9
$ETCDCTL put other 1 >/dev/null        # rev 10
section 'watch --prefix k/ --rev 1: the whole history'
watch_lines 33 10 --prefix k/ --rev 1
section 'watch k/a --rev 4: update, delete, re-create, delete, re-create'
watch_lines 15 10 k/a --rev 4
section 'watch k/a --rev 5: starts at the delete'
watch_lines 12 10 k/a --rev 5
section 'watch --prefix k/ --rev 7: the txn revision and the three deletes'
watch_lines 18 10 --prefix k/ --rev 7
section 'watch --prefix k/ --rev 9 -w json: one event replayed, header at the current revision'
watch_lines 1 10 --prefix k/ --rev 9 -w json
section 'watch k/b --rev 9: nothing to replay (k/b deleted at 8), then a live put'
watch_bg kb --rev 9 k/b
$ETCDCTL put k/b 3 >/dev/null          # rev 11
wait_lines kb 3
bg_stop kb
section 'watch k/a --rev 13: a future start revision skips revision 12'
watch_bg future --rev 13 k/a
$ETCDCTL put k/a 5 >/dev/null          # rev 12: before the start revision
$ETCDCTL put k/a 6 >/dev/null          # rev 13
wait_for future 6
bg_stop future
section 'watch k/a --rev 14 -w json: live events carry the header of their revision'
watch_bg json --rev 14 -w json k/a
$ETCDCTL put k/a 7 >/dev/null          # rev 14
wait_lines json 1
$ETCDCTL del k/a >/dev/null            # rev 15
wait_lines json 2
bg_stop json
