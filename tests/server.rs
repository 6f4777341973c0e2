//! Everything around the KV API: Maintenance, Cluster, HTTP endpoints and gRPC health on the
//! client port, unsupported calls, shutdown, and durability across a crash of the real binary.

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{TestServer, free_port, shared_database, status, test_endpoint};
use etcd_client::{Client, GetOptions};
use tonic::Code;

#[tokio::test]
async fn status_reports_one_leader_and_the_current_revision() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    c.put("a", "1", None).await.unwrap();
    let s = c.status().await.unwrap();
    let header = s.header().unwrap();
    assert_eq!(header.revision(), 2);
    assert_eq!(s.version(), "3.6.16");
    assert_eq!(s.leader(), header.member_id());
    assert_ne!(s.leader(), 0);
    assert!(s.db_size() > 0);
    assert!(s.raft_used_db_size() > 0 && s.raft_used_db_size() <= s.db_size());
    assert_eq!(s.raft_index(), 2);
    assert!(s.raft_term() > 0);
    assert!(!s.is_learner());

    let alarms = c
        .alarm(
            etcd_client::AlarmAction::Get,
            etcd_client::AlarmType::None,
            None,
        )
        .await
        .unwrap();
    assert!(alarms.alarms().is_empty());
    server.stop().await;
}

#[tokio::test]
async fn member_list_names_this_server_and_its_urls() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(dir.path(), |c| c.name = "node-a".into()).await;
    let mut c = server.client().await;
    let list = c.member_list().await.unwrap();
    let members = list.members();
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].name(), "node-a");
    assert_eq!(members[0].client_urls(), [server.url()]);
    assert_eq!(members[0].id(), list.header().unwrap().member_id());
    server.stop().await;

    let advertised = TestServer::start_with(dir.path(), |c| {
        c.advertise_client_urls = vec!["http://etcd.example:2379".into()];
    })
    .await;
    let mut c = advertised.client().await;
    let list = c.member_list().await.unwrap();
    assert_eq!(
        list.members()[0].client_urls(),
        ["http://etcd.example:2379"]
    );
    advertised.stop().await;
}

