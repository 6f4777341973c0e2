use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use etcdsql::lease::{Clock, SystemClock};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

// Every request allocates its messages and frames on whichever worker thread runs it and frees
// them on another; glibc's malloc spent a sixth of a get's CPU time on that (and on its arena
// locks), mimalloc's per-thread free lists far less.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process.
///
/// mimalloc asks for huge pages on its arenas and later returns freed memory in 64 KiB pieces;
/// touching a 2 MiB region again then faults in a whole huge page, which the kernel zeroes
/// first. Under a write load that zeroing took 8% of the server's CPU (`clear_page_erms`
/// under `do_huge_pmd_anonymous_page`) and lengthened the p99 of creates by half; with
/// ordinary pages only the pages touched are zeroed. Linux only; elsewhere nothing to do.
fn disable_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_SET_THP_DISABLE takes plain integers and touches no memory of ours.
        let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        if rc != 0 {
            // Only a cost, never a fault: the process runs as it did before.
            eprintln!(
                "etcdsql: could not turn transparent huge pages off: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// An etcd v3-compatible server that keeps its data in SQL; with a command, a tool for its
/// data store.
#[derive(Parser)]
#[command(name = "etcdsql", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    config: etcdsql::Config,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Writes a snapshot of the store at --endpoint to FILE while it serves: a SQLite database
    /// and its SHA-256, the format Maintenance.Snapshot (`etcdctl snapshot save`) streams.
    Backup { file: PathBuf },
    /// Restores a snapshot (from `backup` or `etcdctl snapshot save`) into the store at
    /// --endpoint, which must be empty; SQLite or PostgreSQL, whichever the snapshot came from.
    /// Stop servers on a SQLite file first.
    Restore { file: PathBuf },
    /// Checks a data store's bookkeeping (revisions, which row replaced which, versions,
    /// counters, leases), offline or while it serves, and says what is wrong in words; exits
    /// with status 1 if anything is. ENDPOINT defaults to --endpoint.
    Check { endpoint: Option<String> },
    /// Copies another store into the store at --endpoint, which must be empty: a kine database
    /// (the SQLite, PostgreSQL or MySQL endpoint k3s gives kine; kine must not be writing
    /// meanwhile) with every revision kept, or a running etcd at its current revision (with
    /// --with-history, everything from its compact revision on).
    #[command(group(clap::ArgGroup::new("source").required(true).args(["from_kine", "from_etcd"])))]
    Import {
        /// The kine database: `sqlite://PATH`, `postgres://…` or `mysql://…` (kine's own
        /// `mysql://user:pass@tcp(host:port)/db` form too).
        #[arg(long, value_name = "ENDPOINT")]
        from_kine: Option<String>,
        /// The etcd to copy: `http://HOST:PORT`, `https://HOST:PORT` or `HOST:PORT`.
        #[arg(long, value_name = "URL")]
        from_etcd: Option<String>,
        /// Also copy etcd's history from its compact revision on, so that older revisions
        /// and watches from them answer as on etcd.
        #[arg(long, requires = "from_etcd")]
        with_history: bool,
        /// After the copy, keep applying etcd's changes to the store until SIGTERM or ctrl-c,
        /// then catch up with etcd and stop: stop etcd's writers, wait for this to exit, start
        /// etcdsql and point the writers at it.
        #[arg(long, requires = "from_etcd")]
        follow: bool,
        /// The CA certificate that signed etcd's server certificate (makes HOST:PORT https);
        /// also `--cacert`, as etcdctl names it.
        #[arg(long, alias = "cacert", value_name = "FILE", requires = "from_etcd")]
        from_etcd_cacert: Option<PathBuf>,
        /// A client certificate for etcd (with --from-etcd-key); also `--cert`.
        #[arg(long, alias = "cert", value_name = "FILE", requires_all = ["from_etcd", "from_etcd_key"])]
        from_etcd_cert: Option<PathBuf>,
        /// The client certificate's private key; also `--key`.
        #[arg(long, alias = "key", value_name = "FILE", requires = "from_etcd_cert")]
        from_etcd_key: Option<PathBuf>,
    },
    /// Writes the store's current keys and leases into an empty etcd, in the order they were
    /// last written. etcd gives them new revisions: clients must relist afterwards.
    Export {
        /// The etcd to write into: `http://HOST:PORT`, `https://HOST:PORT` or `HOST:PORT`.
        #[arg(long, value_name = "URL")]
        to_etcd: String,
        /// The CA certificate that signed etcd's server certificate (makes HOST:PORT https);
        /// also `--cacert`, as etcdctl names it.
        #[arg(long, alias = "cacert", value_name = "FILE")]
        to_etcd_cacert: Option<PathBuf>,
        /// A client certificate for etcd (with --to-etcd-key); also `--cert`.
        #[arg(long, alias = "cert", value_name = "FILE", requires = "to_etcd_key")]
        to_etcd_cert: Option<PathBuf>,
        /// The client certificate's private key; also `--key`.
        #[arg(long, alias = "key", value_name = "FILE", requires = "to_etcd_cert")]
        to_etcd_key: Option<PathBuf>,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    disable_transparent_huge_pages();
    let Cli { config, command } = Cli::parse();
    let filter = EnvFilter::try_new(&config.log_level)
        .with_context(|| format!("invalid --log-level {:?}", config.log_level))?;
    let logs = tracing_subscriber::fmt().with_env_filter(filter);
    if config.log_format == "json" {
        logs.json().init();
    } else {
        logs.init();
    }

    if let Some(command) = command {
        return run_tool(&config, command).await;
    }
    let shutdown = CancellationToken::new();
    let running = etcdsql::start(config, shutdown.clone())
        .await
        .context("etcdsql failed to start")?;
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        shutdown.cancel();
    });
    running.wait().await;
    Ok(())
}

