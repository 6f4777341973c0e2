# --from-key: every key >= KEY (range_end "\x00").
for k in a b c d; do $ETCDCTL put "$k" "v-$k" >/dev/null || echo "setup put $k failed"; done
section 'get --from-key b'
e get --from-key b
e get --from-key b -w json
section 'get --from-key "" (all keys)'
e get --from-key "" --keys-only
e get --from-key "" -w json
section 'get --from-key after the last key'
e get --from-key e -w json
section 'get --from-key with limit'
e get --from-key b --limit 1 -w json
section 'del --from-key c'
e del --from-key c
e get --from-key "" --keys-only
section 'del --from-key "" --prev-kv'
e del --from-key "" --prev-kv
e get --from-key "" -w json
