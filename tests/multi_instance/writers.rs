//! The instances' writers on one database: an idle writer takes in the others' writes before it
//! writes on them; a writer that presumed it was alone runs its batch again after another's
//! commit, its leases and old values checked under the writers' lock; answers match the log
//! whichever instance wrote; and requests that queue while a batch waits for the lock join it.

use std::time::Duration;

use etcd_client::{PutOptions, WatchOptions};

use super::common::{self, TestServer, fields};
use super::{WAIT, metric, skip};

/// An instance that writes nothing while another writes a lot takes those writes into its
/// writer's key index while it is idle, rather than reading them all under the cluster-wide
/// write lock at its next write (which held every instance's writes up for seconds). Its writes
/// on those keys then carry what etcd would: the previous value, versions and create revisions
/// as the other instance left them, deletions and re-creations included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_instance_takes_in_other_writes_before_writing_on_them() {
    if skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let a = TestServer::start(dir.path()).await;
    let b = TestServer::start(dir.path()).await;
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    let key = |i: usize| format!("idle/{i:03}");
    // 550 revisions, more than an idle writer lets pass before it catches up.
    for round in ["1", "2"] {
        for i in 0..200 {
            ca.put(key(i), round, None).await.unwrap();
        }
    }
    for i in 0..100 {
        ca.delete(key(i), None).await.unwrap();
    }
    for i in 0..50 {
        ca.put(key(i), "3", None).await.unwrap();
    }
    // b's writer reads other processes' changes only to catch up, and has written nothing.
    let caught_up = r#"etcdsql_sql_duration_seconds_count{query="change_keys"}"#;
    let give_up = tokio::time::Instant::now() + WAIT;
    while metric(&b, caught_up).await == 0.0 {
        assert!(
            tokio::time::Instant::now() < give_up,
            "the idle instance never took in the other one's writes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 0..200 {
        let before = ca.get(key(i), None).await.unwrap().kvs().to_vec();
        let put = cb
            .put(key(i), "b", Some(PutOptions::new().with_prev_key()))
            .await
            .unwrap();
        let revision = put.header().unwrap().revision();
        let prev: Vec<_> = put.prev_key().into_iter().cloned().collect();
        assert_eq!(fields(&prev), fields(&before), "{}: previous key", key(i));
        let (version, created) = before
            .first()
            .map_or((1, revision), |kv| (kv.version() + 1, kv.create_revision()));
        let after = ca.get(key(i), None).await.unwrap();
        assert_eq!(
            fields(after.kvs()),
            vec![(
                key(i).into_bytes(),
                created,
                revision,
                version,
                b"b".to_vec(),
                0
            )],
            "{}: after b's put",
            key(i)
        );
    }
    a.stop().await;
    b.stop().await;
}

