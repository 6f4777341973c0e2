//! HTTP endpoints served on the gRPC port (HTTPS when the port has TLS), as etcd 3.5 serves
//! them: `/version` (kubeadm's external-etcd preflight reads it), `/health`, `/livez` and
//! `/readyz` (probes), `/metrics` (Prometheus). `--listen-metrics-urls` listeners serve only
//! `/metrics` and `/health`.
//!
//! Every other path is answered the way etcd answers it: 404, never a success. A gRPC call to a
//! service etcdsql does not serve gets `Unimplemented` naming the service, as grpc-go says it.
//!
//! # Probes
//! `/livez` and `/readyz` run named checks and answer `ok` (with `?verbose`, a `[+]name ok`
//! line per check first), or 503 with a `[-]name failed: reason` line for each failed check;
//! `?exclude=NAME` leaves a check out, and `/readyz/NAME` runs one check alone. The checks are
//! etcd's:
//! - `serializable_read`: this process answers a read from what it holds, without asking the
//!   database whether a newer revision exists (alive, whatever the database does);
//! - `linearizable_read`: a read through the database, as every client read is (ready);
//! - `data_corruption`: fails while the CORRUPT alarm is raised;
//! - `non_learner`: etcdsql is never a learner, so this always passes.
//!
//! `/health` fails while an alarm is raised that `?exclude=` does not name (`ALARM NOSPACE`).

use std::time::Duration;

use axum::Router;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get};
use serde_json::json;

use super::ServerInfo;
use crate::metrics::{self, Metrics};
use crate::mvcc::types::{KeyRange, RangeRequest};
use crate::mvcc::{Store, alarm};

/// How long one check may take before it fails (etcd bounds its reads by its request timeout).
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
struct HttpState {
    store: Store,
    info: ServerInfo,
    metrics: Metrics,
}

/// The routes of a client port. Unknown paths, and gRPC services that are not served, fall
/// through to [`not_found`].
pub fn routes(store: Store, info: ServerInfo, metrics: Metrics) -> Router {
    Router::new()
        .route("/version", only_get(get(version)))
        .route("/health", only_get(get(health)))
        .route("/livez", only_get(get(livez)))
        .route("/livez/{check}", only_get(get(livez_check)))
        .route("/readyz", only_get(get(readyz)))
        .route("/readyz/{check}", only_get(get(readyz_check)))
        .route("/metrics", only_get(get(prometheus)))
        .with_state(HttpState {
            store,
            info,
            metrics,
        })
}

/// The routes of a `--listen-metrics-urls` port.
pub fn metrics_routes(store: Store, info: ServerInfo, metrics: Metrics) -> Router {
    Router::new()
        .route("/health", only_get(get(health)))
        .route("/metrics", only_get(get(prometheus)))
        .fallback(not_found)
        .with_state(HttpState {
            store,
            info,
            metrics,
        })
}

/// What a path nobody serves gets: for gRPC, `Unimplemented` naming the service; under `/v3/`
/// (etcd's JSON gateway), the gateway's JSON 404; anything else, Go's plain 404.
pub async fn not_found(request: Request) -> Response {
    let path = request.uri().path();
    let grpc = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if grpc {
        let service = path.trim_start_matches('/').split('/').next().unwrap_or("");
        return tonic::Status::unimplemented(format!("unknown service {service}"))
            .into_http::<axum::body::Body>();
    }
    if path.starts_with("/v3/") {
        return (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "application/json")],
            r#"{"code":5, "message":"Not Found"}"#,
        )
            .into_response();
    }
    plain(StatusCode::NOT_FOUND, "404 page not found\n".to_owned())
}

/// GET only, with etcd's answer to any other method.
fn only_get(route: MethodRouter<HttpState>) -> MethodRouter<HttpState> {
    route.fallback(|| async {
        let mut response = plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "Method Not Allowed\n".to_owned(),
        );
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET"));
        response
    })
}

/// A plain-text answer with the headers Go's `http.Error` sets.
fn plain(status: StatusCode, body: String) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

async fn prometheus(State(state): State<HttpState>) -> impl IntoResponse {
    state.metrics.refresh(&state.store).await;
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        state.metrics.encode(),
    )
}

async fn version(State(state): State<HttpState>) -> impl IntoResponse {
    axum::Json(json!({
        "etcdserver": state.info.version,
        "etcdcluster": state.info.cluster_version(),
    }))
}

/// The query parameters of a request, in order (`a=1&b` gives `("a", "1")`, `("b", "")`),
/// decoded as Go's `url.ParseQuery` decodes them.
fn query_params(query: Option<&str>) -> Vec<(String, String)> {
    form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

/// etcd's `/health`: `{"health":"true","reason":""}`, or 503 with the reason. With
/// `?serializable=true` it reads from what this process holds instead of through the
/// database; `?exclude=ALARM` ignores an alarm (etcdsql raises none).
async fn health(State(state): State<HttpState>, RawQuery(query): RawQuery) -> Response {
    let params = query_params(query.as_deref());
    let serializable = params
        .iter()
        .any(|(name, value)| name == "serializable" && value == "true");
    let excluded = |alarm: &str| {
        params
            .iter()
            .any(|(name, value)| name == "exclude" && value == alarm)
    };
    let unhealthy = |reason: String| {
        plain(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{}\n", json!({"health": "false", "reason": reason})),
        )
    };
    for alarm in state.store.alarms() {
        let name = alarm_name(alarm);
        if !excluded(name) {
            return unhealthy(format!("ALARM {name}"));
        }
    }
    let check = if serializable {
        Check::SerializableRead
    } else {
        Check::LinearizableRead
    };
    match check.run(&state.store).await {
        Ok(()) => plain(
            StatusCode::OK,
            json!({"health": "true", "reason": ""}).to_string(),
        ),
        Err(reason) => unhealthy(format!("RANGE ERROR:{reason}")),
    }
}

/// An alarm by etcd's name for it.
fn alarm_name(alarm: i32) -> &'static str {
    match alarm {
        alarm::NOSPACE => "NOSPACE",
        alarm::CORRUPT => "CORRUPT",
        _ => "UNKNOWN",
    }
}

