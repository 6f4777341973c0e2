//! # Reads and compaction at scale (issue #5)
//!
//! Fills a fresh etcdsql database with `--keys` live keys of `--versions` revisions each (by
//! default 1,000,000 keys and 5,000,000 log rows), starts etcdsql on it, and measures through the
//! real gRPC API (the `etcd-client` crate):
//! - a single-key get, a 500-key page at the start and in the middle of the prefix, and a count
//!   of the whole prefix, at the current revision;
//! - the same reads at an older revision (a paginated list whose first page came before a burst
//!   of writes): from memory while the revision is within the window of history
//!   (`--read-history-changes`), else through the "replaced after R" index;
//! - `--write-rate` updates per second for `--write-seconds`, while a compaction at the revision
//!   before the burst deletes the whole older history and later compactions follow the writes:
//!   write latency (p50, p99, max) during compaction, and whether compaction kept up.
//!
//! It prints each statement's plan (`EXPLAIN QUERY PLAN` on SQLite, `EXPLAIN ANALYZE` on
//! PostgreSQL) with the statement text taken from the backend itself, so the plans shown are the
//! plans of the queries etcdsql runs.
//!
//! ```sh
//! cargo bench --bench scale                           # both backends, full size
//! cargo bench --bench scale -- --backends sqlite      # one backend
//! cargo test --locked --bench scale -- --smoke        # seconds: proves it works (CI)
//! ```
//!
//! The fixture is written with bulk SQL rather than through the API (5,000,000 writes through
//! the API would take most of an hour); it follows the log's rules exactly: each key's versions
//! chain through `prev_revision` and what records their replacement where the backend keeps it
//! apart (`superseded_by` on MySQL, `kv_head` and `kv_replaced` on PostgreSQL; SQLite keeps the
//! log alone), and the current revision is the last row's.
//! PostgreSQL gets `VACUUM ANALYZE` after the load, as autovacuum would give a long-lived table.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use etcd_client::{Client, CompactionOptions, GetOptions, PutOptions};
use etcdsql::backend::{self, PoolOptions, RangeEnd};
use hdrhistogram::Histogram;
use sqlx::Row;
use tokio_util::sync::CancellationToken;

const PREFIX: &str = "/registry/configmaps/";

#[derive(Parser, Debug)]
#[command(name = "scale")]
struct Args {
    /// Small sizes (seconds): proves the bench works.
    #[arg(long)]
    smoke: bool,
    /// Backends to measure, in order: sqlite, postgres, mysql.
    #[arg(long, value_delimiter = ',', default_value = "sqlite,postgres,mysql")]
    backends: Vec<String>,
    /// Live keys [full: 1,000,000; smoke: 5,000].
    #[arg(long)]
    keys: Option<i64>,
    /// Revisions per key in the log [5].
    #[arg(long, default_value_t = 5)]
    versions: i64,
    /// Bytes per value [256].
    #[arg(long, default_value_t = 256)]
    value_bytes: i64,
    /// Updates per second during the compaction phase [1000].
    #[arg(long, default_value_t = 1000)]
    write_rate: u64,
    /// Length of the compaction phase in seconds [full: 60; smoke: 3].
    #[arg(long)]
    write_seconds: Option<u64>,
    /// Timed repetitions of each read [full: 20; smoke: 3].
    #[arg(long)]
    repeat: Option<usize>,
    /// The PostgreSQL server; a fresh database is created on it and dropped at the end.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    postgres_url: String,
    /// The MySQL/MariaDB server; a fresh database is created on it and dropped at the end.
    #[arg(long, default_value = "mysql://root@127.0.0.1:3306")]
    mysql_url: String,
    /// Where the SQLite file goes [a fresh folder under /tmp].
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Leave the database in place at the end.
    #[arg(long)]
    keep: bool,
    /// The server's `--read-history-changes` [its default]: how much of the log's history
    /// the start takes into memory.
    #[arg(long)]
    read_history_changes: Option<usize>,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> ExitCode {
    // `cargo bench` passes `--bench` to every bench target; it means nothing here.
    let args = Args::parse_from(std::env::args().filter(|a| a != "--bench"));
    let mut failed = false;
    for name in args.backends.clone() {
        println!("\n## {name}\n");
        if let Err(e) = run(&args, &name).await {
            eprintln!("{name}: {e}");
            failed = true;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

async fn run(args: &Args, name: &str) -> Result<(), Error> {
    let keys = args
        .keys
        .unwrap_or(if args.smoke { 5_000 } else { 1_000_000 });
    let repeat = args.repeat.unwrap_or(if args.smoke { 3 } else { 20 });
    let write_seconds = args
        .write_seconds
        .unwrap_or(if args.smoke { 3 } else { 60 });
    let dir = match &args.work_dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("etcdsql-scale-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    let (endpoint, database) = match name {
        "sqlite" => (format!("sqlite://{}", dir.join("scale.db").display()), None),
        "postgres" => {
            let db = format!("etcdsql_scale_{}", std::process::id());
            (format!("{}/{db}", args.postgres_url), Some(db))
        }
        "mysql" => {
            let db = format!("etcdsql_scale_{}", std::process::id());
            (format!("{}/{db}", args.mysql_url), Some(db))
        }
        other => return Err(format!("unknown backend {other:?}").into()),
    };

    let started = Instant::now();
    let backend = backend::open(&endpoint, &PoolOptions::default()).await?;
    backend.close().await;
    let fixture = Fixture {
        keys,
        versions: args.versions,
        value_bytes: args.value_bytes,
    };
    fixture.load(&endpoint).await?;
    println!(
        "loaded {keys} keys, {} log rows, {} B values in {:.1} s",
        keys * args.versions,
        args.value_bytes,
        started.elapsed().as_secs_f64()
    );

    let result = measure(&endpoint, &fixture, repeat, args, write_seconds).await;

    if let Some(db) = database.filter(|_| !args.keep) {
        if name == "mysql" {
            let admin = sqlx::MySqlPool::connect(&args.mysql_url).await?;
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS `{db}`"
            )))
            .execute(&admin)
            .await?;
        } else {
            let admin = sqlx::PgPool::connect(&format!("{}/postgres", args.postgres_url)).await?;
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)"
            )))
            .execute(&admin)
            .await?;
        }
    }
    if args.work_dir.is_none() && !args.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

