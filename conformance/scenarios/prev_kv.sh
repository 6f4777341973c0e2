# put --prev-kv and del --prev-kv.
section 'put --prev-kv on a new key'
e put k v1 --prev-kv
e put k2 w1 --prev-kv -w json
section 'put --prev-kv on an existing key'
e put k v2 --prev-kv
e put k v3 --prev-kv -w json
section 'del --prev-kv single key'
e del k --prev-kv
e del k2 --prev-kv -w json
section 'del --prev-kv missing key'
e del k --prev-kv -w json
section 'del --prev-kv range'
$ETCDCTL put r/1 a >/dev/null
$ETCDCTL put r/2 b >/dev/null
e del --prefix r/ --prev-kv -w json