/// One of etcd's probe checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    DataCorruption,
    SerializableRead,
    LinearizableRead,
    NonLearner,
}

const LIVEZ: &[Check] = &[Check::SerializableRead];
const READYZ: &[Check] = &[
    Check::DataCorruption,
    Check::SerializableRead,
    Check::LinearizableRead,
    Check::NonLearner,
];

impl Check {
    fn name(self) -> &'static str {
        match self {
            Check::DataCorruption => "data_corruption",
            Check::SerializableRead => "serializable_read",
            Check::LinearizableRead => "linearizable_read",
            Check::NonLearner => "non_learner",
        }
    }

    /// Runs the check; the reason it failed, if it did.
    async fn run(self, store: &Store) -> Result<(), String> {
        if self == Check::DataCorruption && store.alarms().contains(&alarm::CORRUPT) {
            return Err("alarm activated: CORRUPT".to_owned());
        }
        let read = async {
            match self {
                Check::DataCorruption | Check::NonLearner => Ok(()),
                Check::SerializableRead => store.read_locally().await.map(drop),
                Check::LinearizableRead => {
                    let probe = RangeRequest {
                        limit: 1,
                        keys_only: true,
                        ..RangeRequest::of(KeyRange::single(b"health".to_vec()))
                    };
                    store.range(&probe).await.map(drop)
                }
            }
        };
        match tokio::time::timeout(CHECK_TIMEOUT, read).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("context deadline exceeded".to_owned()),
        }
    }
}

async fn livez(State(state): State<HttpState>, RawQuery(query): RawQuery) -> Response {
    probe(&state, "livez", LIVEZ, query.as_deref(), true).await
}

async fn readyz(State(state): State<HttpState>, RawQuery(query): RawQuery) -> Response {
    probe(&state, "readyz", READYZ, query.as_deref(), true).await
}

async fn livez_check(
    State(state): State<HttpState>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    one_check(&state, "livez", LIVEZ, &name, query.as_deref()).await
}

async fn readyz_check(
    State(state): State<HttpState>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    one_check(&state, "readyz", READYZ, &name, query.as_deref()).await
}

/// `/livez/NAME` or `/readyz/NAME`: the one check, or 404 if the probe has none by that name.
async fn one_check(
    state: &HttpState,
    probe_name: &str,
    checks: &[Check],
    name: &str,
    query: Option<&str>,
) -> Response {
    match checks.iter().find(|c| c.name() == name) {
        Some(&check) => {
            let path = format!("{probe_name}/{name}");
            probe(state, &path, &[check], query, false).await
        }
        None => plain(StatusCode::NOT_FOUND, "404 page not found\n".to_owned()),
    }
}

/// Runs `checks` (less the excluded ones, where `exclusions` allows them) and answers as etcd
/// does. Excluding a check the probe does not have is not an error.
async fn probe(
    state: &HttpState,
    path: &str,
    checks: &[Check],
    query: Option<&str>,
    exclusions: bool,
) -> Response {
    let params = query_params(query);
    let excluded = |check: &Check| {
        exclusions
            && params
                .iter()
                .any(|(name, value)| name == "exclude" && value == check.name())
    };
    let verbose = params.iter().any(|(name, _)| name == "verbose");
    let mut report = String::new();
    let mut failed = false;
    for check in checks.iter().filter(|c| !excluded(c)) {
        match check.run(&state.store).await {
            Ok(()) => report.push_str(&format!("[+]{} ok\n", check.name())),
            Err(reason) => {
                failed = true;
                report.push_str(&format!("[-]{} failed: {reason}\n", check.name()));
            }
        }
    }
    if failed {
        tracing::warn!(path, report = %report.trim_end(), "health check failed");
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{report}{path} check failed\n"),
        );
    }
    if !verbose {
        report.clear();
    }
    report.push_str("ok\n");
    plain(StatusCode::OK, report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_are_split_and_decoded() {
        assert_eq!(
            query_params(Some("exclude=linearizable_read&verbose&exclude=a%5Fb+c")),
            vec![
                ("exclude".to_owned(), "linearizable_read".to_owned()),
                ("verbose".to_owned(), String::new()),
                ("exclude".to_owned(), "a_b c".to_owned()),
            ]
        );
        assert_eq!(query_params(None), Vec::new());
        // A broken escape stays as it was.
        assert_eq!(
            query_params(Some("a=%zz%")),
            vec![("a".to_owned(), "%zz%".to_owned())]
        );
    }
}
