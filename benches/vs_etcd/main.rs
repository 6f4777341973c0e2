//! # etcdsql against etcd, side by side
//!
//! A load generator that drives any etcd v3 endpoint through the real gRPC API (the
//! `etcd-client` crate) with Kubernetes-shaped traffic, and a driver that runs the same
//! workloads against etcdsql on SQLite, etcdsql on PostgreSQL (when that backend exists and
//! the database is reachable) and a real etcd, one after another on this machine, then prints
//! and writes the comparison.
//!
//! ```sh
//! cargo bench --bench vs_etcd -- --etcd-bin ETCD35  # the full run (about an hour)
//! cargo bench --bench vs_etcd -- --smoke            # seconds: proves the harness works
//! cargo test --locked --bench vs_etcd -- --smoke    # the same on the debug build (CI)
//! cargo bench --bench vs_etcd -- --help             # every size is a flag
//! ```
//!
//! It is a `[[bench]]` with `harness = false` rather than a `[[bin]]` so that its client-side
//! dependencies (`etcd-client`, `hdrhistogram`) stay dev-dependencies of the server, `cargo
//! bench` builds it and the `etcdsql` binary with the optimised profile in one step, and the
//! path of that binary comes from Cargo (`CARGO_BIN_EXE_etcdsql`). `cargo test` does not run
//! it unless asked (`--bench vs_etcd`), since bench targets are not tested by default.
//!
//! # Layout
//! - `system.rs`: starting each server on free loopback ports with a fresh data directory on
//!   this disk, readiness, `/proc` readings (CPU seconds, peak RSS, context switches), the
//!   server's `/metrics`, optional `perf record`.
//! - `load.rs`: the workloads and the closed-loop / open-loop drivers; latency histograms.
//! - `report.rs`: the markdown tables, the targets of issue #16, JSON and the SVG chart.
//! - `rounds.rs`: repeating the run in rotated order and folding the rounds into medians.
//!
//! # Measuring
//! The run is repeated in rounds (three by default), each on fresh servers; the systems take
//! turns going first, and the tables report each number's median over the rounds, with every
//! round's throughput beside it. Within a round every system gets a fresh server and they all
//! start up front; then each workload (create,
//! update, get, list and count, watch, mixed, sweep) runs on one system after the other before
//! the next workload starts, so the systems are measured minutes apart at most and noise from
//! the shared machine hits them alike. Each system sees the same requests on the same data.
//! Before each workload the server's peak RSS is reset through `/proc/PID/clear_refs`, and its
//! CPU time read from `/proc/PID/stat` before and after; so is the whole machine's busy time
//! (`/proc/stat`), to show how much *other* work competed. The harness runs on the same cores
//! as the server, so compare systems by their ratio in one run, not across runs.

mod load;
mod report;
mod rounds;
mod system;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use serde_json::{Map, Value, json};

use load::{Ctx, Measured, Sizes};
use report::{Run, SystemResult, WorkloadResult};
use system::{Kind, Profiler, Server, Setup, Skip};

const WORKLOADS: [&str; 7] = ["create", "update", "get", "list", "watch", "mixed", "sweep"];

