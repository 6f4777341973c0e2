//! go-grpc-prometheus's `grpc_server_*` series with etcd's labels, for every etcd method (and
//! gRPC health's); unknown paths are not counted, so a client cannot create series at will.
//!
//! A call is *started* when its request reaches the service and *handled* exactly once, when
//! its response ends: with its trailers' `grpc-status`, the status of a trailers-only response,
//! or `Canceled` if the client went away first. Each method's series are looked up in their
//! families once per process and then kept ([`Series`]): a family lookup takes a lock and hashes
//! three or four labels, and every call used to make three of them.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::{HistogramFamily, Metrics};

/// Prometheus' default buckets, which go-grpc-prometheus (and so etcd) uses for handling times.
const GRPC_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    grpc_type: &'static str,
    grpc_service: &'static str,
    grpc_method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandledLabels {
    grpc_type: &'static str,
    grpc_service: &'static str,
    grpc_method: &'static str,
    grpc_code: &'static str,
}

/// One gRPC method as the metrics label it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct GrpcMethod {
    service: &'static str,
    method: &'static str,
    kind: &'static str,
}

/// The proto that defines etcd's services; the method table is read from it, so it cannot
/// drift from what the server implements.
const RPC_PROTO: &str = include_str!("../../proto/etcdserverpb/rpc.proto");

/// Every etcd method (and gRPC health's), by request path.
static GRPC_METHODS: LazyLock<HashMap<String, GrpcMethod>> = LazyLock::new(|| {
    let mut methods = HashMap::new();
    let mut add = |service: &'static str, method: &'static str, kind: &'static str| {
        methods.insert(
            format!("/{service}/{method}"),
            GrpcMethod {
                service,
                method,
                kind,
            },
        );
    };
    add("grpc.health.v1.Health", "Check", "unary");
    add("grpc.health.v1.Health", "Watch", "server_stream");
    let mut service: Option<&'static str> = None;
    for line in RPC_PROTO.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("service ") {
            let name = rest.trim_end_matches('{').trim();
            // Labels are 'static: the qualified names are made once per process.
            service = Some(Box::leak(format!("etcdserverpb.{name}").into_boxed_str()));
        } else if let (Some(service), Some(rest)) = (service, line.strip_prefix("rpc ")) {
            let Some((method, signature)) = rest.split_once('(') else {
                continue;
            };
            let Some((request, response)) = signature.split_once("returns") else {
                continue;
            };
            let kind = match (
                request.trim_start().starts_with("stream "),
                response
                    .trim_start()
                    .trim_start_matches('(')
                    .starts_with("stream "),
            ) {
                (false, false) => "unary",
                (false, true) => "server_stream",
                (true, false) => "client_stream",
                (true, true) => "bidi_stream",
            };
            add(service, method.trim(), kind);
        } else if line == "}" {
            service = None;
        }
    }
    methods
});

/// gRPC status codes as go-grpc-prometheus names them (`codes.Code.String()`), by number.
const CODE_NAMES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];
const CANCELED: usize = 1;
const UNKNOWN: usize = 2;

/// A `grpc-status` header's code, as an index into [`CODE_NAMES`]; a code outside them, or one
/// that is not a number, is `Unknown`, as grpc-go reads it.
fn grpc_status(headers: &http::HeaderMap) -> Option<usize> {
    let value = headers.get("grpc-status")?.to_str().ok()?;
    let code = value
        .trim()
        .parse::<usize>()
        .ok()
        .filter(|&code| code < CODE_NAMES.len());
    Some(code.unwrap_or(UNKNOWN))
}

/// The gRPC families, and each known method's series in them.
pub(super) struct Series {
    methods: HashMap<&'static str, Arc<MethodSeries>>,
}

