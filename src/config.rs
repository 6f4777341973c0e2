//! The one configuration struct: every flag has an `ETCDSQL_…` environment variable and a
//! default, and the flag names follow etcd's where etcd has the same setting.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::auth::TokenKind;
use crate::tls::MinVersion;

/// An etcd v3-compatible server that keeps its data in SQL.
///
/// Point kube-apiserver's `--etcd-servers` (or etcdctl's `--endpoints`) at it.
#[derive(Parser, Debug, Clone)]
#[command(name = "etcdsql", version, about, long_about = None)]
pub struct Config {
    /// URLs to serve clients on (gRPC and HTTP on the same port), comma-separated:
    /// `http://HOST:PORT`, `https://HOST:PORT` (TLS, see --cert-file), `unix://PATH`, `unixs://PATH`.
    #[arg(
        long,
        env = "ETCDSQL_LISTEN_CLIENT_URLS",
        default_value = "http://127.0.0.1:2379",
        value_delimiter = ','
    )]
    pub listen_client_urls: Vec<String>,

    /// URLs clients are told to use (MemberList); defaults to the listen URLs as bound.
    #[arg(long, env = "ETCDSQL_ADVERTISE_CLIENT_URLS", value_delimiter = ',')]
    pub advertise_client_urls: Vec<String>,

    /// Where the data lives: `sqlite://PATH` (the folder is created if missing) or
    /// `postgres://USER:PASSWORD@HOST:PORT/DB?sslmode=…` (the database is created if missing and
    /// the user may). PostgreSQL lets several etcdsql processes share one database.
    #[arg(
        long,
        env = "ETCDSQL_ENDPOINT",
        // The DSN may hold a password: --help must not print the environment's value.
        hide_env_values = true,
        default_value = "sqlite://./db/state.db"
    )]
    pub endpoint: String,

    /// Most pooled connections to a database server (PostgreSQL) per etcdsql process; the LISTEN
    /// connection and the revision probe's come on top.
    #[arg(long, env = "ETCDSQL_DB_MAX_CONNECTIONS", default_value_t = 16)]
    pub db_max_connections: u32,

    /// How long an unused database connection is kept open, e.g. `5m`.
    #[arg(long, env = "ETCDSQL_DB_IDLE_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    pub db_idle_timeout: Duration,

    /// How long to wait for a database connection before a request fails with `Unavailable`.
    #[arg(long, env = "ETCDSQL_DB_CONNECT_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub db_connect_timeout: Duration,

    /// Human-readable member name, reported by MemberList.
    #[arg(long, env = "ETCDSQL_NAME", default_value = "default")]
    pub name: String,

    /// The etcd version reported by Status and /version. Clients switch features on it:
    /// kube-apiserver 1.31+ serves consistent lists from its watch cache (relying on watch
    /// progress requests) from 3.5.13 on, and kubeadm's external-etcd check wants 3.5.24+.
    #[arg(long, env = "ETCDSQL_EMULATED_ETCD_VERSION", default_value = "3.6.16", value_parser = parse_version)]
    pub emulated_etcd_version: String,

    /// Largest request accepted, in bytes; larger ones get "etcdserver: request is too large".
    #[arg(long, env = "ETCDSQL_MAX_REQUEST_BYTES", default_value_t = 1_572_864)]
    pub max_request_bytes: usize,

    /// Most bytes of values kept in memory for reads (keys and their metadata are always kept);
    /// values beyond it are read from the database by primary key. 0 keeps none.
    #[arg(long, env = "ETCDSQL_READ_CACHE_BYTES", default_value_t = 268_435_456)]
    pub read_cache_bytes: usize,

    /// How many recent changes the in-memory index can undo, so that reads at a revision it has
    /// passed (the later pages of a list, while writes go on) are answered from memory too;
    /// older revisions are read from the database. A compaction through this process forgets
    /// the changes it compacted past. Each change costs about 100 bytes (a key written again
    /// shares its bytes with the index); the old values it keeps share the read cache's budget
    /// (a quarter of it at most, the oldest dropped first). A start takes the window from the
    /// log. Default: 1,048,576 on SQLite, which keeps the log alone and reads by key slowly
    /// without the index; 16,384 on PostgreSQL and MySQL. 0 reads them all from the database.
    #[arg(long, env = "ETCDSQL_READ_HISTORY_CHANGES")]
    pub read_history_changes: Option<usize>,

    /// When the database grows past this many bytes, the NOSPACE alarm is raised and writes
    /// that add data fail until it is disarmed, as in etcd. 0 is etcd's default, 2 GiB;
    /// a negative value sets no quota.
    #[arg(
        long,
        env = "ETCDSQL_QUOTA_BACKEND_BYTES",
        default_value_t = 0,
        allow_hyphen_values = true
    )]
    pub quota_backend_bytes: i64,

    /// SQLite: once the WAL holds this many bytes, the writer checkpoints between two batches
    /// so that the WAL starts over; under writes that never pause it would otherwise grow for
    /// as long as they last. Each restart holds writes up for one fsync of the database file.
    #[arg(
        long,
        env = "ETCDSQL_SQLITE_WAL_RESTART_BYTES",
        default_value_t = crate::backend::sqlite::DEFAULT_WAL_RESTART_BYTES,
        value_parser = clap::value_parser!(i64).range(1024 * 1024..)
    )]
    pub sqlite_wal_restart_bytes: i64,

    /// Most operations (compares, or ops per branch) one txn may hold.
    #[arg(long, env = "ETCDSQL_MAX_TXN_OPS", default_value_t = 128)]
    pub max_txn_ops: usize,

    /// How often a `progress_notify` watcher that received nothing gets a progress response
    /// (etcd's default is 10 minutes), e.g. `10m`, `5s`, `500ms`.
    #[arg(long, env = "ETCDSQL_WATCH_PROGRESS_NOTIFY_INTERVAL", default_value = "10m", value_parser = parse_duration)]
    pub watch_progress_notify_interval: Duration,

    /// How often the watch hub looks for writes made by other processes sharing the database.
    /// Writes made by this process reach watchers at once.
    #[arg(long, env = "ETCDSQL_WATCH_POLL_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub watch_poll_interval: Duration,

    /// Certificate for TLS (PEM, server certificate first, then any intermediates). Used by
    /// `https://` and `unixs://` listen URLs.
    #[arg(long, env = "ETCDSQL_CERT_FILE", value_name = "PATH")]
    pub cert_file: Option<PathBuf>,

    /// Private key of --cert-file (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "ETCDSQL_KEY_FILE", value_name = "PATH")]
    pub key_file: Option<PathBuf>,

    /// CA certificates (PEM) that sign client certificates. As in etcd, setting it makes every
    /// TLS client present a certificate signed by one of them.
    #[arg(long, env = "ETCDSQL_TRUSTED_CA_FILE", value_name = "PATH")]
    pub trusted_ca_file: Option<PathBuf>,

    /// Refuse TLS clients without a certificate signed by --trusted-ca-file (which it needs).
    /// Accepts etcd's `--client-cert-auth=true` form too.
    #[arg(
        long,
        env = "ETCDSQL_CLIENT_CERT_AUTH",
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub client_cert_auth: bool,

    /// Auth tokens, as etcd's flag: `simple` (random tokens that this process remembers), or
    /// `jwt,pub-key=PATH,priv-key=PATH,sign-method=RS256,ttl=5m` (signed tokens that every
    /// instance holding the key accepts; HS256/384/512 take the secret from priv-key).
    #[arg(long, env = "ETCDSQL_AUTH_TOKEN", default_value = "simple", value_parser = parse_auth_token)]
    pub auth_token: TokenKind,

    /// Seconds a simple auth token lives after its last use.
    #[arg(long, env = "ETCDSQL_AUTH_TOKEN_TTL", default_value_t = 300)]
    pub auth_token_ttl: u64,

    /// bcrypt cost of stored password hashes (4-31), as etcd's flag.
    #[arg(
        long,
        env = "ETCDSQL_BCRYPT_COST",
        default_value_t = 10,
        value_parser = clap::value_parser!(u32).range(4..=31)
    )]
    pub bcrypt_cost: u32,

    /// Lowest TLS version accepted on TLS listeners.
    #[arg(
        long,
        env = "ETCDSQL_TLS_MIN_VERSION",
        value_enum,
        default_value = "TLS1.2"
    )]
    pub tls_min_version: MinVersion,

    /// Extra URLs that serve only `/metrics` and `/health` (like etcd's), comma-separated, e.g.
    /// `http://127.0.0.1:2381` so Prometheus needs no client certificate. `https://` uses the
    /// TLS flags above.
    #[arg(long, env = "ETCDSQL_LISTEN_METRICS_URLS", value_delimiter = ',')]
    pub listen_metrics_urls: Vec<String>,

    /// Seconds to let in-flight requests and streams finish at shutdown.
    #[arg(long, env = "ETCDSQL_SHUTDOWN_GRACE_SECONDS", default_value_t = 10)]
    pub shutdown_grace_seconds: u64,

    /// Log filter (tracing's syntax), e.g. `info` or `etcdsql=debug`.
    #[arg(long, env = "ETCDSQL_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Log format: `text` or `json`.
    #[arg(long, env = "ETCDSQL_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
}

