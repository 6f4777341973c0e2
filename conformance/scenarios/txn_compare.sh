# Txn compares on version/create/mod/value with =, !=, <, >; success and failure branches.
# Store: k created at rev 2 (value "m"), modified at rev 3 (value "p") -> version 2, create 2, mod 3.
$ETCDCTL put k m >/dev/null   # rev 2
$ETCDCTL put k p >/dev/null   # rev 3
# check COMPARE: a read-only txn; prints SUCCESS (get k) or FAILURE (get none).
check() {
  echo "-- $1"
  printf '%s\n\nget k --print-value-only\n\nget none\n\n' "$1" | $ETCDCTL txn 2>&1
  echo "exit=$?"
}
section 'version'
check 'version("k") = "2"'
check 'version("k") = "1"'
check 'version("k") != "1"'
check 'version("k") != "2"'
check 'version("k") > "1"'
check 'version("k") > "2"'
check 'version("k") < "3"'
check 'version("k") < "2"'
section 'create'
check 'create("k") = "2"'
check 'create("k") = "3"'
check 'create("k") != "3"'
check 'create("k") > "1"'
check 'create("k") > "2"'
check 'create("k") < "3"'
check 'create("k") < "2"'
section 'mod'
check 'mod("k") = "3"'
check 'mod("k") = "2"'
check 'mod("k") != "2"'
check 'mod("k") != "3"'
check 'mod("k") > "2"'
check 'mod("k") > "3"'
check 'mod("k") < "4"'
check 'mod("k") < "3"'
section 'value'
check 'value("k") = "p"'
check 'value("k") = "m"'
check 'value("k") != "m"'
check 'value("k") != "p"'
check 'value("k") > "o"'
check 'value("k") > "p"'
check 'value("k") < "q"'
check 'value("k") < "p"'
check 'value("k") < "pp"'
check 'value("k") > ""'
section 'missing key compares as 0 (version/create/mod)'
check 'version("missing") = "0"'
check 'create("missing") = "0"'
check 'mod("missing") = "0"'
check 'mod("missing") < "1"'
check 'mod("missing") != "0"'
check 'version("missing") > "0"'
section 'value compare on a missing key never succeeds'
check 'value("missing") = ""'
check 'value("missing") != "x"'
check 'value("missing") < "z"'
# lease("k") compares cannot be tested here: etcdctl 3.4.23 panics client-side
# ("panic: bad value" in clientv3.mustInt64) when parsing them.
section 'several compares: all must hold'
printf 'version("k") = "2"\nvalue("k") = "p"\n\nput ok yes\n\nput bad yes\n\n' | $ETCDCTL txn 2>&1; echo "exit=$?"
printf 'version("k") = "2"\nvalue("k") = "nope"\n\nput ok2 yes\n\nput bad2 yes\n\n' | $ETCDCTL txn 2>&1; echo "exit=$?"
e get --prefix "" --keys-only
section 'the compares above did not bump the revision except the two writes'
e get k -w json