struct Fixture {
    keys: i64,
    versions: i64,
    value_bytes: i64,
}

impl Fixture {
    /// Key `i` sorts in `i`'s order: 1,000 configmaps per namespace.
    fn key(i: i64) -> String {
        format!("{PREFIX}ns-{:04}/cm-{:06}", i / 1000, i % 1000)
    }

    /// Round `r` (0-based) writes every key once, key `i` at revision `2 + r * keys + i`: round 0
    /// creates, the later rounds update.
    async fn load(&self, endpoint: &str) -> Result<(), Error> {
        let current = 1 + self.versions * self.keys;
        if endpoint.starts_with("sqlite://") {
            let pool = sqlx::SqlitePool::connect(endpoint).await?;
            sqlx::query("PRAGMA synchronous = OFF")
                .execute(&pool)
                .await?;
            // Rows as the server writes them on SQLite: no old value (a watch reads the
            // predecessor row's).
            for round in 0..self.versions {
                sqlx::query(
                    "WITH RECURSIVE k(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM k WHERE i + 1 < ?1) \
                     INSERT INTO kv_log (revision, sub, name, created, deleted, create_revision, \
                         prev_revision, version, lease, value, old_value, old_lease) \
                     SELECT 2 + ?2 * ?1 + i, 0, \
                         CAST(printf('/registry/configmaps/ns-%04d/cm-%06d', i / 1000, i % 1000) AS BLOB), \
                         ?2 = 0, 0, 2 + i, \
                         CASE WHEN ?2 = 0 THEN 0 ELSE 2 + (?2 - 1) * ?1 + i END, \
                         ?2 + 1, 0, randomblob(?3), NULL, 0 \
                     FROM k",
                )
                .bind(self.keys)
                .bind(round)
                .bind(self.value_bytes)
                .execute(&pool)
                .await?;
            }
            // SQLite keeps the log alone: the rows' prev_revision says what replaced what.
            sqlx::query("UPDATE meta SET value = ?1 WHERE name = 'current_revision'")
                .bind(current)
                .execute(&pool)
                .await?;
            pool.close().await;
        } else if endpoint.starts_with("mysql://") {
            // MariaDB's SEQUENCE engine numbers the keys; rows as the server writes them.
            let pool = sqlx::MySqlPool::connect(endpoint).await?;
            for round in 0..self.versions {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO kv_log (revision, sub, name, created, deleted, create_revision, \
                         prev_revision, version, lease, value, old_value, old_lease, superseded_by) \
                     SELECT 2 + ? * ? + seq, 0, \
                         CAST(CONCAT('/registry/configmaps/ns-', LPAD(seq DIV 1000, 4, '0'), \
                             '/cm-', LPAD(seq MOD 1000, 6, '0')) AS BINARY), \
                         ? = 0, 0, 2 + seq, \
                         CASE WHEN ? = 0 THEN 0 ELSE 2 + (? - 1) * ? + seq END, \
                         ? + 1, 0, CAST(RPAD(MD5(CONCAT(seq, '-', ?)), ?, 'x') AS BINARY), NULL, 0, \
                         CASE WHEN ? + 1 < ? THEN 2 + (? + 1) * ? + seq END \
                     FROM seq_0_to_{}",
                    self.keys - 1
                )))
                .bind(round)
                .bind(self.keys)
                .bind(round)
                .bind(round)
                .bind(round)
                .bind(self.keys)
                .bind(round)
                .bind(round)
                .bind(self.value_bytes)
                .bind(round)
                .bind(self.versions)
                .bind(round)
                .bind(self.keys)
                .execute(&pool)
                .await?;
            }
            sqlx::query("UPDATE meta SET value = ? WHERE name = 'current_revision'")
                .bind(current)
                .execute(&pool)
                .await?;
            sqlx::query("ANALYZE TABLE kv_log").fetch_all(&pool).await?;
            pool.close().await;
        } else {
            let pool = sqlx::PgPool::connect(endpoint).await?;
            for round in 0..self.versions {
                sqlx::query(
                    "INSERT INTO kv_log (revision, sub, name, created, deleted, create_revision, \
                         prev_revision, version, lease, value, old_value, old_lease) \
                     SELECT 2 + $2 * $1 + i, 0, \
                         convert_to(format('/registry/configmaps/ns-%s/cm-%s', \
                             lpad((i / 1000)::text, 4, '0'), lpad((i % 1000)::text, 6, '0')), 'UTF8'), \
                         $2 = 0, false, 2 + i, \
                         CASE WHEN $2 = 0 THEN 0 ELSE 2 + ($2 - 1) * $1 + i END, \
                         $2 + 1, 0, convert_to(rpad(md5(i::text || $2::text), $3::int, 'x'), 'UTF8'), \
                         CASE WHEN $2 = 0 THEN NULL \
                              ELSE convert_to(rpad(md5(i::text), $3::int, 'x'), 'UTF8') END, 0 \
                     FROM generate_series(0::bigint, $1 - 1) AS i",
                )
                .bind(self.keys)
                .bind(round)
                .bind(self.value_bytes)
                .execute(&pool)
                .await?;
            }
            // Which row replaced which, in tables of their own as on SQLite.
            sqlx::query(
                "INSERT INTO kv_replaced (superseded_by, name, revision, deleted) \
                 SELECT revision, name, prev_revision, false FROM kv_log WHERE prev_revision > 0",
            )
            .execute(&pool)
            .await?;
            sqlx::query(
                "INSERT INTO kv_head (name, revision, deleted) \
                 SELECT name, revision, false FROM kv_log WHERE revision > $1 - $2",
            )
            .bind(current)
            .bind(self.keys)
            .execute(&pool)
            .await?;
            sqlx::query("UPDATE meta SET value = $1 WHERE name = 'current_revision'")
                .bind(current)
                .execute(&pool)
                .await?;
            sqlx::query("VACUUM ANALYZE kv_log, kv_head, kv_replaced")
                .execute(&pool)
                .await?;
            pool.close().await;
        }
        Ok(())
    }
}

