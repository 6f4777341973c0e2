//! Which PostgreSQL server to write to: the endpoint's hosts (libpq's multi-host form,
//! `postgres://u@h1:5432,h2:5433/db?target_session_attrs=read-write`), the check that a server
//! accepts writes, and the task that finds the new primary after a failover.
//!
//! # Invariants
//! - **Writes go to a writable server only.** Under `read-write` (the default when the endpoint
//!   names several hosts) every new pool connection asks `transaction_read_only` before it is
//!   used and is refused if the server is a standby or read-only, so a statement never lands
//!   on a server that cannot keep it.
//! - **One pool per primary.** When the primary is lost, [`follow_primary`] tries the hosts in
//!   the endpoint's order and publishes a new pool for the first one that accepts writes; the
//!   old pool is closed, so no connection to a demoted server outlives the switch. Users of
//!   the backend take the pool afresh for each transaction.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::watch;

use super::super::{Error, Result};

/// How often the primary in use is asked whether it still accepts writes.
const CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// The pause between two rounds over every host while none accepts writes.
const SEARCH_PAUSE: Duration = Duration::from_millis(500);

/// libpq's `target_session_attrs`, as far as etcdsql can honour it: every process writes, so a
/// standby is never a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionAttrs {
    /// The first host that accepts a connection, unchecked (libpq's `any`).
    Any,
    /// The first host that accepts writes (`read-write`, `primary`).
    ReadWrite,
}

/// One host of the endpoint.
#[derive(Clone, Debug)]
pub struct Host {
    /// `host:port`, for logs (no credentials).
    pub name: String,
    pub options: PgConnectOptions,
}

/// The endpoint's hosts, in the order they are tried.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub hosts: Vec<Host>,
    pub attrs: SessionAttrs,
}

impl Endpoint {
    /// Splits a libpq-style URL into one set of connect options per host.
    ///
    /// # Errors
    /// A malformed URL, or a `target_session_attrs` no etcdsql process can work with.
    pub fn parse(url: &str) -> Result<Self> {
        let invalid = |reason: String| Error::Endpoint {
            endpoint: super::super::redact(url),
            reason,
        };
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| invalid("no scheme".into()))?;
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        let (userinfo, host_list) = match authority.rsplit_once('@') {
            Some((user, hosts)) => (format!("{user}@"), hosts),
            None => (String::new(), authority),
        };
        let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
        let mut attrs = None;
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("target_session_attrs", value)) => {
                    attrs = Some(match value {
                        "any" => SessionAttrs::Any,
                        "read-write" | "primary" => SessionAttrs::ReadWrite,
                        other => {
                            return Err(invalid(format!(
                                "target_session_attrs={other} would send etcdsql's writes to a \
                                 standby; use read-write (or any)"
                            )));
                        }
                    });
                }
                _ => kept.push(pair),
            }
        }
        let query = if kept.is_empty() {
            String::new()
        } else {
            format!("?{}", kept.join("&"))
        };
        let names: Vec<&str> = host_list.split(',').collect();
        if names.iter().any(|h| h.is_empty()) && names.len() > 1 {
            return Err(invalid("an empty host in the host list".into()));
        }
        let hosts = names
            .iter()
            .map(|name| {
                let single = format!("{scheme}://{userinfo}{name}{path}{query}");
                let options = PgConnectOptions::from_str(&single)
                    .map_err(|e| invalid(format!("host {name:?}: {e}")))?;
                let name = format!("{}:{}", options.get_host(), options.get_port());
                Ok(Host { name, options })
            })
            .collect::<Result<Vec<_>>>()?;
        // libpq's default is `any`; with several hosts that would as readily pick a standby,
        // which etcdsql cannot write to, so several hosts mean read-write unless told.
        let attrs = attrs.unwrap_or(if hosts.len() > 1 {
            SessionAttrs::ReadWrite
        } else {
            SessionAttrs::Any
        });
        Ok(Self { hosts, attrs })
    }

    /// The first host, in order, that takes a connection and, under read-write, accepts
    /// writes; each is given `timeout`.
    ///
    /// # Errors
    /// No host qualifies: the error names what each one answered.
    pub async fn find(&self, timeout: Duration) -> Result<usize> {
        let mut refusals = Vec::new();
        for (i, host) in self.hosts.iter().enumerate() {
            match self.qualifies(&host.options, timeout).await {
                Ok(()) => return Ok(i),
                Err(why) => refusals.push(format!("{}: {why}", host.name)),
            }
        }
        Err(Error::NoPrimary(refusals.join("; ")))
    }

    async fn qualifies(
        &self,
        options: &PgConnectOptions,
        timeout: Duration,
    ) -> std::result::Result<(), String> {
        let check = async {
            let mut conn = match options.connect().await {
                Ok(conn) => conn,
                // The database is created once the primary is found: ask the server's own.
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("3D000") => options
                    .clone()
                    .database("postgres")
                    .connect()
                    .await
                    .map_err(|e| e.to_string())?,
                Err(e) => return Err(e.to_string()),
            };
            let verdict = self.suits(&mut conn).await;
            let _ = conn.close().await;
            verdict
        };
        tokio::time::timeout(timeout, check)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {timeout:?}")))
    }

    /// `Ok` if the session is one `target_session_attrs` accepts; otherwise why not.
    async fn suits(&self, conn: &mut PgConnection) -> std::result::Result<(), String> {
        match self.attrs {
            SessionAttrs::Any => sqlx::query("SELECT 1")
                .execute(&mut *conn)
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            SessionAttrs::ReadWrite => accepts_writes(conn).await,
        }
    }
}

