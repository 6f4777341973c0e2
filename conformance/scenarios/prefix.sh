# get --prefix / del --prefix, including the empty prefix and prefixes ending in 0xff.
for k in a ab abc abd abd/x ac b ba c; do $ETCDCTL put "$k" "v-$k" >/dev/null || echo "setup put $k failed"; done
section 'get --prefix ab'
e get --prefix ab
e get --prefix ab -w json
section 'get --prefix with no match'
e get --prefix zz -w json
section 'get --prefix "" lists every key'
e get --prefix "" --keys-only
e get --prefix "" -w json
section 'del --prefix abd'
e del --prefix abd
e get --prefix ab --keys-only
section 'del --prefix with --prev-kv'
e del --prefix a --prev-kv
e get --prefix "" -w json
section 'del --prefix with no match'
e del --prefix nothing
section 'del --prefix "" deletes everything'
e del --prefix ""
e get --prefix "" -w json
