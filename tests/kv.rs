//! The KV service end to end: a real server on a real SQLite file, driven by the `etcd-client`
//! crate. Expectations are etcd's behaviour (see SPEC.md §2, §3, §7, §8).

mod common;

use common::{TestServer, fields, log_rows, status, test_endpoint};
use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse,
};
use tonic::Code;

fn rev(header: Option<&etcd_client::ResponseHeader>) -> i64 {
    header.expect("response has a header").revision()
}

#[tokio::test]
async fn a_new_store_starts_at_revision_one_and_counts_versions() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;

    let empty = c.get("missing", None).await.unwrap();
    assert_eq!(rev(empty.header()), 1);
    assert!(empty.kvs().is_empty());
    assert_eq!(empty.count(), 0);

    let put = c.put("k", "v1", None).await.unwrap();
    assert_eq!(rev(put.header()), 2);
    c.put("k", "v2", None).await.unwrap();
    let got = c.get("k", None).await.unwrap();
    let kv = &got.kvs()[0];
    assert_eq!(
        (kv.create_revision(), kv.mod_revision(), kv.version()),
        (2, 3, 2)
    );
    assert_eq!(kv.value(), b"v2");
    assert_eq!(rev(got.header()), 3);

    let header = got.header().unwrap();
    assert_ne!(header.cluster_id(), 0);
    assert_ne!(header.member_id(), 0);
    assert_ne!(header.raft_term(), 0);

    // Delete, then re-create: the version starts over and create_revision moves.
    let del = c.delete("k", None).await.unwrap();
    assert_eq!((del.deleted(), rev(del.header())), (1, 4));
    assert!(c.get("k", None).await.unwrap().kvs().is_empty());
    c.put("k", "v3", None).await.unwrap();
    let kv = c.get("k", None).await.unwrap().kvs()[0].clone();
    assert_eq!(
        (kv.create_revision(), kv.mod_revision(), kv.version()),
        (5, 5, 1)
    );
    server.stop().await;
}

#[tokio::test]
async fn prev_kv_on_put_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;

    let first = c
        .put("p", "1", Some(PutOptions::new().with_prev_key()))
        .await
        .unwrap();
    assert!(first.prev_key().is_none());
    let second = c
        .put("p", "2", Some(PutOptions::new().with_prev_key()))
        .await
        .unwrap();
    let prev = second.prev_key().unwrap();
    assert_eq!(
        (prev.value(), prev.mod_revision(), prev.version()),
        (&b"1"[..], 2, 1)
    );

    c.put("p/a", "x", None).await.unwrap();
    let del = c
        .delete(
            "p",
            Some(DeleteOptions::new().with_prefix().with_prev_key()),
        )
        .await
        .unwrap();
    assert_eq!(del.deleted(), 2);
    let keys: Vec<_> = del.prev_kvs().iter().map(|kv| kv.key().to_vec()).collect();
    assert_eq!(keys, vec![b"p".to_vec(), b"p/a".to_vec()]);
    // One delete of two keys is one revision.
    assert_eq!(rev(del.header()), 5);

    // Deleting nothing takes no revision.
    let none = c.delete("nothing", None).await.unwrap();
    assert_eq!((none.deleted(), rev(none.header())), (0, 5));
    server.stop().await;
}

/// Keys and values are bytes, whatever they hold: every byte value, quotes, backslashes, what
/// looks like SQL or a placeholder, nothing at all, and a value large enough to be sent apart from
/// the commit. Written concurrently, so that they share batches, then overwritten: each reads
/// back exactly, and each overwrite returns the exact value it replaced.
#[tokio::test]
async fn keys_and_values_of_any_bytes_are_kept_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let every_byte: Vec<u8> = (0..=255u8).collect();
    let odd: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (
            b"bytes/all".to_vec(),
            every_byte.iter().rev().copied().collect(),
        ),
        ([b"bytes/".as_slice(), &every_byte].concat(), b"v".to_vec()),
        (b"bytes/quote'".to_vec(), b"it's '' \\' E'\\x00'".to_vec()),
        (b"bytes/backslash\\".to_vec(), b"\\x41\\\\".to_vec()),
        (
            b"bytes/sql".to_vec(),
            b"'); DROP TABLE kv_log; -- $1 $16 ?".to_vec(),
        ),
        (b"bytes/empty".to_vec(), Vec::new()),
    ];
    let put_all = |c: etcd_client::Client, values: Vec<(Vec<u8>, Vec<u8>)>| async move {
        let puts: Vec<_> = values
            .into_iter()
            .map(|(key, value)| {
                let mut c = c.clone();
                tokio::spawn(async move {
                    let put = c
                        .put(key.clone(), value, Some(PutOptions::new().with_prev_key()))
                        .await
                        .unwrap();
                    (key, put.prev_key().map(|kv| kv.value().to_vec()))
                })
            })
            .collect();
        let mut prevs = Vec::new();
        for put in puts {
            prevs.push(put.await.unwrap());
        }
        prevs
    };
    let c = server.client().await;
    let firsts = put_all(c.clone(), odd.clone()).await;
    assert!(firsts.iter().all(|(_, prev)| prev.is_none()), "{firsts:?}");
    // Alone, so that its batch is the large one.
    let large = (
        b"bytes/large".to_vec(),
        (0..400_000u32).map(|i| (i % 251) as u8).collect(),
    );
    put_all(c.clone(), vec![large.clone()]).await;
    let odd = [odd, vec![large]].concat();
    // After a restart, values come from the database, not from what the server remembers.
    drop(c);
    server.stop().await;
    let server = TestServer::start(dir.path()).await;
    let c = server.client().await;
    let mut client = c.clone();
    for (key, value) in &odd {
        let got = client.get(key.clone(), None).await.unwrap();
        assert_eq!(got.kvs().len(), 1, "{key:?}");
        assert_eq!(got.kvs()[0].key(), key.as_slice());
        assert_eq!(got.kvs()[0].value(), value.as_slice(), "{key:?}");
    }
    let again: Vec<_> = odd
        .iter()
        .map(|(k, _)| (k.clone(), b"next".to_vec()))
        .collect();
    let mut replaced = put_all(c.clone(), again).await;
    replaced.sort();
    let mut expected: Vec<_> = odd
        .iter()
        .map(|(k, v)| (k.clone(), Some(v.clone())))
        .collect();
    expected.sort();
    assert_eq!(replaced, expected);
    server.stop().await;
}

