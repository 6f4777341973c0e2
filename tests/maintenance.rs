//! Maintenance beyond Status, through a real client: HashKV is the same for the same history
//! on every instance of one database and across a restart, and changes only with the data;
//! Defragment keeps every key; MoveLeader to this member succeeds and to another fails as in
//! etcd; services etcdsql does not serve answer `Unimplemented` naming the service; the HTTP
//! probes answer as etcd 3.5's do and unknown paths are 404. That HashKV gives etcd's own
//! numbers is checked against etcd 3.5 by the conformance scenario `maintenance`.

mod common;

use common::{TestServer, shared_database, status};
use etcd_client::{Client, DeleteOptions, GetOptions, Txn, TxnOp};

/// HashKV at every revision from 2 to the current one, and at 0 (the current one).
async fn hashes(c: &mut Client) -> Vec<(i64, u32, i64)> {
    let current = common::current_revision(c).await;
    let mut out = Vec::new();
    for revision in (2..=current).chain([0]) {
        match c.maintenance_client().hash_kv(revision).await {
            Ok(h) => out.push((revision, h.hash(), h.compact_version())),
            Err(e) => {
                let s = status(e);
                assert_eq!(s.code(), tonic::Code::OutOfRange, "{s:?}");
                assert_eq!(
                    s.message(),
                    "etcdserver: mvcc: required revision has been compacted"
                );
            }
        }
    }
    out
}

