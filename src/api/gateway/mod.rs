//! etcd's HTTP/JSON gateway (`POST /v3/...`): the same services as gRPC, in protobuf's JSON
//! mapping (pbjson, field names as the protos spell them, 64-bit integers as strings, bytes as
//! base64), as etcd 3.5's grpc-gateway serves them.
//!
//! Each request is decoded from JSON and handed to the very service object gRPC uses, with the
//! `Authorization` header as the `authorization` metadata and the connection's certificate, so
//! validation, auth and errors are gRPC's. An error is `{"code": N, "message": "..."}` with
//! grpc-gateway's HTTP status for the code. Streams (`/v3/watch`, `/v3/lease/keepalive`,
//! `/v3/election/observe`) read a sequence of JSON objects from the request body and answer
//! one `{"result": ...}` line per message.

mod stream;

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::Status;

use super::auth::AuthService;
use super::cluster::ClusterService;
use super::election::ElectionService;
use super::kv::KvService;
use super::lease::LeaseService;
use super::lock::LockService;
use super::maintenance::MaintenanceService;
use super::watch::WatchService;
use crate::listener::ConnInfo;
use crate::pb::etcdserverpb as pb;
use crate::pb::{v3electionpb, v3lockpb};

/// The services the gateway forwards to: the same objects gRPC serves.
#[derive(Clone)]
pub struct Services {
    pub kv: Arc<KvService>,
    pub watch: Arc<WatchService>,
    pub lease: Arc<LeaseService>,
    pub cluster: Arc<ClusterService>,
    pub maintenance: Arc<MaintenanceService>,
    pub auth: Arc<AuthService>,
    pub lock: Arc<LockService>,
    pub election: Arc<ElectionService>,
    /// The largest body a unary request may have.
    pub max_body: usize,
}

/// One unary route: `$service` is a field of [`Services`], `$method` a method of `$api` on it.
macro_rules! unary {
    ($service:ident, $api:path, $method:ident, $req:ty) => {
        post(
            |State(services): State<Services>, request: Request| async move {
                let service = services.$service.clone();
                unary::<$req, _, _, _>(request, services.max_body, move |r| async move {
                    <_ as $api>::$method(&*service, r).await
                })
                .await
            },
        )
        .fallback(method_not_allowed)
    };
}