/// Milliseconds of each repetition of `op`, after one untimed warm-up.
async fn timed<F, Fut>(repeat: usize, mut op: F) -> Result<Vec<f64>, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), Error>>,
{
    op().await?;
    let mut out = Vec::with_capacity(repeat);
    for _ in 0..repeat {
        let t = Instant::now();
        op().await?;
        out.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    out.sort_by(f64::total_cmp);
    Ok(out)
}

fn row(what: &str, ms: &[f64]) {
    let p50 = ms[ms.len() / 2];
    let max = ms[ms.len() - 1];
    println!("| {what} | {p50:.2} | {max:.2} |");
}

async fn measure(
    endpoint: &str,
    fixture: &Fixture,
    repeat: usize,
    args: &Args,
    write_seconds: u64,
) -> Result<(), Error> {
    let write_rate = args.write_rate;
    let mut config = etcdsql::Config::defaults();
    if args.read_history_changes.is_some() {
        config.read_history_changes = args.read_history_changes;
    }
    config.listen_client_urls = vec!["http://127.0.0.1:0".into()];
    config.advertise_client_urls = Vec::new();
    config.endpoint = endpoint.to_owned();
    // Five million log rows are far past etcd's default 2 GiB quota; the updates must not meet
    // NOSPACE.
    config.quota_backend_bytes = -1;
    let before = resident_mib();
    let shutdown = CancellationToken::new();
    let starting = Instant::now();
    let running = etcdsql::start(config, shutdown.clone()).await?;
    let start_seconds = starting.elapsed().as_secs_f64();
    let url = format!("http://{}", running.local_addrs[0]);
    let client = Client::connect([url.as_str()], None).await?;
    // The server runs in this process: what it added is its index of the keys (no values yet:
    // reads fill them in).
    let loaded = resident_mib();
    println!(
        "start: {start_seconds:.1} s to open the store and load the index of {} keys",
        fixture.keys
    );
    println!(
        "resident memory: {before:.0} MiB before the server started, {loaded:.0} MiB once it \
         had loaded its index of {} keys: {:.0} bytes per key\n",
        fixture.keys,
        (loaded - before) * 1048576.0 / fixture.keys as f64
    );

    let keys = fixture.keys;
    let middle = Fixture::key(keys / 2);
    let pinned = {
        let mut c = client.clone();
        c.get("probe", None)
            .await?
            .header()
            .map_or(0, |h| h.revision())
    };
    println!("current revision {pinned}\n");
    println!("| read (through gRPC) | p50 ms | max ms |\n|---|--:|--:|");
    let reads = |revision: i64, label: &'static str| {
        let client = client.clone();
        let middle = middle.clone();
        async move {
            let c = client.clone();
            let ms = timed(repeat, || {
                let mut c = c.clone();
                let key = middle.clone();
                async move {
                    let got = c
                        .get(key, Some(GetOptions::new().with_revision(revision)))
                        .await?;
                    expect(got.kvs().len() == 1, "the get finds its key")
                }
            })
            .await?;
            row(&format!("get one key ({label})"), &ms);
            for (what, from) in [("first", PREFIX.to_owned()), ("middle", middle.clone())] {
                let ms = timed(repeat, || {
                    let mut c = c.clone();
                    let from = from.clone();
                    async move {
                        let got = c
                            .get(
                                from,
                                Some(
                                    GetOptions::new()
                                        .with_range(prefix_end(PREFIX))
                                        .with_limit(500)
                                        .with_revision(revision),
                                ),
                            )
                            .await?;
                        expect(got.kvs().len() == 500 || keys < 1000, "a full page")
                    }
                })
                .await?;
                row(&format!("{what} 500-key page of {keys} ({label})"), &ms);
            }
            let ms = timed(repeat, || {
                let mut c = c.clone();
                async move {
                    let got = c
                        .get(
                            PREFIX,
                            Some(
                                GetOptions::new()
                                    .with_prefix()
                                    .with_count_only()
                                    .with_revision(revision),
                            ),
                        )
                        .await?;
                    expect(got.count() == keys, "the count is every key")
                }
            })
            .await?;
            row(&format!("count of {keys} keys ({label})"), &ms);
            Ok::<(), Error>(())
        }
    };
    reads(0, "current").await?;
    println!(
        "\nresident memory after these reads (which fill the values they read into memory): \
         {:.0} MiB",
        resident_mib()
    );

    // The same write load without compaction first, as the yardstick for the phase with it.
    let quiet = Duration::from_secs(write_seconds.div_ceil(4));
    let before_quiet = sql_histograms(&url).await?;
    let baseline = open_loop_updates(client.clone(), keys, write_rate, quiet).await?;
    let after_quiet = sql_histograms(&url).await?;
    println!(
        "\n| updates at {write_rate}/s, no compaction | p50 ms | p99 ms | max ms |\n|---|--:|--:|--:|"
    );
    print_latency(
        &format!("{} in {} s", baseline.len(), quiet.as_secs()),
        &baseline,
    );
    // A paginated list that began before those updates: memory answers it while its revision
    // is within the window of history (`--read-history-changes`), SQL once it is older.
    println!("\n| read (through gRPC) | p50 ms | max ms |\n|---|--:|--:|");
    reads(pinned, "before the updates without compaction").await?;

    // More writes after `pinned`, then compaction at `pinned`: the whole older history goes.
    println!(
        "\nCompaction at {pinned} (every older version) starts after 1 s, then every 5 s at \
         1,000 revisions behind the head\n"
    );
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = tokio::spawn(open_loop_updates(
        client.clone(),
        keys,
        write_rate,
        Duration::from_secs(write_seconds),
    ));
    let compactor = {
        let client = client.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let mut c = client.clone();
            let mut log = Vec::new();
            let mut target = pinned;
            loop {
                let t = Instant::now();
                c.compact(target, Some(CompactionOptions::new().with_physical()))
                    .await?;
                log.push((target, t.elapsed()));
                // Wait for the head to move 1,000 revisions past the last compaction.
                loop {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        return Ok::<_, Error>(log);
                    }
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    let head = c
                        .get("probe", None)
                        .await?
                        .header()
                        .map_or(0, |h| h.revision());
                    if head - 1000 > target {
                        target = head - 1000;
                        break;
                    }
                }
            }
        })
    };
    let latencies = writer.await??;
    let after_writes = sql_histograms(&url).await?;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let wait = Instant::now();
    let compactions = compactor.await??;
    println!(
        "| updates at {write_rate}/s, compaction running | p50 ms | p99 ms | max ms |\n|---|--:|--:|--:|"
    );
    print_latency(
        &format!("{} in {write_seconds} s", latencies.len()),
        &latencies,
    );
    println!();
    // What the writer waited for: `begin_write` includes waiting for the writer's lock, which
    // a compaction chunk (`compact_window`) holds while it runs.
    println!(
        "| from /metrics (bucket bounds, ms) | calls | p50 ≤ | p99 ≤ | max ≤ |\n|---|--:|--:|--:|--:|"
    );
    for (phase, from, to) in [
        ("no compaction", &before_quiet, &after_quiet),
        ("compaction running", &after_quiet, &after_writes),
    ] {
        for query in ["begin_write", "commit", "compact_window"] {
            if let Some((calls, p50, p99, max)) = bucket_quantiles(from, to, query) {
                println!("| {query}, {phase} | {calls} | {p50} | {p99} | {max} |");
            }
        }
    }
    println!();
    println!("| compaction at | physical compaction took s |\n|--:|--:|");
    for (target, took) in &compactions {
        println!("| {target} | {:.2} |", took.as_secs_f64());
    }
    println!(
        "\nthe last compaction finished {:.2} s after the writes stopped\n",
        wait.elapsed().as_secs_f64()
    );

    println!("| read (through gRPC) | p50 ms | max ms |\n|---|--:|--:|");
    reads(0, "current, after compaction").await?;
    // The last compaction's revision is still readable and lags the head by 1,000 writes or
    // more: a page pinned there reads through the "replaced after R" index.
    let behind = compactions.last().map_or(pinned, |(target, _)| *target);
    reads(behind, "the compact revision, 1,000+ writes behind").await?;

    shutdown.cancel();
    running.wait().await;
    explain(endpoint, fixture, behind).await
}

