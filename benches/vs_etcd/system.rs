//! The systems under test: starting each server on free loopback ports with its data on this
//! disk, waiting until it answers, reading its CPU time and peak RSS from `/proc`, and stopping it.
//!
//! Every server is a child process of the harness, so `/proc/PID/clear_refs` may reset its
//! peak RSS (`VmHWM`) before each workload: the peak reported for a workload is the peak during
//! that workload, not since start-up.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};

/// Which server a run drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Sqlite,
    Postgres,
    /// Three etcdsql processes on one PostgreSQL database (the HA set-up); the clients'
    /// connections are spread over them.
    Postgres3,
    /// One etcdsql process on a MySQL/MariaDB database.
    Mysql,
    /// The etcd the ratios are taken against (today's line: sid's 3.5.x).
    Etcd,
    /// An older etcd beside it (bookworm's 3.4.23), for the record.
    EtcdOld,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Sqlite => "etcdsql-sqlite",
            Kind::Postgres => "etcdsql-postgres",
            Kind::Postgres3 => "etcdsql-postgres-3",
            Kind::Mysql => "etcdsql-mysql",
            Kind::Etcd => "etcd",
            Kind::EtcdOld => "etcd-old",
        }
    }

    pub fn parse(s: &str) -> Result<Kind, String> {
        match s {
            "sqlite" | "etcdsql-sqlite" => Ok(Kind::Sqlite),
            "postgres" | "etcdsql-postgres" => Ok(Kind::Postgres),
            "postgres-3" | "etcdsql-postgres-3" => Ok(Kind::Postgres3),
            "mysql" | "etcdsql-mysql" => Ok(Kind::Mysql),
            "etcd" => Ok(Kind::Etcd),
            "etcd-old" => Ok(Kind::EtcdOld),
            other => Err(format!(
                "unknown system {other:?}: expected sqlite, postgres, postgres-3, mysql, etcd or \
                 etcd-old"
            )),
        }
    }

    /// Whether its data lives in a database server (it may be skipped when none answers).
    pub fn on_server(self) -> bool {
        matches!(self, Kind::Postgres | Kind::Postgres3 | Kind::Mysql)
    }

    /// How many server processes serve it.
    fn instances(self) -> usize {
        if self == Kind::Postgres3 { 3 } else { 1 }
    }
}

/// Where to find the servers and where to put their data.
pub struct Setup {
    pub etcd_bin: String,
    pub etcd_old_bin: String,
    pub etcdsql_bin: String,
    /// Admin URL of the PostgreSQL server; a fresh database is created next to the one it names.
    pub postgres_url: String,
    /// URL of the MySQL server; a fresh database is created on it.
    pub mysql_url: String,
    /// Parent of every data directory and server log of this run.
    pub work_dir: PathBuf,
    /// Leave the PostgreSQL database in place at the end (`--keep`), for inspection.
    pub keep: bool,
}

/// A running server: one process, or several serving one database.
pub struct Server {
    pub kind: Kind,
    /// The first instance's endpoint (its `/metrics` are the ones scraped).
    pub endpoint: String,
    /// Every instance's endpoint, in the order of `children`.
    pub endpoints: Vec<String>,
    pub version: String,
    children: Vec<Child>,
    data_dir: PathBuf,
    logs: Vec<PathBuf>,
    /// The PostgreSQL database created for this run, dropped when the server stops.
    pg_database: Option<String>,
    postgres_url: String,
    /// The MySQL database created for this run, dropped when the server stops.
    my_database: Option<String>,
    mysql_url: String,
    keep: bool,
}

/// The space quota of every server: etcd's largest recommended one (8 GiB), far above what a
/// run writes, so that no server meets NOSPACE (etcdsql's log takes more disk than etcd's
/// B-tree for the same writes; see the disk columns).
const QUOTA_BYTES: u64 = 8 << 30;

