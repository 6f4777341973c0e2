# Multi-op txns: several writes share one revision; mixed ops; read-only txns; empty compares.
section 'three puts in one txn get one revision'
txn -w json <<'TXN'

put a 1
put b 2
put c 3


TXN
e get --prefix "" -w json
section 'put + del + get in one txn'
txn -w json <<'TXN'
value("a") = "1"

put d 4
del b
get --prefix ""

get a

TXN
e get --prefix "" -w json
section 'overwrite two existing keys and delete a range in one txn'
txn <<'TXN'

put a 10
put c 30
del d e


TXN
e get --prefix "" -w json
section 'read-only txn does not bump the revision'
txn -w json <<'TXN'
mod("a") > "0"

get a
get c

get none

TXN
e get a -w json
section 'failure branch with writes'
txn -w json <<'TXN'
value("a") = "nope"

put x 1

put y 1
put z 1

TXN
e get --prefix "" -w json
section 'failed txn without failure ops does not bump the revision'
txn -w json <<'TXN'
value("a") = "nope"

put x 1


TXN
e get a -w json
section 'txn with compares only (no ops)'
txn -w json <<'TXN'
value("a") = "10"



TXN
section 'get with options inside a txn'
txn -w json <<'TXN'

get --prefix "" --limit 1 --keys-only
get --prefix "" --rev 2


TXN
section 'delete with prev-kv inside a txn'
txn -w json <<'TXN'

del --prefix "" --prev-kv


TXN
e get --prefix "" -w json
section 'a txn whose only write deletes nothing does not bump the revision'
txn -w json <<'TXN'

del nothing-here


TXN
e put after 1 -w json
