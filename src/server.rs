//! The gRPC services and HTTP routes served on every listener, and the one shutdown path.
//!
//! Each client listener ([`crate::listener`]) yields finished connections — TCP or a Unix
//! socket, TLS already negotiated — and each is wrapped in [`AuthorityFix`] *after* TLS, since
//! the repair has to read the decrypted HTTP/2 frames. gRPC and HTTP (`/version`, `/health`,
//! `/metrics`) share every port; `--listen-metrics-urls` ports serve only `/metrics` and
//! `/health`. hyper serves the connections ([`crate::connections`]), and a gRPC metrics layer
//! wraps every service ([`crate::metrics`]).
//!
//! Shutdown order: stop accepting and let in-flight requests finish (bounded by the grace
//! period, since watch streams never finish on their own), then stop the store's writer after
//! its current batch, then close the database. A write is acknowledged only after its batch
//! committed, so cutting streams at the deadline loses nothing that was acknowledged.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::service::Routes;
use tower_layer::Layer;

use crate::api::auth::{AuthService, Callers};
use crate::api::cluster::ClusterService;
use crate::api::election::ElectionService;
use crate::api::gateway;
use crate::api::kv::KvService;
use crate::api::lease::LeaseService;
use crate::api::lock::LockService;
use crate::api::maintenance::MaintenanceService;
use crate::api::watch::WatchService;
use crate::api::{self, ServerInfo};
use crate::auth::{self, AuthStore};
use crate::backend;
use crate::coalesce::{Coalesce, InFlight};
use crate::compat::AuthorityFix;
use crate::concurrency::Recipes;
use crate::config::Config;
use crate::connections::{self, ConnectionService, Dispatch};
use crate::lease::{Lessor, SystemClock};
use crate::listener::{self, Listener};
use crate::metrics::{self, Metrics};
use crate::mvcc::{self, Store, StoreOptions};
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::kv_server::KvServer;
use crate::pb::{v3electionpb, v3lockpb};
use crate::tls;
use crate::watch::Hub;