/// Kubernetes-shaped load against etcdsql (SQLite, PostgreSQL) and etcd, side by side.
///
/// Size flags override the defaults of the chosen mode (full, or --smoke).
#[derive(Parser, Debug)]
#[command(name = "vs_etcd")]
struct Args {
    /// Tiny sizes (seconds): proves the harness and the servers work. Fails on any error.
    #[arg(long)]
    smoke: bool,
    /// Systems to run: sqlite, postgres, postgres-3 (three etcdsql processes on one
    /// database, the clients' connections spread over them), mysql, etcd (the reference:
    /// `--etcd-bin`), etcd-old (`--etcd-old-bin`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "sqlite,postgres,postgres-3,mysql,etcd,etcd-old"
    )]
    systems: Vec<String>,
    /// Workloads to run: create, update, get, list (with count), watch, mixed, sweep.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "create,update,get,list,watch,mixed,sweep"
    )]
    workloads: Vec<String>,
    /// Rounds of the whole run, each on fresh servers in rotated order [full: 3].
    #[arg(long)]
    rounds: Option<usize>,
    /// Concurrent clients of the closed-loop workloads [full: 64].
    #[arg(long)]
    clients: Option<usize>,
    /// gRPC connections the clients share [full: 8].
    #[arg(long)]
    conns: Option<usize>,
    /// Namespaces the configmaps spread over [full: 100].
    #[arg(long)]
    namespaces: Option<usize>,
    /// Value size in bytes [1024].
    #[arg(long)]
    value_size: Option<usize>,
    /// Create txns [full: 20000].
    #[arg(long)]
    creates: Option<u64>,
    /// GuaranteedUpdate txns [full: 20000].
    #[arg(long)]
    updates: Option<u64>,
    /// Percent of updates sent with a stale revision [5].
    #[arg(long)]
    stale_percent: Option<u32>,
    /// Single-key gets [full: 30000].
    #[arg(long)]
    gets: Option<u64>,
    /// Keys per list prefix, comma-separated [full: 10000,100000].
    #[arg(long, value_delimiter = ',')]
    list_sizes: Option<Vec<u64>>,
    /// Page size of paginated lists [500].
    #[arg(long)]
    list_page: Option<i64>,
    /// Full paginated lists per prefix [full: 2].
    #[arg(long)]
    list_repeats: Option<u64>,
    /// count_only requests per prefix [full: 20].
    #[arg(long)]
    counts: Option<u64>,
    /// Watcher counts, comma-separated [full: 1,100,1000].
    #[arg(long, value_delimiter = ',')]
    watchers: Option<Vec<usize>>,
    /// Creates per second while watchers listen [full: 500].
    #[arg(long)]
    watch_rate: Option<f64>,
    /// Seconds of creates per watcher count [full: 4].
    #[arg(long)]
    watch_secs: Option<f64>,
    /// Seconds of the mixed workload [full: 10].
    #[arg(long)]
    mixed_secs: Option<f64>,
    /// Offered update rates of the open-loop sweep [full: 250,500,1000,2000,4000,8000].
    #[arg(long, value_delimiter = ',')]
    sweep_rates: Option<Vec<f64>>,
    /// Seconds per sweep rate [full: 2].
    #[arg(long)]
    sweep_secs: Option<f64>,
    /// Longest any one workload may run, in seconds [full: 60].
    #[arg(long)]
    max_secs: Option<f64>,
    /// Where latest.{md,json,svg} go [benches/results; with --smoke, inside --work-dir].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Data directories and server logs [a fresh directory under /tmp].
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Keep the data directories, logs and the PostgreSQL database after the run.
    #[arg(long)]
    keep: bool,
    /// The etcd the ratios are taken against: today's, e.g. sid's 3.5.x, which
    /// `conformance/k8s-storage/build.sh` leaves in its output folder.
    #[arg(long, default_value = "etcd")]
    etcd_bin: String,
    /// An older etcd for the record (bookworm's 3.4.23 is `/usr/bin/etcd`).
    #[arg(long, default_value = "/usr/bin/etcd")]
    etcd_old_bin: String,
    #[arg(long, default_value = env!("CARGO_BIN_EXE_etcdsql"))]
    etcdsql_bin: String,
    /// PostgreSQL admin URL; a fresh database is created beside it for the run and dropped.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    postgres_url: String,
    /// MySQL/MariaDB server URL; a fresh database is created on it for the run and dropped.
    #[arg(long, default_value = "mysql://root@127.0.0.1:3306")]
    mysql_url: String,
    /// Record a `perf` profile of the server during each workload into this directory.
    #[arg(long)]
    perf_dir: Option<PathBuf>,
    /// Arguments for `perf record`.
    #[arg(long, default_value = "-F 499 -g", allow_hyphen_values = true)]
    perf_args: String,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

