//! # Importing from etcd (issue #19)
//!
//! Fills a real etcd (`--etcd-bin`) through its API with `--keys` keys (txns of 128 puts from
//! several clients at once), compacts it, and updates `--updates` of the keys after the
//! compaction; then times `etcdsql import --from-etcd` (the binary, `--etcdsql-bin`) into a
//! fresh store of each backend, without and with `--with-history`. As a yardstick from the same
//! run it also times the least any copy must do: reading every key from etcd in pages of
//! 100,000 keys (about the importer's 32 MiB at this value size), through the same client stack.
//!
//! ```sh
//! cargo bench --bench import -- --etcd-bin PATH/etcd     # 1,000,000 keys, three backends
//! cargo test --locked --bench import -- --smoke          # seconds: proves it works (CI)
//! ```

use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use etcd_client::{Client, CompactionOptions, GetOptions, Txn, TxnOp};

#[derive(Parser, Debug)]
#[command(name = "import")]
struct Args {
    /// Small sizes (seconds): proves the bench works.
    #[arg(long)]
    smoke: bool,
    /// Backends to import into, in order: sqlite, postgres, mysql.
    #[arg(long, value_delimiter = ',', default_value = "sqlite,postgres,mysql")]
    backends: Vec<String>,
    /// Keys [full: 1,000,000; smoke: 5,000].
    #[arg(long)]
    keys: Option<usize>,
    /// Updates after the compaction, replayed by --with-history [full: 100,000; smoke: 1,000].
    #[arg(long)]
    updates: Option<usize>,
    /// Bytes per value [256].
    #[arg(long, default_value_t = 256)]
    value_bytes: usize,
    /// Clients filling etcd at once [8].
    #[arg(long, default_value_t = 8)]
    clients: usize,
    #[arg(long, default_value = "etcd")]
    etcd_bin: String,
    #[arg(long, default_value = env!("CARGO_BIN_EXE_etcdsql"))]
    etcdsql_bin: String,
    /// The PostgreSQL server; a fresh database is created on it and dropped at the end.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    postgres_url: String,
    /// The MySQL/MariaDB server; a fresh database is created on it and dropped at the end.
    #[arg(long, default_value = "mysql://root@127.0.0.1:3306")]
    mysql_url: String,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Keys per txn (etcd's limit is 128 operations).
const PER_TXN: usize = 128;

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse_from(std::env::args().filter(|a| a != "--bench"));
    match run(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("import bench: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> Result<(), Error> {
    let keys = args
        .keys
        .unwrap_or(if args.smoke { 5_000 } else { 1_000_000 });
    let updates = args
        .updates
        .unwrap_or(if args.smoke { 1_000 } else { 100_000 });
    let work = tempfile::tempdir()?;
    let etcd = Etcd::start(&args.etcd_bin, work.path().join("etcd"))?;
    let mut client = etcd.connect().await?;

    let started = Instant::now();
    fill(&etcd.url, keys, args.value_bytes, args.clients).await?;
    let compact = client
        .get("k", None)
        .await?
        .header()
        .map_or(0, |h| h.revision());
    client
        .compact(compact, Some(CompactionOptions::new().with_physical()))
        .await?;
    let value = "u".repeat(args.value_bytes);
    for i in 0..updates {
        client
            .put(key(i * 7919 % keys), value.as_str(), None)
            .await?;
    }
    let current = client
        .get("k", None)
        .await?
        .header()
        .map_or(0, |h| h.revision());
    println!(
        "etcd ({}) filled with {keys} keys of {} B in {:.1} s, compacted at {compact}, then \
         {updates} updates: current revision {current}\n",
        version(&args.etcd_bin),
        args.value_bytes,
        started.elapsed().as_secs_f64()
    );

    let read = read_all(&mut client).await?;
    println!(
        "yardstick: every key read from etcd in pages of 100,000: {:.2} s ({:.0} keys/s)\n",
        read.as_secs_f64(),
        keys as f64 / read.as_secs_f64()
    );
    println!(
        "| into | history | rows | seconds | rows/s | ÷ the yardstick |\n|---|---|--:|--:|--:|--:|"
    );
    for backend in &args.backends {
        for history in [false, true] {
            let (endpoint, cleanup) = store(args, backend, work.path(), history)?;
            let mut command = Command::new(&args.etcdsql_bin);
            command
                .args(["--log-level", "warn", "--endpoint", &endpoint, "import"])
                .args(["--from-etcd", &etcd.url])
                .stdin(Stdio::null());
            if history {
                command.arg("--with-history");
            }
            let started = Instant::now();
            let out = command.output()?;
            let took = started.elapsed();
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            cleanup();
            let rows: Option<u64> = text
                .split("Imported ")
                .nth(1)
                .and_then(|rest| rest.split(' ').next())
                .and_then(|n| n.parse().ok());
            let Some(rows) = rows.filter(|_| out.status.success()) else {
                return Err(format!("import into {backend} failed: {text}").into());
            };
            println!(
                "| {backend} | {} | {rows} | {:.1} | {:.0} | {:.1}× |",
                if history { "with" } else { "without" },
                took.as_secs_f64(),
                rows as f64 / took.as_secs_f64(),
                took.as_secs_f64() / read.as_secs_f64()
            );
        }
    }
    println!(
        "\npeak resident memory of the import processes: {} MiB",
        peak_child_rss_kib() / 1024
    );
    Ok(())
}

fn key(i: usize) -> String {
    format!("/registry/configmaps/ns{}/cm{i:07}", i % 100)
}

/// `keys` keys through txns of [`PER_TXN`] puts, `clients` txns at a time.
async fn fill(url: &str, keys: usize, value_bytes: usize, clients: usize) -> Result<(), Error> {
    let value = "v".repeat(value_bytes);
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let (url, value) = (url.to_owned(), value.clone());
        tasks.spawn(async move {
            let mut client = Client::connect([url], None).await?;
            for start in (c * PER_TXN..keys).step_by(clients * PER_TXN) {
                let puts: Vec<TxnOp> = (start..(start + PER_TXN).min(keys))
                    .map(|i| TxnOp::put(key(i), value.as_str(), None))
                    .collect();
                client.txn(Txn::new().and_then(puts)).await?;
            }
            Ok::<_, etcd_client::Error>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}

/// Every key with its value, in pages of 100,000.
async fn read_all(client: &mut Client) -> Result<Duration, Error> {
    let mut client = client.kv_client().max_decoding_message_size(usize::MAX);
    let started = Instant::now();
    let mut from = vec![0_u8];
    loop {
        let options = GetOptions::new().with_from_key().with_limit(100_000);
        let page = client.get(from, Some(options)).await?;
        let Some(last) = page.kvs().last() else { break };
        from = last.key().to_vec();
        from.push(0);
        if !page.more() {
            break;
        }
    }
    Ok(started.elapsed())
}

/// Removes a store the bench made.
type Cleanup = Box<dyn FnOnce()>;

/// A fresh store on `backend` and what removes it afterwards.
fn store(
    args: &Args,
    backend: &str,
    dir: &std::path::Path,
    history: bool,
) -> Result<(String, Cleanup), Error> {
    let name = format!(
        "etcdsql_import_{}_{}",
        std::process::id(),
        if history { "h" } else { "n" }
    );
    Ok(match backend {
        "sqlite" => {
            let path = dir.join(format!("{name}.db"));
            let endpoint = format!("sqlite://{}", path.display());
            (endpoint, Box::new(move || drop(std::fs::remove_file(path))))
        }
        "postgres" => {
            let admin = format!("{}/postgres", args.postgres_url);
            let drop_db = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
            (
                format!("{}/{name}", args.postgres_url),
                Box::new(move || {
                    drop(
                        Command::new("psql")
                            .args([&admin, "-qc", &drop_db])
                            .status(),
                    )
                }),
            )
        }
        "mysql" => {
            let drop_db = format!("DROP DATABASE IF EXISTS {name}");
            (
                format!("{}/{name}", args.mysql_url),
                Box::new(move || {
                    drop(
                        Command::new("mariadb")
                            .args(["-h127.0.0.1", "-uroot", "-e", &drop_db])
                            .status(),
                    )
                }),
            )
        }
        other => return Err(format!("unknown backend {other:?}").into()),
    })
}

fn version(bin: &str) -> String {
    Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| bin.to_owned())
}

/// The largest resident set of any child process waited for so far (Linux reports KiB).
fn peak_child_rss_kib() -> i64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    usage.ru_maxrss
}

/// A real etcd on two free loopback ports, stopped on drop.
struct Etcd {
    url: String,
    child: std::process::Child,
}

impl Etcd {
    fn start(bin: &str, data: PathBuf) -> Result<Self, Error> {
        let free = || -> Result<u16, Error> {
            Ok(std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port())
        };
        let (client, peer) = (free()?, free()?);
        let url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new(bin)
            .args(["--name", "source", "--data-dir"])
            .arg(data)
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("source={peer_url}")])
            .args(["--quota-backend-bytes", &(8_i64 << 30).to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {bin}: {e}"))?;
        Ok(Self { url, child })
    }

    async fn connect(&self) -> Result<Client, Error> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut c) = Client::connect([self.url.clone()], None).await
                && c.get("probe", None).await.is_ok()
            {
                return Ok(c);
            }
            if Instant::now() > deadline {
                return Err(format!("etcd at {} did not answer within 30 s", self.url).into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
