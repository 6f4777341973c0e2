# Watch replay from history (start revision given, so no timing dependence).
$ETCDCTL put w/a 1 >/dev/null   # rev 2
$ETCDCTL put w/b 2 >/dev/null   # rev 3
$ETCDCTL put w/a 3 >/dev/null   # rev 4
$ETCDCTL del w/b >/dev/null     # rev 5
$ETCDCTL put x 9 >/dev/null     # rev 6
section 'watch --prefix w/ from revision 1 (4 events, 3 lines each)'
watch_lines 12 10 --rev 1 --prefix w/
section 'watch single key with --prev-kv'
watch_lines 8 10 --rev 1 --prev-kv w/a
section 'watch a range [w/a, w/b) from revision 3'
watch_lines 3 10 --rev 3 w/a w/b