#[tokio::test]
async fn ranges_prefixes_and_from_key_follow_byte_order() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    for key in [
        &b"a"[..],
        b"a/1",
        b"a/2",
        b"a/\x00",
        b"a/\xff",
        b"a0",
        b"b",
        b"\x00z",
    ] {
        c.put(key, "v", None).await.unwrap();
    }
    let keys = |r: &etcd_client::GetResponse| -> Vec<Vec<u8>> {
        r.kvs().iter().map(|kv| kv.key().to_vec()).collect()
    };

    let prefix = c
        .get("a/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(
        keys(&prefix),
        vec![
            b"a/\x00".to_vec(),
            b"a/1".to_vec(),
            b"a/2".to_vec(),
            b"a/\xff".to_vec()
        ]
    );
    assert_eq!(prefix.count(), 4);

    let range = c
        .get("a/1", Some(GetOptions::new().with_range("a0")))
        .await
        .unwrap();
    assert_eq!(
        keys(&range),
        vec![b"a/1".to_vec(), b"a/2".to_vec(), b"a/\xff".to_vec()]
    );

    let from = c
        .get("a0", Some(GetOptions::new().with_from_key()))
        .await
        .unwrap();
    assert_eq!(keys(&from), vec![b"a0".to_vec(), b"b".to_vec()]);

    let all = c
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap();
    assert_eq!(all.count(), 8);
    assert_eq!(all.kvs()[0].key(), b"\x00z");

    // An inverted range holds nothing.
    let inverted = c
        .get("b", Some(GetOptions::new().with_range("a")))
        .await
        .unwrap();
    assert_eq!((inverted.kvs().len(), inverted.count()), (0, 0));
    server.stop().await;
}

#[tokio::test]
async fn limit_more_count_keys_only_and_count_only() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    for i in 0..5 {
        c.put(format!("k{i}"), format!("value{i}"), None)
            .await
            .unwrap();
    }
    let page = c
        .get("k", Some(GetOptions::new().with_prefix().with_limit(2)))
        .await
        .unwrap();
    assert_eq!((page.kvs().len(), page.more(), page.count()), (2, true, 5));

    let exact = c
        .get("k", Some(GetOptions::new().with_prefix().with_limit(5)))
        .await
        .unwrap();
    assert_eq!(
        (exact.kvs().len(), exact.more(), exact.count()),
        (5, false, 5)
    );

    let keys_only = c
        .get("k", Some(GetOptions::new().with_prefix().with_keys_only()))
        .await
        .unwrap();
    assert!(keys_only.kvs().iter().all(|kv| kv.value().is_empty()));
    assert_eq!(keys_only.kvs()[4].key(), b"k4");
    assert_eq!(keys_only.kvs()[4].version(), 1);

    let count_only = c
        .get("k", Some(GetOptions::new().with_prefix().with_count_only()))
        .await
        .unwrap();
    assert_eq!(
        (
            count_only.kvs().len(),
            count_only.count(),
            count_only.more()
        ),
        (0, 5, false)
    );
    server.stop().await;
}

#[tokio::test]
async fn sort_and_revision_filters() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    c.put("s/a", "3", None).await.unwrap(); // rev 2
    c.put("s/b", "1", None).await.unwrap(); // rev 3
    c.put("s/c", "2", None).await.unwrap(); // rev 4
    c.put("s/a", "4", None).await.unwrap(); // rev 5, version 2
    let keys = |r: etcd_client::GetResponse| -> Vec<String> {
        r.kvs()
            .iter()
            .map(|kv| kv.key_str().unwrap().to_owned())
            .collect()
    };
    let by = |target, order| GetOptions::new().with_prefix().with_sort(target, order);
    assert_eq!(
        keys(
            c.get("s/", Some(by(SortTarget::Key, SortOrder::Descend)))
                .await
                .unwrap()
        ),
        ["s/c", "s/b", "s/a"]
    );
    assert_eq!(
        keys(
            c.get("s/", Some(by(SortTarget::Mod, SortOrder::Descend)))
                .await
                .unwrap()
        ),
        ["s/a", "s/c", "s/b"]
    );
    assert_eq!(
        keys(
            c.get("s/", Some(by(SortTarget::Create, SortOrder::Ascend)))
                .await
                .unwrap()
        ),
        ["s/a", "s/b", "s/c"]
    );
    assert_eq!(
        keys(
            c.get("s/", Some(by(SortTarget::Value, SortOrder::Ascend)))
                .await
                .unwrap()
        ),
        ["s/b", "s/c", "s/a"]
    );
    assert_eq!(
        keys(
            c.get("s/", Some(by(SortTarget::Version, SortOrder::Descend)))
                .await
                .unwrap()
        )[0],
        "s/a"
    );
    // Sorting happens before the limit.
    let top = c
        .get(
            "s/",
            Some(by(SortTarget::Mod, SortOrder::Descend).with_limit(1)),
        )
        .await
        .unwrap();
    assert_eq!(
        (top.kvs()[0].key(), top.more(), top.count()),
        (&b"s/a"[..], true, 3)
    );

    let filtered = c
        .get(
            "s/",
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_min_mod_revision(3)
                    .with_max_mod_revision(4),
            ),
        )
        .await
        .unwrap();
    assert_eq!(keys(filtered), ["s/b", "s/c"]);
    let created = c
        .get(
            "s/",
            Some(GetOptions::new().with_prefix().with_min_create_revision(3)),
        )
        .await
        .unwrap();
    assert_eq!(created.count(), 3, "count ignores filters, as in etcd");
    assert_eq!(keys(created), ["s/b", "s/c"]);
    server.stop().await;
}

