//! A database outage under load (PostgreSQL and MySQL runs only): the local server is stopped
//! and started again with its own tools (`pg_ctlcluster`; `mariadb-admin` and `mariadbd`)
//! while writers and a watcher run. While it is down requests fail with `Unavailable`;
//! afterwards etcdsql recovers by itself, nothing acknowledged is lost, and the watch stream
//! carries on with no gap. Bounded: a fixed outage, a deadline on recovery.
//!
//! It stops the machine's database server, so it runs in its own test binary (cargo runs
//! binaries one at a time) and only when `ETCDSQL_TEST_OUTAGE=1` as well (test.sh sets it),
//! never by accident.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::{TestServer, on_mysql, shared_database};
use etcd_client::{GetOptions, WatchOptions};
use tonic::Code;

/// Stops or starts the database server the run targets.
fn db_ctl(action: &str) {
    if on_mysql() {
        mariadb_ctl(action);
        return;
    }
    let version = common::postgres_version();
    // Stopped the way a crash stops it (no shutdown checkpoint, recovery from the WAL at the
    // next start): what etcdsql acknowledged must survive that, and a fast shutdown's
    // checkpoint could outlast pg_ctl's wait on a machine busy writing.
    let mode: &[&str] = if action == "stop" {
        &["-m", "immediate"]
    } else {
        &[]
    };
    // pg_ctl waits 60 s by default; crash recovery on a machine busy with other tests can
    // take longer than that, and is not what this test is about.
    let status = Command::new("pg_ctlcluster")
        .arg("--skip-systemctl-redirect")
        .args(mode)
        .args([version.as_str(), "main", action, "--", "-t", "300"])
        .status()
        .expect("pg_ctlcluster runs");
    assert!(status.success(), "pg_ctlcluster {action} failed");
}

/// Stops MariaDB with its admin tool, or starts its server detached from the test (this machine
/// runs `mariadbd` without an init system, and Debian's init script needs a maintenance account
/// the machine does not have); either way waits, bounded, until it has happened.
///
/// "Stopped" means no `mariadbd` process is left, not merely that none answers: a second
/// `mariadbd` started while one runs does not fail, it waits for InnoDB's file lock and takes
/// over the moment the first one exits, so an outage that stopped only the first would last
/// about a second.
fn mariadb_ctl(action: &str) {
    let answers = || {
        Command::new("mariadb-admin")
            .args(["--protocol=tcp", "-h127.0.0.1", "-uroot", "ping"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let running = || {
        Command::new("pgrep")
            .args(["-x", "mariadbd"])
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let want_up = action == "start";
    if want_up {
        if !running() {
            Command::new("setsid")
                .args(["--fork", "/usr/sbin/mariadbd"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .expect("mariadbd starts");
        }
    } else {
        let status = Command::new("mariadb-admin")
            .args(["--protocol=tcp", "-h127.0.0.1", "-uroot", "shutdown"])
            .status()
            .expect("mariadb-admin runs");
        assert!(status.success(), "mariadb-admin shutdown failed");
    }
    for _ in 0..600 {
        let done = if want_up {
            answers()
        } else {
            !running() && !answers()
        };
        if done {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if want_up {
        panic!("MariaDB did not start within 60 s");
    }
    panic!(
        "a mariadbd process was still running 60 s after the shutdown: one that another start \
         left waiting for InnoDB's lock would take over, so there would be no outage"
    );
}

/// Starts the database again if the test ends while it is down (a panic during the outage).
struct RestartOnDrop {
    armed: bool,
}

impl Drop for RestartOnDrop {
    fn drop(&mut self) {
        if self.armed {
            let _ = std::panic::catch_unwind(|| db_ctl("start"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_outage_loses_nothing_and_recovers_by_itself() {
    if !shared_database() || std::env::var("ETCDSQL_TEST_OUTAGE").as_deref() != Ok("1") {
        eprintln!(
            "skipped: needs ETCDSQL_TEST_BACKEND=postgres or mysql, and ETCDSQL_TEST_OUTAGE=1"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(dir.path(), |c| {
        c.db_connect_timeout = Duration::from_secs(1);
    })
    .await;
    let client = server.client().await;
    let mut watch = client
        .clone()
        .watch("o/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), watch.message())
        .await
        .expect("the watch is created within 30 s")
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let mut c = client.clone();
            let stop = stop.clone();
            let refused = refused.clone();
            tokio::spawn(async move {
                let (mut acked, mut unavailable) = (Vec::new(), 0);
                for i in 0..100_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let key = format!("o/{w}/{i:06}");
                    match c.put(key.clone(), "v", None).await {
                        Ok(put) => acked.push((key, put.header().unwrap().revision())),
                        Err(etcd_client::Error::GRpcStatus(s)) => {
                            assert_eq!(s.code(), Code::Unavailable, "{s:?}");
                            unavailable += 1;
                            refused.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        Err(e) => panic!("unexpected error {e:?}"),
                    }
                }
                (acked, unavailable)
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut restart = RestartOnDrop { armed: true };
    db_ctl("stop");
    // Down for 2 s at least, and until requests have been refused: how soon the first one is
    // depends on where the writers were when the server went (a batch in flight first waits
    // for its connection to fail), and MariaDB stops and starts in a fraction of a second.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let down = tokio::time::Instant::now();
    while refused.load(Ordering::Relaxed) == 0 {
        assert!(
            down.elapsed() < Duration::from_secs(30),
            "no request was refused in 32 s without the database"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    db_ctl("start");
    restart.armed = false;
    // Recovery: a write succeeds again within the deadline.
    let mut c = client.clone();
    let started = tokio::time::Instant::now();
    while c.put("o/probe", "v", None).await.is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "etcdsql never recovered"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);

    let mut acked = Vec::new();
    let mut unavailable = 0;
    for w in writers {
        // Each writer stops at its next request; a request waits at most for the pool's
        // connect timeout.
        let (a, u) = tokio::time::timeout(Duration::from_secs(30), w)
            .await
            .expect("a writer stopped within 30 s of being told to")
            .unwrap();
        acked.extend(a);
        unavailable += u;
    }
    assert!(
        unavailable > 0,
        "requests failed while the database was down"
    );
    let stored = c
        .get("o/", Some(GetOptions::new().with_prefix().with_keys_only()))
        .await
        .unwrap();
    let keys: BTreeSet<String> = stored
        .kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap().to_owned())
        .collect();
    for (key, _) in &acked {
        assert!(keys.contains(key), "acknowledged {key} was lost");
    }

    // The watch stream went on through the outage: every revision from the first write to the
    // last, in order, none missing.
    let last = stored.header().unwrap().revision();
    let mut revisions = Vec::new();
    while revisions.last().copied().unwrap_or(0) < last {
        let r = tokio::time::timeout(Duration::from_secs(30), watch.message())
            .await
            .expect("events after the outage")
            .unwrap()
            .unwrap();
        revisions.extend(r.events().iter().map(|e| e.kv().unwrap().mod_revision()));
    }
    assert_eq!(revisions, (2..=last).collect::<Vec<_>>());
    server.stop().await;
}
