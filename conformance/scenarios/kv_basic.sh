# Single-key put/get/del; revisions and versions on a fresh store (starts at revision 1).
section 'fresh store'
e get foo -w json
section 'put and get'
e put foo bar
e get foo
e get foo -w json
e put foo baz
e get foo -w json
e get foo --print-value-only
e get foo --consistency=s -w json
section 'put empty value'
e put empty ""
e get empty -w json
section 'get missing key'
e get missing
e get missing -w json
section 'delete'
e del foo
e del foo
e get foo -w json
e del missing -w json
section 're-create after delete gets a fresh create_revision and version 1'
e put foo again
e get foo -w json
e del foo -w json
e get --prefix "" -w json