#[tokio::test]
async fn reads_at_past_and_future_revisions() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    c.put("r", "1", None).await.unwrap(); // 2
    c.put("r", "2", None).await.unwrap(); // 3
    c.delete("r", None).await.unwrap(); // 4
    c.put("other", "x", None).await.unwrap(); // 5

    let at2 = c
        .get("r", Some(GetOptions::new().with_revision(2)))
        .await
        .unwrap();
    assert_eq!(at2.kvs()[0].value(), b"1");
    assert_eq!(
        rev(at2.header()),
        5,
        "the header reports the current revision"
    );
    let at3 = c
        .get("r", Some(GetOptions::new().with_revision(3)))
        .await
        .unwrap();
    assert_eq!(at3.kvs()[0].value(), b"2");
    let at4 = c
        .get("r", Some(GetOptions::new().with_revision(4)))
        .await
        .unwrap();
    assert!(at4.kvs().is_empty());
    let at1 = c
        .get("r", Some(GetOptions::new().with_revision(1)))
        .await
        .unwrap();
    assert!(at1.kvs().is_empty());

    let future = status(
        c.get("r", Some(GetOptions::new().with_revision(6)))
            .await
            .unwrap_err(),
    );
    assert_eq!(future.code(), Code::OutOfRange);
    assert_eq!(
        future.message(),
        "etcdserver: mvcc: required revision is a future revision"
    );
    server.stop().await;
}

/// kube-apiserver's list: pages of `limit` at a pinned revision, each continuing from the last
/// key + "\x00", with `count` counted from the continue key and `more` while keys remain.
#[tokio::test]
async fn kube_apiserver_pagination() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let prefix = "/registry/pods/";
    for i in 0..25 {
        c.put(format!("{prefix}ns/pod-{i:02}"), format!("{i}"), None)
            .await
            .unwrap();
    }
    let pinned = rev(c.get(prefix, None).await.unwrap().header());
    // Writes after the list started must not show up in its pages.
    c.put(format!("{prefix}ns/pod-99"), "late", None)
        .await
        .unwrap();
    c.delete(format!("{prefix}ns/pod-03"), None).await.unwrap();

    let end = "/registry/pods0";
    let mut key = prefix.as_bytes().to_vec();
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let page = c
            .get(
                key.clone(),
                Some(
                    GetOptions::new()
                        .with_range(end)
                        .with_limit(10)
                        .with_revision(pinned),
                ),
            )
            .await
            .unwrap();
        pages += 1;
        let remaining = 25 - seen.len() as i64;
        assert_eq!(page.count(), remaining, "count starts at the continue key");
        assert_eq!(page.more(), (page.kvs().len() as i64) < page.count());
        for kv in page.kvs() {
            seen.push(kv.key_str().unwrap().to_owned());
        }
        if !page.more() {
            break;
        }
        key = page.kvs().last().unwrap().key().to_vec();
        key.push(0);
    }
    assert_eq!(pages, 3);
    let expected: Vec<_> = (0..25).map(|i| format!("{prefix}ns/pod-{i:02}")).collect();
    assert_eq!(seen, expected);
    server.stop().await;
}

#[tokio::test]
async fn kube_apiserver_txn_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let key = "/registry/configmaps/default/cm";

    // Create: MOD(K) == 0 → Put.
    let create = || {
        Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, "v1", None)])
    };
    let created = c.txn(create()).await.unwrap();
    assert!(created.succeeded());
    let created_rev = rev(created.header());
    assert_eq!(created_rev, 2);
    match &created.op_responses()[0] {
        TxnOpResponse::Put(p) => assert_eq!(rev(p.header()), created_rev),
        other => panic!("unexpected {other:?}"),
    }
    // A second create of the same key fails, writes nothing, takes no revision.
    let again = c.txn(create()).await.unwrap();
    assert!(!again.succeeded());
    assert!(again.op_responses().is_empty());
    assert_eq!(rev(again.header()), created_rev);

    // Update: MOD(K) == R → Put, else Range(K).
    let update = |r: i64, value: &str| {
        Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, r)])
            .and_then([TxnOp::put(key, value, None)])
            .or_else([TxnOp::get(key, None)])
    };
    let updated = c.txn(update(created_rev, "v2")).await.unwrap();
    assert!(updated.succeeded());
    let updated_rev = rev(updated.header());
    assert_eq!(updated_rev, 3);
    // Stale revision: the failure branch returns the current object.
    let stale = c.txn(update(created_rev, "v3")).await.unwrap();
    assert!(!stale.succeeded());
    assert_eq!(rev(stale.header()), updated_rev);
    match &stale.op_responses()[0] {
        TxnOpResponse::Get(g) => {
            assert_eq!(g.kvs()[0].value(), b"v2");
            assert_eq!(g.kvs()[0].mod_revision(), updated_rev);
            assert_eq!(rev(g.header()), updated_rev);
        }
        other => panic!("unexpected {other:?}"),
    }

    // Delete: MOD(K) == R → DeleteRange, else Range(K).
    let delete = |r: i64| {
        Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, r)])
            .and_then([TxnOp::delete(key, None)])
            .or_else([TxnOp::get(key, None)])
    };
    let stale_delete = c.txn(delete(created_rev)).await.unwrap();
    assert!(!stale_delete.succeeded());
    let deleted = c.txn(delete(updated_rev)).await.unwrap();
    assert!(deleted.succeeded());
    assert_eq!(rev(deleted.header()), 4);
    match &deleted.op_responses()[0] {
        TxnOpResponse::Delete(d) => assert_eq!(d.deleted(), 1),
        other => panic!("unexpected {other:?}"),
    }

    // Compactor: VERSION("compact_rev_key") == T → Put, else Range.
    let compactor = |t: i64, value: &str| {
        Txn::new()
            .when([Compare::version("compact_rev_key", CompareOp::Equal, t)])
            .and_then([TxnOp::put("compact_rev_key", value, None)])
            .or_else([TxnOp::get("compact_rev_key", None)])
    };
    assert!(c.txn(compactor(0, "4")).await.unwrap().succeeded());
    let lost = c.txn(compactor(0, "4")).await.unwrap();
    assert!(!lost.succeeded());
    match &lost.op_responses()[0] {
        TxnOpResponse::Get(g) => assert_eq!(g.kvs()[0].version(), 1),
        other => panic!("unexpected {other:?}"),
    }
    assert!(c.txn(compactor(1, "5")).await.unwrap().succeeded());
    server.stop().await;
}

