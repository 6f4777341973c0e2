# put --ignore-value / --ignore-lease.
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
section 'lease kept by ignore-lease, replaced by a plain put'
LID=$($ETCDCTL lease grant 600 | awk '{print $2}')
e put k withlease --lease="$LID"
e get k -w json
e put k newvalue --ignore-lease
e get k -w json
e put k --ignore-value
e get k -w json
section 'ignore-lease with a lease is rejected by the server'
e put k v --ignore-lease --lease="$LID"
section 'a plain put detaches the key from its lease'
e put k plain
e get k -w json