/// Why a system was not run: a note for the report rather than a failure of the run.
pub struct Skip(pub String);

/// A port nobody listens on right now. The harness binds and releases it; the server binds it
/// a moment later, which is racy only against other processes picking ports at the same time.
fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// [`free_port`], or why the server cannot start.
fn port() -> Result<u16, Skip> {
    free_port().map_err(|e| Skip(format!("no free port: {e}")))
}

fn first_line(bin: &str, arg: &str) -> String {
    Command::new(bin)
        .arg(arg)
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// A file's modification time as `YYYY-MM-DD HH:MM UTC`.
fn modified_utc(path: &Path) -> String {
    let Some(secs) = fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs() as i64)
    else {
        return "unknown time".to_owned();
    };
    // Howard Hinnant's days-to-civil algorithm.
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

/// The last `n` lines of a log file, to explain why a server did not come up.
pub fn tail(path: &Path, n: usize) -> String {
    let mut text = String::new();
    if let Ok(mut f) = fs::File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(8192)));
        let _ = f.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn psql(admin_url: &str, sql: &str) -> Result<(), String> {
    let out = Command::new("psql")
        .arg(admin_url)
        .args(["-v", "ON_ERROR_STOP=1", "-q", "-c", sql])
        .output()
        .map_err(|e| format!("cannot run psql: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// Runs `sql` on the MySQL server `url` (`mysql://USER[:PASSWORD]@HOST[:PORT]`) with the
/// `mariadb` client.
fn mysql_exec(url: &str, sql: &str) -> Result<(), String> {
    let rest = url.strip_prefix("mysql://").unwrap_or(url);
    let rest = rest.split(['/', '?']).next().unwrap_or(rest);
    let (userinfo, address) = rest.rsplit_once('@').unwrap_or(("root", rest));
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let (host, port) = address.rsplit_once(':').unwrap_or((address, "3306"));
    let out = Command::new("mariadb")
        .env("MYSQL_PWD", password)
        .args([
            "--protocol=tcp",
            "-h",
            host,
            "-P",
            port,
            "-u",
            user,
            "-e",
            sql,
        ])
        .output()
        .map_err(|e| format!("cannot run mariadb: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// `postgres://user@host:port/db?x` with the database replaced.
fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let authority_end = base
        .find("://")
        .map(|i| i + 3)
        .and_then(|start| base[start..].find('/').map(|j| start + j))
        .unwrap_or(base.len());
    format!("{}/{db}{query}", &base[..authority_end])
}

impl Server {
    /// Starts a fresh server of `kind` with an empty data directory and waits until every
    /// instance answers a Range.
    pub async fn start(kind: Kind, setup: &Setup) -> Result<Server, Skip> {
        let data_dir = setup.work_dir.join(kind.name());
        let _ = fs::remove_dir_all(&data_dir);
        fs::create_dir_all(&data_dir).map_err(|e| Skip(format!("{}: {e}", data_dir.display())))?;
        let mut pg_database = None;
        let mut my_database = None;
        let mut commands = Vec::new();
        let version;
        match kind {
            Kind::Etcd | Kind::EtcdOld => {
                let endpoint = format!("http://127.0.0.1:{}", port()?);
                let peer_url = format!("http://127.0.0.1:{}", port()?);
                let bin = if kind == Kind::Etcd {
                    &setup.etcd_bin
                } else {
                    &setup.etcd_old_bin
                };
                version = first_line(bin, "--version");
                let mut cmd = Command::new(bin);
                // Default durability: etcd fsyncs its WAL on every raft append, as in production.
                cmd.arg("--name")
                    .arg("bench")
                    .arg("--data-dir")
                    .arg(data_dir.join("etcd"))
                    .arg("--listen-client-urls")
                    .arg(&endpoint)
                    .arg("--advertise-client-urls")
                    .arg(&endpoint)
                    .arg("--listen-peer-urls")
                    .arg(&peer_url)
                    .arg("--initial-advertise-peer-urls")
                    .arg(&peer_url)
                    .arg("--initial-cluster")
                    .arg(format!("bench={peer_url}"))
                    .arg("--log-level")
                    .arg("warn")
                    .arg("--logger")
                    .arg("zap")
                    .arg("--quota-backend-bytes")
                    .arg(QUOTA_BYTES.to_string());
                commands.push((endpoint, cmd));
            }
            Kind::Sqlite | Kind::Postgres | Kind::Postgres3 | Kind::Mysql => {
                // etcdsql changes under active development: name the build by its binary's time.
                version = format!(
                    "{} (binary of {})",
                    first_line(&setup.etcdsql_bin, "--version"),
                    modified_utc(Path::new(&setup.etcdsql_bin))
                );
                let db_endpoint = if kind == Kind::Sqlite {
                    format!("sqlite://{}", data_dir.join("state.db").display())
                } else if kind == Kind::Mysql {
                    let db = format!("etcdsql_bench_{}_my", std::process::id());
                    mysql_exec(&setup.mysql_url, &format!("DROP DATABASE IF EXISTS {db}"))
                        .map_err(|e| Skip(format!("MySQL not usable: {e}")))?;
                    my_database = Some(db.clone());
                    // etcdsql creates it.
                    format!("{}/{db}", setup.mysql_url.trim_end_matches('/'))
                } else {
                    let db = format!("etcdsql_bench_{}_{}", std::process::id(), kind.instances());
                    psql(
                        &setup.postgres_url,
                        &format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"),
                    )
                    .and_then(|()| psql(&setup.postgres_url, &format!("CREATE DATABASE {db}")))
                    .map_err(|e| Skip(format!("PostgreSQL not usable: {e}")))?;
                    pg_database = Some(db.clone());
                    with_database(&setup.postgres_url, &db)
                };
                for i in 0..kind.instances() {
                    let endpoint = format!("http://127.0.0.1:{}", port()?);
                    let mut cmd = Command::new(&setup.etcdsql_bin);
                    cmd.arg("--listen-client-urls")
                        .arg(&endpoint)
                        .arg("--endpoint")
                        .arg(&db_endpoint)
                        .arg("--name")
                        .arg(format!("bench-{i}"))
                        .arg("--quota-backend-bytes")
                        .arg(QUOTA_BYTES.to_string())
                        .arg("--log-level")
                        .arg("warn");
                    commands.push((endpoint, cmd));
                }
            }
        }
        let mut server = Server {
            kind,
            endpoint: commands[0].0.clone(),
            endpoints: Vec::new(),
            version,
            children: Vec::new(),
            data_dir,
            logs: Vec::new(),
            pg_database,
            postgres_url: setup.postgres_url.clone(),
            my_database,
            mysql_url: setup.mysql_url.clone(),
            keep: setup.keep,
        };
        for (i, (endpoint, mut cmd)) in commands.into_iter().enumerate() {
            let log = if i == 0 {
                setup.work_dir.join(format!("{}.log", kind.name()))
            } else {
                setup.work_dir.join(format!("{}-{i}.log", kind.name()))
            };
            let log_file =
                fs::File::create(&log).map_err(|e| Skip(format!("{}: {e}", log.display())))?;
            let child = cmd
                .stdin(Stdio::null())
                .stdout(
                    log_file
                        .try_clone()
                        .map_err(|e| Skip(format!("log: {e}")))?,
                )
                .stderr(log_file)
                .spawn()
                .map_err(|e| Skip(format!("cannot start {}: {e}", kind.name())))?;
            server.children.push(child);
            server.endpoints.push(endpoint);
            server.logs.push(log);
        }
        for i in 0..server.children.len() {
            if let Err(why) = server.wait_ready(i, Duration::from_secs(60)).await {
                server.stop();
                return Err(Skip(why));
            }
        }
        Ok(server)
    }

    /// Waits until instance `i` answers a Range.
    async fn wait_ready(&mut self, i: usize, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let endpoint = self.endpoints[i].clone();
        loop {
            if let Ok(Some(status)) = self.children[i].try_wait() {
                return Err(format!(
                    "{} exited ({status}) before serving: {}",
                    self.kind.name(),
                    tail(&self.logs[i], 3).replace('\n', " / ")
                ));
            }
            let options = ConnectOptions::new()
                .with_connect_timeout(Duration::from_secs(1))
                .with_timeout(Duration::from_secs(2));
            if let Ok(mut client) = Client::connect([&endpoint], Some(options)).await
                && client.get("/registry/health", None).await.is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} did not answer within {timeout:?}",
                    self.kind.name()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The first instance's process (the one a profile is taken of).
    pub fn pid(&self) -> u32 {
        self.children[0].id()
    }

    fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.children.iter().map(Child::id)
    }

    /// Resets the peak RSS so the next `peak_rss_bytes` covers only what follows.
    pub fn reset_peak_rss(&self) {
        for pid in self.pids() {
            let _ = fs::write(format!("/proc/{pid}/clear_refs"), "5");
        }
    }

    /// The peak RSS, added up over the instances.
    pub fn peak_rss_bytes(&self) -> u64 {
        self.pids()
            .map(|pid| status_kib(pid, "VmHWM:") * 1024)
            .sum()
    }

    /// CPU seconds of every instance.
    pub fn cpu_seconds(&self) -> f64 {
        self.pids().map(cpu_seconds).sum()
    }

    /// Context switches of all the server's threads so far (voluntary and not). Threads that
    /// ended are not counted, so compare deltas over a workload.
    pub fn context_switches(&self) -> u64 {
        self.pids().map(context_switches).sum()
    }

    /// Bytes the server has caused to be written to storage so far (`write_bytes` of
    /// `/proc/PID/io`: its WAL and database writes, not its network traffic). PostgreSQL's own
    /// writes are not included.
    pub fn disk_write_bytes(&self) -> u64 {
        self.pids().map(disk_write_bytes).sum()
    }

    /// CPU seconds of the PostgreSQL backends serving this server's database, when it keeps
    /// its data there: etcdsql's own CPU time is then only part of the cost. PostgreSQL's
    /// shared background processes (WAL writer, checkpointer) also serve other databases and
    /// are left out; a backend that exits takes its CPU time with it.
    pub fn db_cpu_seconds(&self) -> Option<f64> {
        self.pg_database.as_deref().map(postgres_cpu_seconds)
    }

    /// Bytes the data takes on disk (etcd's member dir, SQLite's file and WAL); `None` for
    /// a database server, whose files live in the server's own directory.
    pub fn disk_bytes(&self) -> Option<u64> {
        (!self.kind.on_server()).then(|| dir_bytes(&self.data_dir))
    }

    /// Stops every instance (SIGTERM, then SIGKILL after 15 s) and drops its PostgreSQL
    /// database.
    pub fn stop(&mut self) {
        let running = |child: &mut Child| matches!(child.try_wait(), Ok(None));
        for child in &mut self.children {
            if !running(child) {
                continue;
            }
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.children.iter_mut().any(running) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(db) = self.pg_database.take().filter(|_| !self.keep) {
            let _ = psql(
                &self.postgres_url,
                &format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"),
            );
        }
        if let Some(db) = self.my_database.take().filter(|_| !self.keep) {
            let _ = mysql_exec(&self.mysql_url, &format!("DROP DATABASE IF EXISTS {db}"));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Context switches of all a process's threads so far (voluntary and not).
fn context_switches(pid: u32) -> u64 {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// `write_bytes` of `/proc/PID/io`.
fn disk_write_bytes(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/io"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("write_bytes:")?.trim().parse().ok())
        .unwrap_or(0)
}

/// `utime + stime` of a process from `/proc/PID/stat`, in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| stat_ticks(&s))
        .map_or(0.0, |t| t as f64 / clock_ticks())
}

/// The harness's own CPU time: it shares the two cores with the server.
pub fn self_cpu_seconds() -> f64 {
    fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| stat_ticks(&s))
        .map_or(0.0, |t| t as f64 / clock_ticks())
}

fn stat_ticks(stat: &str) -> Option<u64> {
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line; `rest` starts at field 3.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

fn status_kib(pid: u32, field: &str) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// PostgreSQL names each backend's process `postgres: USER DATABASE CLIENT STATE`.
fn postgres_cpu_seconds(database: &str) -> f64 {
    let Ok(entries) = fs::read_dir("/proc") else {
        return 0.0;
    };
    let needle = format!(" {database} ");
    let mut ticks = 0u64;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cmdline.starts_with("postgres: ")
            && cmdline.contains(&needle)
            && let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat"))
        {
            ticks += stat_ticks(&stat).unwrap_or(0);
        }
    }
    ticks as f64 / clock_ticks()
}

/// CPU seconds the whole machine was busy (all cores, every process) since boot, from
/// `/proc/stat`: the difference over a workload minus the server's, PostgreSQL's and the
/// harness's own shows how much other work (another build, say) competed for the cores.
pub fn machine_busy_seconds() -> f64 {
    let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return 0.0;
    };
    // user nice system idle iowait irq softirq steal ...: all but idle and iowait.
    let ticks: u64 = cpu
        .split_whitespace()
        .skip(1)
        .take(8)
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .filter_map(|(_, v)| v.parse::<u64>().ok())
        .sum();
    ticks as f64 / clock_ticks()
}

fn dir_bytes(path: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(path) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// `perf record` attached to a server for the length of one workload.
pub struct Profiler(Child);

impl Profiler {
    pub fn start(pid: u32, out: &Path, args: &str) -> Option<Profiler> {
        let child = Command::new("perf")
            .arg("record")
            .args(args.split_whitespace())
            .arg("-p")
            .arg(pid.to_string())
            .arg("-o")
            .arg(out)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        // perf needs a moment to attach; samples before that are simply not taken.
        std::thread::sleep(Duration::from_millis(300));
        Some(Profiler(child))
    }

    pub fn stop(mut self) {
        let _ = Command::new("kill")
            .arg("-INT")
            .arg(self.0.id().to_string())
            .status();
        let _ = self.0.wait();
    }
}

/// Metric families worth a delta per workload: disk and commit times of both servers, and
/// etcdsql's own (group-commit batch sizes, time per SQL operation).
const METRIC_PREFIXES: [&str; 2] = ["etcd_disk_", "etcdsql_"];

/// The `_sum` and `_count` samples of [`METRIC_PREFIXES`] from the server's `/metrics` (both
/// servers serve it on the client port), or nothing if it does not answer within seconds.
pub async fn scrape_metrics(endpoint: &str) -> BTreeMap<String, f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut out = BTreeMap::new();
    let addr = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let fetch = async {
        let mut conn = tokio::net::TcpStream::connect(addr).await.ok()?;
        // HTTP/1.0: the body ends with the connection, with no chunked encoding to undo.
        conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")
            .await
            .ok()?;
        let mut body = Vec::new();
        conn.read_to_end(&mut body).await.ok()?;
        Some(body)
    };
    let Ok(Some(body)) = tokio::time::timeout(Duration::from_secs(20), fetch).await else {
        return out;
    };
    let text = String::from_utf8_lossy(&body);
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = series.split('{').next().unwrap_or(series);
        if METRIC_PREFIXES.iter().any(|p| name.starts_with(p))
            && (name.ends_with("_sum") || name.ends_with("_count"))
            && let Ok(v) = value.parse::<f64>()
        {
            out.insert(series.to_owned(), v);
        }
    }
    out
}