/// Cumulative bucket counts of `etcdsql_sql_duration_seconds`, by query label and bound.
type Buckets = std::collections::BTreeMap<(String, String), f64>;

/// Scrapes the server's `/metrics` for the SQL timing histograms.
async fn sql_histograms(url: &str) -> Result<Buckets, Error> {
    let text = reqwest::get(format!("{url}/metrics")).await?.text().await?;
    let mut out = Buckets::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("etcdsql_sql_duration_seconds_bucket{") else {
            continue;
        };
        let Some((labels, count)) = rest.split_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels.split(',').find_map(|kv| {
                kv.strip_prefix(name)
                    .and_then(|v| v.strip_prefix("=\""))
                    .map(|v| v.trim_end_matches('"').to_owned())
            })
        };
        if let (Some(query), Some(le), Ok(count)) = (label("query"), label("le"), count.parse()) {
            out.insert((query, le), count);
        }
    }
    Ok(out)
}

/// Calls of `query` between two scrapes, and the bucket bounds (ms) holding its median, 99th
/// percentile and slowest call.
fn bucket_quantiles(
    from: &Buckets,
    to: &Buckets,
    query: &str,
) -> Option<(u64, String, String, String)> {
    let mut bounds: Vec<(f64, f64)> = to
        .iter()
        .filter(|((q, _), _)| q == query)
        .map(|((_, le), count)| {
            let before = from
                .get(&(query.to_owned(), le.clone()))
                .copied()
                .unwrap_or(0.0);
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap_or(f64::INFINITY)
            };
            (bound, count - before)
        })
        .collect();
    bounds.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = bounds.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let at = |q: f64| {
        let bound = bounds
            .iter()
            .find(|(_, n)| *n >= q * total)
            .map_or(f64::INFINITY, |(b, _)| *b);
        if bound.is_finite() {
            format!("{:.1}", bound * 1000.0)
        } else {
            "inf".into()
        }
    };
    Some((total as u64, at(0.5), at(0.99), at(1.0)))
}

