# Watch across a compaction (moved out of compact so that compact stays pure KV).
for i in 1 2 3 4 5; do $ETCDCTL put k "v$i" >/dev/null || echo "setup put failed"; done   # revs 2..6
e compact 4
section 'watch from a compacted revision is canceled'
watch_lines 0 10 --rev 3 k
section 'watch from the compact revision itself replays from there'
watch_lines 9 10 --rev 4 k
