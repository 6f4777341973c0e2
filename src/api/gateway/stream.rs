//! The gateway's streams: a request body read as a sequence of JSON objects as they arrive,
//! and answers written one JSON line per message.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::{Services, error, stream_body, to_grpc};
use crate::api::auth::Credentials;
use crate::pb::etcdserverpb as pb;
use crate::pb::v3electionpb;

/// Decoded requests a stream may have waiting for its service.
const INBOUND_QUEUE: usize = 16;

/// The JSON objects of `body`, decoded as they arrive. A malformed one ends the requests, as
/// the end of the body does (grpc-gateway's way): the answers go on.
fn json_objects<T>(body: Body) -> ReceiverStream<Result<T, Status>>
where
    T: DeserializeOwned + Send + 'static,
{
    let (sender, objects) = mpsc::channel(INBOUND_QUEUE);
    tokio::spawn(async move {
        let mut chunks = body.into_data_stream();
        let mut buffer: Vec<u8> = Vec::new();
        loop {
            // Every complete object in the buffer first.
            let mut parsed = serde_json::Deserializer::from_slice(&buffer).into_iter::<T>();
            match parsed.next() {
                Some(Ok(object)) => {
                    let used = parsed.byte_offset();
                    buffer.drain(..used);
                    if sender.send(Ok(object)).await.is_err() {
                        return;
                    }
                    continue;
                }
                Some(Err(e)) if !e.is_eof() => {
                    let _ = sender
                        .send(Err(Status::invalid_argument(e.to_string())))
                        .await;
                    return;
                }
                // Only whitespace, or an object not complete yet: read on.
                _ => {}
            }
            match chunks.next().await {
                Some(Ok(chunk)) => buffer.extend_from_slice(&chunk),
                Some(Err(_)) => return,
                None => {
                    if !buffer.iter().all(u8::is_ascii_whitespace) {
                        let _ = sender
                            .send(Err(Status::invalid_argument(
                                "unexpected end of JSON input",
                            )))
                            .await;
                    }
                    return;
                }
            }
        }
    });
    ReceiverStream::new(objects)
}

pub(super) async fn watch(State(services): State<Services>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let credentials = Credentials::of(&to_grpc(&parts, ()));
    let inbound = json_objects::<pb::WatchRequest>(body);
    stream_body(services.watch.open(credentials, inbound))
}

pub(super) async fn keep_alive(State(services): State<Services>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let credentials = Credentials::of(&to_grpc(&parts, ()));
    let inbound = json_objects::<pb::LeaseKeepAliveRequest>(body);
    match services.lease.keep_alive(&credentials, inbound) {
        Ok(answers) => stream_body(answers),
        Err(status) => error(&status),
    }
}

pub(super) async fn observe(State(services): State<Services>, request: Request) -> Response {
    use v3electionpb::election_server::Election;
    let (parts, body) = request.into_parts();
    let message = match axum::body::to_bytes(body, services.max_body).await {
        Ok(bytes) => super::decode::<v3electionpb::LeaderRequest>(&bytes),
        Err(e) => Err(Status::invalid_argument(e.to_string())),
    };
    let message = match message {
        Ok(message) => message,
        Err(status) => return error(&status),
    };
    match services.election.observe(to_grpc(&parts, message)).await {
        Ok(answer) => stream_body(answer.into_inner()),
        Err(status) => error(&status),
    }
}

pub(super) async fn snapshot(State(services): State<Services>, request: Request) -> Response {
    use pb::maintenance_server::Maintenance;
    let (parts, _) = request.into_parts();
    match services
        .maintenance
        .snapshot(to_grpc(&parts, pb::SnapshotRequest {}))
        .await
    {
        Ok(answer) => stream_body(answer.into_inner()),
        Err(status) => error(&status),
    }
}
