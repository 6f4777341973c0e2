//! Client listeners: parses listen URLs, binds TCP and Unix sockets, performs TLS handshakes,
//! and hands finished connections to the gRPC/HTTP server.
//!
//! # URLs
//! `http://HOST:PORT` and `https://HOST:PORT` listen on TCP; `unix://PATH` and `unixs://PATH`
//! on a Unix socket at PATH (`unix:///run/etcdsql.sock`, or `unix://localhost:2379` for a file
//! named `localhost:2379` in the working directory, as etcd reads it). The `s` schemes need
//! TLS configured (`--cert-file`, `--key-file`).
//!
//! # Connections
//! Each listener has one accept task. A plain connection goes to the server at once; a TLS
//! connection first completes its handshake in a task of its own, bounded by
//! [`HANDSHAKE_TIMEOUT`], so a slow or silent client never delays anyone else's accept. A
//! failed handshake (no client certificate, one from another CA, not TLS at all) closes that
//! connection and is logged; nothing of it reaches a handler.
//!
//! The accept task stops when the server's shutdown token fires or the server stops taking
//! connections, and removes the socket file of a Unix listener it created.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Longest a client may take to complete the TLS handshake after connecting.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Accepted connections waiting for the server to pick them up.
const READY_QUEUE: usize = 64;
/// Pause after an accept error such as "too many open files", so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "invalid listen URL {0:?}: expected http://HOST:PORT, https://HOST:PORT, unix://PATH or unixs://PATH"
    )]
    Url(String),
    #[error("listen URL {0} uses TLS but --cert-file and --key-file are not set")]
    TlsNotConfigured(String),
    #[error("cannot listen on {url}: {source}")]
    Bind { url: String, source: io::Error },
}

/// Where a listen URL points.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenUrl {
    Tcp { addr: String, tls: bool },
    Unix { path: PathBuf, tls: bool },
}

impl ListenUrl {
    /// Reads one listen URL.
    ///
    /// # Errors
    /// An unknown scheme or a missing address.
    pub fn parse(url: &str) -> Result<Self, Error> {
        let bad = || Error::Url(url.to_owned());
        let (scheme, rest) = url.split_once("://").ok_or_else(bad)?;
        match scheme {
            "http" | "https" => {
                let addr = rest.trim_end_matches('/');
                if addr.is_empty() || addr.contains('/') || !addr.contains(':') {
                    return Err(bad());
                }
                Ok(ListenUrl::Tcp {
                    addr: addr.to_owned(),
                    tls: scheme == "https",
                })
            }
            "unix" | "unixs" if !rest.is_empty() => Ok(ListenUrl::Unix {
                path: PathBuf::from(rest),
                tls: scheme == "unixs",
            }),
            _ => Err(bad()),
        }
    }

    pub fn tls(&self) -> bool {
        match self {
            ListenUrl::Tcp { tls, .. } | ListenUrl::Unix { tls, .. } => *tls,
        }
    }
}

/// A bound listener, not yet accepting.
pub struct Listener {
    socket: Socket,
    /// Set for `https://` and `unixs://`: every connection is handshaken before it is served.
    tls: Option<TlsAcceptor>,
    /// The URL as bound, for logs and for what MemberList advertises by default.
    url: String,
}

enum Socket {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Binds `url`; TLS URLs use `tls`.
    ///
    /// # Errors
    /// A bad URL, a TLS URL without TLS configured, or an address that cannot be bound.
    pub async fn bind(url: &str, tls: Option<&Arc<ServerConfig>>) -> Result<Self, Error> {
        let parsed = ListenUrl::parse(url)?;
        let acceptor = if parsed.tls() {
            let config = tls.ok_or_else(|| Error::TlsNotConfigured(url.to_owned()))?;
            Some(TlsAcceptor::from(config.clone()))
        } else {
            None
        };
        let bind_error = |source| Error::Bind {
            url: url.to_owned(),
            source,
        };
        let (socket, bound) = match parsed {
            ListenUrl::Tcp { addr, tls } => {
                let listener = TcpListener::bind(&addr).await.map_err(bind_error)?;
                let local = listener.local_addr().map_err(bind_error)?;
                let scheme = if tls { "https" } else { "http" };
                (Socket::Tcp(listener), format!("{scheme}://{local}"))
            }
            ListenUrl::Unix { path, tls } => {
                let listener = bind_unix(&path).map_err(bind_error)?;
                let scheme = if tls { "unixs" } else { "unix" };
                let bound = format!("{scheme}://{}", path.display());
                (Socket::Unix(listener, path), bound)
            }
        };
        Ok(Self {
            socket,
            tls: acceptor,
            url: bound,
        })
    }