async fn run_tool(config: &etcdsql::Config, command: Command) -> anyhow::Result<()> {
    let pool = etcdsql::backend::PoolOptions::default();
    let url = match &command {
        Command::Check {
            endpoint: Some(endpoint),
        } => endpoint.as_str(),
        _ => config.endpoint.as_str(),
    };
    let endpoint = etcdsql::backend::redact(url);
    let backend = etcdsql::backend::open(url, &pool)
        .await
        .with_context(|| format!("cannot open {endpoint}"))?;
    let done = match command {
        Command::Backup { file } => etcdsql::snapshot::save(&backend, &file).await.map(|bytes| {
            println!(
                "Snapshot of {endpoint} saved at {} ({bytes} bytes)",
                file.display()
            )
        }),
        Command::Restore { file } => etcdsql::snapshot::restore(&backend, &file).await.map(|()| {
            println!("Restored {} into {endpoint}", file.display());
        }),
        Command::Import {
            from_kine,
            from_etcd,
            with_history,
            follow,
            from_etcd_cacert,
            from_etcd_cert,
            from_etcd_key,
        } => {
            let source = match (from_kine, from_etcd) {
                (Some(kine), _) => Source::Kine(kine),
                (None, Some(endpoint)) => Source::Etcd(
                    etcdsql::import::Source {
                        endpoint,
                        cacert: from_etcd_cacert,
                        cert: from_etcd_cert,
                        key: from_etcd_key,
                    },
                    with_history,
                    follow,
                ),
                (None, None) => unreachable!("clap requires one source"),
            };
            let imported = import(&backend, source, &endpoint).await;
            backend.close().await;
            return imported;
        }
        Command::Export {
            to_etcd,
            to_etcd_cacert,
            to_etcd_cert,
            to_etcd_key,
        } => {
            let target = etcdsql::import::Source {
                endpoint: to_etcd,
                cacert: to_etcd_cacert,
                cert: to_etcd_cert,
                key: to_etcd_key,
            };
            let exported = export(&backend, &target, &endpoint).await;
            backend.close().await;
            return exported;
        }
        Command::Check { .. } => {
            let report = backend.check().await;
            backend.close().await;
            let report = report.with_context(|| format!("cannot check {endpoint}"))?;
            println!(
                "{endpoint}: {} log rows, current revision {}, compact revision {}, {} leases",
                report.rows, report.current_revision, report.compact_revision, report.leases
            );
            if report.problems.is_empty() {
                println!("ok: no problems found");
                return Ok(());
            }
            for problem in &report.problems {
                println!("problem: {problem}");
            }
            println!("{} problems found", report.problems.len());
            std::process::exit(1);
        }
    };
    backend.close().await;
    Ok(done?)
}