/// A writer whose last batch found no other instance's commits presumes there are none: its next
/// batch runs on its key index as it is and writes in one statement that checks the presumption
/// (PostgreSQL). When another instance did commit meanwhile, the batch runs again after taking
/// that commit in: a compare against what the other instance replaced fails, whether its txn
/// would write or not, and a failed compare's read returns the other instance's value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_presumed_it_was_alone_sees_what_another_committed() {
    if skip() {
        return;
    }
    let postgres = std::env::var("ETCDSQL_TEST_BACKEND").is_ok_and(|b| b == "postgres");
    let dir = tempfile::tempdir().unwrap();
    let a = TestServer::start(dir.path()).await;
    let b = TestServer::start(dir.path()).await;
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    let key = "presumed/shared";
    let held = r#"etcdsql_write_presumed_batches_total{outcome="held"} "#;
    let rerun = r#"etcdsql_write_presumed_batches_total{outcome="rerun"} "#;
    // Whether b's write reaches a's applied index before a's next batch is a race; enough
    // rounds make a's writer lose it several times (the first round alone, mostly).
    for round in 0..100 {
        // The second of a's own writes finds nothing new: the batch after it presumes.
        for _ in 0..2 {
            ca.put("presumed/a", round.to_string(), None).await.unwrap();
        }
        let written = cb.put(key, format!("b{round}"), None).await.unwrap();
        let written = written.header().unwrap().revision();
        let out = ca
            .txn(
                etcd_client::Txn::new()
                    .when([etcd_client::Compare::value(
                        key,
                        etcd_client::CompareOp::NotEqual,
                        format!("b{round}"),
                    )])
                    .and_then([etcd_client::TxnOp::put(key, "stale", None)])
                    .or_else([etcd_client::TxnOp::get(key, None)]),
            )
            .await
            .unwrap();
        assert!(!out.succeeded(), "round {round}: a wrote over b's value");
        let read = match &out.op_responses()[0] {
            etcd_client::TxnOpResponse::Get(get) => fields(get.kvs()),
            other => panic!("round {round}: unexpected response {other:?}"),
        };
        assert_eq!(read[0].2, written, "round {round}: a's read of b's write");
        assert_eq!(read[0].4, format!("b{round}").into_bytes());
        // A txn that writes nothing answers on the presumption too.
        for _ in 0..2 {
            ca.put("presumed/a", round.to_string(), None).await.unwrap();
        }
        let moved = cb.put(key, format!("c{round}"), None).await.unwrap();
        let moved = moved.header().unwrap().revision();
        let out = ca
            .txn(etcd_client::Txn::new().when([etcd_client::Compare::value(
                key,
                etcd_client::CompareOp::Equal,
                format!("b{round}"),
            )]))
            .await
            .unwrap();
        assert!(
            !out.succeeded(),
            "round {round}: a compared with a replaced value"
        );
        assert!(out.header().unwrap().revision() >= moved, "round {round}");
        if !postgres || (round >= 10 && metric(&a, rerun).await >= 2.0) {
            break;
        }
    }
    if postgres {
        assert!(metric(&a, held).await > 0.0, "no batch presumed");
        assert!(metric(&a, rerun).await > 0.0, "no presumed batch ran again");
    }
    a.stop().await;
    b.stop().await;
}

/// The database announces every commit to every instance, this one's own included, and the
/// announcement can come before the writer learns its commit went through. The watch hub then
/// waits for the writer's batch in flight rather than reading that commit back from the log:
/// a writer's own commits, watched as they land, cost no reads of the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_is_not_sent_back_to_the_log_for_its_own_commits() {
    if skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let slow_poll = |c: &mut etcdsql::Config| c.watch_poll_interval = Duration::from_secs(3600);
    let a = TestServer::start_with(dir.path(), slow_poll).await;
    let mut ca = a.client().await;
    let mut watch = ca
        .watch("own/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    tokio::time::timeout(WAIT, watch.message())
        .await
        .expect("the watch is created in time")
        .unwrap();
    let reads = r#"etcdsql_sql_duration_seconds_count{query="changes"} "#;
    let before = metric(&a, reads).await;
    let writes = 200;
    for i in 0..writes {
        let put = ca.put(format!("own/{i}"), "v", None).await.unwrap();
        let event = tokio::time::timeout(WAIT, watch.message())
            .await
            .expect("the event arrives in time")
            .unwrap()
            .unwrap();
        assert_eq!(
            event.events()[0].kv().unwrap().mod_revision(),
            put.header().unwrap().revision()
        );
    }
    // Not zero: a batch's hand-over may still lose to a read that was already under way.
    let read_back = metric(&a, reads).await - before;
    assert!(
        read_back < f64::from(writes) / 20.0,
        "{read_back} reads of the log for {writes} commits of this instance's own"
    );
    a.stop().await;
}

/// Two backends on one PostgreSQL database, as two instances have them, and its endpoint;
/// `None` on other databases, where writers presume nothing.
async fn two_postgres_backends(
    dir: &std::path::Path,
) -> Option<(
    std::sync::Arc<dyn etcdsql::backend::Backend>,
    std::sync::Arc<dyn etcdsql::backend::Backend>,
    String,
)> {
    if !common::on_postgres() {
        eprintln!("skipped: presumed batches need ETCDSQL_TEST_BACKEND=postgres");
        return None;
    }
    let endpoint = common::test_endpoint(dir);
    let options = Default::default();
    let a = etcdsql::backend::open(&endpoint, &options).await.unwrap();
    let b = etcdsql::backend::open(&endpoint, &options).await.unwrap();
    Some((a, b, endpoint))
}