fn parse_version(s: &str) -> Result<String, String> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.parse::<u32>().is_ok())
    {
        Ok(s.to_owned())
    } else {
        Err(format!("{s:?} is not a version like 3.5.0"))
    }
}

fn parse_auth_token(s: &str) -> Result<TokenKind, String> {
    TokenKind::parse(s).map_err(|e| e.to_string())
}

/// Reads durations such as `10m`, `1m30s`, `250ms` or `2h`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration like 10m, 30s or 500ms");
    let mut total = Duration::ZERO;
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let number: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ms" => Duration::from_millis(number),
            "s" => Duration::from_secs(number),
            "m" => Duration::from_secs(number * 60),
            "h" => Duration::from_secs(number * 3600),
            _ => return Err(bad()),
        };
        total += unit;
        rest = &rest[unit_len..];
    }
    if total.is_zero() {
        return Err(format!("{s:?} must be longer than zero"));
    }
    Ok(total)
}

impl Config {
    /// The defaults, as if no flag were given; tests adjust the fields they need.
    pub fn defaults() -> Self {
        Self::parse_from(["etcdsql"])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_etcd() {
        let c = Config::defaults();
        assert_eq!(c.listen_client_urls, vec!["http://127.0.0.1:2379"]);
        assert_eq!(c.max_request_bytes, 1_572_864);
        assert_eq!(c.max_txn_ops, 128);
        assert_eq!(c.endpoint, "sqlite://./db/state.db");
    }

    #[test]
    fn the_sqlite_wal_bound_is_at_least_a_mebibyte() {
        let parse = |v: &str| Config::try_parse_from(["etcdsql", "--sqlite-wal-restart-bytes", v]);
        assert_eq!(Config::defaults().sqlite_wal_restart_bytes, 256 << 20);
        assert_eq!(parse("1048576").unwrap().sqlite_wal_restart_bytes, 1 << 20);
        assert!(parse("1048575").is_err());
        assert!(parse("-1").is_err());
    }

    #[test]
    fn versions_are_checked() {
        assert!(parse_version("3.6.4").is_ok());
        assert!(parse_version("3.6").is_err());
        assert!(parse_version("v3.6.4").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5 minutes").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn urls_split_on_commas() {
        let c = Config::parse_from([
            "etcdsql",
            "--listen-client-urls",
            "http://127.0.0.1:1,http://127.0.0.1:2",
        ]);
        assert_eq!(c.listen_client_urls.len(), 2);
    }
}