fn print_latency(what: &str, micros: &Histogram<u64>) {
    println!(
        "| {what} | {:.2} | {:.2} | {:.2} |",
        micros.value_at_quantile(0.5) as f64 / 1000.0,
        micros.value_at_quantile(0.99) as f64 / 1000.0,
        micros.max() as f64 / 1000.0,
    );
}

/// This process's resident memory (`VmRSS`), in MiB; 0 where `/proc` cannot tell.
fn resident_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

fn expect(ok: bool, what: &str) -> Result<(), Error> {
    if ok {
        Ok(())
    } else {
        Err(format!("unexpected result: {what}").into())
    }
}

fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}

/// Updates of random keys at `rate` per second (open loop: each request starts on its schedule,
/// whatever the previous ones are doing); latency in microseconds from the scheduled start.
async fn open_loop_updates(
    client: Client,
    keys: i64,
    rate: u64,
    length: Duration,
) -> Result<Histogram<u64>, Error> {
    let total = rate * length.as_secs();
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let start = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut histogram = Histogram::<u64>::new(3)?;
    for n in 0..total {
        let due = start + interval * n as u32;
        tokio::time::sleep_until(due).await;
        let mut c = client.clone();
        let key = Fixture::key((n as i64 * 7919) % keys);
        tasks.spawn(async move {
            c.put(key, format!("update {n}"), Some(PutOptions::new()))
                .await?;
            Ok::<_, Error>(due.elapsed())
        });
        while let Some(done) = tasks.try_join_next() {
            histogram.record(done??.as_micros() as u64)?;
        }
    }
    while let Some(done) = tasks.join_next().await {
        histogram.record(done??.as_micros() as u64)?;
    }
    Ok(histogram)
}