    /// The URL as bound (port 0 resolved).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The TCP address, for a TCP listener.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match &self.socket {
            Socket::Tcp(listener) => listener.local_addr().ok(),
            Socket::Unix(..) => None,
        }
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Starts accepting on `tasks`; connections come out of the returned stream (handshake
    /// done) until `shutdown` fires or the stream is dropped.
    pub fn accept(
        self,
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> ReceiverStream<io::Result<Conn>> {
        let (ready, stream) = mpsc::channel(READY_QUEUE);
        tasks.spawn(accept_loop(self, ready, shutdown));
        ReceiverStream::new(stream)
    }
}

/// Binds a Unix socket, replacing a stale socket file that no server answers on.
fn bind_unix(path: &Path) -> io::Result<UnixListener> {
    match UnixListener::bind(path) {
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            let is_socket = std::fs::symlink_metadata(path)
                .map(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
                .unwrap_or(false);
            // Only a socket nobody listens on is ours to replace; anything else is an error.
            if is_socket && std::os::unix::net::UnixStream::connect(path).is_err() {
                std::fs::remove_file(path)?;
                UnixListener::bind(path)
            } else {
                Err(e)
            }
        }
        other => other,
    }
}

enum Accepted {
    Tcp(TcpStream),
    Unix(UnixStream),
}

async fn accept_loop(
    listener: Listener,
    ready: mpsc::Sender<io::Result<Conn>>,
    shutdown: CancellationToken,
) {
    let Listener { socket, tls, url } = listener;
    let mut handshakes = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            () = ready.closed() => break,
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => continue,
            accepted = accept_one(&socket) => accepted,
        };
        let accepted = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(listener = %url, error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        match &tls {
            None => {
                let conn = match accepted {
                    Accepted::Tcp(stream) => Conn::Tcp(stream),
                    Accepted::Unix(stream) => Conn::Unix(stream),
                };
                if ready.send(Ok(conn)).await.is_err() {
                    break;
                }
            }
            Some(acceptor) => {
                handshakes.spawn(handshake(
                    acceptor.clone(),
                    accepted,
                    ready.clone(),
                    url.clone(),
                ));
            }
        }
    }
    // Dropping the set aborts handshakes still in progress.
    drop(handshakes);
    if let Socket::Unix(listener, path) = socket {
        drop(listener);
        if let Err(e) = std::fs::remove_file(&path) {
            tracing::debug!(path = %path.display(), error = %e, "cannot remove the socket file");
        }
    }
}

async fn accept_one(socket: &Socket) -> io::Result<Accepted> {
    match socket {
        Socket::Tcp(listener) => {
            let (stream, _) = listener.accept().await?;
            // gRPC sends many small frames; Nagle's delay would only add latency.
            stream.set_nodelay(true)?;
            Ok(Accepted::Tcp(stream))
        }
        Socket::Unix(listener, _) => Ok(Accepted::Unix(listener.accept().await?.0)),
    }
}

async fn handshake(
    acceptor: TlsAcceptor,
    accepted: Accepted,
    ready: mpsc::Sender<io::Result<Conn>>,
    url: String,
) {
    let (conn, peer) = match accepted {
        Accepted::Tcp(stream) => {
            let peer = stream
                .peer_addr()
                .map_or_else(|_| "unknown".to_owned(), |a| a.to_string());
            let done = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await;
            (done.map(|r| r.map(|s| Conn::TcpTls(Box::new(s)))), peer)
        }
        Accepted::Unix(stream) => {
            let done = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await;
            (
                done.map(|r| r.map(|s| Conn::UnixTls(Box::new(s)))),
                "unix socket".to_owned(),
            )
        }
    };
    match conn {
        Ok(Ok(conn)) => {
            // The server stopped taking connections: this one just closes.
            let _ = ready.send(Ok(conn)).await;
        }
        Ok(Err(e)) => {
            tracing::warn!(listener = %url, %peer, error = %e, "rejected connection: TLS handshake failed");
        }
        Err(_) => {
            tracing::warn!(listener = %url, %peer, timeout = ?HANDSHAKE_TIMEOUT, "rejected connection: TLS handshake timed out");
        }
    }
}

/// An accepted client connection, plain or TLS, over TCP or a Unix socket.
pub enum Conn {
    Tcp(TcpStream),
    // Boxed: a TLS session is about a kilobyte, and connections are moved around.
    TcpTls(Box<TlsStream<TcpStream>>),
    Unix(UnixStream),
    UnixTls(Box<TlsStream<UnixStream>>),
}

