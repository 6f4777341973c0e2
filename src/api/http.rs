//! HTTP endpoints served on the gRPC port (HTTPS when the port has TLS), as etcd serves them:
//! `/version` (kubeadm's external-etcd preflight reads it), `/health` and `/metrics`
//! (Prometheus). `--listen-metrics-urls` listeners serve only `/metrics` and `/health`.

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use serde_json::json;

use super::ServerInfo;
use crate::metrics::{self, Metrics};
use crate::mvcc::Store;

#[derive(Clone)]
struct HttpState {
    store: Store,
    info: ServerInfo,
    metrics: Metrics,
}

/// The routes of a client port.
pub fn routes(store: Store, info: ServerInfo, metrics: Metrics) -> Router {
    Router::new()
        .route("/version", get(version))
        .route("/health", get(health))
        .route("/metrics", get(prometheus))
        .with_state(HttpState {
            store,
            info,
            metrics,
        })
}

/// The routes of a `--listen-metrics-urls` port.
pub fn metrics_routes(store: Store, info: ServerInfo, metrics: Metrics) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(prometheus))
        .with_state(HttpState {
            store,
            info,
            metrics,
        })
}

async fn prometheus(State(state): State<HttpState>) -> impl IntoResponse {
    state.metrics.refresh(&state.store).await;
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        state.metrics.encode(),
    )
}

async fn version(State(state): State<HttpState>) -> impl IntoResponse {
    Json(json!({
        "etcdserver": state.info.version,
        "etcdcluster": state.info.cluster_version(),
    }))
}

/// Healthy when the database answers a read.
async fn health(State(state): State<HttpState>) -> impl IntoResponse {
    match state.store.revisions().await {
        Ok(_) => (StatusCode::OK, Json(json!({"health": "true"}))),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"health": "false", "reason": e.to_string()})),
        ),
    }
}