/// The plans of the backend's own range and count statements.
async fn explain(endpoint: &str, fixture: &Fixture, pinned: i64) -> Result<(), Error> {
    let start = PREFIX.as_bytes().to_vec();
    let end = prefix_end(PREFIX);
    let range = RangeEnd::Before(end.clone());
    let single = Fixture::key(fixture.keys / 2).into_bytes();
    if endpoint.starts_with("sqlite://") {
        use etcdsql::backend::sqlite::{count_query, scan_query};
        let pool = sqlx::SqlitePool::connect(endpoint).await?;
        let head: i64 =
            sqlx::query_scalar("SELECT value FROM meta WHERE name = 'current_revision'")
                .fetch_one(&pool)
                .await?;
        for (what, sql, key, revision, limit) in [
            (
                "page at the current revision",
                scan_query(&range, false),
                &start,
                head,
                Some(500),
            ),
            (
                "page at the pinned revision",
                scan_query(&range, false),
                &start,
                pinned,
                Some(500),
            ),
            (
                "count at the current revision",
                count_query(&range),
                &start,
                head,
                None,
            ),
            (
                "count at the pinned revision",
                count_query(&range),
                &start,
                pinned,
                None,
            ),
            (
                "get one key",
                scan_query(&RangeEnd::Single, false),
                &single,
                head,
                Some(1),
            ),
        ] {
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
                .bind(key.as_slice())
                .bind(end.as_slice())
                .bind(revision);
            if let Some(limit) = limit {
                q = q.bind(limit);
            }
            let rows = q.fetch_all(&pool).await?;
            println!("\n{what}:\n```");
            for r in rows {
                let detail: String = r.try_get(3)?;
                println!("{detail}");
            }
            println!("```");
        }
        pool.close().await;
    } else if endpoint.starts_with("mysql://") {
        use etcdsql::backend::mysql::{count_query, scan_query};
        let pool = sqlx::MySqlPool::connect(endpoint).await?;
        let head: i64 =
            sqlx::query_scalar("SELECT value FROM meta WHERE name = 'current_revision'")
                .fetch_one(&pool)
                .await?;
        // Each statement takes its range and revision once per branch (MySQL's placeholders
        // are positional).
        for (what, sql, revision, with_limit) in [
            (
                "page at the current revision",
                scan_query(&range, false),
                head,
                true,
            ),
            (
                "page at the pinned revision",
                scan_query(&range, false),
                pinned,
                true,
            ),
            (
                "count at the current revision",
                count_query(&range),
                head,
                false,
            ),
            (
                "count at the pinned revision",
                count_query(&range),
                pinned,
                false,
            ),
        ] {
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")))
                .bind(start.as_slice())
                .bind(end.as_slice())
                .bind(revision);
            if with_limit {
                q = q.bind(500_i64);
            }
            q = q
                .bind(start.as_slice())
                .bind(end.as_slice())
                .bind(revision)
                .bind(revision);
            if with_limit {
                q = q.bind(500_i64).bind(500_i64);
            }
            print_mysql_plan(what, q.fetch_all(&pool).await?)?;
        }
        let q = sqlx::query(sqlx::AssertSqlSafe(format!(
            "EXPLAIN {}",
            scan_query(&RangeEnd::Single, false)
        )))
        .bind(single.as_slice())
        .bind(head)
        .bind(1_i64);
        print_mysql_plan("get one key", q.fetch_all(&pool).await?)?;
        pool.close().await;
    } else {
        use etcdsql::backend::postgres::{count_query, scan_query};
        let pool = sqlx::PgPool::connect(endpoint).await?;
        let head: i64 =
            sqlx::query_scalar("SELECT value FROM meta WHERE name = 'current_revision'")
                .fetch_one(&pool)
                .await?;
        for (what, sql, revision, with_limit) in [
            (
                "page at the current revision",
                scan_query(&range, false),
                head,
                true,
            ),
            (
                "page at the pinned revision",
                scan_query(&range, false),
                pinned,
                true,
            ),
            (
                "count at the current revision",
                count_query(&range),
                head,
                false,
            ),
            (
                "count at the pinned revision",
                count_query(&range),
                pinned,
                false,
            ),
        ] {
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
                "EXPLAIN (ANALYZE, BUFFERS) {sql}"
            )))
            .bind(start.as_slice())
            .bind(end.as_slice())
            .bind(revision);
            if with_limit {
                q = q.bind(500_i64);
            }
            print_plan(what, q.fetch_all(&pool).await?)?;
        }
        let q = sqlx::query(sqlx::AssertSqlSafe(format!(
            "EXPLAIN (ANALYZE, BUFFERS) {}",
            scan_query(&RangeEnd::Single, false)
        )))
        .bind(single.as_slice())
        .bind(head)
        .bind(1_i64);
        print_plan("get one key", q.fetch_all(&pool).await?)?;
        pool.close().await;
    }
    Ok(())
}