#[tokio::test]
async fn multi_key_txns_share_one_revision_and_see_their_own_writes() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    c.put("t/old", "x", None).await.unwrap(); // 2

    let txn = Txn::new()
        .when([Compare::value("t/old", CompareOp::Equal, "x")])
        .and_then([
            TxnOp::put("t/a", "1", None),
            TxnOp::put("t/b", "2", None),
            TxnOp::delete("t/old", None),
            TxnOp::get("t/", Some(GetOptions::new().with_prefix())),
            TxnOp::txn(
                Txn::new()
                    .when([Compare::version("t/a", CompareOp::Equal, 1)])
                    .and_then([TxnOp::put("t/c", "3", None)]),
            ),
        ]);
    let out = c.txn(txn).await.unwrap();
    assert!(out.succeeded());
    assert_eq!(rev(out.header()), 3);
    let responses = out.op_responses();
    match &responses[3] {
        TxnOpResponse::Get(g) => {
            let keys: Vec<_> = g.kvs().iter().map(|kv| kv.key_str().unwrap()).collect();
            assert_eq!(keys, ["t/a", "t/b"], "a range sees the txn's earlier ops");
        }
        other => panic!("unexpected {other:?}"),
    }
    match &responses[4] {
        TxnOpResponse::Txn(t) => {
            assert!(t.succeeded(), "a nested compare sees the txn's earlier ops");
            assert_eq!(rev(t.header()), 3);
        }
        other => panic!("unexpected {other:?}"),
    }
    let all = c
        .get("t/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert!(all.kvs().iter().all(|kv| kv.mod_revision() == 3));
    assert_eq!(all.kvs().len(), 3);

    // A read-only txn takes no revision.
    let read = c
        .txn(Txn::new().and_then([TxnOp::get("t/a", None)]))
        .await
        .unwrap();
    assert_eq!(rev(read.header()), 3);
    server.stop().await;
}

#[tokio::test]
async fn every_compare_target_and_operator() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    c.put("c", "m", None).await.unwrap(); // create 2
    c.put("c", "m", None).await.unwrap(); // mod 3, version 2
    let holds = |cmp: Compare| Txn::new().when([cmp]);
    let cases = [
        (Compare::version("c", CompareOp::Equal, 2), true),
        (Compare::version("c", CompareOp::Greater, 1), true),
        (Compare::version("c", CompareOp::Less, 2), false),
        (Compare::version("c", CompareOp::NotEqual, 2), false),
        (Compare::create_revision("c", CompareOp::Equal, 2), true),
        (Compare::mod_revision("c", CompareOp::Greater, 2), true),
        (Compare::mod_revision("c", CompareOp::Less, 3), false),
        (Compare::value("c", CompareOp::Equal, "m"), true),
        (Compare::value("c", CompareOp::Greater, "a"), true),
        (Compare::value("c", CompareOp::Less, "a"), false),
        (Compare::value("c", CompareOp::NotEqual, "x"), true),
        (Compare::lease("c", CompareOp::Equal, 0), true),
        (Compare::version("missing", CompareOp::Equal, 0), true),
        (
            Compare::create_revision("missing", CompareOp::Equal, 0),
            true,
        ),
        (Compare::value("missing", CompareOp::NotEqual, "x"), false),
        (
            Compare::mod_revision("c", CompareOp::Less, 4).with_prefix(),
            true,
        ),
    ];
    for (cmp, expected) in cases {
        let label = format!("{cmp:?}");
        let out = c.txn(holds(cmp)).await.unwrap();
        assert_eq!(out.succeeded(), expected, "{label}");
    }
    server.stop().await;
}

#[tokio::test]
async fn invalid_requests_get_etcds_errors_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let check = |err: etcd_client::Error, code: Code, message: &str| {
        let s = status(err);
        assert_eq!((s.code(), s.message()), (code, message));
    };
    check(
        c.put("", "v", None).await.unwrap_err(),
        Code::InvalidArgument,
        "etcdserver: key is not provided",
    );
    check(
        c.get("", None).await.unwrap_err(),
        Code::InvalidArgument,
        "etcdserver: key is not provided",
    );
    check(
        c.put("k", "", Some(PutOptions::new().with_ignore_value()))
            .await
            .unwrap_err(),
        Code::InvalidArgument,
        "etcdserver: key not found",
    );
    check(
        c.put("k", "v", Some(PutOptions::new().with_ignore_value()))
            .await
            .unwrap_err(),
        Code::InvalidArgument,
        "etcdserver: value is provided",
    );
    check(
        c.put(
            "k",
            "v",
            Some(PutOptions::new().with_ignore_lease().with_lease(7)),
        )
        .await
        .unwrap_err(),
        Code::InvalidArgument,
        "etcdserver: lease is provided",
    );
    check(
        c.txn(Txn::new().and_then([TxnOp::put("d", "1", None), TxnOp::put("d", "2", None)]))
            .await
            .unwrap_err(),
        Code::InvalidArgument,
        "etcdserver: duplicate key given in txn request",
    );
    let many: Vec<_> = (0..129)
        .map(|i| TxnOp::put(format!("m{i}"), "v", None))
        .collect();
    check(
        c.txn(Txn::new().and_then(many)).await.unwrap_err(),
        Code::InvalidArgument,
        "etcdserver: too many operations in txn request",
    );
    // A txn that fails midway leaves nothing behind: the first put is rolled back.
    check(
        c.txn(Txn::new().and_then([
            TxnOp::put("half", "1", None),
            TxnOp::put("absent", "", Some(PutOptions::new().with_ignore_value())),
        ]))
        .await
        .unwrap_err(),
        Code::InvalidArgument,
        "etcdserver: key not found",
    );
    let after = c.get("half", None).await.unwrap();
    assert!(after.kvs().is_empty());
    assert_eq!(rev(after.header()), 1, "failed requests take no revision");
    server.stop().await;
}

#[tokio::test]
async fn ignore_value_and_ignore_lease_keep_the_current_ones() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    c.lease_grant(600, Some(etcd_client::LeaseGrantOptions::new().with_id(42)))
        .await
        .unwrap();
    c.put("i", "keep", Some(PutOptions::new().with_lease(42)))
        .await
        .unwrap();
    c.put("i", "", Some(PutOptions::new().with_ignore_value()))
        .await
        .unwrap();
    let kv = c.get("i", None).await.unwrap().kvs()[0].clone();
    // The value is kept; the lease is not ignored, so lease 0 detaches the key (etcd's rule).
    assert_eq!((kv.value(), kv.lease(), kv.version()), (&b"keep"[..], 0, 2));
    c.put(
        "i",
        "",
        Some(PutOptions::new().with_ignore_value().with_lease(42)),
    )
    .await
    .unwrap();
    c.put("i", "new", Some(PutOptions::new().with_ignore_lease()))
        .await
        .unwrap();
    let kv = c.get("i", None).await.unwrap().kvs()[0].clone();
    assert_eq!((kv.value(), kv.lease()), (&b"new"[..], 42));
    // Lease 0 detaches.
    c.put("i", "new", None).await.unwrap();
    assert_eq!(c.get("i", None).await.unwrap().kvs()[0].lease(), 0);
    server.stop().await;
}

