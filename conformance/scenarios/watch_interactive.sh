# etcdctl watch -i: several watches on one gRPC stream, fed on stdin. Each
# watch starts at a known revision and its output is awaited before the next
# command, so the interleaving of the watches' output is fixed. etcdctl 3.4's
# interactive mode knows only `watch` and `progress` (no `cancel`): the cancels
# here are the server's (compacted start revision, empty range). Closing stdin
# ends etcdctl (exit 3).
$ETCDCTL put c 1 >/dev/null      # rev 2
$ETCDCTL put d 1 >/dev/null      # rev 3
$ETCDCTL put e 1 >/dev/null      # rev 4
$ETCDCTL del c >/dev/null        # rev 5
$ETCDCTL compact 2 >/dev/null
watch_i iw
send iw 'watch --rev 6 a'                     # W1: single key, from the next revision
$ETCDCTL put a 1 >/dev/null      # rev 6: W1
wait_lines iw 3
send iw 'watch --rev 7 --prev-kv --prefix b/' # W2: prefix with prev_kv
$ETCDCTL put b/1 x >/dev/null    # rev 7: W2
wait_lines iw 6
send iw 'watch --rev 2 c e'                   # W3: range [c, e) replayed from the compact revision
wait_lines iw 15
send iw 'watch --rev 1 z'                     # W4: below the compact revision: canceled
wait_lines iw 16
send iw 'watch e c'                           # W5: empty range: canceled
wait_lines iw 17
send iw 'cancel 1'                            # not a 3.4 interactive command
wait_lines iw 18
$ETCDCTL put a 2 >/dev/null      # rev 8: W1
wait_lines iw 21
$ETCDCTL put b/1 y >/dev/null    # rev 9: W2, with prev_kv
wait_lines iw 26
$ETCDCTL put d 2 >/dev/null      # rev 10: W3, live now
wait_lines iw 29
$ETCDCTL put e 2 >/dev/null      # rev 11: nobody (outside W3, W5 is gone)
$ETCDCTL del b/1 >/dev/null      # rev 12: W2, with prev_kv
wait_lines iw 34
$ETCDCTL put a 3 >/dev/null      # rev 13: W1
wait_lines iw 37
section 'watch -i: five watches, two canceled by the server, one unknown command'
close_stdin iw