/// Where `import` copies from.
enum Source {
    Kine(String),
    /// The etcd, whether its history comes too, and whether to follow it afterwards.
    Etcd(etcdsql::import::Source, bool, bool),
}

/// `import`: the source into a backup file, then that file into the store.
async fn import(
    backend: &Arc<dyn etcdsql::backend::Backend>,
    source: Source,
    endpoint: &str,
) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("etcdsql-import")
        .tempdir()?;
    let file = dir.path().join("import.db");
    let started = std::time::Instant::now();
    let now_ms = SystemClock.now_ms();
    let mut progress = Progress::new("changes read");
    let report = |rows, total| progress.report(rows, total);
    let (imported, name) = match &source {
        Source::Kine(from) => {
            let name = etcdsql::backend::redact(from);
            let imported = etcdsql::backend::kine::to_file(from, &file, now_ms, report)
                .await
                .with_context(|| format!("cannot read kine's rows from {name}"))?;
            (imported, name)
        }
        Source::Etcd(from, with_history, _) => {
            let name = from.endpoint.clone();
            let imported = etcdsql::import::to_file(from, &file, *with_history, now_ms, report)
                .await
                .with_context(|| format!("cannot copy etcd at {name}"))?;
            (imported, name)
        }
    };
    // The source's total was an estimate: the last line says where the copy really ended.
    progress.report(imported.rows, imported.rows);
    let writing = std::sync::Mutex::new(Progress::new("rows written into the store"));
    let copied = |rows| {
        if let Ok(mut progress) = writing.lock() {
            progress.report(rows, imported.rows);
        }
    };
    backend
        .restore(&file, &copied)
        .await
        .with_context(|| format!("cannot write into {endpoint}"))?;
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "Imported {} rows ({} live keys, {} leases) from {name} into {endpoint} in {seconds:.1} s \
         ({:.0} rows/s): current revision {}, compact revision {}",
        imported.rows,
        imported.keys,
        imported.leases,
        imported.rows as f64 / seconds.max(0.001),
        imported.current_revision,
        imported.compact_revision
    );
    if let Source::Etcd(from, _, true) = &source {
        follow(backend, from, imported.current_revision).await?;
    }
    Ok(())
}

/// `import --follow`: etcd's changes after `after` into the store until a signal, through the
/// store's own write path.
async fn follow(
    backend: &Arc<dyn etcdsql::backend::Backend>,
    from: &etcdsql::import::Source,
    after: i64,
) -> anyhow::Result<()> {
    let running = ToolStore::start(backend).await?;
    let store = &running.store;
    let lessor = etcdsql::lease::Lessor::new(store.clone(), Arc::new(SystemClock));
    let stop = CancellationToken::new();
    let signal = stop.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        signal.cancel();
    });
    eprintln!("follow: applying etcd's changes after revision {after}; SIGTERM or ctrl-c stops");
    let mut last_report = std::time::Instant::now();
    let followed = etcdsql::import::follow(from, store, &lessor, after, stop, |revision| {
        if last_report.elapsed() >= std::time::Duration::from_secs(5) {
            last_report = std::time::Instant::now();
            eprintln!("follow: at etcd's revision {revision}");
        }
    })
    .await;
    running.stop().await;
    let followed =
        followed.with_context(|| format!("following etcd at {} failed", from.endpoint))?;
    println!(
        "Followed etcd through revision {} ({} revisions applied); the store is at etcd's \
         revision and ready to serve",
        followed.revision, followed.revisions
    );
    Ok(())
}

