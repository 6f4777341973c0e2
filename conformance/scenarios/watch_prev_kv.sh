# watch --prev-kv: updates and deletes carry the previous key-value (creations
# do not), live and replayed; -w json shows every field of both.
watch_bg live --rev 2 --prev-kv --prefix p/ -w json
$ETCDCTL put p/a 1 >/dev/null          # rev 2: create, no prev_kv
wait_lines live 1
$ETCDCTL put p/a 2 >/dev/null          # rev 3: update
wait_lines live 2
$ETCDCTL del p/a >/dev/null            # rev 4: delete
wait_lines live 3
$ETCDCTL put p/a 3 >/dev/null          # rev 5: re-create, no prev_kv
wait_lines live 4
$ETCDCTL txn >/dev/null <<'TXN'

put p/a 4
put p/b 1


TXN
# rev 6: update + create in one revision
wait_lines live 5
$ETCDCTL del --prefix p/ >/dev/null    # rev 7: two deletes
wait_lines live 6
$ETCDCTL put p/a "" >/dev/null         # rev 8: empty value
wait_lines live 7
$ETCDCTL put p/a 5 >/dev/null          # rev 9: previous value is empty
wait_lines live 8
section 'live: watch --rev 2 --prev-kv --prefix p/ -w json'
bg_stop live
section 'replayed: watch --rev 2 --prev-kv --prefix p/'
watch_lines 42 10 --rev 2 --prev-kv --prefix p/
section 'replayed: watch --rev 9 --prev-kv p/a -w json (the prev_kv is older than the start revision)'
watch_lines 1 10 --rev 9 --prev-kv p/a -w json
section 'prev_kv of an event whose previous version was compacted away'
$ETCDCTL put q 1 >/dev/null            # rev 10
$ETCDCTL put q 2 >/dev/null            # rev 11
$ETCDCTL put other 1 >/dev/null        # rev 12
e compact 11
watch_lines 1 10 --rev 11 --prev-kv q -w json
section 'prev_kv older than the compact revision, of an event after it'
$ETCDCTL put q 3 >/dev/null            # rev 13: its previous version (rev 11) is below 12
e compact 12
watch_lines 1 10 --rev 13 --prev-kv q -w json