/// The row that creates `key` at `revision`, its value the key, attached to `lease`.
fn created_row(key: &str, revision: i64, lease: i64) -> etcdsql::backend::LogRow {
    etcdsql::backend::LogRow {
        revision,
        sub: 0,
        key: key.as_bytes().to_vec(),
        created: true,
        deleted: false,
        create_revision: revision,
        prev_revision: 0,
        version: 1,
        lease,
        value: key.as_bytes().to_vec(),
        old_value: None,
        old_lease: 0,
    }
}

/// A presumed batch reads the leases its Puts name before it takes the writers' lock, and its
/// append checks them again under the lock (PostgreSQL): a lease another instance revoked in
/// between (one with no keys, whose revocation moves no revision) fails the append, which then
/// writes nothing, and the writer runs the batch again. The earlier form of the function, which
/// instances of the previous release call, still answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_presumed_batch_checks_its_leases_again_under_the_writers_lock() {
    use etcdsql::backend::{self, LeaseRow};
    let dir = tempfile::tempdir().unwrap();
    let Some((a, b, endpoint)) = two_postgres_backends(dir.path()).await else {
        return;
    };
    let mut tx = b.write().await.unwrap();
    for id in [7, 8] {
        let lease = LeaseRow {
            id,
            ttl: 600,
            expires_at: i64::MAX / 2,
        };
        assert!(tx.insert_lease(&lease).await.unwrap());
    }
    tx.commit().await.unwrap();
    let current = a.read().await.unwrap().revisions().await.unwrap().current;
    let row = |lease: i64| created_row("leased/x", current + 1, lease);

    let mut tx = a.write_presuming(current).await.unwrap().expect("presumes");
    assert_eq!(tx.leases_ahead(&[7, 8, 9]).await.unwrap(), vec![7, 8]);
    let mut revoke = b.write().await.unwrap();
    assert!(revoke.delete_lease(7).await.unwrap());
    revoke.commit().await.unwrap();
    let refused = tx.append(&[row(7)], current, current + 1, &[7]).await;
    assert!(
        refused.as_ref().is_err_and(backend::Error::is_moved),
        "appended rows attached to a revoked lease: {refused:?}"
    );
    drop(tx);
    let mut read = a.read().await.unwrap();
    assert_eq!(read.revisions().await.unwrap().current, current);
    assert!(read.latest(b"leased/x").await.unwrap().is_none());
    drop(read);

    let mut tx = a.write_presuming(current).await.unwrap().expect("presumes");
    assert_eq!(tx.leases_ahead(&[8]).await.unwrap(), vec![8]);
    let rows = [row(8)];
    let written = tx.append(&rows, current, current + 1, &[8]).await;
    written.unwrap();
    tx.commit().await.unwrap();
    let mut read = a.read().await.unwrap();
    assert_eq!(read.revisions().await.unwrap().current, current + 1);
    let written = read.latest(b"leased/x").await.unwrap().expect("written");
    assert_eq!((written.revision, written.lease), (current + 1, 8));
    drop(read);

    // The previous release's call: no rows, the revision moved only if presumed right.
    let pool = sqlx::PgPool::connect(&endpoint).await.unwrap();
    let earlier = |presumed: i64| {
        sqlx::query_scalar::<_, i64>(
            "SELECT * FROM etcdsql_append('{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', \
             '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', $1, $2)",
        )
        .bind(current + 2)
        .bind(presumed)
        .fetch_all(&pool)
    };
    assert_eq!(earlier(current).await.unwrap(), Vec::<i64>::new());
    assert_eq!(earlier(current + 1).await.unwrap(), vec![current + 2]);
    pool.close().await;
    a.close().await;
    b.close().await;
}

