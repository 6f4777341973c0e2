# put --ignore-value / --ignore-lease on keys without a lease (pure KV: no lease is granted here;
# ignore flags combined with a real lease are covered by lease_put).
section 'ignore-value on a missing key'
e put missing --ignore-value
section 'ignore-lease on a missing key'
e put missing v --ignore-lease
e get missing -w json
section 'ignore-value on an existing key keeps the value, bumps mod_revision and version'
$ETCDCTL put k orig >/dev/null
e put k --ignore-value
e get k -w json
section 'ignore-value with a value is rejected by etcdctl itself'
e put k v --ignore-value
section 'ignore-value + prev-kv'
e put k --ignore-value --prev-kv -w json
section 'ignore-lease on an existing key without a lease replaces the value'
e put k newvalue --ignore-lease
e get k -w json
section 'ignore-lease + prev-kv'
e put k again --ignore-lease --prev-kv -w json
section 'ignore-lease with a lease id is rejected by the server (request validation, before any lease lookup)'
e put k v --ignore-lease --lease=1234abcd
e put missing v --ignore-lease --lease=1234abcd
section 'ignore-value + ignore-lease together keep value and (no) lease'
e put k --ignore-value --ignore-lease
e get k -w json
section 'nothing rejected above changed the key'
e get --prefix "" -w json
