//! PostgreSQL failover. Each test makes a primary and a streaming standby of its own, as two
//! new clusters of the machine's PostgreSQL (`pg_createcluster`, `pg_basebackup -R`), starts
//! two etcdsql instances on an endpoint naming both hosts, and runs writers and prefix watchers
//! on both. Then it stops the primary hard and promotes the standby. etcdsql must find the new
//! primary by itself within a bound, and:
//! - with synchronous replication, keep every acknowledged write, and the watches carry on
//!   with every revision once, in order;
//! - with asynchronous replication and the standby cut off before the last writes (so that
//!   they are lost for certain), never acknowledge a revision twice or go backwards, cancel
//!   the watches as compacted (a client then watches again from the compact revision), and
//!   count the lost revisions in `/metrics`.
//!
//! The clusters are dropped afterwards whatever happened. Needs root and Debian's PostgreSQL
//! tools, and runs only on PostgreSQL runs with `ETCDSQL_TEST_FAILOVER=1` (test.sh sets it).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{TestServer, current_revision, etcdsql_tool, on_postgres};
use etcd_client::{Client, GetOptions, WatchOptions};
use tokio::time::Instant;
use tonic::Code;

/// The two tests each run two clusters and two servers under load: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long etcdsql may take to write again after the standby is promoted.
const RECOVERY: Duration = Duration::from_secs(60);

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} runs: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// One PostgreSQL cluster made for the test; dropped, stopped or not, with the value.
struct Cluster {
    version: String,
    name: String,
    port: u16,
}

impl Cluster {
    fn create(name: String, extra_conf: &str) -> Self {
        let version = common::postgres_version();
        let port = common::free_port();
        let _ = Command::new("pg_dropcluster")
            .args(["--stop", &version, &name])
            .output();
        let port_arg = port.to_string();
        run(
            "pg_createcluster",
            &[&version, &name, "-p", &port_arg, "--", "--auth=trust"],
        );
        let cluster = Self {
            version,
            name,
            port,
        };
        let conf = format!(
            "/etc/postgresql/{}/{}/postgresql.conf",
            cluster.version, cluster.name
        );
        let mut text = std::fs::read_to_string(&conf).expect("the cluster's configuration");
        text.push_str("listen_addresses = '127.0.0.1'\nshared_buffers = '32MB'\n");
        text.push_str(extra_conf);
        std::fs::write(&conf, text).expect("the configuration is written");
        cluster
    }

    fn ctl(&self, args: &[&str]) {
        let mut all = vec!["--skip-systemctl-redirect"];
        all.extend_from_slice(&args[..args.len() - 1]);
        all.extend([
            self.version.as_str(),
            self.name.as_str(),
            args[args.len() - 1],
        ]);
        run("pg_ctlcluster", &all);
    }

    fn data_dir(&self) -> String {
        format!("/var/lib/postgresql/{}/{}", self.version, self.name)
    }

    /// psql's arguments to run `sql` as postgres in `database`, output unaligned.
    fn psql_args<'a>(port: &'a str, database: &'a str, sql: &'a str) -> [&'a str; 10] {
        [
            "-h",
            "127.0.0.1",
            "-p",
            port,
            "-U",
            "postgres",
            "-d",
            database,
            "-Atqc",
            sql,
        ]
    }

    /// Runs `sql` as postgres in `database`; its output.
    fn sql(&self, database: &str, sql: &str) -> String {
        let port = self.port.to_string();
        run("psql", &Self::psql_args(&port, database, sql))
    }

    /// Waits, bounded, until `sql` answers `want`.
    async fn wait_for(&self, database: &str, sql: &str, want: &str, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let port = self.port.to_string();
            let out = Command::new("psql")
                .args(Self::psql_args(&port, database, sql))
                .output()
                .expect("psql runs");
            if String::from_utf8_lossy(&out.stdout).trim() == want {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: not within 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("pg_dropcluster")
            .args(["--stop", &self.version, &self.name])
            .output();
    }
}