#[tokio::test]
async fn requests_over_the_size_limit_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(dir.path(), |c| c.max_request_bytes = 1024).await;
    let mut c = server.client().await;
    let err = status(c.put("big", vec![b'x'; 2048], None).await.unwrap_err());
    assert_eq!(
        (err.code(), err.message()),
        (Code::InvalidArgument, "etcdserver: request is too large")
    );
    c.put("small", vec![b'x'; 512], None).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn compaction_hides_old_revisions_and_keeps_what_is_readable() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    c.put("a", "1", None).await.unwrap(); // 2
    c.put("a", "2", None).await.unwrap(); // 3
    c.put("b", "1", None).await.unwrap(); // 4
    c.delete("b", None).await.unwrap(); // 5
    c.put("c", "1", None).await.unwrap(); // 6
    c.put("a", "3", None).await.unwrap(); // 7
    let before: Vec<_> = {
        let mut out = Vec::new();
        for r in 5..=7 {
            let got = c
                .get("", Some(GetOptions::new().with_all_keys().with_revision(r)))
                .await
                .unwrap();
            out.push(fields(got.kvs()));
        }
        out
    };

    let compacted = c
        .compact(
            5,
            Some(etcd_client::CompactionOptions::new().with_physical()),
        )
        .await
        .unwrap();
    assert_eq!(rev(compacted.header()), 7);

    for (i, r) in (5..=7).enumerate() {
        let got = c
            .get("", Some(GetOptions::new().with_all_keys().with_revision(r)))
            .await
            .unwrap();
        assert_eq!(fields(got.kvs()), before[i], "read at {r} after compaction");
    }
    let below = status(
        c.get("a", Some(GetOptions::new().with_revision(4)))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (below.code(), below.message()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted"
        )
    );
    let again = status(c.compact(5, None).await.unwrap_err());
    assert_eq!(
        again.message(),
        "etcdserver: mvcc: required revision has been compacted"
    );
    let future = status(c.compact(8, None).await.unwrap_err());
    assert_eq!(
        future.message(),
        "etcdserver: mvcc: required revision is a future revision"
    );

    // Compact everything; the current state is untouched.
    c.compact(
        7,
        Some(etcd_client::CompactionOptions::new().with_physical()),
    )
    .await
    .unwrap();
    let now = c
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap();
    assert_eq!(fields(now.kvs()), before[2]);
    server.stop().await;

    // Superseded rows really are gone from the database: only the live keys' rows remain, and
    // a@3, replaced at the compact revision: a watch from 7 reports that change with it as
    // prev_kv.
    let rows = log_rows(&test_endpoint(dir.path())).await;
    assert_eq!(rows, 3, "a@7, a@3 and c@6 remain");
}

/// A key as a model of etcd holds it: create revision, mod revision, version, value, lease.
type ModelKv = (i64, i64, i64, Vec<u8>, i64);

/// Every revision of a random history reads back as a model of etcd says it was — keys that
/// were updated, deleted, re-created and deleted by range, with limits and counts — before and
/// after compactions. The storage finds a revision's rows by which change replaced each row; a
/// mistake in that bookkeeping shows here as a stale, missing or resurrected key.
#[tokio::test]
async fn every_revision_of_a_random_history_reads_as_it_was() {
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeMap;

    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let keys: Vec<String> = (0..12).map(|i| format!("/h/{i:02}")).collect();
    let mut state: BTreeMap<String, ModelKv> = BTreeMap::new();
    // snapshots[r] is the state at revision r (revision 1 is the empty store).
    let mut snapshots = vec![BTreeMap::new(), BTreeMap::new()];
    for step in 0..300 {
        let revision = snapshots.len() as i64;
        let key = &keys[rng.random_range(0..keys.len())];
        match rng.random_range(0..10) {
            0..=5 => {
                let value = format!("v{step}").into_bytes();
                c.put(key.as_str(), value.clone(), None).await.unwrap();
                let entry = match state.get(key) {
                    Some((create, _, version, _, _)) => (*create, revision, version + 1, value, 0),
                    None => (revision, revision, 1, value, 0),
                };
                state.insert(key.clone(), entry);
            }
            6..=7 => {
                let deleted = c.delete(key.as_str(), None).await.unwrap().deleted();
                assert_eq!(deleted, i64::from(state.remove(key).is_some()));
                if deleted == 0 {
                    continue;
                }
            }
            _ => {
                // Delete a range of keys in one revision.
                let end = &keys[(keys.iter().position(|k| k == key).unwrap() + 3).min(11)];
                let doomed: Vec<String> = state
                    .range(key.clone()..end.clone())
                    .map(|(k, _)| k.clone())
                    .collect();
                let got = c
                    .delete(
                        key.as_str(),
                        Some(DeleteOptions::new().with_range(end.as_str())),
                    )
                    .await
                    .unwrap();
                assert_eq!(got.deleted(), doomed.len() as i64);
                if doomed.is_empty() {
                    continue;
                }
                for k in doomed {
                    state.remove(&k);
                }
            }
        }
        snapshots.push(state.clone());
    }
    let current = snapshots.len() as i64 - 1;
    assert_eq!(common::current_revision(&mut c).await, current);

    let expected = |r: i64| -> Vec<common::Fields> {
        snapshots[r as usize]
            .iter()
            .map(|(k, (create, modr, version, value, lease))| {
                (
                    k.as_bytes().to_vec(),
                    *create,
                    *modr,
                    *version,
                    value.clone(),
                    *lease,
                )
            })
            .collect()
    };
    let check_from = |compact: i64| (compact.max(1)..=current).step_by(1);
    for compact in [0, current / 3, 2 * current / 3] {
        if compact > 0 {
            c.compact(
                compact,
                Some(etcd_client::CompactionOptions::new().with_physical()),
            )
            .await
            .unwrap();
        }
        for r in check_from(compact) {
            let want = expected(r);
            let all = c
                .get(
                    "/h/",
                    Some(GetOptions::new().with_prefix().with_revision(r)),
                )
                .await
                .unwrap();
            assert_eq!(fields(all.kvs()), want, "prefix at revision {r}");
            assert_eq!(all.count(), want.len() as i64, "count at revision {r}");
            let page = c
                .get(
                    "/h/03",
                    Some(
                        GetOptions::new()
                            .with_range("/h/09")
                            .with_limit(2)
                            .with_revision(r),
                    ),
                )
                .await
                .unwrap();
            let in_range: Vec<_> = want
                .iter()
                .filter(|kv| {
                    kv.0.as_slice() >= b"/h/03".as_slice() && kv.0.as_slice() < b"/h/09".as_slice()
                })
                .cloned()
                .collect();
            assert_eq!(
                fields(page.kvs()),
                in_range[..in_range.len().min(2)],
                "page at {r}"
            );
            assert_eq!(page.count(), in_range.len() as i64, "page count at {r}");
            assert_eq!(page.more(), in_range.len() > 2, "more at {r}");
            let counted = c
                .get(
                    "/h/",
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_count_only()
                            .with_revision(r),
                    ),
                )
                .await
                .unwrap();
            assert_eq!(counted.count(), want.len() as i64, "count_only at {r}");
            let key = &keys[(r as usize) % keys.len()];
            let one = c
                .get(key.as_str(), Some(GetOptions::new().with_revision(r)))
                .await
                .unwrap();
            let want_one: Vec<_> = want
                .iter()
                .filter(|kv| kv.0 == key.as_bytes())
                .cloned()
                .collect();
            assert_eq!(fields(one.kvs()), want_one, "{key} at {r}");
        }
    }
    server.stop().await;
}