impl Args {
    fn sizes(&self) -> Sizes {
        let mut s = if self.smoke {
            Sizes::smoke()
        } else {
            Sizes::full()
        };
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = self.$f.clone() { s.$f = v; } )* };
        }
        set!(
            rounds,
            clients,
            conns,
            namespaces,
            value_size,
            creates,
            updates,
            stale_percent,
            gets,
            list_sizes,
            list_page,
            list_repeats,
            counts,
            watchers,
            watch_rate,
            watch_secs,
            mixed_secs,
            sweep_rates,
            sweep_secs,
            max_secs
        );
        s
    }
}

fn machine() -> Map<String, Value> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map_or("unknown".to_owned(), |m| m.trim().to_owned());
    let mem = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or("unknown".to_owned(), |kib| {
            format!("{:.1} GiB", kib as f64 / 1048576.0)
        });
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut m = Map::new();
    m.insert("nproc".into(), json!(nproc.to_string()));
    m.insert("memory".into(), json!(mem));
    m.insert("cpu".into(), json!(cpu));
    m.insert(
        "kernel".into(),
        json!(read("/proc/sys/kernel/osrelease").trim()),
    );
    m
}

/// Starts `perf record` on the server into `<dir>/<system>-<name>.data`, if asked to.
fn profile(server: &Server, perf: Option<&(PathBuf, String)>, name: &str) -> Option<Profiler> {
    perf.and_then(|(dir, args)| {
        let file = dir.join(format!("{}-{name}.data", server.kind.name()));
        Profiler::start(server.pid(), &file, args)
    })
}

/// Runs one workload with the server's CPU time and peak RSS taken around it.
async fn measure<F>(
    server: &Server,
    perf: Option<&(PathBuf, String)>,
    name: &str,
    latency_of: &str,
    run: F,
) -> WorkloadResult
where
    F: Future<Output = Result<Measured, String>>,
{
    // Let the previous workload's background work (fsyncs, checkpoints) settle.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let metrics_before = system::scrape_metrics(&server.endpoint).await;
    server.reset_peak_rss();
    let (cpu0, db0, me0, cs0, busy0, disk0) = (
        server.cpu_seconds(),
        server.db_cpu_seconds(),
        system::self_cpu_seconds(),
        server.context_switches(),
        system::machine_busy_seconds(),
        server.disk_write_bytes(),
    );
    let profiler = profile(server, perf, name);
    let mut m = run.await.unwrap_or_else(|e| Measured {
        ops: 0,
        elapsed: Duration::ZERO,
        latency: load::new_hist(),
        errors: 1,
        error_samples: vec![e],
        extra: Map::new(),
    });
    let (cpu1, db1, me1, cs1, busy1, rss, disk1) = (
        server.cpu_seconds(),
        server.db_cpu_seconds(),
        system::self_cpu_seconds(),
        server.context_switches(),
        system::machine_busy_seconds(),
        server.peak_rss_bytes(),
        server.disk_write_bytes(),
    );
    if let Some(p) = profiler {
        p.stop();
    }
    // What the server says it did meanwhile: group-commit batch sizes, commit and fsync times.
    let metrics_after = system::scrape_metrics(&server.endpoint).await;
    let deltas: Map<String, Value> = metrics_after
        .iter()
        .filter_map(|(k, after)| {
            let d = after - metrics_before.get(k).copied().unwrap_or(0.0);
            (d > 0.0).then(|| (k.clone(), json!(d)))
        })
        .collect();
    if !deltas.is_empty() {
        m.extra
            .insert("server_metrics".into(), Value::Object(deltas));
    }
    let ms = |q: f64| {
        if m.latency.is_empty() {
            0.0
        } else {
            m.latency.value_at_quantile(q) as f64 / 1000.0
        }
    };
    let secs = m.elapsed.as_secs_f64();
    let (server_cpu, db_cpu, client_cpu) =
        (cpu1 - cpu0, db1.zip(db0).map(|(a, b)| a - b), me1 - me0);
    let w = WorkloadResult {
        name: name.to_owned(),
        latency_of: latency_of.to_owned(),
        ops: m.ops,
        secs,
        ops_per_sec: if secs > 0.0 { m.ops as f64 / secs } else { 0.0 },
        p50_ms: ms(0.5),
        p99_ms: ms(0.99),
        p999_ms: ms(0.999),
        max_ms: if m.latency.is_empty() {
            0.0
        } else {
            m.latency.max() as f64 / 1000.0
        },
        server_cpu_s: server_cpu,
        db_cpu_s: db_cpu,
        client_cpu_s: client_cpu,
        server_context_switches: cs1.saturating_sub(cs0),
        server_disk_write_bytes: disk1.saturating_sub(disk0),
        other_cpu_s: (busy1 - busy0 - server_cpu - db_cpu.unwrap_or(0.0) - client_cpu).max(0.0),
        peak_rss_mib: rss as f64 / 1048576.0,
        errors: m.errors,
        error_samples: m.error_samples,
        extra: m.extra,
    };
    eprintln!(
        "  {:<17} {:<12} {:>8.0} ops/s  p50 {:>8.2} ms  p99 {:>8.2} ms  cpu {:>6.2} s  other cpu {:>5.1} s  rss {:>5.0} MiB  errors {}{}",
        server.kind.name(),
        w.name,
        w.ops_per_sec,
        w.p50_ms,
        w.p99_ms,
        w.server_cpu_s,
        w.other_cpu_s,
        w.peak_rss_mib,
        w.errors,
        w.error_samples
            .first()
            .map(|e| format!(" ({e})"))
            .unwrap_or_default()
    );
    w
}