/// A primary and its streaming standby.
async fn primary_and_standby(mode: &str, synchronous: bool) -> (Cluster, Cluster) {
    let base = format!("etcdsql_fo_{mode}_{}", std::process::id());
    let sync_conf = if synchronous {
        "synchronous_standby_names = '*'\n"
    } else {
        ""
    };
    let primary = Cluster::create(format!("{base}_p"), sync_conf);
    primary.ctl(&["start"]);
    let standby = Cluster::create(format!("{base}_s"), "");
    let data = standby.data_dir();
    // pg_basebackup fills the folder pg_createcluster made (and owns), once it is empty.
    for entry in std::fs::read_dir(&data).expect("the standby's data folder") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        }
        .expect("the standby's fresh data goes");
    }
    let port = primary.port.to_string();
    run(
        "runuser",
        &[
            "-u",
            "postgres",
            "--",
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            "postgres",
            "-D",
            &data,
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
        ],
    );
    standby.ctl(&["start"]);
    let state = if synchronous { "sync" } else { "async" };
    primary
        .wait_for(
            "postgres",
            "SELECT string_agg(sync_state, ',') FROM pg_stat_replication WHERE state = 'streaming'",
            state,
            "the standby streams",
        )
        .await;
    (primary, standby)
}

/// An acknowledged put.
#[derive(Clone, Debug)]
struct Ack {
    key: String,
    revision: i64,
    at: Instant,
}

