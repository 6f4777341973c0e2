//! Serves accepted connections with hyper: gRPC over HTTP/2, and HTTP/1.1 or HTTP/2 for
//! `/version`, `/health`, `/metrics` and the JSON gateway, on one port.
//!
//! tonic's own server is not used because of what it adds to every request, which is most of
//! what a get costs beyond the read itself: a boxed service stack cloned per request, a path
//! router in front of the KV service, and hyper's `date` header on every response, which no
//! gRPC client reads (grpc-go sends none) and which both sides spend HPACK work on. Here each
//! request goes to the KV service directly when its path is KV's ([`Dispatch`]), else to the
//! router.
//!
//! # Invariants
//! - Every request carries its connection's `ConnectInfo` in its extensions, as under tonic
//!   (auth reads the client certificate's name from it).
//! - Once `shutdown` fires no connection is taken and the listening socket is closed; only then
//!   is each open connection told to finish (HTTP/2 GOAWAY: calls in flight complete), so that
//!   a client redialling at the GOAWAY is refused rather than reset, and [`serve`] returns when
//!   all have closed.
//!   Its caller bounds that wait; dropping the future drops every connection with it.
//! - A client's `grpc-timeout` is not enforced here: gRPC clients cancel their own stream at
//!   their deadline (RST_STREAM), and hyper then drops the call's future.

use std::convert::Infallible;
use std::io;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinSet;
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::body::Body;
use tonic::codegen::BoxFuture;
use tonic::server::NamedService;
use tonic::service::Routes;
use tonic::transport::server::Connected;
use tower_service::Service;

use crate::api::kv::KvService;
use crate::pb::etcdserverpb::kv_server::KvServer;

/// What can serve a connection's requests of type `R`: a service that hyper clones for each
/// request, that never fails (errors are answers) and whose response body hyper can send.
pub trait ConnectionService<R>:
    Service<R, Response = http::Response<Self::Body>, Error = Infallible, Future: Send + 'static>
    + Clone
    + Send
    + 'static
{
    /// The response body.
    type Body: http_body::Body<Data = bytes::Bytes, Error: Into<BoxError>> + Send + 'static;
}

impl<R, S, B> ConnectionService<R> for S
where
    S: Service<R, Response = http::Response<B>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Body = B;
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// HTTP/2 PINGs to an idle client this often, to answer clients' keepalives in kind and to
/// find dead peers (kube-apiserver holds hundreds of long-lived connections).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// A peer that does not answer a PING within this is closed.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The KV service straight from the request path; every other path through the router.
#[derive(Clone)]
pub struct Dispatch {
    kv: KvServer<KvService>,
    rest: Routes,
}

impl Dispatch {
    /// `rest` serves everything but `kv` (it may hold `kv` too; it is then never asked).
    pub fn new(kv: KvServer<KvService>, rest: Routes) -> Self {
        Self { kv, rest }
    }
}

/// Whether `path` names a method of KV (`/etcdserverpb.KV/…`). Checked in place rather than
/// against a prefix kept in [`Dispatch`]: the service stack is cloned for every request.
fn is_kv(path: &str) -> bool {
    path.strip_prefix('/')
        .and_then(|path| path.strip_prefix(<KvServer<KvService> as NamedService>::NAME))
        .is_some_and(|method| method.starts_with('/'))
}

impl Service<http::Request<Body>> for Dispatch {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Both services are always ready (tonic's servers and axum's router say so).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if is_kv(request.uri().path()) {
            // Already boxed by the generated server.
            self.kv.call(request)
        } else {
            Box::pin(self.rest.call(request))
        }
    }
}

/// Puts its connection's `ConnectInfo` in each request, whose body becomes tonic's.
#[derive(Clone)]
struct PerConnection<S, C> {
    inner: S,
    info: C,
}

impl<S, C> Service<http::Request<Incoming>> for PerConnection<S, C>
where
    S: Service<http::Request<Body>>,
    C: Clone + Send + Sync + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Incoming>) -> Self::Future {
        let mut request = request.map(Body::new);
        request.extensions_mut().insert(self.info.clone());
        self.inner.call(request)
    }
}

/// Serves every connection `incoming` yields with `service` until `shutdown`; see the module's
/// invariants for how it ends. `incoming` must end once `shutdown` fires, after its listening
/// socket is closed (as [`crate::listener::Listener::accept`]'s does).
pub async fn serve<I, IO, S>(incoming: I, service: S, shutdown: CancellationToken)
where
    I: Stream<Item = io::Result<IO>>,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
    S: ConnectionService<http::Request<Body>>,
{
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        // etcd sets no limit either; a watch or keep-alive stream is one long-lived stream.
        .max_concurrent_streams(None)
        .auto_date_header(false);
    // hyper enforces its HTTP/1 header read timeout only with a timer.
    builder.http1().timer(TokioTimer::new());

    let mut connections = JoinSet::new();
    // Open connections are told to finish only once the listening socket is closed: a client
    // told so redials at once, and a dial that reached the socket's queue in between would be
    // reset as it closes, where a closed socket refuses it, which clients take as the server
    // gone and try elsewhere or later.
    let finish = CancellationToken::new();
    let mut incoming = std::pin::pin!(incoming);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            next = incoming.next() => match next {
                Some(Ok(io)) => {
                    let service = PerConnection {
                        inner: service.clone(),
                        info: io.connect_info(),
                    };
                    connections.spawn(serve_one(io, service, builder.clone(), finish.clone()));
                }
                // The listener logs its own failures and sends none; were one sent, the
                // next connection may still be fine.
                Some(Err(e)) => tracing::debug!(error = %e, "connection not accepted"),
                None => break,
            },
            // Reaps finished connections as it goes, so the set holds only open ones.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    // The listener closes its socket and then ends its stream; a connection it took meanwhile
    // is closed unserved. Connections outlive a stream that ended by itself until the shutdown.
    while incoming.next().await.is_some() {}
    shutdown.cancelled().await;
    finish.cancel();
    while connections.join_next().await.is_some() {}
}

/// Serves one connection until it closes; once `finish` fires, it is told to finish.
async fn serve_one<IO, S>(
    io: IO,
    service: S,
    builder: Builder<TokioExecutor>,
    finish: CancellationToken,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: ConnectionService<http::Request<Incoming>>,
{
    let connection = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
    let mut connection = std::pin::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = finish.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_paths_are_told_from_the_rest() {
        assert!(is_kv("/etcdserverpb.KV/Range"));
        assert!(is_kv("/etcdserverpb.KV/Nope"));
        assert!(!is_kv("/etcdserverpb.KVX/Range"));
        assert!(!is_kv("/etcdserverpb.Watch/Watch"));
        assert!(!is_kv("/etcdserverpb.KV"));
        assert!(!is_kv("/v3/kv/range"));
        assert!(!is_kv("etcdserverpb.KV/Range"));
    }
}