/// `Ok` if the session may write; otherwise why not.
pub async fn accepts_writes(conn: &mut PgConnection) -> std::result::Result<(), String> {
    let read_only: String = sqlx::query_scalar("SHOW transaction_read_only")
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| e.to_string())?;
    if read_only == "on" {
        let standby: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| e.to_string())?;
        return Err(if standby {
            "a standby (in recovery)".into()
        } else {
            "read-only (default_transaction_read_only is on)".into()
        });
    }
    Ok(())
}

/// Watches the primary in use (`current`, an index into the endpoint's hosts) and, once it is
/// gone or (under read-write) stops accepting writes, publishes a pool for the first host that
/// suits, made by `new_pool`. Runs until `pools` has no receivers left.
pub async fn follow_primary(
    endpoint: Endpoint,
    mut current: usize,
    pools: watch::Sender<PgPool>,
    new_pool: impl Fn(PgConnectOptions) -> PgPool + Send,
    timeout: Duration,
) {
    let mut checker: Option<PgConnection> = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(CHECK_INTERVAL) => {}
            () = pools.closed() => return,
        }
        let host = &endpoint.hosts[current];
        let check = async {
            if checker.is_none() {
                checker = Some(host.options.connect().await.map_err(|e| e.to_string())?);
            }
            let conn = checker.as_mut().ok_or("no connection")?;
            endpoint.suits(conn).await
        };
        let why = match tokio::time::timeout(timeout, check).await {
            Ok(Ok(())) => continue,
            Ok(Err(why)) => why,
            Err(_) => format!("no answer within {timeout:?}"),
        };
        checker = None;
        tracing::warn!(host = %host.name, reason = %why, "the PostgreSQL primary is lost; looking for the one that accepts writes");
        let found = loop {
            match endpoint.find(timeout).await {
                Ok(found) => break found,
                Err(e) => tracing::warn!(error = %e, "no PostgreSQL host accepts writes yet"),
            }
            tokio::select! {
                () = tokio::time::sleep(SEARCH_PAUSE) => {}
                () = pools.closed() => return,
            }
        };
        if found == current {
            tracing::info!(host = %host.name, "the PostgreSQL primary accepts writes again");
            continue;
        }
        current = found;
        tracing::warn!(host = %endpoint.hosts[current].name, "writing to the new PostgreSQL primary");
        let old = pools.send_replace(new_pool(endpoint.hosts[current].options.clone()));
        // Closing waits for connections in use to come back; their transactions fail on the
        // lost server, or on the demoted one that refuses writes.
        tokio::spawn(async move { old.close().await });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(endpoint: &Endpoint) -> Vec<&str> {
        endpoint.hosts.iter().map(|h| h.name.as_str()).collect()
    }

    #[test]
    fn several_hosts_mean_read_write_unless_told() {
        let url = "postgres://u:pw@h1:5432,h2:5433,[::1]/db?sslmode=disable";
        let endpoint = Endpoint::parse(url).expect("parses");
        assert_eq!(hosts(&endpoint), ["h1:5432", "h2:5433", "[::1]:5432"]);
        assert_eq!(endpoint.attrs, SessionAttrs::ReadWrite);
        let second = &endpoint.hosts[1].options;
        assert_eq!(second.get_database(), Some("db"));
        assert_eq!(second.get_username(), "u");

        let any =
            Endpoint::parse("postgres://u@h1,h2/db?target_session_attrs=any").expect("parses");
        assert_eq!(any.attrs, SessionAttrs::Any);
        let one = Endpoint::parse("postgresql://u@h1/db").expect("parses");
        assert_eq!(
            (hosts(&one), one.attrs),
            (vec!["h1:5432"], SessionAttrs::Any)
        );
    }

    #[test]
    fn a_standby_target_is_refused_with_the_reason() {
        for attrs in ["standby", "prefer-standby", "read-only"] {
            let url = format!("postgres://u:secret@h1,h2/db?target_session_attrs={attrs}");
            let err = Endpoint::parse(&url).expect_err("refused").to_string();
            assert!(
                err.contains("would send etcdsql's writes to a standby"),
                "{err}"
            );
            assert!(!err.contains("secret"), "{err}");
        }
        let err = Endpoint::parse("postgres://u@h1,,h2/db").expect_err("refused");
        assert!(err.to_string().contains("empty host"), "{err}");
    }
}