async fn write_history(c: &mut Client) {
    for i in 0..20 {
        c.put(format!("h/{}", i % 7), format!("v{i}"), None)
            .await
            .unwrap();
    }
    c.delete("h/3", None).await.unwrap();
    c.txn(Txn::new().and_then([
        TxnOp::put("h/x", "1", None),
        TxnOp::put("h/y", "2", None),
        TxnOp::delete("h/1", None),
    ]))
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashkv_is_the_same_on_every_instance_and_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestServer::start(dir.path()).await;
    let mut ca = a.client().await;
    write_history(&mut ca).await;
    let before = hashes(&mut ca).await;
    // Every revision hashes differently: each wrote something.
    let mut distinct: Vec<u32> = before.iter().map(|&(_, h, _)| h).collect();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), before.len() - 1, "{before:?}");

    // Compaction hides nothing at or above it: those hashes count the same rows, now from
    // above the compact revision.
    let compact_at = 15;
    ca.compact(
        compact_at,
        Some(etcd_client::CompactionOptions::new().with_physical()),
    )
    .await
    .unwrap();
    let compacted = hashes(&mut ca).await;
    assert!(
        compacted
            .iter()
            .all(|&(r, _, c)| r == 0 || r >= compact_at && c == compact_at)
    );
    assert_eq!(compacted.len(), before.len() - (compact_at as usize - 2));

    if shared_database() {
        let b = TestServer::start(dir.path()).await;
        let mut cb = b.client().await;
        assert_eq!(hashes(&mut cb).await, compacted);
        b.stop().await;
    }
    a.stop().await;
    let a = TestServer::start(dir.path()).await;
    let mut ca = a.client().await;
    assert_eq!(hashes(&mut ca).await, compacted);

    // A write moves the current hash and leaves the earlier ones.
    ca.put("h/new", "1", None).await.unwrap();
    let after = hashes(&mut ca).await;
    assert_eq!(
        &after[..compacted.len() - 1],
        &compacted[..compacted.len() - 1]
    );
    assert_ne!(after.last(), compacted.last());
    let whole = ca.maintenance_client().hash().await.unwrap().hash();
    assert_eq!(ca.maintenance_client().hash().await.unwrap().hash(), whole);
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defragment_move_leader_and_unserved_services() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let value = "x".repeat(4096);
    for i in 0..200 {
        c.put(format!("d/{i:03}"), value.clone(), None)
            .await
            .unwrap();
    }
    c.delete("d/1", Some(DeleteOptions::new().with_prefix()))
        .await
        .unwrap();
    let revision = common::current_revision(&mut c).await;
    c.compact(
        revision,
        Some(etcd_client::CompactionOptions::new().with_physical()),
    )
    .await
    .unwrap();
    let before = c
        .get("d/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    c.maintenance_client().defragment().await.unwrap();
    let after = c
        .get("d/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(common::fields(after.kvs()), common::fields(before.kvs()));
    assert_eq!(after.count(), 100);
    c.put("d/after", "1", None).await.unwrap();

    let status = c.maintenance_client().status().await.unwrap();
    let me = status.header().unwrap().member_id();
    c.maintenance_client().move_leader(me).await.unwrap();
    let refused = common::status(
        c.maintenance_client()
            .move_leader(me.wrapping_add(1))
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert_eq!(refused.message(), "etcdserver: bad leader transferee");

    // A service etcdsql does not serve is named in the answer, as grpc-go names it.
    let mut channel = tonic::client::Grpc::new(
        tonic::transport::Channel::from_shared(server.url())
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    channel.ready().await.unwrap();
    let unserved = channel
        .unary::<_, (), _>(
            tonic::Request::new(()),
            "/etcdserverpb.Nowhere/Nothing".parse().unwrap(),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(unserved.code(), tonic::Code::Unimplemented);
    assert_eq!(unserved.message(), "unknown service etcdserverpb.Nowhere");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer_and_unknown_paths_are_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let http = reqwest::Client::new();
    let get = |path: &str| {
        let http = http.clone();
        let url = format!("{}{path}", server.url());
        async move {
            let r = http.get(url).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    assert_eq!(get("/livez").await, (200, "ok\n".into()));
    assert_eq!(
        get("/readyz?verbose").await,
        (
            200,
            "[+]data_corruption ok\n[+]serializable_read ok\n[+]linearizable_read ok\n\
             [+]non_learner ok\nok\n"
                .into()
        )
    );
    assert_eq!(
        get("/readyz?verbose&exclude=linearizable_read").await.1,
        "[+]data_corruption ok\n[+]serializable_read ok\n[+]non_learner ok\nok\n"
    );
    assert_eq!(get("/readyz/linearizable_read").await, (200, "ok\n".into()));
    assert_eq!(get("/livez/linearizable_read").await.0, 404);
    assert_eq!(
        get("/health?serializable=true").await,
        (200, r#"{"health":"true","reason":""}"#.into())
    );
    assert_eq!(
        get("/no/such/path").await,
        (404, "404 page not found\n".into())
    );
    let post = http
        .post(format!("{}/v3/kv/nosuch", server.url()))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(post.status().as_u16(), 404);
    assert_eq!(
        post.text().await.unwrap(),
        r#"{"code":5, "message":"Not Found"}"#
    );
    // The gateway: JSON in, the same service, JSON out.
    let gateway = |path: &str, body: &'static str| {
        let request = http.post(format!("{}{path}", server.url())).body(body);
        async move {
            let r = request.send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<serde_json::Value>().await.unwrap())
        }
    };
    let (status, put) = gateway("/v3/kv/put", r#"{"key":"Zw==","value":"MQ=="}"#).await;
    assert_eq!(status, 200);
    let revision = put["header"]["revision"].clone();
    let (status, got) = gateway("/v3/kv/range", r#"{"key":"Zw=="}"#).await;
    assert_eq!(status, 200);
    assert_eq!(got["kvs"][0]["value"], "MQ==");
    assert_eq!(got["kvs"][0]["mod_revision"], revision);
    assert_eq!(got["count"], "1");
    let (status, refused) = gateway("/v3/kv/range", "{}").await;
    assert_eq!(status, 400);
    assert_eq!(refused["message"], "etcdserver: key is not provided");
    let post = http
        .post(format!("{}/livez", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(post.status().as_u16(), 405);
    assert_eq!(post.headers()["allow"], "GET");
    server.stop().await;
}
