//! `etcdsql import --from-etcd`, checked against the etcd it copied: a real etcd (Debian's, see
//! `RealEtcd`) is given a history — thousands of keys written by txns (more than one Range
//! page), updates, deletions, leases, a compaction and changes after it — and imported into the
//! store the run targets. Then etcdsql and etcd must answer alike: every key at every retained
//! revision, `Compacted` below, a watch replaying the history with the same events and prev_kvs,
//! the same HashKV, the same leases; `etcdsql check` finds the store consistent; writes go on
//! from etcd's revision.

mod common;

use common::{RealEtcd, TestServer, etcdsql_tool, test_endpoint};
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions,
};

/// Keys written in the first txns: more than one page of the importer's Range.
const KEYS: usize = 2_500;
/// Puts per txn (etcd allows 128 ops).
const PER_TXN: usize = 100;

fn pod(i: usize) -> String {
    format!("/registry/pods/default/p{i:05}")
}

/// Gives `etcd` a history and returns its (compact, current) revisions.
async fn history(c: &mut Client) -> (i64, i64) {
    // Keys in key order, many per revision: the importer numbers them in key order.
    for start in (0..KEYS).step_by(PER_TXN) {
        let puts: Vec<TxnOp> = (start..start + PER_TXN)
            .map(|i| TxnOp::put(pod(i), format!("v1-{i}"), None))
            .collect();
        c.txn(Txn::new().and_then(puts)).await.unwrap();
    }
    // An earlier compaction: only the last one's revision counts.
    let first = c.get("k", None).await.unwrap().header().unwrap().revision();
    c.compact(first, None).await.unwrap();
    let keep = c.lease_grant(600, None).await.unwrap().id();
    let doomed = c.lease_grant(600, None).await.unwrap().id();
    // Before the compaction only the tail of the first txn changes: the Range that copies the
    // keys live at the compaction cannot see sub-revisions, and numbers the keys left at a
    // revision from 0 in key order, which matches etcd's numbering when what went is a tail.
    for i in 85..99 {
        c.put(pod(i), format!("v2-{i}"), None).await.unwrap();
    }
    c.put(
        "/registry/leases/a",
        "held",
        Some(PutOptions::new().with_lease(keep)),
    )
    .await
    .unwrap();
    c.put(
        "/registry/leases/b",
        "held",
        Some(PutOptions::new().with_lease(doomed)),
    )
    .await
    .unwrap();
    c.delete(pod(99), None).await.unwrap();
    c.put(pod(83), "v2", None).await.unwrap();
    let compact = c.put(pod(84), "v2", None).await.unwrap();
    let compact = compact.header().unwrap().revision();
    c.compact(compact, None).await.unwrap();
    // After the compaction: what a watch must replay, sub-revisions in op order (not key order).
    c.txn(Txn::new().and_then(vec![
        TxnOp::put(pod(50), "v3", None),
        TxnOp::delete(pod(40), None),
        TxnOp::put(pod(10), "v3", None),
        TxnOp::put("/registry/new", "n", None),
    ]))
    .await
    .unwrap();
    c.txn(
        Txn::new()
            .when(vec![Compare::version(pod(10), CompareOp::Greater, 1)])
            .and_then(vec![TxnOp::delete(pod(11), None)]),
    )
    .await
    .unwrap();
    c.delete(
        "/registry/pods/default/p0010",
        Some(etcd_client::DeleteOptions::new().with_range("/registry/pods/default/p0013")),
    )
    .await
    .unwrap();
    c.put(pod(99), "back", None).await.unwrap();
    c.put(
        "/registry/new",
        "n2",
        Some(PutOptions::new().with_lease(keep)),
    )
    .await
    .unwrap();
    c.lease_revoke(doomed).await.unwrap();
    let current = c.put(pod(60), "last", None).await.unwrap();
    (compact, current.header().unwrap().revision())
}

