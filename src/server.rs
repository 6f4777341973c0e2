//! Listeners, the gRPC services and HTTP routes on one port, and the one shutdown path.
//!
//! Shutdown order: stop accepting and let in-flight requests finish (bounded by the grace
//! period, since watch streams never finish on their own), then stop the store's writer after
//! its current batch, then close the database. A write is acknowledged only after its batch
//! committed, so cutting streams at the deadline loses nothing that was acknowledged.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;

use crate::api::cluster::ClusterService;
use crate::api::kv::KvService;
use crate::api::lease::LeaseService;
use crate::api::maintenance::MaintenanceService;
use crate::api::watch::WatchService;
use crate::api::{self, ServerInfo};
use crate::backend;
use crate::compat::AuthorityFix;
use crate::config::Config;
use crate::lease::{Lessor, SystemClock};
use crate::mvcc::{self, Store};
use crate::pb::etcdserverpb as pb;
use crate::watch::Hub;

/// gRPC allows this much beyond `--max-request-bytes`, so an oversized request reaches the
/// handler and gets etcd's "request is too large" rather than a transport error (etcd does the
/// same).
const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid listen URL {0:?}: expected http://HOST:PORT")]
    ListenUrl(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Backend(#[from] backend::Error),
    #[error(transparent)]
    Store(#[from] mvcc::Error),
    #[error("serving failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// A started server.
pub struct Running {
    /// The addresses actually bound (port 0 resolved).
    pub local_addrs: Vec<SocketAddr>,
    done: tokio::task::JoinHandle<Result<(), Error>>,
}

impl Running {
    /// Waits until the server has shut down completely (database closed).
    ///
    /// # Errors
    /// A listener failed while serving.
    pub async fn wait(self) -> Result<(), Error> {
        self.done.await.unwrap_or(Ok(()))
    }
}

fn listen_addr(url: &str) -> Result<String, Error> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| Error::ListenUrl(url.to_owned()))?;
    let host_port = rest.trim_end_matches('/');
    if host_port.is_empty() || host_port.contains('/') {
        return Err(Error::ListenUrl(url.to_owned()));
    }
    Ok(host_port.to_owned())
}

/// Opens the database, binds the listeners and starts serving until `shutdown` fires.
///
/// # Errors
/// A bad listen URL, a port that cannot be bound, or a database that cannot be opened.
pub async fn start(config: Config, shutdown: CancellationToken) -> Result<Running, Error> {
    let mut listeners = Vec::new();
    for url in &config.listen_client_urls {
        let addr = listen_addr(url)?;
        let listener = TcpListener::bind(&addr)
            .await
            .map_err(|source| Error::Bind {
                addr: addr.clone(),
                source,
            })?;
        listeners.push(listener);
    }
    let local_addrs = listeners
        .iter()
        .map(TcpListener::local_addr)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| Error::Bind {
            addr: config.listen_client_urls.join(","),
            source,
        })?;

    let backend = backend::open(&config.endpoint).await?;
    let tasks = TaskTracker::new();
    // The store outlives the listeners: in-flight requests need it while they drain.
    let store_shutdown = CancellationToken::new();
    let store = Store::start(backend.clone(), &tasks, store_shutdown.clone()).await?;
    let hub = Hub::start(
        &store,
        config.watch_poll_interval,
        &tasks,
        store_shutdown.clone(),
    )
    .await?;
    let cluster_id = backend.cluster_id().await?;

    let client_urls = if config.advertise_client_urls.is_empty() {
        local_addrs.iter().map(|a| format!("http://{a}")).collect()
    } else {
        config.advertise_client_urls.clone()
    };
    let info = ServerInfo {
        cluster_id,
        member_id: api::member_id(cluster_id, &config.name),
        name: config.name.clone(),
        client_urls,
        version: config.emulated_etcd_version.clone(),
        max_request_bytes: config.max_request_bytes,
        max_txn_ops: config.max_txn_ops,
    };

    let (health, health_service) = tonic_health::server::health_reporter();
    tasks.spawn(report_health(health, store.clone(), shutdown.clone()));
    let lessor = Lessor::new(store.clone(), Arc::new(SystemClock));
    lessor.start_expiry(&tasks, store_shutdown.clone());
    let lease = LeaseService::new(lessor, info.clone());
    let watch = WatchService::new(
        hub,
        store.clone(),
        info.clone(),
        config.watch_progress_notify_interval,
        shutdown.clone(),
    );
    let routes = build_routes(&store, watch, lease, &info, config.max_request_bytes)
        .add_service(health_service);

    let mut servers = JoinSet::new();
    for listener in listeners {
        // etcdctl 3.4 sends URL-valued `:authority` headers that h2 would reject.
        let incoming = TcpIncoming::from(listener)
            .with_nodelay(Some(true))
            .map(|conn| conn.map(AuthorityFix::new));
        let serve = tonic::transport::Server::builder()
            .accept_http1(true)
            // Answer clients' keepalive pings and detect dead peers; kube-apiserver holds
            // hundreds of long-lived connections.
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .max_concurrent_streams(None)
            .add_routes(routes.clone())
            .serve_with_incoming_shutdown(incoming, shutdown.clone().cancelled_owned());
        servers.spawn(serve);
    }
    tracing::info!(
        addrs = ?local_addrs,
        endpoint = %redact(&config.endpoint),
        version = %info.version,
        "etcdsql serving"
    );

    let grace = Duration::from_secs(config.shutdown_grace_seconds);
    let done = tokio::spawn(async move {
        let served = serve_until_shutdown(servers, &shutdown, grace).await;
        store_shutdown.cancel();
        tasks.close();
        tasks.wait().await;
        backend.close().await;
        tracing::info!("etcdsql stopped");
        served
    });
    Ok(Running { local_addrs, done })
}