/// Concurrent writers on a few shared keys, so that one group commit often changes the same key
/// several times: every revision still reads back as the acknowledged puts say it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_updates_of_shared_keys_keep_every_revision_readable() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..8 {
        let mut c = server.client().await;
        writers.spawn(async move {
            let mut acked = Vec::new();
            for i in 0..40 {
                let key = format!("/s/{}", (w + i) % 4);
                let value = format!("{w}-{i}");
                let put = c.put(key.as_str(), value.as_str(), None).await.unwrap();
                acked.push((rev(put.header()), key, value));
            }
            acked
        });
    }
    let mut acked: Vec<(i64, String, String)> = Vec::new();
    while let Some(done) = writers.join_next().await {
        acked.extend(done.unwrap());
    }
    acked.sort();
    // 320 puts, one revision each, no gap.
    let revisions: Vec<i64> = acked.iter().map(|a| a.0).collect();
    assert_eq!(revisions, (2..2 + 320).collect::<Vec<_>>());
    let mut c = server.client().await;
    let mut state: std::collections::BTreeMap<&str, (i64, i64, i64, &str)> = Default::default();
    for (revision, key, value) in &acked {
        let entry = state.entry(key.as_str()).or_insert((*revision, 0, 0, ""));
        *entry = (entry.0, *revision, entry.2 + 1, value.as_str());
        let got = c
            .get(
                "/s/",
                Some(GetOptions::new().with_prefix().with_revision(*revision)),
            )
            .await
            .unwrap();
        let want: Vec<common::Fields> = state
            .iter()
            .map(|(k, (create, modr, version, value))| {
                (
                    k.as_bytes().to_vec(),
                    *create,
                    *modr,
                    *version,
                    value.as_bytes().to_vec(),
                    0,
                )
            })
            .collect();
        assert_eq!(fields(got.kvs()), want, "at revision {revision}");
    }
    server.stop().await;
}

#[tokio::test]
async fn data_revision_and_identity_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    c.put("durable", "yes", None).await.unwrap();
    c.compact(2, None).await.unwrap();
    let before = c.get("durable", None).await.unwrap();
    let header = before.header().unwrap().clone();
    drop(c);
    server.stop().await;

    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let after = c.get("durable", None).await.unwrap();
    assert_eq!(fields(after.kvs()), fields(before.kvs()));
    let h = after.header().unwrap();
    assert_eq!(
        (h.revision(), h.cluster_id(), h.member_id()),
        (header.revision(), header.cluster_id(), header.member_id())
    );
    let compacted = status(
        c.get("durable", Some(GetOptions::new().with_revision(1)))
            .await
            .unwrap_err(),
    );
    assert_eq!(compacted.code(), Code::OutOfRange);
    server.stop().await;
}

/// Many clients racing kube-apiserver's create txn on the same keys: each key is created exactly
/// once, and revisions stay gapless and unique although writes are committed in groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_are_serialised_without_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let mut tasks = Vec::new();
    for writer in 0..16 {
        let mut c = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut wins = Vec::new();
            for k in 0..20 {
                let key = format!("race/{k}");
                let txn = Txn::new()
                    .when([Compare::mod_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(key.clone(), format!("{writer}"), None)]);
                let out = c.txn(txn).await.unwrap();
                if out.succeeded() {
                    wins.push((k, rev(out.header())));
                }
                c.put(format!("own/{writer}/{k}"), "x", None).await.unwrap();
            }
            wins
        }));
    }
    let mut revisions = Vec::new();
    let mut keys = Vec::new();
    for t in tasks {
        for (k, r) in t.await.unwrap() {
            keys.push(k);
            revisions.push(r);
        }
    }
    keys.sort_unstable();
    assert_eq!(
        keys,
        (0..20).collect::<Vec<_>>(),
        "each key created exactly once"
    );
    let mut c = client.clone();
    let own = c
        .get("own/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    revisions.extend(own.kvs().iter().map(|kv| kv.mod_revision()));
    revisions.sort_unstable();
    let expected: Vec<i64> = (2..2 + 20 + 16 * 20).collect();
    assert_eq!(
        revisions, expected,
        "one revision per write, none skipped or shared"
    );
    server.stop().await;
}

