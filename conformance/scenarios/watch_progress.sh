# etcd-flags: --experimental-watch-progress-notify-interval=1s
# etcdsql-flags: --watch-progress-notify-interval=1s
# Watch progress. etcdctl 3.4 has no --progress-notify flag (3.5+), so none of
# its watches asks for periodic progress notifications: with the interval at
# 1s (header lines above), a watch must still get none. What etcdctl 3.4 can
# ask for is a progress request (`progress` in interactive mode): the server
# answers on the stream with the current revision, and etcdctl prints
# "progress notify: REV" once per watch of that stream. Progress is requested
# only when every watch has delivered all its events (etcd 3.4 answers at once,
# even before a replay is done).
section 'no periodic notification without progress_notify (2.5 intervals of silence)'
watch_bg plain --rev 2 a
$ETCDCTL put a 1 >/dev/null      # rev 2
wait_for plain 1
sleep 2.5                        # waiting for something that must not come: no poll can do it
$ETCDCTL put a 2 >/dev/null      # rev 3
wait_for plain 2
bg_stop plain
section 'progress requests in interactive mode'
watch_i iw
send iw 'progress'                         # no watch yet: nothing printed
send iw 'watch a'                          # created at revision 3
send iw 'progress'
wait_for iw 'progress notify: 3' 1
send iw 'watch --prefix b/'
send iw 'progress'
wait_for iw 'progress notify: 3' 3         # one line per watch
$ETCDCTL put a 4 >/dev/null      # rev 4
$ETCDCTL put b/1 1 >/dev/null    # rev 5
$ETCDCTL put c 1 >/dev/null      # rev 6: watched by nobody
wait_lines iw 9
send iw 'progress'
wait_for iw 'progress notify: 6' 2
send iw 'watch --rev 2 a'                  # replays revisions 2, 3 and 4
wait_lines iw 20
send iw 'progress'
wait_for iw 'progress notify: 6' 5
close_stdin iw