fn build_routes(
    store: &Store,
    watch: WatchService,
    lease: LeaseService,
    info: &ServerInfo,
    max_request_bytes: usize,
) -> Routes {
    let max_decoding = max_request_bytes + GRPC_OVERHEAD_BYTES;
    // Responses are not limited: a page of 10,000 keys is large.
    let kv = pb::kv_server::KvServer::new(KvService::new(store.clone(), info.clone()))
        .max_decoding_message_size(max_decoding)
        .max_encoding_message_size(usize::MAX);
    let watch = pb::watch_server::WatchServer::new(watch)
        .max_decoding_message_size(max_decoding)
        .max_encoding_message_size(usize::MAX);
    let maintenance = pb::maintenance_server::MaintenanceServer::new(MaintenanceService::new(
        store.clone(),
        info.clone(),
    ))
    .max_decoding_message_size(max_decoding);
    let cluster = pb::cluster_server::ClusterServer::new(ClusterService::new(info.clone()))
        .max_decoding_message_size(max_decoding);
    let lease = pb::lease_server::LeaseServer::new(lease).max_decoding_message_size(max_decoding);
    let mut routes = Routes::new(kv)
        .add_service(watch)
        .add_service(lease)
        .add_service(maintenance)
        .add_service(cluster);
    let router = routes.axum_router_mut();
    *router = std::mem::take(router).merge(api::http::routes(store.clone(), info.clone()));
    routes
}

/// Waits for every listener to stop; after `shutdown`, waits at most `grace` for open
/// connections to finish.
async fn serve_until_shutdown(
    mut servers: JoinSet<Result<(), tonic::transport::Error>>,
    shutdown: &CancellationToken,
    grace: Duration,
) -> Result<(), Error> {
    let mut result = Ok(());
    let mut collect = |joined: Result<Result<(), tonic::transport::Error>, _>| {
        if let Ok(Err(e)) = joined {
            tracing::error!(error = %e, "listener failed");
            shutdown.cancel();
            result = Err(Error::Transport(e));
        }
    };
    loop {
        tokio::select! {
            joined = servers.join_next() => match joined {
                Some(joined) => collect(joined),
                None => break,
            },
            () = shutdown.cancelled() => {
                let drained = tokio::time::timeout(grace, async {
                    while let Some(joined) = servers.join_next().await {
                        collect(joined);
                    }
                })
                .await;
                if drained.is_err() {
                    tracing::warn!(?grace, "connections still open after the grace period; closing them");
                    servers.shutdown().await;
                }
                break;
            }
        }
    }
    result
}

/// Keeps the gRPC health service in step with whether the database answers.
async fn report_health(
    health: tonic_health::server::HealthReporter,
    store: Store,
    shutdown: CancellationToken,
) {
    let mut ticker = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let status = match store.revisions().await {
            Ok(_) => tonic_health::ServingStatus::Serving,
            Err(e) => {
                tracing::warn!(error = %e, "database unreachable");
                tonic_health::ServingStatus::NotServing
            }
        };
        health.set_service_status("", status).await;
        health
            .set_service_status(
                <pb::kv_server::KvServer<KvService> as tonic::server::NamedService>::NAME,
                status,
            )
            .await;
    }
}

/// The endpoint with any password replaced, for logs.
pub fn redact(endpoint: &str) -> String {
    match (endpoint.find("://"), endpoint.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &endpoint[scheme + 3..at];
            match userinfo.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &endpoint[..scheme + 3],
                    &userinfo[..colon],
                    &endpoint[at..]
                ),
                None => endpoint.to_owned(),
            }
        }
        _ => endpoint.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_urls() {
        assert_eq!(
            listen_addr("http://127.0.0.1:2379").unwrap(),
            "127.0.0.1:2379"
        );
        assert_eq!(listen_addr("http://[::1]:2379/").unwrap(), "[::1]:2379");
        assert!(listen_addr("127.0.0.1:2379").is_err());
        assert!(listen_addr("http://").is_err());
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://user:secret@host/db"),
            "postgres://user:***@host/db"
        );
        assert_eq!(redact("sqlite://./db/state.db"), "sqlite://./db/state.db");
    }
}