/// One step of the run; every system takes each step before the next step starts.
#[derive(Clone, Debug)]
enum Step {
    Create,
    Update,
    Get,
    /// Writes a list set (not measured).
    Load(u64),
    List(u64),
    Count(u64),
    Watch(usize),
    Mixed,
    Sweep,
}

fn steps(workloads: &[String], sizes: &Sizes) -> Vec<Step> {
    let mut steps = Vec::new();
    for wl in workloads {
        match wl.as_str() {
            "create" => steps.push(Step::Create),
            "update" => steps.push(Step::Update),
            "get" => steps.push(Step::Get),
            "list" => {
                for &size in &sizes.list_sizes {
                    steps.extend([Step::Load(size), Step::List(size), Step::Count(size)]);
                }
            }
            "watch" => steps.extend(sizes.watchers.iter().map(|&n| Step::Watch(n))),
            "mixed" => steps.push(Step::Mixed),
            "sweep" => steps.push(Step::Sweep),
            other => unreachable!("workload {other} was validated"),
        }
    }
    steps
}

/// A running system with its client and what it has measured so far.
struct Subject {
    server: Server,
    ctx: Ctx,
}

async fn run_step(
    step: &Step,
    subject: &mut Subject,
    result: &mut SystemResult,
    perf: Option<&(PathBuf, String)>,
) {
    let Subject { server, ctx } = subject;
    let server = &*server;
    let w = match step {
        Step::Create => {
            measure(server, perf, "create", "request", async {
                Ok(load::create(ctx).await)
            })
            .await
        }
        Step::Update => measure(server, perf, "update", "request", load::update(ctx)).await,
        Step::Get => measure(server, perf, "get", "request", load::get(ctx)).await,
        Step::Load(size) => {
            let note = match load::load_list_set(ctx, *size).await {
                Ok(took) => format!(
                    "loaded {size} list keys in {:.1} s (100 puts per txn, not measured)",
                    took.as_secs_f64()
                ),
                Err(e) => format!("cannot load the list set: {e}"),
            };
            eprintln!("  {:<17} {note}", server.kind.name());
            result.notes.push(note);
            return;
        }
        Step::List(size) => {
            let name = format!("list-{}", load::short(*size));
            let ctx = &*ctx;
            measure(server, perf, &name, "full list", async {
                Ok(load::list(ctx, *size).await)
            })
            .await
        }
        Step::Count(size) => {
            let name = format!("count-{}", load::short(*size));
            let ctx = &*ctx;
            measure(server, perf, &name, "request", async {
                Ok(load::count(ctx, *size).await)
            })
            .await
        }
        Step::Watch(n) => {
            let name = format!("watch-{n}");
            measure(server, perf, &name, "delivery", load::watch(ctx, *n)).await
        }
        Step::Mixed => measure(server, perf, "mixed", "request", load::mixed(ctx)).await,
        Step::Sweep => {
            tokio::time::sleep(Duration::from_millis(500)).await;
            eprintln!("  {:<17} sweep", server.kind.name());
            let cpu = || server.cpu_seconds() + server.db_cpu_seconds().unwrap_or(0.0);
            // One profile over every rate: the rates run back to back, the highest last.
            let profiler = profile(server, perf, "sweep");
            let swept = load::sweep(ctx, &cpu).await;
            if let Some(p) = profiler {
                p.stop();
            }
            match swept {
                Ok(points) => result.sweep = points,
                Err(e) => result.notes.push(format!("sweep: {e}")),
            }
            return;
        }
    };
    result.workloads.push(w);
}