/// What one writer of [`writes_on_several_instances_are_answered_as_the_log_has_them`] saw: each
/// write it was told succeeded (revision, key, value), and each key read back in a failed
/// compare's branch (the answer's revision, then the key's mod revision, version and value).
#[derive(Default)]
struct Told {
    written: Vec<(i64, String, Vec<u8>)>,
    read: Vec<(i64, String, i64, i64, Vec<u8>)>,
    increments: u64,
}

/// One writer: creates and then updates its own keys as kube-apiserver does (a create txn, then
/// compare-and-swap on the mod revision it last saw, reading the key back when that fails), and
/// every third op increments a counter every writer shares by the same compare-and-swap.
async fn kube_like_writer(mut client: etcd_client::Client, w: usize, ops: usize) -> Told {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
    let mut told = Told::default();
    let mut known: std::collections::HashMap<String, i64> = Default::default();
    // The counter's value as last seen: the number of increments so far.
    let mut counter: i64 = 0;
    for op in 0..ops {
        let shared = op % 3 == 2;
        let key = match shared {
            true => "told/counter".to_owned(),
            false => format!("told/{w}/{}", op % 4),
        };
        let expected = known.get(&key).copied().unwrap_or(0);
        let value = match shared {
            true => (counter + 1).to_string(),
            false => format!("{w}-{op}"),
        };
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.as_str(),
                CompareOp::Equal,
                expected,
            )])
            .and_then([TxnOp::put(key.as_str(), value.as_str(), None)])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let out = tokio::time::timeout(Duration::from_secs(30), client.txn(txn))
            .await
            .expect("a txn answered in time")
            .unwrap();
        let revision = out.header().unwrap().revision();
        if out.succeeded() {
            told.written
                .push((revision, key.clone(), value.clone().into_bytes()));
            known.insert(key.clone(), revision);
            if shared {
                told.increments += 1;
                counter += 1;
            }
            continue;
        }
        let TxnOpResponse::Get(get) = &out.op_responses()[0] else {
            panic!(
                "writer {w}: the failure branch answered {:?}",
                out.op_responses()
            );
        };
        let kv = &get.kvs()[0];
        told.read.push((
            revision,
            key.clone(),
            kv.mod_revision(),
            kv.version(),
            kv.value().to_vec(),
        ));
        known.insert(key.clone(), kv.mod_revision());
        if shared {
            counter = String::from_utf8_lossy(kv.value()).parse().unwrap();
        }
    }
    told
}