fn print_plan(what: &str, rows: Vec<sqlx::postgres::PgRow>) -> Result<(), Error> {
    println!("\n{what}:\n```");
    for r in rows {
        let line: String = r.try_get(0)?;
        println!("{line}");
    }
    println!("```");
    Ok(())
}

/// MySQL's EXPLAIN: one line per table access (its access type, index and estimated rows).
fn print_mysql_plan(what: &str, rows: Vec<sqlx::mysql::MySqlRow>) -> Result<(), Error> {
    println!("\n{what}:\n```");
    println!("id select_type table type key rows Extra");
    for r in rows {
        let text = |i: usize| -> String {
            r.try_get::<Option<String>, _>(i)
                .ok()
                .flatten()
                .or_else(|| {
                    r.try_get::<Option<i64>, _>(i)
                        .ok()
                        .flatten()
                        .map(|n| n.to_string())
                })
                .or_else(|| {
                    r.try_get::<Option<u64>, _>(i)
                        .ok()
                        .flatten()
                        .map(|n| n.to_string())
                })
                .unwrap_or_else(|| "-".into())
        };
        println!(
            "{} {} {} {} {} {} {}",
            text(0),
            text(1),
            text(2),
            text(3),
            text(5),
            text(8),
            text(9)
        );
    }
    println!("```");
    Ok(())
}