/// Starts every system, then runs each step on every system in turn, so that the systems are
/// measured close together in time (this machine is shared: noise comes and goes).
async fn run_all(
    kinds: &[Kind],
    setup: &Setup,
    sizes: &Sizes,
    workloads: &[String],
    perf: Option<&(PathBuf, String)>,
) -> Vec<SystemResult> {
    let mut results = Vec::new();
    let mut subjects = Vec::new();
    for &kind in kinds {
        let mut result = SystemResult {
            name: kind.name().to_owned(),
            version: String::new(),
            skipped: None,
            workloads: Vec::new(),
            sweep: Vec::new(),
            peak_rss_mib: 0.0,
            disk_mib: None,
            notes: Vec::new(),
        };
        match Server::start(kind, setup).await {
            Ok(server) => {
                result.version = server.version.clone();
                eprintln!(
                    "{}: {} pid {} at {}",
                    kind.name(),
                    server.version,
                    server.pid(),
                    server.endpoint
                );
                match Ctx::connect(&server.endpoints, sizes.clone()).await {
                    Ok(ctx) => subjects.push(Some(Subject { server, ctx })),
                    Err(e) => {
                        result.skipped = Some(e);
                        subjects.push(None);
                    }
                }
            }
            Err(Skip(why)) => {
                eprintln!("{}: skipped: {why}", kind.name());
                result.skipped = Some(why);
                subjects.push(None);
            }
        }
        results.push(result);
    }
    for step in steps(workloads, sizes) {
        eprintln!("== {step:?}");
        for (subject, result) in subjects.iter_mut().zip(results.iter_mut()) {
            if let Some(subject) = subject {
                run_step(&step, subject, result, perf).await;
            }
        }
    }
    for (subject, result) in subjects.into_iter().zip(results.iter_mut()) {
        let Some(Subject { mut server, ctx }) = subject else {
            continue;
        };
        result.peak_rss_mib = result
            .workloads
            .iter()
            .map(|w| w.peak_rss_mib)
            .fold(0.0, f64::max);
        result.disk_mib = server.disk_bytes().map(|b| b as f64 / 1048576.0);
        drop(ctx);
        server.stop();
    }
    results
}