/// Every key at `revision` with every field, or the error's text.
async fn all_at(c: &mut Client, revision: i64) -> Result<Vec<String>, String> {
    let options = GetOptions::new().with_from_key().with_revision(revision);
    match c.get(vec![0_u8], Some(options)).await {
        Ok(r) => Ok(r
            .kvs()
            .iter()
            .map(|kv| {
                format!(
                    "{} {} c{} m{} v{} l{}",
                    kv.key_str().unwrap(),
                    kv.value_str().unwrap(),
                    kv.create_revision(),
                    kv.mod_revision(),
                    kv.version(),
                    kv.lease()
                )
            })
            .collect()),
        Err(e) => Err(common::status(e).message().to_owned()),
    }
}

/// A watch's events from `from` through `to`, each with its prev_kv.
async fn replay(c: &mut Client, from: i64, to: i64) -> Vec<String> {
    let options = WatchOptions::new()
        .with_from_key()
        .with_start_revision(from)
        .with_prev_key();
    let mut stream = c.watch(vec![0_u8], Some(options)).await.unwrap();
    let mut events = Vec::new();
    loop {
        let response = tokio::time::timeout(std::time::Duration::from_secs(30), stream.message())
            .await
            .expect("watch events within 30 s")
            .unwrap()
            .expect("the watch stays open");
        for e in response.events() {
            let kv = e.kv().unwrap();
            let prev = e.prev_kv().map(|p| {
                format!(
                    "{}@{} v{} c{}",
                    p.value_str().unwrap(),
                    p.mod_revision(),
                    p.version(),
                    p.create_revision()
                )
            });
            events.push(format!(
                "{:?} {} {} m{} v{} c{} l{} prev {prev:?}",
                e.event_type(),
                kv.key_str().unwrap(),
                kv.value_str().unwrap(),
                kv.mod_revision(),
                kv.version(),
                kv.create_revision(),
                kv.lease()
            ));
            if kv.mod_revision() == to && e.event_type() == EventType::Put {
                return events;
            }
        }
    }
}