/// Puts new keys under `f/{writer}/` until told to stop; waits a little after each refusal.
fn writer(
    mut client: Client,
    writer: usize,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<Ack>> {
    tokio::spawn(async move {
        let mut acks = Vec::new();
        for i in 0..1_000_000 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let key = format!("f/{writer}/{i:07}");
            let put =
                tokio::time::timeout(Duration::from_secs(30), client.put(key.clone(), "v", None))
                    .await
                    .unwrap_or_else(|_| panic!("a put on writer {writer} took over 30 s"));
            match put {
                Ok(put) => acks.push(Ack {
                    key,
                    revision: put.header().expect("a header").revision(),
                    at: Instant::now(),
                }),
                Err(etcd_client::Error::GRpcStatus(s)) => {
                    assert_eq!(s.code(), Code::Unavailable, "writer {writer}: {s:?}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("writer {writer}: unexpected error {e:?}"),
            }
        }
        acks
    })
}

/// What a prefix watch received: event revisions, and the compact revision it was cancelled
/// with, if it was.
#[derive(Default)]
struct Seen {
    revisions: Vec<i64>,
    cancelled: Option<i64>,
}

fn watcher(mut client: Client, from: i64) -> (Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let out = seen.clone();
    let task = tokio::spawn(async move {
        let options = WatchOptions::new().with_prefix().with_start_revision(from);
        let mut stream = client.watch("f/", Some(options)).await.expect("watch");
        while let Ok(Some(response)) = stream.message().await {
            let mut seen = out.lock().unwrap();
            seen.revisions.extend(
                response
                    .events()
                    .iter()
                    .filter_map(|e| e.kv())
                    .map(|kv| kv.mod_revision()),
            );
            if response.canceled() {
                seen.cancelled = Some(response.compact_revision());
                return;
            }
        }
    });
    (seen, task)
}

/// Waits, up to `bound`, until the watch has seen revision `through` or was cancelled.
async fn settle(seen: &Mutex<Seen>, through: i64, which: &str, bound: Duration) {
    let deadline = Instant::now() + bound;
    loop {
        {
            let seen = seen.lock().unwrap();
            if seen.cancelled.is_some() || seen.revisions.last().is_some_and(|r| *r >= through) {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the watch on {which} neither reached revision {through} nor was cancelled in {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn lost_revisions(server: &TestServer) -> u64 {
    let text = reqwest::get(format!("{}/metrics", server.url()))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix("etcdsql_failover_lost_revisions_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("the lost-revisions counter is exposed")
}

fn enabled() -> bool {
    if on_postgres() && std::env::var("ETCDSQL_TEST_FAILOVER").as_deref() == Ok("1") {
        return true;
    }
    eprintln!("skipped: needs ETCDSQL_TEST_BACKEND=postgres and ETCDSQL_TEST_FAILOVER=1");
    false
}

/// What a failover run produced.
struct Outcome {
    acks: Vec<Vec<Ack>>,
    /// When the primary was stopped, and when the standby was promoted after that.
    killed: Instant,
    promoted: Instant,
    /// The revision the standby had when it was cut off (asynchronous runs).
    standby_had: Option<i64>,
    servers: [TestServer; 2],
    clients: [Client; 2],
    watches: [Arc<Mutex<Seen>>; 2],
    start: i64,
}

/// How the primary fails.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// Stopped hard: its connections are reset at once.
    Crash,
    /// Gone without a word: every packet to and from it is dropped, so connections hang until
    /// etcdsql's own timeouts end them.
    Vanish,
}

/// Drops every packet to and from a port on the loopback interface while it lives.
struct Blackhole {
    rules: [[String; 10]; 2],
}

impl Blackhole {
    fn new(port: u16) -> Self {
        let rule = |direction: &str| {
            [
                "INPUT",
                "-i",
                "lo",
                "-p",
                "tcp",
                direction,
                &port.to_string(),
                "-j",
                "DROP",
                "-w",
            ]
            .map(str::to_owned)
        };
        let hole = Self {
            rules: [rule("--dport"), rule("--sport")],
        };
        for rule in &hole.rules {
            let mut args = vec!["-I".to_owned()];
            args.extend(rule.iter().cloned());
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run("iptables", &args);
        }
        hole
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        for rule in &self.rules {
            let _ = Command::new("iptables").arg("-D").args(rule).output();
        }
    }
}

/// What a test holds until it ends, dropped in this order: any blackhole (so that the old
/// primary stops at once, its servers are gone by then), the clusters, then the guard that
/// runs one failover at a time.
struct Held {
    _blackhole: Option<Blackhole>,
    clusters: [Cluster; 2],
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

/// Two instances under load through a failover, with a synchronous standby, or with an
/// asynchronous one cut off before the last writes; checks that revisions only grew.
async fn fail_over(synchronous: bool, failure: Failure) -> (Outcome, Held) {
    let serial = SERIAL.lock().await;
    let mode = match (synchronous, failure) {
        (true, Failure::Crash) => "sync",
        (false, Failure::Crash) => "async",
        (_, Failure::Vanish) => "vanish",
    };
    let (primary, standby) = primary_and_standby(mode, synchronous).await;
    let (outcome, blackhole) = under_load(&primary, &standby, !synchronous, failure).await;
    revisions_only_grow(&outcome);
    let held = Held {
        _blackhole: blackhole,
        clusters: [primary, standby],
        _serial: serial,
    };
    (outcome, held)
}

/// Two instances under load through a failover; `cut_off` cuts the standby off first.
async fn under_load(
    primary: &Cluster,
    standby: &Cluster,
    cut_off: bool,
    failure: Failure,
) -> (Outcome, Option<Blackhole>) {
    let endpoint = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/etcdsql_failover",
        primary.port, standby.port
    );
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut servers = Vec::new();
    for dir in &dirs {
        let endpoint = endpoint.clone();
        servers.push(
            TestServer::start_with(dir.path(), move |c| {
                c.endpoint = endpoint;
                c.db_connect_timeout = Duration::from_secs(1);
                // Far longer than the tests' bounds: another instance's commits reach the
                // watchers through NOTIFY, so the LISTEN must have followed the primary.
                c.watch_poll_interval = Duration::from_secs(600);
            })
            .await,
        );
    }
    let servers: [TestServer; 2] = servers.try_into().unwrap_or_else(|_| unreachable!());
    let clients = [servers[0].client().await, servers[1].client().await];
    let start = current_revision(&mut clients[0].clone()).await;
    let (seen_a, _wa) = watcher(clients[0].clone(), start + 1);
    let (seen_b, _wb) = watcher(clients[1].clone(), start + 1);

    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| writer(clients[w % 2].clone(), w, stop.clone()))
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut standby_had = None;
    if cut_off {
        standby.sql("postgres", "ALTER SYSTEM SET primary_conninfo = ''");
        standby.sql("postgres", "SELECT pg_reload_conf()");
        standby
            .wait_for(
                "postgres",
                "SELECT count(*) FROM pg_stat_wal_receiver",
                "0",
                "the standby is cut off",
            )
            .await;
        let had = standby.sql(
            "etcdsql_failover",
            "SELECT value FROM meta WHERE name = 'current_revision'",
        );
        standby_had = Some(had.parse().expect("a revision"));
        // Writes the standby will never have.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let killed = Instant::now();
    let blackhole = match failure {
        Failure::Crash => {
            tokio::task::block_in_place(|| primary.ctl(&["-m", "immediate", "stop"]));
            None
        }
        Failure::Vanish => Some(Blackhole::new(primary.port)),
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let promoted = Instant::now();
    tokio::task::block_in_place(|| standby.ctl(&["promote"]));

    // Both instances write again, by themselves, within the bound.
    let deadline = promoted + RECOVERY;
    for (i, client) in clients.iter().enumerate() {
        let mut client = client.clone();
        loop {
            let put =
                tokio::time::timeout(Duration::from_secs(10), client.put("probe", "v", None)).await;
            if let Ok(Ok(_)) = put {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "instance {i} did not write within {RECOVERY:?} of the promotion: {put:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let mut acks = Vec::new();
    for w in writers {
        acks.push(w.await.expect("a writer ends"));
    }
    let _dirs = dirs;
    let outcome = Outcome {
        acks,
        killed,
        promoted,
        standby_had,
        servers,
        clients,
        watches: [seen_a, seen_b],
        start,
    };
    (outcome, blackhole)
}

/// Checks that hold in both modes: each writer's revisions grow, no revision is acknowledged
/// twice, and everything acknowledged after the failover is above everything before it.
fn revisions_only_grow(outcome: &Outcome) {
    let mut all = BTreeSet::new();
    for (w, acks) in outcome.acks.iter().enumerate() {
        for pair in acks.windows(2) {
            assert!(
                pair[0].revision < pair[1].revision,
                "writer {w}: revision {} after {}",
                pair[1].revision,
                pair[0].revision
            );
        }
        for ack in acks {
            assert!(
                all.insert(ack.revision),
                "revision {} acknowledged twice",
                ack.revision
            );
        }
    }
    let before = outcome
        .acks
        .iter()
        .flatten()
        .filter(|a| a.at < outcome.killed);
    let after = outcome
        .acks
        .iter()
        .flatten()
        .filter(|a| a.at > outcome.promoted);
    let highest_before = before
        .map(|a| a.revision)
        .max()
        .expect("writes before the failover");
    let lowest_after = after
        .map(|a| a.revision)
        .min()
        .expect("writes after the failover");
    assert!(
        lowest_after > highest_before,
        "revision {lowest_after} acknowledged after the failover, {highest_before} before"
    );
}

/// Stops the servers, then checks the promoted standby's log with `etcdsql check`.
async fn stop_and_check(outcome: Outcome, promoted: &Cluster) {
    let Outcome { servers, .. } = outcome;
    for server in servers {
        server.stop().await;
    }
    let endpoint = format!(
        "postgres://postgres@127.0.0.1:{}/etcdsql_failover",
        promoted.port
    );
    let (code, out) = etcdsql_tool(&["--endpoint", &endpoint, "check"]);
    assert_eq!(code, 0, "etcdsql check after the failover: {out}");
}

/// The store's keys under `f/` with their mod revisions.
async fn stored(client: &Client) -> BTreeMap<String, i64> {
    let mut client = client.clone();
    let all = client
        .get("f/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("a read after the failover");
    all.kvs()
        .iter()
        .map(|kv| (kv.key_str().unwrap().to_owned(), kv.mod_revision()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_standby_keeps_every_acknowledged_write_and_watch() {
    if enabled() {
        nothing_lost(Failure::Crash).await;
    }
}

/// A primary whose host or network fails sends no reset: requests in flight hang until
/// etcdsql's socket timeouts end them, and then go to the promoted standby.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_that_vanishes_without_a_word_is_left_behind_too() {
    if enabled() {
        nothing_lost(Failure::Vanish).await;
    }
}

/// A failover to a synchronous standby: every acknowledged write is there, and each watch
/// carries on with every revision once, in order.
async fn nothing_lost(failure: Failure) {
    let (outcome, held) = fail_over(true, failure).await;

    let keys = stored(&outcome.clients[1]).await;
    let acks: Vec<&Ack> = outcome.acks.iter().flatten().collect();
    for ack in &acks {
        assert_eq!(
            keys.get(&ack.key),
            Some(&ack.revision),
            "acknowledged {ack:?}"
        );
    }
    let last = *keys.values().max().expect("keys");
    for (i, seen) in outcome.watches.iter().enumerate() {
        settle(
            seen,
            last,
            &format!("instance {i}"),
            Duration::from_secs(60),
        )
        .await;
        let seen = seen.lock().unwrap();
        assert_eq!(seen.cancelled, None, "instance {i}'s watch was cancelled");
        // Each key under f/ was written once, so its revision is an event the watch must
        // have had: each comes once, in order, and no other.
        let mut expected: Vec<i64> = keys
            .values()
            .copied()
            .filter(|r| *r > outcome.start)
            .collect();
        expected.sort_unstable();
        let got: Vec<i64> = seen
            .revisions
            .iter()
            .copied()
            .filter(|r| *r <= last)
            .collect();
        assert_eq!(got, expected, "instance {i}'s watch events");
    }
    for server in &outcome.servers {
        assert_eq!(
            lost_revisions(server).await,
            0,
            "nothing is lost with a synchronous standby"
        );
    }
    // A write on one instance reaches the other's watcher through NOTIFY alone.
    let put = outcome.clients[0]
        .clone()
        .put("f/after", "v", None)
        .await
        .expect("a put after the failover");
    let revision = put.header().expect("a header").revision();
    settle(
        &outcome.watches[1],
        revision,
        "instance 1, for a write on instance 0",
        Duration::from_secs(30),
    )
    .await;
    stop_and_check(outcome, &held.clusters[1]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_standby_loses_the_tail_but_revisions_never_go_back() {
    if !enabled() {
        return;
    }
    let (outcome, held) = fail_over(false, Failure::Crash).await;
    let standby_had = outcome.standby_had.expect("the standby was cut off");

    let keys = stored(&outcome.clients[0]).await;
    let acks: Vec<&Ack> = outcome.acks.iter().flatten().collect();
    let highest_before = acks
        .iter()
        .filter(|a| a.at < outcome.killed)
        .map(|a| a.revision)
        .max()
        .expect("writes before the failover");
    assert!(
        highest_before > standby_had,
        "no write was acknowledged after the standby was cut off at {standby_had}"
    );
    for ack in &acks {
        let kept = keys.get(&ack.key);
        if ack.revision <= standby_had || ack.at > outcome.promoted {
            assert_eq!(kept, Some(&ack.revision), "acknowledged {ack:?}");
        } else {
            assert_eq!(
                kept, None,
                "{ack:?} was written after the standby was cut off"
            );
        }
    }
    // The lost revisions are counted, once, by the instance that moved the store past them.
    let lost =
        lost_revisions(&outcome.servers[0]).await + lost_revisions(&outcome.servers[1]).await;
    assert!(
        lost >= (highest_before - standby_had) as u64,
        "{lost} revisions counted as lost; at least {} were",
        highest_before - standby_had
    );

    // Each watch is cancelled as compacted past everything served before; a client that
    // watches again from the compact revision hears of later writes.
    for (i, seen) in outcome.watches.iter().enumerate() {
        settle(
            seen,
            i64::MAX,
            &format!("instance {i}"),
            Duration::from_secs(60),
        )
        .await;
        let (revisions, compact) = {
            let seen = seen.lock().unwrap();
            (seen.revisions.clone(), seen.cancelled.expect("cancelled"))
        };
        assert!(
            compact > highest_before,
            "instance {i}: compact revision {compact}"
        );
        let expected: Vec<i64> = (outcome.start + 1..).take(revisions.len()).collect();
        assert_eq!(
            revisions, expected,
            "instance {i}'s events before the cancel"
        );

        let mut client = outcome.clients[i].clone();
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(compact);
        let mut stream = client
            .watch("f/again/", Some(options))
            .await
            .expect("watch");
        // Written through the other instance: it reaches this one through NOTIFY alone.
        let put = outcome.clients[1 - i]
            .clone()
            .put(format!("f/again/{i}"), "v", None)
            .await
            .expect("put");
        let revision = put.header().expect("header").revision();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let message = tokio::time::timeout_at(deadline, stream.message())
                .await
                .expect("the new watch hears of the put within 30 s")
                .expect("the stream")
                .expect("a response");
            assert!(
                !message.canceled(),
                "the new watch from {compact} was cancelled"
            );
            // The other instance's put may come first: the watch covers both.
            let key = format!("f/again/{i}");
            let mine = message
                .events()
                .iter()
                .filter_map(|e| e.kv())
                .find(|kv| kv.key() == key.as_bytes());
            if let Some(kv) = mine {
                assert_eq!(kv.mod_revision(), revision);
                break;
            }
        }
    }
    stop_and_check(outcome, &held.clusters[1]).await;
}
