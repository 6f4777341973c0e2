//! Plain HTTP endpoints served on the gRPC port, as etcd serves them: `/version` (kubeadm's
//! external-etcd preflight reads it) and `/health`.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use serde_json::json;

use super::ServerInfo;
use crate::mvcc::Store;

#[derive(Clone)]
struct HttpState {
    store: Store,
    info: ServerInfo,
}

pub fn routes(store: Store, info: ServerInfo) -> Router {
    Router::new()
        .route("/version", get(version))
        .route("/health", get(health))
        .with_state(HttpState { store, info })
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