#[tokio::test]
async fn http_version_and_health_share_the_grpc_port() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(dir.path(), |c| {
        c.emulated_etcd_version = "3.5.21".into();
    })
    .await;
    let http = reqwest::Client::new();
    let version: serde_json::Value = http
        .get(format!("{}/version", server.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        version,
        serde_json::json!({"etcdserver": "3.5.21", "etcdcluster": "3.5.0"})
    );
    let health = http
        .get(format!("{}/health", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let body: serde_json::Value = health.json().await.unwrap();
    assert_eq!(body, serde_json::json!({"health": "true", "reason": ""}));

    // And gRPC still works on that port.
    let mut c = server.client().await;
    c.put("k", "v", None).await.unwrap();
    server.stop().await;
}

/// A plain gRPC channel to `server`, for calls the etcd client does not make.
async fn channel(server: &TestServer) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(server.url())
        .expect("a valid URL")
        .connect()
        .await
        .expect("connects")
}

#[tokio::test]
async fn grpc_health_service_answers_serving() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let channel = channel(&server).await;
    let mut health = HealthClient::new(channel);
    // The reporter checks the database on start-up; poll until it has.
    let mut serving = false;
    for _ in 0..100 {
        let answer = health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await;
        if let Ok(answer) = answer
            && answer.into_inner().status == ServingStatus::Serving as i32
        {
            serving = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(serving, "health service never reported SERVING");
    server.stop().await;
}

#[tokio::test]
async fn unsupported_calls_answer_unimplemented() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let add = status(
        c.member_add(["http://127.0.0.1:1"], None)
            .await
            .unwrap_err(),
    );
    assert_eq!(add.code(), Code::Unimplemented);
    assert!(add.message().contains("member add"), "{add:?}");
    server.stop().await;
}

/// KV calls go to the KV service by their path and every other call through the router; both
/// answer as gRPC does, without the `date` header hyper would add (grpc-go sends none, and each
/// one costs both ends HPACK work), and an unknown KV method is Unimplemented.
#[tokio::test]
async fn grpc_answers_by_path_without_a_date_header() {
    use etcdsql::pb::etcdserverpb as pb;

    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let channel = channel(&server).await;
    let mut grpc = tonic::client::Grpc::new(channel);

    grpc.ready().await.unwrap();
    let put: tonic::Response<pb::PutResponse> = grpc
        .unary(
            tonic::Request::new(pb::PutRequest {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
                ..Default::default()
            }),
            "/etcdserverpb.KV/Put".parse().unwrap(),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap();
    assert_eq!(put.get_ref().header.as_ref().unwrap().revision, 2);
    assert!(put.metadata().get("date").is_none(), "{:?}", put.metadata());

    grpc.ready().await.unwrap();
    let status: tonic::Response<pb::StatusResponse> = grpc
        .unary(
            tonic::Request::new(pb::StatusRequest {}),
            "/etcdserverpb.Maintenance/Status".parse().unwrap(),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap();
    assert_eq!(status.get_ref().header.as_ref().unwrap().revision, 2);
    assert!(
        status.metadata().get("date").is_none(),
        "{:?}",
        status.metadata()
    );

    grpc.ready().await.unwrap();
    let unknown: Result<tonic::Response<pb::PutResponse>, _> = grpc
        .unary(
            tonic::Request::new(pb::PutRequest::default()),
            "/etcdserverpb.KV/Nope".parse().unwrap(),
            tonic_prost::ProstCodec::default(),
        )
        .await;
    assert_eq!(unknown.unwrap_err().code(), Code::Unimplemented);
    server.stop().await;
}

/// Shutdown with writes in flight: every write acknowledged before the server stopped is in the
/// database afterwards, and the revision counts exactly the acknowledged writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_keeps_every_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let mut writers = Vec::new();
    for w in 0..8 {
        let mut c = client.clone();
        writers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..10_000 {
                let key = format!("w{w}/{i:05}");
                match c.put(key.clone(), "v", None).await {
                    Ok(_) => acked.push(key),
                    Err(_) => break,
                }
            }
            acked
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.stop().await;
    let mut acked = Vec::new();
    for w in writers {
        acked.extend(w.await.unwrap());
    }
    assert!(!acked.is_empty(), "some writes completed before shutdown");

    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    let all = c
        .get("w", Some(GetOptions::new().with_prefix().with_keys_only()))
        .await
        .unwrap();
    let stored: std::collections::HashSet<_> = all
        .kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap().to_owned())
        .collect();
    for key in &acked {
        assert!(stored.contains(key), "acknowledged {key} was lost");
    }
    // A write can be committed and then lose its reply to the shutdown, never the reverse.
    assert!(stored.len() >= acked.len());
    assert_eq!(all.header().unwrap().revision(), 1 + stored.len() as i64);
    server.stop().await;
}

struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the real binary and waits until it answers a read.
async fn spawn_binary(dir: &std::path::Path, port: u16) -> (Process, Client) {
    let child = Command::new(env!("CARGO_BIN_EXE_etcdsql"))
        .arg("--listen-client-urls")
        .arg(format!("http://127.0.0.1:{port}"))
        .arg("--endpoint")
        .arg(test_endpoint(dir))
        .arg("--log-level")
        .arg("warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("binary starts");
    let process = Process(child);
    let url = format!("http://127.0.0.1:{port}");
    for _ in 0..200 {
        if let Ok(mut c) = Client::connect([url.as_str()], None).await
            && c.get("probe", None).await.is_ok()
        {
            return (process, c);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("etcdsql did not become ready");
}

/// The server turns transparent huge pages off for itself (see `main.rs`): the kernel reports
/// it in the process's status.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_binary_runs_without_transparent_huge_pages() {
    let dir = tempfile::tempdir().unwrap();
    let (process, _client) = spawn_binary(dir.path(), free_port()).await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", process.0.id())).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("THP_enabled:"))
        .expect("the kernel reports THP_enabled (Linux 5.0 and later)");
    assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
}

/// Writes that never pause still let the SQLite WAL start over, so its file stays near
/// its configured bound rather than growing with everything written (backend/sqlite).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_wal_starts_over_under_writes_that_never_pause() {
    if common::on_postgres() || common::on_mysql() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Smaller than the default, so that writing the WAL full four times takes seconds.
    let limit: u64 = 32 * 1024 * 1024;
    let server = TestServer::start_with(dir.path(), |c| {
        c.sqlite_wal_restart_bytes = i64::try_from(limit).unwrap();
    })
    .await;
    let client = server.client().await;
    // Enough values to fill the WAL four times over, from writers that always have one in
    // flight, so the writer is never idle for a whole background checkpoint. The values are
    // small enough that the WAL grows by well under the bound while one background pass runs,
    // even on a busy machine: the restart is asked for only once a pass has finished.
    let value = vec![b'x'; 16 * 1024];
    let to_write = 4 * limit;
    let written = Arc::new(AtomicU64::new(0));
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..8 {
        let (mut c, value, written) = (client.clone(), value.clone(), written.clone());
        writers.spawn(async move {
            let mut i = 0u64;
            while written.load(Ordering::Relaxed) < to_write {
                c.put(format!("wal/{w}/{}", i % 8), value.clone(), None)
                    .await
                    .unwrap();
                written.fetch_add(value.len() as u64, Ordering::Relaxed);
                i += 1;
            }
        });
    }
    let wal = dir.path().join("state.db-wal");
    let largest = tokio::time::timeout(Duration::from_secs(300), async {
        let mut largest = 0;
        while !writers.is_empty() {
            largest = largest.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
            tokio::select! {
                done = writers.join_next() => done.unwrap().unwrap(),
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
        largest
    })
    .await
    .expect("the writers did not finish within 300 s");
    eprintln!("the WAL peaked at {largest} bytes");
    assert!(
        largest < 2 * limit,
        "the WAL grew to {largest} bytes while {} were written; it should start over past {limit}",
        written.load(Ordering::Relaxed)
    );
    server.stop().await;
}

/// `kill -9` in the middle of concurrent writes: every acknowledged write survives, the log has
/// no half-applied txn, and the server starts again on the same file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_dash_nine_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (mut process, client) = spawn_binary(dir.path(), port).await;

    let mut writers = Vec::new();
    for w in 0..8 {
        let mut c = client.clone();
        writers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..100_000 {
                // Two keys per txn: after the crash both or neither must exist.
                let txn = etcd_client::Txn::new().and_then([
                    etcd_client::TxnOp::put(format!("a/{w}/{i:06}"), "v", None),
                    etcd_client::TxnOp::put(format!("b/{w}/{i:06}"), "v", None),
                ]);
                match c.txn(txn).await {
                    Ok(_) => acked.push(format!("{w}/{i:06}")),
                    Err(_) => break,
                }
            }
            acked
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    process.0.kill().expect("SIGKILL");
    process.0.wait().unwrap();
    let mut acked = Vec::new();
    for w in writers {
        acked.extend(w.await.unwrap());
    }
    assert!(acked.len() > 10, "the writers got going before the kill");
    drop(process);

    let (_process, mut c) = spawn_binary(dir.path(), free_port()).await;
    let keys = |prefix: &'static str| {
        let mut c = c.clone();
        async move {
            c.get(
                prefix,
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )
            .await
            .unwrap()
            .kvs()
            .iter()
            .map(|kv| kv.key_str().unwrap()[2..].to_owned())
            .collect::<std::collections::BTreeSet<_>>()
        }
    };
    let a = keys("a/").await;
    let b = keys("b/").await;
    assert_eq!(a, b, "every txn is whole or absent");
    for key in &acked {
        assert!(a.contains(key), "acknowledged txn {key} was lost");
    }
    let current = c
        .get("a/", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    assert_eq!(
        current,
        1 + a.len() as i64,
        "one revision per committed txn"
    );
}

/// SIGTERM stops the real binary cleanly: exit status 0, and SQLite's write-ahead log is folded
/// back into the database file, which happens only when the last connection closes properly.
#[tokio::test]
async fn sigterm_shuts_down_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let (mut process, mut c) = spawn_binary(dir.path(), free_port()).await;
    c.put("before-term", "v", None).await.unwrap();
    let wal = dir.path().join("state.db-wal");
    let sqlite = !shared_database();
    assert!(!sqlite || wal.exists(), "WAL mode is on while serving");

    let pid = process.0.id().to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(sent.success());
    let mut exit = None;
    for _ in 0..200 {
        if let Some(status) = process.0.try_wait().unwrap() {
            exit = Some(status);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let exit = exit.expect("etcdsql exits after SIGTERM");
    assert!(exit.success(), "clean exit, got {exit:?}");
    assert!(!sqlite || !wal.exists(), "the database was closed cleanly");

    let (_process, mut c) = spawn_binary(dir.path(), free_port()).await;
    let kept = c.get("before-term", None).await.unwrap();
    assert_eq!(kept.kvs()[0].value(), b"v");
}

/// A tmpfs of its own, for a test that fills its disk; unmounted when dropped.
struct SmallDisk(tempfile::TempDir);

impl SmallDisk {
    /// A tmpfs of `mib` MiB, or `None` where this process may not mount one (not root). Runs
    /// that must exercise a full disk set `ETCDSQL_TEST_DISK_FULL=1` (test.sh does, where it
    /// runs as root), and then not being able to mount is a failure.
    fn mount(mib: u32) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "etcdsql-test"])
            .arg(dir.path())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if mounted {
            return Some(Self(dir));
        }
        assert!(
            std::env::var_os("ETCDSQL_TEST_DISK_FULL").is_none(),
            "ETCDSQL_TEST_DISK_FULL is set but a tmpfs cannot be mounted here"
        );
        eprintln!("skipped: mounting a tmpfs needs root (ETCDSQL_TEST_DISK_FULL=1 requires it)");
        None
    }

    fn resize(&self, mib: u32) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={mib}m")])
            .arg(self.0.path())
            .status()
            .unwrap();
        assert!(status.success(), "remounting the tmpfs at {mib} MiB failed");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

/// A full disk under concurrent writes, on SQLite, whose writer runs each batch while the one
/// before commits: a commit that fails takes the batch built on it along. Writes then fail
/// with an error rather than hang; every write acknowledged before the disk filled, and after
/// space came back (no restart), holds the value and the revision its answer named, and no
/// revision was answered twice; a `kill -9` and a restart keep them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_writes_and_loses_no_acknowledged_one() {
    if shared_database() {
        return;
    }
    let Some(disk) = SmallDisk::mount(3) else {
        return;
    };
    let (process, client) = spawn_binary(disk.0.path(), free_port()).await;
    // Each writer puts `count` keys of its own, each once, or fewer if its writes fail 20 times
    // in a row (the disk is full).
    let write = |round: usize, count: usize| {
        let mut writers = tokio::task::JoinSet::new();
        for w in 0..8 {
            let mut c = client.clone();
            writers.spawn(async move {
                let (mut acked, mut failures, mut in_a_row) = (Vec::new(), Vec::new(), 0);
                for i in 0..count {
                    let key = format!("full/{round}/{w}/{i:06}");
                    let value = format!("{key}:{}", "v".repeat(2000));
                    match c.put(key.as_str(), value.as_str(), None).await {
                        Ok(r) => {
                            acked.push((key, value, r.header().unwrap().revision()));
                            in_a_row = 0;
                        }
                        Err(e) => {
                            failures.push(status(e));
                            in_a_row += 1;
                            if in_a_row == 20 {
                                break;
                            }
                        }
                    }
                }
                (acked, failures)
            });
        }
        async move {
            let (mut acked, mut failures) = (Vec::new(), Vec::new());
            tokio::time::timeout(Duration::from_secs(120), async {
                while let Some(done) = writers.join_next().await {
                    let (a, f) = done.unwrap();
                    acked.extend(a);
                    failures.extend(f);
                }
            })
            .await
            .expect("the writers got their answers within 120 s");
            (acked, failures)
        }
    };
    // 3 MiB hold about 500 of these writes.
    let (mut acked, failures) = write(0, 100_000).await;
    assert!(acked.len() > 100, "only {} writes went in", acked.len());
    assert!(failures.len() >= 8 * 20, "every writer ends on a full disk");
    eprintln!(
        "{} writes acknowledged before the disk filled; the first refusal: {:?}",
        acked.len(),
        failures[0]
    );
    // A full disk is the storage failing, as a lost database connection is: retryable.
    assert!(
        failures.iter().all(|s| s.code() == Code::Unavailable),
        "every refusal is Unavailable: {failures:?}"
    );

    // Space comes back: writes go in again without a restart.
    disk.resize(64);
    let mut c = client.clone();
    let mut again = None;
    for attempt in 0..50 {
        match c.put("full/after", "back", None).await {
            Ok(r) => {
                again = Some(r.header().unwrap().revision());
                break;
            }
            Err(e) if attempt < 49 => {
                eprintln!("a write after space came back failed: {:?}", status(e));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("writes still fail once space is back: {:?}", status(e)),
        }
    }
    let again = again.expect("a write went in");
    let (more, refused) = write(1, 100).await;
    assert!(
        refused.is_empty(),
        "writes failed with room on the disk: {refused:?}"
    );
    acked.extend(more);
    acked.push(("full/after".into(), "back".into(), again));

    let check = |mut c: Client, acked: Vec<(String, String, i64)>| async move {
        let mut revisions = std::collections::BTreeSet::new();
        for (key, value, revision) in &acked {
            assert!(
                revisions.insert(*revision),
                "revision {revision} was answered to two writes"
            );
            let got = c.get(key.as_str(), None).await.unwrap();
            let kv = got
                .kvs()
                .first()
                .unwrap_or_else(|| panic!("acknowledged {key} at revision {revision} was lost"));
            assert_eq!(kv.mod_revision(), *revision, "{key} is at another revision");
            assert_eq!(kv.value(), value.as_bytes(), "{key} holds another value");
        }
        // Every revision is one put of a key of its own: a revision with no key would be a
        // batch answered at revisions the log skipped.
        let all = c
            .get(
                "full/",
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
            .unwrap();
        let current = all.header().unwrap().revision();
        assert_eq!(
            current,
            1 + all.count(),
            "one revision per write in the log"
        );
        assert!(revisions.last().is_some_and(|newest| *newest <= current));
    };
    check(client.clone(), acked.clone()).await;

    // And after a crash.
    drop(process);
    let (_process, client) = spawn_binary(disk.0.path(), free_port()).await;
    check(client, acked).await;
}