impl Series {
    /// Registers the families in `registry`, in go-grpc-prometheus's order.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let started = Family::<MethodLabels, Counter>::default();
        registry.register(
            "grpc_server_started",
            "Total number of RPCs started on the server",
            started.clone(),
        );
        let handled = Family::<HandledLabels, Counter>::default();
        registry.register(
            "grpc_server_handled",
            "Total number of RPCs completed on the server, regardless of success or failure",
            handled.clone(),
        );
        let seconds: HistogramFamily<MethodLabels> =
            Family::new_with_constructor(|| Histogram::new(GRPC_BUCKETS));
        registry.register(
            "grpc_server_handling_seconds",
            "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server",
            seconds.clone(),
        );
        let methods = GRPC_METHODS
            .iter()
            .map(|(path, &method)| {
                let series = MethodSeries {
                    method,
                    started_family: started.clone(),
                    handled_family: handled.clone(),
                    seconds_family: seconds.clone(),
                    started: OnceLock::new(),
                    seconds: OnceLock::new(),
                    handled: std::array::from_fn(|_| OnceLock::new()),
                };
                (path.as_str(), Arc::new(series))
            })
            .collect();
        Self { methods }
    }
}

/// One method's series. Each is created in its family at its first use, not before, so
/// `/metrics` lists only the methods and codes that have been seen.
struct MethodSeries {
    method: GrpcMethod,
    started_family: Family<MethodLabels, Counter>,
    handled_family: Family<HandledLabels, Counter>,
    seconds_family: HistogramFamily<MethodLabels>,
    started: OnceLock<Counter>,
    seconds: OnceLock<Histogram>,
    /// By code, as [`CODE_NAMES`] numbers them.
    handled: [OnceLock<Counter>; CODE_NAMES.len()],
}

impl MethodSeries {
    fn labels(&self) -> MethodLabels {
        MethodLabels {
            grpc_type: self.method.kind,
            grpc_service: self.method.service,
            grpc_method: self.method.method,
        }
    }

    fn start(&self) {
        self.started
            .get_or_init(|| self.started_family.get_or_create(&self.labels()).clone())
            .inc();
    }

    fn finish(&self, started: Instant, code: usize) {
        // Every caller passes a code from `grpc_status` or a constant; anything else is
        // Unknown, as grpc-go reads it, rather than a panic.
        let code = if code < CODE_NAMES.len() {
            code
        } else {
            UNKNOWN
        };
        self.seconds
            .get_or_init(|| self.seconds_family.get_or_create(&self.labels()).clone())
            .observe(started.elapsed().as_secs_f64());
        self.handled[code]
            .get_or_init(|| {
                let labels = self.labels();
                self.handled_family
                    .get_or_create(&HandledLabels {
                        grpc_type: labels.grpc_type,
                        grpc_service: labels.grpc_service,
                        grpc_method: labels.grpc_method,
                        grpc_code: CODE_NAMES[code],
                    })
                    .clone()
            })
            .inc();
    }
}

/// Wraps the gRPC server's service in [`GrpcMetrics`].
#[derive(Clone)]
pub struct GrpcMetricsLayer {
    metrics: Metrics,
}

impl GrpcMetricsLayer {
    pub(super) fn new(metrics: Metrics) -> Self {
        Self { metrics }
    }
}

impl<S> tower_layer::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetrics {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// Counts gRPC calls to known methods; HTTP requests (`/version`, `/metrics`…) pass untouched.
#[derive(Clone)]
pub struct GrpcMetrics<S> {
    inner: S,
    metrics: Metrics,
}

impl<S, ReqBody, ResBody> tower_service::Service<http::Request<ReqBody>> for GrpcMetrics<S>
where
    S: tower_service::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
{
    type Response = http::Response<MeteredBody<ResBody>>;
    type Error = S::Error;
    type Future = MeteredFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let is_grpc = request
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/grpc"));
        let call = is_grpc
            .then(|| self.metrics.inner.grpc.methods.get(request.uri().path()))
            .flatten()
            .map(|series| {
                series.start();
                Call {
                    series: series.clone(),
                    started: Instant::now(),
                    code: None,
                }
            });
        MeteredFuture {
            inner: self.inner.call(request),
            call,
        }
    }
}