/// gRPC allows this much beyond `--max-request-bytes`, so an oversized request reaches the
/// handler and gets etcd's "request is too large" rather than a transport error (etcd does the
/// same).
const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Listen(#[from] listener::Error),
    #[error(transparent)]
    Tls(#[from] tls::Error),
    #[error(transparent)]
    Backend(#[from] backend::Error),
    #[error(transparent)]
    Store(#[from] mvcc::Error),
    #[error(transparent)]
    Auth(#[from] auth::Error),
}

/// A started server.
pub struct Running {
    /// The TCP addresses of the client listeners (port 0 resolved), in flag order.
    pub local_addrs: Vec<SocketAddr>,
    /// Every client listener's URL as bound (`https://127.0.0.1:41234`, `unix:///run/x.sock`).
    pub client_urls: Vec<String>,
    /// The `--listen-metrics-urls` listeners' URLs as bound.
    pub metrics_urls: Vec<String>,
    done: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Waits until the server has shut down completely (database closed).
    pub async fn wait(self) {
        if let Err(e) = self.done.await {
            tracing::error!(error = %e, "the shutdown task failed");
        }
    }
}

/// Opens the database, binds the listeners and starts serving until `shutdown` fires.
///
/// # Errors
/// A bad listen URL, a port that cannot be bound, or a database that cannot be opened.
pub async fn start(config: Config, shutdown: CancellationToken) -> Result<Running, Error> {
    let tls_settings = tls::Settings::from_config(&config);
    let tls_config = tls_settings.server_config()?;
    let mut listeners = Vec::new();
    for url in &config.listen_client_urls {
        listeners.push(Listener::bind(url, tls_config.as_ref()).await?);
    }
    let mut metrics_listeners = Vec::new();
    for url in &config.listen_metrics_urls {
        metrics_listeners.push(Listener::bind(url, tls_config.as_ref()).await?);
    }
    warn_if_exposed(&listeners, &tls_settings);
    let local_addrs: Vec<SocketAddr> = listeners.iter().filter_map(Listener::local_addr).collect();
    let client_urls: Vec<String> = listeners.iter().map(|l| l.url().to_owned()).collect();
    let metrics_urls: Vec<String> = metrics_listeners
        .iter()
        .map(|l| l.url().to_owned())
        .collect();
    let metrics = Metrics::new(&config.emulated_etcd_version);

    let pool = backend::PoolOptions {
        max_connections: config.db_max_connections,
        idle_timeout: config.db_idle_timeout,
        connect_timeout: config.db_connect_timeout,
        sqlite_wal_restart_bytes: config.sqlite_wal_restart_bytes,
    };
    // Every database call is timed; the decorator forwards everything else unchanged.
    let backend = metrics::instrument(backend::open(&config.endpoint, &pool).await?, &metrics);
    let tasks = TaskTracker::new();
    // The store outlives the listeners: in-flight requests need it while they drain.
    let store_shutdown = CancellationToken::new();
    let options = StoreOptions {
        read_cache_bytes: config.read_cache_bytes,
        read_history_changes: config.read_history_changes,
        quota_backend_bytes: config.quota_backend_bytes,
    };
    let store = Store::start(backend.clone(), options, &tasks, store_shutdown.clone()).await?;
    store.observe_commits(metrics.commit_observer());
    let hub = Hub::start(
        &store,
        config.watch_poll_interval,
        &tasks,
        store_shutdown.clone(),
    )
    .await?;
    metrics.watch_hub(hub.delivered_changes());
    let cluster_id = backend.cluster_id().await?;

    let advertised = if config.advertise_client_urls.is_empty() {
        client_urls.clone()
    } else {
        config.advertise_client_urls.clone()
    };
    let info = ServerInfo {
        cluster_id,
        member_id: api::member_id(cluster_id, &config.name),
        name: config.name.clone(),
        client_urls: advertised,
        version: config.emulated_etcd_version.clone(),
        max_request_bytes: config.max_request_bytes,
        max_txn_ops: config.max_txn_ops,
    };

    let (health, health_service) = tonic_health::server::health_reporter();
    tasks.spawn(report_health(health, store.clone(), shutdown.clone()));
    let lessor = Lessor::new(store.clone(), Arc::new(SystemClock))
        .observe_expiries(metrics.expiry_observer());
    lessor.start_expiry(&tasks, store_shutdown.clone());
    let recipes = Recipes::new(store.clone(), hub.clone(), lessor.clone());
    let auth = AuthStore::start(
        backend.clone(),
        &auth::Options {
            token: config.auth_token.clone(),
            simple_token_ttl: Duration::from_secs(config.auth_token_ttl),
            bcrypt_cost: config.bcrypt_cost,
        },
        &tasks,
        store_shutdown.clone(),
    )
    .await?;
    let callers = Callers::new(auth, config.client_cert_auth);
    let lease = LeaseService::new(lessor, info.clone(), metrics.clone(), callers.clone());
    let watch = WatchService::new(
        hub,
        store.clone(),
        info.clone(),
        config.watch_progress_notify_interval,
        shutdown.clone(),
        metrics.clone(),
        callers.clone(),
    );
    let (kv, routes) = build_routes(&store, watch, lease, recipes, &callers, &info, &metrics);
    let routes = Dispatch::new(kv, routes.add_service(health_service));
    let metrics_routes = Routes::from(api::http::metrics_routes(
        store.clone(),
        info.clone(),
        metrics.clone(),
    ));

    let mut servers = JoinSet::new();
    for listener in listeners {
        servers.spawn(serve(listener, routes.clone(), &metrics, &tasks, &shutdown));
    }
    for listener in metrics_listeners {
        servers.spawn(serve(
            listener,
            metrics_routes.clone(),
            &metrics,
            &tasks,
            &shutdown,
        ));
    }
    tracing::info!(
        urls = ?client_urls,
        metrics_urls = ?metrics_urls,
        tls = tls_config.is_some(),
        client_cert_auth = tls_config.is_some() && tls_settings.requires_client_certs(),
        endpoint = %backend::redact(&config.endpoint),
        version = %info.version,
        "etcdsql serving"
    );

    let grace = Duration::from_secs(config.shutdown_grace_seconds);
    let done = tokio::spawn(async move {
        serve_until_shutdown(servers, &shutdown, grace).await;
        store_shutdown.cancel();
        tasks.close();
        tasks.wait().await;
        backend.close().await;
        tracing::info!("etcdsql stopped");
    });
    Ok(Running {
        local_addrs,
        client_urls,
        metrics_urls,
        done,
    })
}

/// Serves `routes` on one listener until `shutdown` fires.
fn serve<S>(
    listener: Listener,
    routes: S,
    metrics: &Metrics,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> impl Future<Output = ()> + Send + 'static
where
    S: ConnectionService<http::Request<tonic::body::Body>>,
{
    // TLS is already done when a connection comes out of the listener; the authority repair
    // (etcdctl 3.4 sends URL-valued `:authority` headers that h2 would reject) reads the
    // decrypted HTTP/2 frames. Under it, responses gather into one send per pass of the runtime
    // while the listener has requests in hand.
    let in_flight = InFlight::default();
    let counted = in_flight.layer();
    let incoming = listener.accept(tasks, shutdown.clone()).map(move |conn| {
        conn.map(|conn| AuthorityFix::new(Coalesce::new(conn, in_flight.clone())))
    });
    let service = metrics.grpc_layer().layer(counted.layer(routes));
    connections::serve(incoming, service, shutdown.clone())
}

/// Warns, loudly, about client listeners that anyone on the network could use: etcd's API has
/// no other access control here, so whoever connects can read and write every key.
fn warn_if_exposed(listeners: &[Listener], tls: &tls::Settings) {
    if tls.enabled() && !listeners.iter().any(Listener::is_tls) {
        tracing::warn!(
            "--cert-file/--key-file are set but no listen URL is https:// or unixs://: clients are served WITHOUT TLS"
        );
    }
    for listener in listeners {
        let Some(addr) = listener.local_addr() else {
            continue;
        };
        match exposure(addr, listener.is_tls(), tls.requires_client_certs()) {
            Some(Exposure::Plain) => tracing::warn!(
                listener = listener.url(),
                "!!! SERVING PLAIN HTTP ON A NON-LOOPBACK ADDRESS: anyone who can reach {addr} can read and write every key. \
                 Use an https:// URL with --cert-file, --key-file and --trusted-ca-file."
            ),
            Some(Exposure::AnyClient) => tracing::warn!(
                listener = listener.url(),
                "TLS without client certificates on a non-loopback address: any client that can reach {addr} can read and write every key. \
                 Set --trusted-ca-file (and --client-cert-auth)."
            ),
            None => {}
        }
    }
}

/// How a TCP listener lets strangers in; Unix sockets are guarded by file permissions instead.
#[derive(Debug, PartialEq, Eq)]
enum Exposure {
    /// Plain HTTP/2 on an address other hosts can reach.
    Plain,
    /// TLS, but any client that trusts the server certificate gets in.
    AnyClient,
}

fn exposure(addr: SocketAddr, tls: bool, client_certs: bool) -> Option<Exposure> {
    if addr.ip().is_loopback() {
        None
    } else if !tls {
        Some(Exposure::Plain)
    } else if !client_certs {
        Some(Exposure::AnyClient)
    } else {
        None
    }
}

fn build_routes(
    store: &Store,
    watch: WatchService,
    lease: LeaseService,
    recipes: Recipes,
    callers: &Callers,
    info: &ServerInfo,
    metrics: &Metrics,
) -> (KvServer<KvService>, Routes) {
    // One object per service, shared by gRPC and the JSON gateway.
    let services = gateway::Services {
        kv: Arc::new(KvService::new(
            store.clone(),
            info.clone(),
            metrics.clone(),
            callers.clone(),
        )),
        watch: Arc::new(watch),
        lease: Arc::new(lease),
        cluster: Arc::new(ClusterService::new(info.clone(), callers.clone())),
        maintenance: Arc::new(MaintenanceService::new(
            store.clone(),
            info.clone(),
            callers.clone(),
        )),
        auth: Arc::new(AuthService::new(
            callers.clone(),
            store.clone(),
            info.clone(),
        )),
        lock: Arc::new(LockService::new(
            recipes.clone(),
            info.clone(),
            callers.clone(),
        )),
        election: Arc::new(ElectionService::new(recipes, info.clone(), callers.clone())),
        max_body: info.max_request_bytes + GRPC_OVERHEAD_BYTES,
    };
    let max_decoding = services.max_body;
    // Responses are not limited: a page of 10,000 keys is large.
    let kv = pb::kv_server::KvServer::from_arc(services.kv.clone())
        .max_decoding_message_size(max_decoding)
        .max_encoding_message_size(usize::MAX);
    let watch = pb::watch_server::WatchServer::from_arc(services.watch.clone())
        .max_decoding_message_size(max_decoding)
        .max_encoding_message_size(usize::MAX);
    let maintenance =
        pb::maintenance_server::MaintenanceServer::from_arc(services.maintenance.clone())
            .max_decoding_message_size(max_decoding);
    let cluster = pb::cluster_server::ClusterServer::from_arc(services.cluster.clone())
        .max_decoding_message_size(max_decoding);
    let lease = pb::lease_server::LeaseServer::from_arc(services.lease.clone())
        .max_decoding_message_size(max_decoding);
    let lock = v3lockpb::lock_server::LockServer::from_arc(services.lock.clone())
        .max_decoding_message_size(max_decoding);
    let election =
        v3electionpb::election_server::ElectionServer::from_arc(services.election.clone())
            .max_decoding_message_size(max_decoding);
    let auth = pb::auth_server::AuthServer::from_arc(services.auth.clone())
        .max_decoding_message_size(max_decoding);
    let mut routes = Routes::new(kv.clone())
        .add_service(watch)
        .add_service(lease)
        .add_service(maintenance)
        .add_service(cluster)
        .add_service(lock)
        .add_service(election)
        .add_service(auth);
    let router = routes.axum_router_mut();
    *router = std::mem::take(router)
        .merge(api::http::routes(
            store.clone(),
            info.clone(),
            metrics.clone(),
        ))
        .merge(gateway::routes(services))
        .fallback(api::http::not_found);
    (kv, routes)
}

/// Waits for `shutdown` (or for every listener to have stopped), then at most `grace` for the
/// open connections to finish.
async fn serve_until_shutdown(
    mut servers: JoinSet<()>,
    shutdown: &CancellationToken,
    grace: Duration,
) {
    loop {
        tokio::select! {
            joined = servers.join_next() => if joined.is_none() {
                return;
            },
            () = shutdown.cancelled() => break,
        }
    }
    let drained = tokio::time::timeout(grace, async {
        while servers.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            ?grace,
            "connections still open after the grace period; closing them"
        );
        servers.shutdown().await;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_loopback_listeners_without_tls_or_client_certificates_are_exposed() {
        let at = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(exposure(at("127.0.0.1:2379"), false, false), None);
        assert_eq!(exposure(at("[::1]:2379"), false, false), None);
        assert_eq!(
            exposure(at("0.0.0.0:2379"), false, false),
            Some(Exposure::Plain)
        );
        assert_eq!(
            exposure(at("10.0.0.10:2379"), false, true),
            Some(Exposure::Plain)
        );
        assert_eq!(
            exposure(at("[::]:2379"), true, false),
            Some(Exposure::AnyClient)
        );
        assert_eq!(exposure(at("10.0.0.10:2379"), true, true), None);
    }
}