/// Instances writing at once, kube-apiserver's way: every answer must say what the log says:
/// each write at the revision it was told, each failed compare's read as the key was at that
/// revision, one revision per write, and no increment of the shared counter lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_on_several_instances_are_answered_as_the_log_has_them() {
    if skip() {
        return;
    }
    const INSTANCES: usize = 3;
    const WRITERS: usize = 9;
    const OPS: usize = 60;
    let dir = tempfile::tempdir().unwrap();
    let mut servers = Vec::new();
    for _ in 0..INSTANCES {
        servers.push(TestServer::start(dir.path()).await);
    }
    let mut clients = Vec::new();
    for server in &servers {
        clients.push(server.client().await);
    }
    let start = clients[0].get("told/", None).await.unwrap();
    let start = start.header().unwrap().revision();
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| tokio::spawn(kube_like_writer(clients[w % INSTANCES].clone(), w, OPS)))
        .collect();
    let mut told = Vec::new();
    for writer in writers {
        told.push(writer.await.unwrap());
    }

    // The log, as a watch from the start replays it: revision -> (key, version, value).
    let end = start + told.iter().map(|t| t.written.len() as i64).sum::<i64>();
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(start + 1);
    let mut stream = clients[1].watch("told/", Some(options)).await.unwrap();
    let mut log = std::collections::BTreeMap::new();
    while log.len() < (end - start) as usize {
        let message = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .unwrap_or_else(|_| panic!("{} of {} events in time", log.len(), end - start))
            .unwrap()
            .expect("the watch stays open");
        for event in message.events() {
            let kv = event.kv().unwrap();
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            log.insert(kv.mod_revision(), (key, kv.version(), kv.value().to_vec()));
        }
    }
    let revisions: Vec<i64> = log.keys().copied().collect();
    let expected: Vec<i64> = (start + 1..=end).collect();
    assert_eq!(revisions, expected, "one revision per acknowledged write");
    for (w, t) in told.iter().enumerate() {
        for (revision, key, value) in &t.written {
            let (logged, _, logged_value) = &log[revision];
            assert_eq!(
                (logged, logged_value),
                (key, value),
                "writer {w}: told its write was at {revision}"
            );
        }
        for (answered, key, mod_revision, version, value) in &t.read {
            assert!(mod_revision <= answered, "writer {w}: read {key} ahead");
            assert_eq!(
                log.get(mod_revision),
                Some(&(key.clone(), *version, value.clone())),
                "writer {w}: read {key} at {mod_revision} (answer at {answered})"
            );
            // Nothing wrote the key between the row read and the answer's revision.
            let later = log
                .range(mod_revision + 1..answered + 1)
                .find(|(_, (k, _, _))| k == key);
            assert_eq!(later, None, "writer {w}: read a replaced {key}");
        }
    }
    let increments: u64 = told.iter().map(|t| t.increments).sum();
    let counter = clients[2].get("told/counter", None).await.unwrap();
    let counter = String::from_utf8_lossy(counter.kvs()[0].value()).into_owned();
    assert_eq!(counter, increments.to_string(), "increments lost");

    for server in servers {
        server.stop().await;
    }
}

/// A presumed batch reads the old values it needs before it takes the writers' lock
/// (PostgreSQL): rows the writer's key index names as current, which no commit changes. A row
/// that is not there (another instance replaced it, and compaction removed it) makes the batch
/// run again, reading under the lock, where a missing row is an error of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_presumed_batch_reads_old_values_ahead_of_the_writers_lock() {
    let dir = tempfile::tempdir().unwrap();
    let Some((a, b, _)) = two_postgres_backends(dir.path()).await else {
        return;
    };
    let p = a.read().await.unwrap().revisions().await.unwrap().current;
    let mut tx = b.write_presuming(p).await.unwrap().expect("presumes");
    let rows = [created_row("x", p + 1, 0)];
    tx.append(&rows, p, p + 1, &[]).await.unwrap();
    tx.commit().await.unwrap();

    let mut tx = a.write_presuming(p + 1).await.unwrap().expect("presumes");
    let found = tx.values_ahead(&[(b"x", p + 1)]).await.unwrap();
    assert_eq!(found, vec![Some(b"x".to_vec())]);
    let missing = tx.values_ahead(&[(b"x", p + 1), (b"x", p + 99)]).await;
    assert!(
        missing.is_err_and(|e| e.is_moved()),
        "a missing row read ahead"
    );
    drop(tx);
    let mut tx = a.write().await.unwrap();
    let missing = tx.values_ahead(&[(b"x", p + 99)]).await.unwrap();
    assert_eq!(missing, vec![None]);
    drop(tx);
    a.close().await;
    b.close().await;
}

/// Another session holding the writers' lock, as another instance's batch does: PostgreSQL's
/// advisory lock (its key is "etcdsql" in ASCII), MySQL's lock on the current revision's row.
enum LockHolder {
    Postgres(sqlx::PgConnection),
    Mysql(sqlx::MySqlConnection),
}

impl LockHolder {
    async fn take(endpoint: &str) -> Self {
        use sqlx::Connection;
        if common::on_postgres() {
            let mut conn = sqlx::PgConnection::connect(endpoint).await.unwrap();
            sqlx::query("SELECT pg_advisory_lock(28556942883647852)")
                .execute(&mut conn)
                .await
                .unwrap();
            LockHolder::Postgres(conn)
        } else {
            let mut conn = sqlx::MySqlConnection::connect(endpoint).await.unwrap();
            for statement in [
                "START TRANSACTION",
                "SELECT value FROM meta WHERE name = 'current_revision' FOR UPDATE",
            ] {
                sqlx::raw_sql(statement).execute(&mut conn).await.unwrap();
            }
            LockHolder::Mysql(conn)
        }
    }