/// A call in flight; recorded as handled exactly once, by [`Call::finish`].
struct Call {
    series: Arc<MethodSeries>,
    started: Instant,
    /// A status already sent in the response headers (a trailers-only response).
    code: Option<usize>,
}

impl Call {
    fn finish(self, code: usize) {
        self.series.finish(self.started, code);
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`GrpcMetrics`].
    pub struct MeteredFuture<F> {
        #[pin]
        inner: F,
        call: Option<Call>,
    }
}

impl<F, B, E> Future for MeteredFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<MeteredBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        let mut call = this.call.take();
        Poll::Ready(match result {
            Ok(response) => {
                if let Some(call) = &mut call {
                    call.code = grpc_status(response.headers());
                }
                Ok(response.map(|inner| MeteredBody { inner, call }))
            }
            Err(e) => {
                if let Some(call) = call {
                    call.finish(UNKNOWN);
                }
                Err(e)
            }
        })
    }
}

pin_project_lite::pin_project! {
    /// A response body that records its call as handled when it ends or is dropped.
    pub struct MeteredBody<B> {
        #[pin]
        inner: B,
        call: Option<Call>,
    }

    impl<B> PinnedDrop for MeteredBody<B> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(call) = this.project().call.take() {
                // Ended without trailers: the status was in the headers, or the client left
                // before the server finished (go-grpc-prometheus reports that as Canceled).
                let code = call.code.unwrap_or(CANCELED);
                call.finish(code);
            }
        }
    }
}

impl<B: http_body::Body> http_body::Body for MeteredBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        match &frame {
            Some(Ok(frame)) => {
                if let Some(trailers) = frame.trailers_ref()
                    && let Some(call) = this.call.take()
                {
                    let code = grpc_status(trailers).or(call.code).unwrap_or(UNKNOWN);
                    call.finish(code);
                }
            }
            Some(Err(_)) => {
                if let Some(call) = this.call.take() {
                    call.finish(UNKNOWN);
                }
            }
            None => {
                if let Some(call) = this.call.take() {
                    let code = call.code.unwrap_or(UNKNOWN);
                    call.finish(code);
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn method(path: &str) -> Option<GrpcMethod> {
        GRPC_METHODS.get(path).copied()
    }

    #[test]
    fn methods_come_from_the_proto_with_their_stream_kinds() {
        let range = method("/etcdserverpb.KV/Range").unwrap();
        assert_eq!(
            (range.service, range.method, range.kind),
            ("etcdserverpb.KV", "Range", "unary")
        );
        assert_eq!(
            method("/etcdserverpb.Watch/Watch").unwrap().kind,
            "bidi_stream"
        );
        assert_eq!(
            method("/etcdserverpb.Lease/LeaseKeepAlive").unwrap().kind,
            "bidi_stream"
        );
        assert_eq!(
            method("/etcdserverpb.Maintenance/Snapshot").unwrap().kind,
            "server_stream"
        );
        assert_eq!(method("/etcdserverpb.Auth/UserAdd").unwrap().kind, "unary");
        assert_eq!(
            method("/grpc.health.v1.Health/Check").unwrap().kind,
            "unary"
        );
        assert!(method("/etcdserverpb.KV/Nope").is_none());
        assert!(method("/version").is_none());
    }

    #[test]
    fn codes_have_grpc_go_names() {
        let name = |value: &'static str| {
            let mut headers = http::HeaderMap::new();
            headers.insert("grpc-status", http::HeaderValue::from_static(value));
            grpc_status(&headers).map(|code| CODE_NAMES[code])
        };
        assert_eq!(name("0"), Some("OK"));
        assert_eq!(name("5"), Some("NotFound"));
        assert_eq!(name("11"), Some("OutOfRange"));
        assert_eq!(name("16"), Some("Unauthenticated"));
        assert_eq!(name("99"), Some("Unknown"));
        assert_eq!(name("x"), Some("Unknown"));
        assert_eq!(grpc_status(&http::HeaderMap::new()), None);
    }
}