/// What every request on a connection carries in its extensions (tonic puts it there).
#[derive(Clone, Debug)]
pub struct ConnInfo {
    /// The TCP addresses (none for a Unix socket).
    pub tcp: TcpConnectInfo,
    /// The CommonName of the client certificate, when the client presented one. Shared: the
    /// connection's info is cloned into each of its requests.
    pub certificate_name: Option<Arc<str>>,
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        let (tcp, session) = match self {
            Conn::Tcp(stream) => (Some(stream), None),
            Conn::TcpTls(stream) => (Some(stream.get_ref().0), Some(stream.get_ref().1)),
            Conn::Unix(_) => (None, None),
            Conn::UnixTls(stream) => (None, Some(stream.get_ref().1)),
        };
        let certificate_name = session
            .and_then(|s| s.peer_certificates())
            .and_then(|chain| chain.first())
            .and_then(|cert| common_name(cert.as_ref()))
            .map(Arc::from);
        ConnInfo {
            tcp: TcpConnectInfo {
                local_addr: tcp.and_then(|s| s.local_addr().ok()),
                remote_addr: tcp.and_then(|s| s.peer_addr().ok()),
            },
            certificate_name,
        }
    }
}

/// The first CommonName in a DER certificate's subject.
fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let name = cert.subject().iter_common_name().next()?;
    name.as_str().ok().map(str::to_owned)
}

macro_rules! delegate {
    ($self:ident, $s:ident => $call:expr) => {
        match $self.get_mut() {
            Conn::Tcp($s) => $call,
            Conn::TcpTls($s) => $call,
            Conn::Unix($s) => $call,
            Conn::UnixTls($s) => $call,
        }
    };
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        delegate!(self, s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        delegate!(self, s => Pin::new(s).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        delegate!(self, s => Pin::new(s).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Tcp(s) => s.is_write_vectored(),
            Conn::TcpTls(s) => s.is_write_vectored(),
            Conn::Unix(s) => s.is_write_vectored(),
            Conn::UnixTls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => Pin::new(s).poll_shutdown(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_urls() {
        let tcp = |addr: &str, tls| ListenUrl::Tcp {
            addr: addr.into(),
            tls,
        };
        assert_eq!(
            ListenUrl::parse("http://127.0.0.1:2379").unwrap(),
            tcp("127.0.0.1:2379", false)
        );
        assert_eq!(
            ListenUrl::parse("https://[::1]:2379/").unwrap(),
            tcp("[::1]:2379", true)
        );
        assert_eq!(
            ListenUrl::parse("unix:///run/etcdsql.sock").unwrap(),
            ListenUrl::Unix {
                path: "/run/etcdsql.sock".into(),
                tls: false
            }
        );
        assert_eq!(
            ListenUrl::parse("unixs://localhost:2379").unwrap(),
            ListenUrl::Unix {
                path: "localhost:2379".into(),
                tls: true
            }
        );
        for bad in [
            "127.0.0.1:2379",
            "http://",
            "http://host",
            "http://host:1/path",
            "unix://",
            "ftp://host:1",
        ] {
            assert!(ListenUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn tls_urls_need_tls_configured() {
        let err = Listener::bind("https://127.0.0.1:0", None).await.err();
        assert!(matches!(err, Some(Error::TlsNotConfigured(_))));
    }

    #[tokio::test]
    async fn a_stale_socket_file_is_replaced_and_removed_at_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        // A socket file left behind by a process that is gone.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let url = format!("unix://{}", path.display());
        let listener = Listener::bind(&url, None).await.unwrap();
        assert_eq!(listener.url(), url);
        let tasks = TaskTracker::new();
        let shutdown = CancellationToken::new();
        let mut incoming = listener.accept(&tasks, shutdown.clone());
        let _client = UnixStream::connect(&path).await.unwrap();
        let conn = tokio_stream::StreamExt::next(&mut incoming).await;
        assert!(matches!(conn, Some(Ok(Conn::Unix(_)))));
        shutdown.cancel();
        tasks.close();
        tasks.wait().await;
        assert!(!path.exists());
    }

    #[tokio::test]
    async fn a_live_socket_is_not_stolen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let _live = UnixListener::bind(&path).unwrap();
        let url = format!("unix://{}", path.display());
        assert!(matches!(
            Listener::bind(&url, None).await.err(),
            Some(Error::Bind { .. })
        ));
    }
}