    /// Whether another session waits for the lock.
    async fn contended(&mut self) -> bool {
        let waiting: i64 = match self {
            LockHolder::Postgres(conn) => sqlx::query_scalar(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
            )
            .fetch_one(conn)
            .await
            .unwrap(),
            // The wait does not show in `innodb_trx` (MariaDB reads the row while it plans).
            LockHolder::Mysql(conn) => sqlx::query_scalar(
                "SELECT count(*) FROM information_schema.processlist \
                 WHERE id <> CONNECTION_ID() AND info LIKE '%current_revision%FOR UPDATE'",
            )
            .fetch_one(conn)
            .await
            .unwrap(),
        };
        waiting > 0
    }

    async fn release(self) {
        match self {
            LockHolder::Postgres(mut conn) => {
                sqlx::query("SELECT pg_advisory_unlock(28556942883647852)")
                    .execute(&mut conn)
                    .await
                    .unwrap();
            }
            LockHolder::Mysql(mut conn) => {
                sqlx::raw_sql("COMMIT").execute(&mut conn).await.unwrap();
            }
        }
    }
}

/// Puts `server` has begun to answer.
async fn puts_started(server: &TestServer) -> f64 {
    common::metrics_text(server)
        .await
        .lines()
        .filter(|line| {
            line.starts_with("grpc_server_started_total{") && line.contains("grpc_method=\"Put\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// While a batch waits for the writers' lock (another instance writing), the next requests of its
/// instance queue up behind it. They join it once it has the lock, rather than waiting for a turn
/// of their own: one turn of the lock writes them all. Here one put waits for the lock, nineteen
/// more arrive meanwhile, and all twenty commit in one batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_queued_while_a_batch_waits_for_the_lock_join_it() {
    if skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let a = TestServer::start(dir.path()).await;
    let b = TestServer::start(dir.path()).await;
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    // a's reads take in b's commit, which a's writer has not: a's next batch cannot presume it
    // is alone, and takes the lock before it runs.
    cb.put("queued/b", "b", None).await.unwrap();
    assert_eq!(ca.get("queued/b", None).await.unwrap().kvs().len(), 1);
    let batches = r"etcdsql_write_batch_size_count";
    let written = r"etcdsql_write_batch_size_sum";
    let (batches_before, written_before) = (metric(&a, batches).await, metric(&a, written).await);

    let mut holder = LockHolder::take(&common::test_endpoint(dir.path())).await;
    let put = |i: usize| {
        let mut client = ca.clone();
        tokio::spawn(async move { client.put(format!("queued/{i:02}"), "v", None).await })
    };
    let mut puts = vec![put(0)];
    let give_up = tokio::time::Instant::now() + WAIT;
    while !holder.contended().await {
        assert!(
            tokio::time::Instant::now() < give_up,
            "the first put's batch never waited for the writers' lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    puts.extend((1..20).map(put));
    while puts_started(&a).await < 20.0 {
        assert!(
            tokio::time::Instant::now() < give_up,
            "the server never began to answer all twenty puts"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // From the handler's start to the writer's queue is a few steps with no wait among them.
    tokio::time::sleep(Duration::from_millis(500)).await;
    holder.release().await;
    for put in puts {
        tokio::time::timeout(WAIT, put)
            .await
            .expect("a put was never answered after the lock was let go")
            .unwrap()
            .unwrap();
    }
    assert_eq!(metric(&a, written).await - written_before, 20.0);
    assert_eq!(
        metric(&a, batches).await - batches_before,
        1.0,
        "the puts that queued while the first one's batch waited for the lock ran in a batch \
         of their own"
    );
    a.stop().await;
    b.stop().await;
}