/// The gateway's routes, under etcd's paths (and their older `/v3/kv/lease/...` aliases).
pub fn routes(services: Services) -> Router {
    use pb::auth_server::Auth;
    use pb::cluster_server::Cluster;
    use pb::kv_server::Kv;
    use pb::lease_server::Lease;
    use pb::maintenance_server::Maintenance;
    use v3electionpb::election_server::Election;
    use v3lockpb::lock_server::Lock;
    let lease_revoke = || unary!(lease, Lease, lease_revoke, pb::LeaseRevokeRequest);
    let lease_ttl = || unary!(lease, Lease, lease_time_to_live, pb::LeaseTimeToLiveRequest);
    let lease_list = || unary!(lease, Lease, lease_leases, pb::LeaseLeasesRequest);
    Router::new()
        .route("/v3/kv/range", unary!(kv, Kv, range, pb::RangeRequest))
        .route("/v3/kv/put", unary!(kv, Kv, put, pb::PutRequest))
        .route(
            "/v3/kv/deleterange",
            unary!(kv, Kv, delete_range, pb::DeleteRangeRequest),
        )
        .route("/v3/kv/txn", unary!(kv, Kv, txn, pb::TxnRequest))
        .route(
            "/v3/kv/compaction",
            unary!(kv, Kv, compact, pb::CompactionRequest),
        )
        .route(
            "/v3/watch",
            post(stream::watch).fallback(method_not_allowed),
        )
        .route(
            "/v3/lease/grant",
            unary!(lease, Lease, lease_grant, pb::LeaseGrantRequest),
        )
        .route("/v3/lease/revoke", lease_revoke())
        .route("/v3/kv/lease/revoke", lease_revoke())
        .route(
            "/v3/lease/keepalive",
            post(stream::keep_alive).fallback(method_not_allowed),
        )
        .route("/v3/lease/timetolive", lease_ttl())
        .route("/v3/kv/lease/timetolive", lease_ttl())
        .route("/v3/lease/leases", lease_list())
        .route("/v3/kv/lease/leases", lease_list())
        .route(
            "/v3/cluster/member/add",
            unary!(cluster, Cluster, member_add, pb::MemberAddRequest),
        )
        .route(
            "/v3/cluster/member/remove",
            unary!(cluster, Cluster, member_remove, pb::MemberRemoveRequest),
        )
        .route(
            "/v3/cluster/member/update",
            unary!(cluster, Cluster, member_update, pb::MemberUpdateRequest),
        )
        .route(
            "/v3/cluster/member/list",
            unary!(cluster, Cluster, member_list, pb::MemberListRequest),
        )
        .route(
            "/v3/cluster/member/promote",
            unary!(cluster, Cluster, member_promote, pb::MemberPromoteRequest),
        )
        .route(
            "/v3/maintenance/alarm",
            unary!(maintenance, Maintenance, alarm, pb::AlarmRequest),
        )
        .route(
            "/v3/maintenance/status",
            unary!(maintenance, Maintenance, status, pb::StatusRequest),
        )
        .route(
            "/v3/maintenance/defragment",
            unary!(maintenance, Maintenance, defragment, pb::DefragmentRequest),
        )
        .route(
            "/v3/maintenance/hash",
            unary!(maintenance, Maintenance, hash, pb::HashRequest),
        )
        .route(
            "/v3/maintenance/hashkv",
            unary!(maintenance, Maintenance, hash_kv, pb::HashKvRequest),
        )
        .route(
            "/v3/maintenance/snapshot",
            post(stream::snapshot).fallback(method_not_allowed),
        )
        .route(
            "/v3/maintenance/transfer-leadership",
            unary!(maintenance, Maintenance, move_leader, pb::MoveLeaderRequest),
        )
        .route(
            "/v3/maintenance/downgrade",
            unary!(maintenance, Maintenance, downgrade, pb::DowngradeRequest),
        )
        .route(
            "/v3/auth/enable",
            unary!(auth, Auth, auth_enable, pb::AuthEnableRequest),
        )
        .route(
            "/v3/auth/disable",
            unary!(auth, Auth, auth_disable, pb::AuthDisableRequest),
        )
        .route(
            "/v3/auth/status",
            unary!(auth, Auth, auth_status, pb::AuthStatusRequest),
        )
        .route(
            "/v3/auth/authenticate",
            unary!(auth, Auth, authenticate, pb::AuthenticateRequest),
        )
        .route(
            "/v3/auth/user/add",
            unary!(auth, Auth, user_add, pb::AuthUserAddRequest),
        )
        .route(
            "/v3/auth/user/get",
            unary!(auth, Auth, user_get, pb::AuthUserGetRequest),
        )
        .route(
            "/v3/auth/user/list",
            unary!(auth, Auth, user_list, pb::AuthUserListRequest),
        )
        .route(
            "/v3/auth/user/delete",
            unary!(auth, Auth, user_delete, pb::AuthUserDeleteRequest),
        )
        .route(
            "/v3/auth/user/changepw",
            unary!(
                auth,
                Auth,
                user_change_password,
                pb::AuthUserChangePasswordRequest
            ),
        )
        .route(
            "/v3/auth/user/grant",
            unary!(auth, Auth, user_grant_role, pb::AuthUserGrantRoleRequest),
        )
        .route(
            "/v3/auth/user/revoke",
            unary!(auth, Auth, user_revoke_role, pb::AuthUserRevokeRoleRequest),
        )
        .route(
            "/v3/auth/role/add",
            unary!(auth, Auth, role_add, pb::AuthRoleAddRequest),
        )
        .route(
            "/v3/auth/role/get",
            unary!(auth, Auth, role_get, pb::AuthRoleGetRequest),
        )
        .route(
            "/v3/auth/role/list",
            unary!(auth, Auth, role_list, pb::AuthRoleListRequest),
        )
        .route(
            "/v3/auth/role/delete",
            unary!(auth, Auth, role_delete, pb::AuthRoleDeleteRequest),
        )
        .route(
            "/v3/auth/role/grant",
            unary!(
                auth,
                Auth,
                role_grant_permission,
                pb::AuthRoleGrantPermissionRequest
            ),
        )
        .route(
            "/v3/auth/role/revoke",
            unary!(
                auth,
                Auth,
                role_revoke_permission,
                pb::AuthRoleRevokePermissionRequest
            ),
        )
        .route(
            "/v3/lock/lock",
            unary!(lock, Lock, lock, v3lockpb::LockRequest),
        )
        .route(
            "/v3/lock/unlock",
            unary!(lock, Lock, unlock, v3lockpb::UnlockRequest),
        )
        .route(
            "/v3/election/campaign",
            unary!(election, Election, campaign, v3electionpb::CampaignRequest),
        )
        .route(
            "/v3/election/proclaim",
            unary!(election, Election, proclaim, v3electionpb::ProclaimRequest),
        )
        .route(
            "/v3/election/leader",
            unary!(election, Election, leader, v3electionpb::LeaderRequest),
        )
        .route(
            "/v3/election/observe",
            post(stream::observe).fallback(method_not_allowed),
        )
        .route(
            "/v3/election/resign",
            unary!(election, Election, resign, v3electionpb::ResignRequest),
        )
        .with_state(services)
}