/// The store's write path in a tool process: the writer and compactor tasks, no server.
struct ToolStore {
    store: etcdsql::mvcc::Store,
    tasks: tokio_util::task::TaskTracker,
    shutdown: CancellationToken,
}

impl ToolStore {
    async fn start(backend: &Arc<dyn etcdsql::backend::Backend>) -> anyhow::Result<Self> {
        let tasks = tokio_util::task::TaskTracker::new();
        let shutdown = CancellationToken::new();
        let store = etcdsql::mvcc::Store::start(
            backend.clone(),
            etcdsql::mvcc::StoreOptions::default(),
            &tasks,
            shutdown.clone(),
        )
        .await
        .context("cannot open the store")?;
        Ok(Self {
            store,
            tasks,
            shutdown,
        })
    }

    /// Lets the writer finish what it has and waits for its tasks.
    async fn stop(self) {
        self.shutdown.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// `export --to-etcd`: the store's live keys and leases into an empty etcd.
async fn export(
    backend: &Arc<dyn etcdsql::backend::Backend>,
    target: &etcdsql::import::Source,
    endpoint: &str,
) -> anyhow::Result<()> {
    let running = ToolStore::start(backend).await?;
    let started = std::time::Instant::now();
    let now_ms = SystemClock.now_ms();
    let mut progress = Progress::new("keys written");
    let exported = etcdsql::export::to_etcd(&running.store, target, now_ms, |done, total| {
        progress.report(done, total)
    })
    .await;
    running.stop().await;
    let exported =
        exported.with_context(|| format!("cannot export into etcd at {}", target.endpoint))?;
    println!(
        "Exported {} keys and {} leases from {endpoint} (revision {}) into etcd at {} in {:.1} s: \
         etcd is at its own revision {}, so clients must relist",
        exported.keys,
        exported.leases,
        exported.from_revision,
        target.endpoint,
        started.elapsed().as_secs_f64(),
        exported.to_revision
    );
    Ok(())
}

/// Progress of a long copy: on a terminal one line rewritten in place, otherwise a plain line
/// every few seconds (logs).
struct Progress {
    /// What is counted, e.g. "changes read".
    what: &'static str,
    started: std::time::Instant,
    last: Option<std::time::Instant>,
    terminal: bool,
}

impl Progress {
    fn new(what: &'static str) -> Self {
        use std::io::IsTerminal;
        Self {
            what,
            started: std::time::Instant::now(),
            last: None,
            terminal: std::io::stderr().is_terminal(),
        }
    }

    fn report(&mut self, done: u64, total: u64) {
        let every = if self.terminal { 0.2 } else { 5.0 };
        if self.last.is_some_and(|t| t.elapsed().as_secs_f64() < every) && done < total {
            return;
        }
        self.last = Some(std::time::Instant::now());
        let seconds = self.started.elapsed().as_secs_f64().max(0.001);
        let rate = done as f64 / seconds;
        let eta = if rate > 0.0 {
            total.saturating_sub(done) as f64 / rate
        } else {
            0.0
        };
        let line = format!(
            "{done} of {total} {} ({:.0}%), {rate:.0}/s, about {eta:.0} s left",
            self.what,
            100.0 * done as f64 / total.max(1) as f64
        );
        if self.terminal {
            eprint!("\r{line}");
            if done >= total {
                eprintln!();
            }
        } else {
            eprintln!("{line}");
        }
    }
}

async fn wait_for_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM; only ctrl-c stops the server");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