/// A txn that writes and then reads a range at an older revision (through SQL) puts its batch's
/// rows into the database before the batch ends; the requests after it in the same batch are
/// written with the rest at the end. Many clients mixing such txns with plain puts: every
/// request is answered, each read sees its own txn's write (or, at the older revision, not),
/// and revisions stay gapless.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txns_reading_back_share_batches_with_other_writes() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let mut tasks = Vec::new();
    for writer in 0..16 {
        let mut c = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut revisions = Vec::new();
            for k in 0..20_i64 {
                let key = format!("mix/{writer}/{k:02}");
                if writer % 2 == 1 {
                    revisions.push(rev(c.put(key, "x", None).await.unwrap().header()));
                    continue;
                }
                let prefix = format!("mix/{writer}/");
                let count = || GetOptions::new().with_prefix().with_count_only();
                // The count now comes from the batch's index; the one at the revision of this
                // writer's previous write from SQL, which must see the rows the batch wrote
                // before this txn (and this txn's own, under a savepoint).
                let before = revisions.last().copied().unwrap_or(1);
                let txn = Txn::new().and_then([
                    TxnOp::put(key, "x", None),
                    TxnOp::get(prefix.as_str(), Some(count())),
                    TxnOp::get(prefix.as_str(), Some(count().with_revision(before))),
                ]);
                let out = c.txn(txn).await.unwrap();
                let counts: Vec<i64> = out.op_responses()[1..]
                    .iter()
                    .map(|response| match response {
                        TxnOpResponse::Get(get) => get.count(),
                        other => panic!("unexpected response {other:?}"),
                    })
                    .collect();
                assert_eq!(
                    counts,
                    [k + 1, k],
                    "writer {writer}'s reads after write {k}"
                );
                revisions.push(rev(out.header()));
            }
            revisions
        }));
    }
    let mut revisions = Vec::new();
    for t in tasks {
        revisions.extend(t.await.unwrap());
    }
    revisions.sort_unstable();
    let expected: Vec<i64> = (2..2 + 16 * 20).collect();
    assert_eq!(revisions, expected, "one revision per write");
    server.stop().await;
}

/// A Range inside a txn, after the txn's own writes, answers as a get of the txn's revision
/// does, whatever its shape: limits, counts, keys only, sorts and filters.
#[tokio::test]
async fn ranges_inside_a_txn_answer_as_gets_of_its_revision() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    for (i, value) in ["q", "c", "x", "a", "m"].iter().enumerate() {
        c.put(format!("s/{i}"), *value, None).await.unwrap();
    }
    c.put("s/2", "again", None).await.unwrap();
    let shapes = || {
        let prefix = || GetOptions::new().with_prefix();
        vec![
            prefix(),
            prefix().with_limit(2),
            prefix().with_limit(9),
            prefix().with_count_only(),
            prefix().with_keys_only().with_limit(3),
            prefix()
                .with_sort(SortTarget::Value, SortOrder::Descend)
                .with_limit(3),
            prefix()
                .with_keys_only()
                .with_sort(SortTarget::Value, SortOrder::Ascend),
            prefix()
                .with_sort(SortTarget::Mod, SortOrder::Descend)
                .with_limit(2),
            prefix().with_min_mod_revision(4).with_limit(2),
            GetOptions::new().with_range("s/2").with_limit(1),
        ]
    };
    let mut ops = vec![
        TxnOp::put("s/1", "changed", None),
        TxnOp::delete("s/3", None),
    ];
    ops.extend(shapes().into_iter().map(|o| TxnOp::get("s/", Some(o))));
    let out = c.txn(Txn::new().and_then(ops)).await.unwrap();
    let revision = rev(out.header());
    for (i, (response, options)) in out.op_responses()[2..].iter().zip(shapes()).enumerate() {
        let TxnOpResponse::Get(inside) = response else {
            panic!("unexpected response {response:?}");
        };
        let get = c
            .get("s/", Some(options.with_revision(revision)))
            .await
            .unwrap();
        let answer = |r: &etcd_client::GetResponse| (fields(r.kvs()), r.count(), r.more());
        assert_eq!(answer(inside), answer(&get), "shape {i}");
    }
    server.stop().await;
}