/// Imports the etcd at `url` into `endpoint` with `extra` flags, expecting the store to end at
/// (compact, current) revisions, and checks the result.
fn import_and_check(endpoint: &str, url: &str, extra: &[&str], (compact, current): (i64, i64)) {
    let args = ["--endpoint", endpoint, "import", "--from-etcd", url];
    let (status, text) = etcdsql_tool(&[&args[..], extra].concat());
    assert_eq!(status, 0, "{text}");
    let expected = format!("current revision {current}, compact revision {compact}");
    assert!(text.contains(&expected), "{text}");
    let (status, text) = etcdsql_tool(&["check", endpoint]);
    assert_eq!(status, 0, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_with_its_history_imports_and_answers_as_etcd() {
    let etcd = RealEtcd::start().await;
    let mut source = etcd.client().await;
    let (compact, current) = history(&mut source).await;

    let dir = tempfile::tempdir().unwrap();
    let endpoint = test_endpoint(dir.path());
    import_and_check(
        &endpoint,
        &etcd.url,
        &["--with-history"],
        (compact, current),
    );

    let server = TestServer::start(dir.path()).await;
    let mut copy = server.client().await;
    for revision in compact..=current {
        let expected = all_at(&mut source, revision).await;
        assert_eq!(all_at(&mut copy, revision).await, expected, "at {revision}");
        assert!(expected.as_ref().is_ok_and(|kvs| kvs.len() > 2_000));
    }
    let below = all_at(&mut source, compact - 1).await;
    assert!(below.is_err());
    assert_eq!(all_at(&mut copy, compact - 1).await, below);

    let expected = replay(&mut source, compact + 1, current).await;
    assert_eq!(replay(&mut copy, compact + 1, current).await, expected);

    for revision in [0, current, compact + 3] {
        let (ours, theirs) = (
            copy.hash_kv(revision).await.unwrap(),
            source.hash_kv(revision).await.unwrap(),
        );
        assert_eq!(ours.hash(), theirs.hash(), "HashKV at {revision}");
        assert_eq!(ours.compact_version(), theirs.compact_version());
    }

    // The lease still held came along with its TTL; the revoked one did not.
    let leases: Vec<i64> = copy
        .leases()
        .await
        .unwrap()
        .leases()
        .iter()
        .map(|l| l.id())
        .collect();
    let theirs: Vec<i64> = source
        .leases()
        .await
        .unwrap()
        .leases()
        .iter()
        .map(|l| l.id())
        .collect();
    assert_eq!(leases, theirs);
    let ttl = copy.lease_time_to_live(leases[0], None).await.unwrap();
    assert_eq!(ttl.granted_ttl(), 600);
    assert!(ttl.ttl() > 500 && ttl.ttl() <= 600, "{}", ttl.ttl());

    let next = copy.put("/registry/after", "x", None).await.unwrap();
    assert_eq!(next.header().unwrap().revision(), current + 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_without_history_imports_its_current_keys() {
    let etcd = RealEtcd::start().await;
    let mut source = etcd.client().await;
    let (_, current) = history(&mut source).await;

    let dir = tempfile::tempdir().unwrap();
    let endpoint = test_endpoint(dir.path());
    import_and_check(&endpoint, &etcd.url, &[], (current, current));

    let server = TestServer::start(dir.path()).await;
    let mut copy = server.client().await;
    assert_eq!(
        all_at(&mut copy, current).await,
        all_at(&mut source, current).await
    );
    assert_eq!(
        all_at(&mut copy, current - 1).await,
        Err("etcdserver: mvcc: required revision has been compacted".into())
    );
    // A store that is not empty is refused, and keeps what it has.
    server.stop().await;
    let (status, text) =
        etcdsql_tool(&["--endpoint", &endpoint, "import", "--from-etcd", &etcd.url]);
    assert_ne!(status, 0, "{text}");
    assert!(text.contains("not empty"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_over_tls_with_a_client_certificate() {
    let pki = common::pki::Pki::new();
    let etcd = RealEtcd::start_with(Some(&pki)).await;
    let mut source = etcd.client().await;
    source.put("/registry/secrets/a", "s", None).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let endpoint = test_endpoint(dir.path());
    let file = |name: &str| pki.path(name).display().to_string();
    let (ca, cert, key) = (file("ca.crt"), file("client.crt"), file("client.key"));
    let import = |extra: &[&str]| {
        let args = ["--endpoint", &endpoint, "import", "--from-etcd"];
        etcdsql_tool(&[&args[..], extra].concat())
    };

    let (status, text) = import(&[&etcd.url]);
    assert_ne!(status, 0, "{text}");
    assert!(text.contains("needs --from-etcd-cacert"), "{text}");
    // etcd asks for a client certificate.
    let (status, text) = import(&[&etcd.url, "--from-etcd-cacert", &ca]);
    assert_ne!(status, 0, "{text}");
    assert!(text.contains("cannot copy etcd at"), "{text}");
    // HOST:PORT with a CA means https.
    let host_port = etcd.url.trim_start_matches("https://");
    // etcdctl's names for the TLS flags work too.
    let (status, text) = import(&[host_port, "--cacert", &ca, "--cert", &cert, "--key", &key]);
    assert_eq!(status, 0, "the failed tries left the store empty: {text}");

    let server = TestServer::start(dir.path()).await;
    let got = server
        .client()
        .await
        .get("/registry/secrets/a", None)
        .await
        .unwrap();
    assert_eq!(got.kvs()[0].value(), b"s");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_keeps_applying_etcds_changes_until_stopped() {
    let etcd = RealEtcd::start().await;
    let mut source = etcd.client().await;
    let (compact, _) = history(&mut source).await;
    let dir = tempfile::tempdir().unwrap();
    let endpoint = test_endpoint(dir.path());
    let log = dir.path().join("follow.log");
    let mut child = std::process::Command::new(common::etcdsql_bin())
        .args(["--log-level", "error", "--endpoint", &endpoint, "import"])
        .args(["--from-etcd", &etcd.url, "--with-history", "--follow"])
        .stdout(std::fs::File::create(dir.path().join("follow.out")).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap()
        .contains("follow: applying")
    {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the import ended early"
        );
        assert!(
            started.elapsed().as_secs() < 60,
            "not following within 60 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    // Changes after the copy: puts, a txn, a range delete, a lease granted after the copy with
    // a key on it, and a lease revoked while followed.
    let fresh = source.lease_grant(300, None).await.unwrap().id();
    let brief = source.lease_grant(300, None).await.unwrap().id();
    source
        .put(
            "/registry/followed",
            "1",
            Some(PutOptions::new().with_lease(fresh)),
        )
        .await
        .unwrap();
    source
        .put(
            "/registry/brief",
            "1",
            Some(PutOptions::new().with_lease(brief)),
        )
        .await
        .unwrap();
    source
        .txn(Txn::new().and_then(vec![
            TxnOp::put(pod(1), "v4", None),
            TxnOp::delete(pod(2), None),
            TxnOp::put(
                "/registry/followed",
                "2",
                Some(PutOptions::new().with_lease(fresh)),
            ),
        ]))
        .await
        .unwrap();
    source
        .delete(
            pod(100),
            Some(etcd_client::DeleteOptions::new().with_range(pod(110))),
        )
        .await
        .unwrap();
    source.lease_revoke(brief).await.unwrap();
    let current = source.put(pod(3), "last", None).await.unwrap();
    let current = current.header().unwrap().revision();

    // SAFETY: a plain signal to a child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed().as_secs() < 60,
            "follow did not stop within 60 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let out = std::fs::read_to_string(dir.path().join("follow.out")).unwrap()
        + &std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{out}");
    assert!(
        out.contains(&format!("Followed etcd through revision {current}")),
        "{out}"
    );
    let (status, text) = etcdsql_tool(&["check", &endpoint]);
    assert_eq!(status, 0, "{text}");

    let server = TestServer::start(dir.path()).await;
    let mut copy = server.client().await;
    for revision in compact..=current {
        let expected = all_at(&mut source, revision).await;
        assert_eq!(all_at(&mut copy, revision).await, expected, "at {revision}");
    }
    let expected = replay(&mut source, compact + 1, current).await;
    assert_eq!(replay(&mut copy, compact + 1, current).await, expected);
    let ids = |r: etcd_client::LeaseLeasesResponse| -> Vec<i64> {
        let mut ids: Vec<i64> = r.leases().iter().map(|l| l.id()).collect();
        ids.sort_unstable();
        ids
    };
    assert_eq!(
        ids(copy.leases().await.unwrap()),
        ids(source.leases().await.unwrap())
    );
    let ttl = copy.lease_time_to_live(fresh, None).await.unwrap();
    assert_eq!(ttl.granted_ttl(), 300);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_run_out_when_they_would_have_on_etcd() {
    let etcd = RealEtcd::start().await;
    let mut source = etcd.client().await;
    let lease = source.lease_grant(8, None).await.unwrap().id();
    source
        .put(
            "/registry/short",
            "x",
            Some(PutOptions::new().with_lease(lease)),
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let endpoint = test_endpoint(dir.path());
    let current = source
        .get("k", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    import_and_check(&endpoint, &etcd.url, &[], (current, current));
    let server = TestServer::start(dir.path()).await;
    let mut copy = server.client().await;
    let (ours, theirs) = (
        copy.lease_time_to_live(lease, None).await.unwrap(),
        source.lease_time_to_live(lease, None).await.unwrap(),
    );
    assert_eq!(ours.granted_ttl(), theirs.granted_ttl());
    assert!(
        (ours.ttl() - theirs.ttl()).abs() <= 1,
        "{} vs {}",
        ours.ttl(),
        theirs.ttl()
    );

    // Both delete the key when the lease runs out, etcdsql within seconds of etcd (its expiry
    // loop and etcd's both poll).
    let gone = |c: &mut etcd_client::Client| {
        let mut c = c.clone();
        async move {
            c.get("/registry/short", None)
                .await
                .unwrap()
                .kvs()
                .is_empty()
        }
    };
    let started = std::time::Instant::now();
    while !gone(&mut source).await {
        assert!(started.elapsed().as_secs() < 30, "etcd kept the key 30 s");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let on_etcd = started.elapsed();
    while !gone(&mut copy).await {
        assert!(
            started.elapsed().as_secs() < 30,
            "etcdsql kept the key 30 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let late = started.elapsed().as_secs_f64() - on_etcd.as_secs_f64();
    assert!(late < 5.0, "etcdsql deleted the key {late:.1} s after etcd");
    server.stop().await;
}
