# kube-apiserver's txn shapes (create / GuaranteedUpdate / delete / compactor), as JSON.
K=/registry/pods/default/p1
section 'create: mod(K) = 0 -> put (succeeds)'
txn -w json <<TXN
mod("$K") = "0"

put $K v1


TXN
section 'create again: fails (key exists), no failure ops'
txn -w json <<TXN
mod("$K") = "0"

put $K v1-dup


TXN
section 'update with the right resourceVersion (mod_revision 2): succeeds'
txn -w json <<TXN
mod("$K") = "2"

put $K v2

get $K

TXN
section 'update with a stale resourceVersion: failure branch returns the current object'
txn -w json <<TXN
mod("$K") = "2"

put $K v3

get $K

TXN
section 'delete with a stale resourceVersion: failure branch returns the current object'
txn -w json <<TXN
mod("$K") = "2"

del $K

get $K

TXN
section 'delete with the right resourceVersion (mod_revision 3)'
txn -w json <<TXN
mod("$K") = "3"

del $K

get $K

TXN
section 'update of a deleted key: failure branch range is empty'
txn -w json <<TXN
mod("$K") = "3"

put $K v4

get $K

TXN
section 'compactor: version(compact_rev_key) = 0 -> put, else get'
txn -w json <<TXN
version("compact_rev_key") = "0"

put compact_rev_key 4

get compact_rev_key

TXN
txn -w json <<TXN
version("compact_rev_key") = "0"

put compact_rev_key 5

get compact_rev_key

TXN
txn -w json <<TXN
version("compact_rev_key") = "1"

put compact_rev_key 5

get compact_rev_key

TXN
section 'simple (non-json) output of a failed update'
txn <<TXN
mod("compact_rev_key") = "1"

put compact_rev_key 7

get compact_rev_key

TXN
e get --prefix "" -w json