/// Decodes a unary request's JSON body, calls the service, encodes the answer.
async fn unary<Req, Resp, F, Fut>(request: Request, max_body: usize, call: F) -> Response
where
    Req: DeserializeOwned,
    Resp: Serialize,
    F: FnOnce(tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    let (parts, body) = request.into_parts();
    let message = match axum::body::to_bytes(body, max_body).await {
        Ok(bytes) => match decode::<Req>(&bytes) {
            Ok(message) => message,
            Err(status) => return error(&status),
        },
        Err(e) => return error(&Status::invalid_argument(e.to_string())),
    };
    match call(to_grpc(&parts, message)).await {
        Ok(answer) => json(StatusCode::OK, &answer.into_inner()),
        Err(status) => error(&status),
    }
}

/// A request body's one JSON object; an empty body is the empty message, as for grpc-gateway.
fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Status> {
    let text = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        bytes
    };
    serde_json::from_slice(text).map_err(|e| Status::invalid_argument(e.to_string()))
}

/// The gRPC request the gateway makes of an HTTP one: what names the caller goes along.
fn to_grpc<T>(parts: &Parts, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(value) = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
    {
        request.metadata_mut().insert("authorization", value);
    }
    if let Some(conn) = parts.extensions.get::<ConnInfo>() {
        request.extensions_mut().insert(conn.clone());
    }
    request
}

fn json(status: StatusCode, message: &impl Serialize) -> Response {
    match serde_json::to_vec(message) {
        Ok(body) => (status, [(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => error(&Status::internal(e.to_string())),
    }
}

/// grpc-gateway's error answer.
fn error(status: &Status) -> Response {
    let body = serde_json::json!({
        "code": status.code() as i32,
        "message": status.message(),
    });
    (
        http_status(status.code()),
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn method_not_allowed() -> Response {
    error(&Status::unimplemented("Method Not Allowed"))
}

/// grpc-gateway's HTTP status for a gRPC code.
fn http_status(code: tonic::Code) -> StatusCode {
    use tonic::Code;
    match code {
        Code::Ok => StatusCode::OK,
        // Go's net/http has no name for 499 ("client closed request").
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// A streamed answer: one `{"result": ...}` line per message, `{"error": ...}` to end with an
/// error, as grpc-gateway streams.
fn ndjson_line<T: Serialize>(message: Result<T, Status>) -> bytes::Bytes {
    #[derive(Serialize)]
    #[serde(rename_all = "lowercase")]
    enum Line<T> {
        Result(T),
        Error { code: i32, message: String },
    }
    let line = match message {
        Ok(message) => Line::Result(message),
        Err(status) => Line::Error {
            code: status.code() as i32,
            message: status.message().to_owned(),
        },
    };
    let mut text = serde_json::to_vec(&line).unwrap_or_else(|e| {
        format!(r#"{{"error":{{"code":13,"message":{:?}}}}}"#, e.to_string()).into_bytes()
    });
    text.push(b'\n');
    text.into()
}

/// The body of a streamed answer.
fn stream_body<T, S>(messages: S) -> Response
where
    T: Serialize + Send + 'static,
    S: tokio_stream::Stream<Item = Result<T, Status>> + Send + 'static,
{
    use tokio_stream::StreamExt;
    let lines = messages.map(|m| Ok::<_, std::convert::Infallible>(ndjson_line(m)));
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(lines),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_get_grpc_gateways_http_status() {
        assert_eq!(
            http_status(tonic::Code::InvalidArgument),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            http_status(tonic::Code::PermissionDenied),
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            http_status(tonic::Code::Unauthenticated),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            http_status(tonic::Code::Unimplemented),
            StatusCode::NOT_IMPLEMENTED
        );
        assert_eq!(http_status(tonic::Code::Cancelled).as_u16(), 499);
    }

    #[test]
    fn requests_decode_from_either_field_spelling_and_ignore_unknown_fields() {
        let a: pb::RangeRequest = decode(br#"{"key":"Zm9v","count_only":true}"#).unwrap();
        let b: pb::RangeRequest = decode(br#"{"key":"Zm9v","countOnly":true,"bogus":1}"#).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.key, b"foo");
        assert!(a.count_only);
        let empty: pb::RangeRequest = decode(b" ").unwrap();
        assert_eq!(empty, pb::RangeRequest::default());
        assert_eq!(
            decode::<pb::RangeRequest>(b"not json").unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }

    #[test]
    fn answers_use_the_protos_field_names_and_strings_for_64_bit_numbers() {
        let answer = pb::LeaseGrantResponse {
            header: Some(pb::ResponseHeader {
                cluster_id: 1,
                member_id: 2,
                revision: 3,
                raft_term: 4,
            }),
            id: 5,
            ttl: 30,
            error: String::new(),
        };
        let text = serde_json::to_string(&answer).unwrap();
        assert_eq!(
            text,
            r#"{"header":{"cluster_id":"1","member_id":"2","revision":"3","raft_term":"4"},"ID":"5","TTL":"30"}"#
        );
        let line = ndjson_line::<pb::LeaseGrantResponse>(Err(Status::not_found("gone")));
        assert_eq!(
            &line[..],
            b"{\"error\":{\"code\":5,\"message\":\"gone\"}}\n"
        );
    }
}
