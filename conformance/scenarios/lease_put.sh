# Puts that involve a lease: unknown lease, lease kept by --ignore-lease / --ignore-value,
# detached by a plain put. (Moved out of errors / ignore_flags so that those stay pure KV.)
section 'put with an unknown lease'
e put a v --lease=1234abcd
e get a -w json
section 'put attaches a granted lease'
LID=$($ETCDCTL lease grant 600 | awk '{print $2}')
echo "granted: ${LID:+yes}"
$ETCDCTL put k orig >/dev/null
e put k withlease --lease="$LID"
e get k -w json
section 'ignore-lease keeps the lease, replaces the value'
e put k newvalue --ignore-lease
e get k -w json
section 'ignore-value keeps the value but a put without --lease detaches the key'
e put k --ignore-value
e get k -w json
section 'ignore-lease with a granted lease is rejected by the server'
e put k v --ignore-lease --lease="$LID"
section 'ignore-value with a lease keeps the value and attaches the lease'
e put k --ignore-value --lease="$LID"
e get k -w json
section 'a plain put detaches the key from its lease'
e put k plain
e get k -w json
section 'the lease no longer lists the key'
e lease timetolive "$LID" --keys