/// A read that starts after a write was acknowledged sees that write, on another connection,
/// while other writes keep landing (reads use the revision the writer published before it
/// answered, not a snapshot of their own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_after_an_acknowledged_write_sees_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..8 {
        let mut writer = server.client().await;
        let mut reader = server.client().await;
        tasks.spawn(async move {
            for i in 0..40 {
                let key = format!("/ack/{w}");
                let put = writer
                    .put(key.as_str(), format!("{i}"), None)
                    .await
                    .unwrap();
                let acked = rev(put.header());
                let got = reader.get(key.as_str(), None).await.unwrap();
                assert!(rev(got.header()) >= acked, "header behind the write");
                let kv = &got.kvs()[0];
                assert_eq!(
                    (kv.mod_revision(), kv.value()),
                    (acked, format!("{i}").as_bytes())
                );
                let listed = reader
                    .get("/ack/", Some(GetOptions::new().with_prefix()))
                    .await
                    .unwrap();
                let mine = listed.kvs().iter().find(|kv| kv.key() == key.as_bytes());
                assert!(mine.is_some_and(|kv| kv.mod_revision() >= acked));
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    server.stop().await;
}

/// Reads at old revisions racing a compaction that passes them: each answers exactly what the
/// key held at its revision, or that the revision is compacted; never rows half-deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_racing_compaction_are_exact_or_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    // Revisions 2..=201: "/race/a" holds the revision that wrote it; "/race/b" every other.
    for r in 2..=201i64 {
        let key = if r % 2 == 0 { "/race/a" } else { "/race/b" };
        c.put(key, r.to_string(), None).await.unwrap();
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut readers = tokio::task::JoinSet::new();
    for n in 0..4i64 {
        let mut reader = server.client().await;
        let stop = stop.clone();
        readers.spawn(async move {
            let (mut exact, mut refused) = (0, 0);
            let mut r = 2 + n;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                r = if r + 4 > 201 { 2 + n } else { r + 4 };
                let options = GetOptions::new().with_prefix().with_revision(r);
                match reader.get("/race/", Some(options)).await {
                    Ok(got) => {
                        // "a" last changed at the even revision at or below r, "b" at the odd one.
                        let values: Vec<&[u8]> = got.kvs().iter().map(|kv| kv.value()).collect();
                        let (a, b) = if r % 2 == 0 { (r, r - 1) } else { (r - 1, r) };
                        let (a, b) = (a.to_string(), b.to_string());
                        assert_eq!(values, [a.as_bytes(), b.as_bytes()], "at {r}");
                        exact += 1;
                    }
                    Err(e) => {
                        let e = status(e);
                        assert_eq!(e.code(), Code::OutOfRange, "at {r}: {e:?}");
                        assert_eq!(
                            e.message(),
                            "etcdserver: mvcc: required revision has been compacted"
                        );
                        refused += 1;
                    }
                }
            }
            (exact, refused)
        });
    }
    for to in (20..=200).step_by(20) {
        c.compact(
            to,
            Some(etcd_client::CompactionOptions::new().with_physical()),
        )
        .await
        .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut exact, mut refused) = (0, 0);
    while let Some(done) = readers.join_next().await {
        let (e, r) = done.unwrap();
        exact += e;
        refused += r;
    }
    assert!(
        exact > 0 && refused > 0,
        "{exact} exact reads, {refused} refused"
    );
    server.stop().await;
}

/// Single-key gets at the current revision (served from memory when the key was written
/// recently) agree with a prefix read of the same revision (served by SQL) while the keys are
/// put, put with a lease, deleted and re-created underneath.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gets_agree_with_range_reads_at_their_revision() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut writer = server.client().await;
    let lease = writer.lease_grant(600, None).await.unwrap().id();
    let writes = tokio::spawn(async move {
        for i in 0..400 {
            let key = format!("/agree/{}", i % 5);
            match i % 4 {
                0 | 1 => drop(writer.put(key, format!("v{i}"), None).await.unwrap()),
                2 => {
                    let options = PutOptions::new().with_lease(lease);
                    drop(
                        writer
                            .put(key, format!("l{i}"), Some(options))
                            .await
                            .unwrap(),
                    );
                }
                _ => drop(writer.delete(key, None).await.unwrap()),
            }
        }
    });
    let mut readers = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let mut reader = server.client().await;
        readers.spawn(async move {
            let mut checked = 0;
            for round in 0..150 {
                let key = format!("/agree/{}", round % 5);
                let got = reader.get(key.as_str(), None).await.unwrap();
                let at = rev(got.header());
                let all = GetOptions::new().with_prefix().with_revision(at);
                let listed = reader.get("/agree/", Some(all)).await.unwrap();
                let expected: Vec<_> = listed
                    .kvs()
                    .iter()
                    .filter(|kv| kv.key() == key.as_bytes())
                    .collect();
                let fields = |kv: &etcd_client::KeyValue| {
                    let meta = (kv.create_revision(), kv.mod_revision(), kv.version());
                    (meta, kv.lease(), kv.value().to_vec())
                };
                assert_eq!(
                    got.kvs().iter().map(fields).collect::<Vec<_>>(),
                    expected.iter().map(|kv| fields(kv)).collect::<Vec<_>>(),
                    "{key} at revision {at}"
                );
                assert_eq!(got.count(), expected.len() as i64);
                let counted = reader
                    .get(key.as_str(), Some(GetOptions::new().with_count_only()))
                    .await
                    .unwrap();
                if rev(counted.header()) == at {
                    assert!(counted.kvs().is_empty());
                    assert_eq!(counted.count(), expected.len() as i64);
                    checked += 1;
                }
            }
            checked
        });
    }
    let mut checked = 0;
    while let Some(done) = readers.join_next().await {
        checked += done.unwrap();
    }
    writes.await.unwrap();
    assert!(
        checked > 0,
        "no count-only get landed on the revision of its get"
    );
    server.stop().await;
}

/// etcd takes any key up to its request size; MySQL's key column holds 3,000 bytes, and a longer
/// key is refused with a clear InvalidArgument before anything of the request is written.
/// SQLite has no such bound, nor PostgreSQL for a key that compresses (this one does).
#[tokio::test]
async fn keys_longer_than_the_database_holds_are_refused_whole() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let long = "k".repeat(4000);
    let before = c
        .get("short", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let put = c.put(long.as_str(), "v", None).await;
    let nested = c
        .txn(Txn::new().and_then([
            TxnOp::put("short", "v", None),
            TxnOp::txn(Txn::new().and_then([TxnOp::put(long.as_str(), "v", None)])),
        ]))
        .await;
    if common::on_mysql() {
        for result in [put.map(drop), nested.map(drop)] {
            let s = status(result.unwrap_err());
            assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
            assert!(
                s.message()
                    .starts_with("etcdserver: key is too long for this data store"),
                "{s:?}"
            );
        }
        let after = c.get("short", None).await.unwrap();
        assert!(after.kvs().is_empty(), "nothing of the txn was written");
        assert_eq!(after.header().unwrap().revision(), before);
    } else {
        put.unwrap();
        nested.unwrap();
        let got = c.get(long.as_str(), None).await.unwrap();
        assert_eq!(got.kvs()[0].key().len(), 4000);
    }
    if common::on_postgres() {
        // A 4,000-byte key that does not compress: PostgreSQL's index refuses it when it is
        // written. The refusal is InvalidArgument and fails that txn alone, not the puts that
        // share its moment.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let random: String = (0..4000)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                char::from(b'!' + (state % 90) as u8)
            })
            .collect();
        let others: Vec<_> = (0..8)
            .map(|i| {
                let mut c = c.clone();
                tokio::spawn(async move { c.put(format!("beside/{i}"), "v", None).await })
            })
            .collect();
        let s = status(c.put(random.as_str(), "v", None).await.unwrap_err());
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        assert!(
            s.message()
                .starts_with("etcdserver: key is too long for this data store"),
            "{s:?}"
        );
        for other in others {
            other
                .await
                .unwrap()
                .expect("a put beside the refused one succeeds");
        }
        let none = c.get(random.as_str(), None).await.unwrap();
        assert!(none.kvs().is_empty());
        // The failed transaction ended with its batch: no connection of the server's pool is
        // left inside it, to fail the statements of whoever takes it next.
        let pool = sqlx::PgPool::connect(&common::test_endpoint(dir.path()))
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let stuck: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            if stuck == 0 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{stuck} connections still idle in a transaction after 10 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        for i in 0..8 {
            c.put(format!("after/{i}"), "v", None)
                .await
                .expect("a put after the refused one succeeds");
        }
    }
    server.stop().await;
}
