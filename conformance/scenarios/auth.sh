# etcd-version: 3.5
# Users, roles and permissions, and what auth changes for every kind of request: etcdctl's
# `auth`, `user` and `role` commands and `--user`, before and after `auth enable`.
R="--user=root:rootpw"
A="--user=alice:alicepw"
section 'before auth is enabled: users and roles'
e user add root:rootpw
e user add alice:alicepw
e user add nopw --no-password
e user add alice:again
e role add reader
e role add reader
e role grant-permission reader read /r/ --prefix
e role grant-permission reader readwrite /rw
e role grant-permission reader write /w /x
e role grant-permission reader read /w /x
e role grant-permission nosuch read /a
e role get reader
e role get nosuch
e role list
e user grant-role alice reader
e user grant-role alice reader
e user grant-role alice nosuch
e user get alice
e user get nosuch
e user list
section 'enabling: etcdctl gives root the root role when it lacks it'
e user get root
e auth enable
e auth enable
e $R user get root
e $R role get root
section 'with auth: no user, a wrong password, users without passwords'
e put /r/a 1
e get /r/a
e --user=alice:wrong get /r/a
e --user=nosuch:pw get /r/a
e --user=nopw:x get /r/a
section 'root may do anything'
e $R put /r/a 1
e $R put /w 1
e $R put /x 1
e $R get "" --from-key --keys-only
section 'alice: what reader grants'
e $A get /r/a
e $A get /r/ --prefix
e $A get /r/ /r0
e $A get /r/ /s
e $A put /r/a 2
e $A put /rw 1
e $A get /rw
e $A del /rw
e $A put /w 1
e $A put /w0 1
e $A get /w
e $A del /w /x
e $A get "" --from-key
section 'alice: txns are checked op by op, compares included'
txn $A <<'TXN'
value("/r/a") = "1"

get /r/a
put /rw 2


TXN
txn $A <<'TXN'
value("/w") = "1"

put /rw 3


TXN
txn $A <<'TXN'
value("/r/a") = "1"

put /rw 4

put /x 1

TXN
section 'alice: leases, compaction, maintenance, auth management'
e $A lease grant 100
e $A compact 2
e $A user get alice
e $A user list
e $A role get reader
e $A role list
e $A user add bob:bobpw
e $A alarm list
e $A endpoint status -w fields
section 'revoking takes effect at once'
e $R role revoke-permission reader /rw
e $R role revoke-permission reader /rw
e $A get /rw
e $R user revoke-role alice reader
e $R user revoke-role alice reader
e $A get /r/a
e $R user grant-role alice reader
e $A get /r/a
section 'a new password replaces the old'
printf 'newpw\n' | x $ETCDCTL $R user passwd alice --interactive=false
e $A get /r/a
e --user=alice:newpw get /r/a
section 'root stays root while auth is on'
e $R user delete root
e $R user revoke-role root root
e $R role delete root
e $R role add root
e $R role get root
section 'deleting'
e $R role delete reader
e $R role delete reader
e $R user get alice
e $R user delete alice
e $R user delete alice
e $R user list
e $R role list
section 'disabling'
e $A auth disable
e $R auth disable
e $R auth disable
e get /r/a
e user list