fn write(path: &Path, text: &str) {
    if let Err(e) = std::fs::write(path, text) {
        eprintln!("cannot write {}: {e}", path.display());
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let sizes = args.sizes();
    let mut kinds = Vec::new();
    for s in &args.systems {
        match Kind::parse(s) {
            Ok(k) => kinds.push(k),
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(2);
            }
        }
    }
    if let Some(bad) = args
        .workloads
        .iter()
        .find(|w| !WORKLOADS.contains(&w.as_str()))
    {
        eprintln!(
            "unknown workload {bad:?}: expected one of {}",
            WORKLOADS.join(", ")
        );
        return ExitCode::from(2);
    }
    let work_dir = args.work_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("etcdsql-bench-{}", std::process::id()))
    });
    if let Err(e) = std::fs::create_dir_all(&work_dir) {
        eprintln!("cannot create {}: {e}", work_dir.display());
        return ExitCode::from(2);
    }
    let out_dir = args.out.clone().unwrap_or_else(|| {
        if args.smoke {
            work_dir.join("results")
        } else {
            PathBuf::from("benches/results")
        }
    });
    let perf = args.perf_dir.clone().map(|d| {
        let _ = std::fs::create_dir_all(&d);
        (d, args.perf_args.clone())
    });
    let setup = Setup {
        etcd_bin: args.etcd_bin.clone(),
        etcd_old_bin: args.etcd_old_bin.clone(),
        etcdsql_bin: args.etcdsql_bin.clone(),
        postgres_url: args.postgres_url.clone(),
        mysql_url: args.mysql_url.clone(),
        work_dir: work_dir.clone(),
        keep: args.keep,
    };
    let argv: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let command = format!("cargo bench --bench vs_etcd -- {}", argv.join(" "))
        .trim_end_matches(" -- ")
        .to_owned();
    let mut run = Run {
        command,
        started_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        machine: machine(),
        sizes: sizes.clone(),
        systems: Vec::new(),
        rounds: Vec::new(),
    };
    eprintln!(
        "work dir {}, results in {}",
        work_dir.display(),
        out_dir.display()
    );
    for round in 0..sizes.rounds.max(1) {
        eprintln!("=== round {} of {}", round + 1, sizes.rounds.max(1));
        let order = rounds::rotated(&kinds, round);
        let mut results = run_all(&order, &setup, &sizes, &args.workloads, perf.as_ref()).await;
        results.sort_by_key(|r| kinds.iter().position(|k| k.name() == r.name));
        run.rounds.push(results);
    }
    run.systems = rounds::fold(&run.rounds);

    let markdown = run.markdown();
    println!("{markdown}");
    let _ = std::fs::create_dir_all(&out_dir);
    write(&out_dir.join("latest.md"), &markdown);
    write(
        &out_dir.join("latest.json"),
        &serde_json::to_string_pretty(&run).expect("serialisable"),
    );
    write(&out_dir.join("latest.svg"), &run.svg());
    eprintln!("wrote {}/latest.{{md,json,svg}}", out_dir.display());
    if !args.keep {
        for kind in [
            Kind::Sqlite,
            Kind::Postgres,
            Kind::Postgres3,
            Kind::Etcd,
            Kind::EtcdOld,
        ] {
            let _ = std::fs::remove_dir_all(work_dir.join(kind.name()));
        }
    }

    // Only the database servers' systems may be missing; any error is a failure (of the harness or a server),
    // never a timing judgement.
    let missing: Vec<&str> = run
        .systems
        .iter()
        .filter(|s| {
            s.skipped.is_some() && !kinds.iter().any(|k| k.on_server() && k.name() == s.name)
        })
        .map(|s| s.name.as_str())
        .collect();
    let errors: u64 = run
        .systems
        .iter()
        .flat_map(|s| s.workloads.iter().map(|w| w.errors))
        .sum::<u64>()
        + run
            .systems
            .iter()
            .flat_map(|s| s.sweep.iter().map(|p| p.errors))
            .sum::<u64>();
    if !missing.is_empty() {
        eprintln!("FAILED: {} did not run", missing.join(", "));
        return ExitCode::FAILURE;
    }
    if errors > 0 {
        eprintln!("FAILED: {errors} errors (see the table)");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
