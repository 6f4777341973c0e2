//! The Lease service: grant, revoke, keep-alive stream, time-to-live, list.

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::ServerInfo;
use super::auth::{Callers, Credentials};
use super::status::RequestError;
use crate::auth::Access;
use crate::lease::{Lessor, MAX_TTL};
use crate::metrics::Metrics;
use crate::pb::etcdserverpb as pb;

/// Keep-alive answers a stream may have waiting for the client.
const KEEPALIVE_QUEUE: usize = 16;

pub struct LeaseService {
    lessor: Lessor,
    info: ServerInfo,
    metrics: Metrics,
    callers: Callers,
}

impl LeaseService {
    pub fn new(lessor: Lessor, info: ServerInfo, metrics: Metrics, callers: Callers) -> Self {
        Self {
            lessor,
            info,
            metrics,
            callers,
        }
    }
}

impl LeaseService {
    /// Serves one keep-alive stream: `inbound` carries the client's requests (gRPC, or the
    /// JSON gateway's body); the stream ends when they do.
    ///
    /// # Errors
    /// Auth is on and the credentials name no user.
    pub fn keep_alive<S>(
        &self,
        credentials: &Credentials,
        mut inbound: S,
    ) -> Result<ReceiverStream<Result<pb::LeaseKeepAliveResponse, Status>>, Status>
    where
        S: Stream<Item = Result<pb::LeaseKeepAliveRequest, Status>> + Unpin + Send + 'static,
    {
        let caller = self.callers.resolve(credentials)?;
        self.callers.auth().check_user(caller.as_ref())?;
        let (out, responses) = mpsc::channel(KEEPALIVE_QUEUE);
        let lessor = self.lessor.clone();
        let info = self.info.clone();
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            // Each request is answered in order; the stream ends when the client closes it.
            while let Some(Ok(req)) = inbound.next().await {
                let answer = match lessor.keep_alive(req.id).await {
                    Ok(kept) => {
                        if kept.value.is_some() {
                            metrics.lease_renewed();
                        }
                        Ok(pb::LeaseKeepAliveResponse {
                            header: info.header(kept.revision),
                            id: req.id,
                            // etcd answers an unknown or expired lease with TTL 0.
                            ttl: kept.value.unwrap_or(0),
                        })
                    }
                    Err(e) => Err(Status::from(e)),
                };
                let failed = answer.is_err();
                if out.send(answer).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(ReceiverStream::new(responses))
    }
}

#[tonic::async_trait]
impl pb::lease_server::Lease for LeaseService {
    async fn lease_grant(
        &self,
        request: Request<pb::LeaseGrantRequest>,
    ) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        self.callers.require_user(&request)?;
        let req = request.into_inner();
        if req.ttl > MAX_TTL {
            return Err(RequestError::LeaseTtlTooLarge.into());
        }
        let out = self.lessor.grant(req.id, req.ttl).await?;
        self.metrics.lease_granted();
        Ok(Response::new(pb::LeaseGrantResponse {
            header: self.info.header(out.revision),
            id: out.value.id,
            ttl: out.value.ttl,
            error: String::new(),
        }))
    }

    async fn lease_revoke(
        &self,
        request: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        let caller = self.callers.of(&request)?;
        self.callers.auth().check_user(caller.as_ref())?;
        let id = request.into_inner().id;
        if self.callers.auth().state().enabled {
            // Revoking deletes the lease's keys: the caller must be allowed to write each.
            let attached = self.lessor.time_to_live(id, true).await?;
            for key in attached.value.map(|l| l.keys).unwrap_or_default() {
                self.callers
                    .auth()
                    .check(caller.as_ref(), &key, &[], Access::Write)?;
            }
        }
        let revision = self.lessor.revoke(id).await?;
        self.metrics.lease_revoked();
        Ok(Response::new(pb::LeaseRevokeResponse {
            header: self.info.header(revision),
        }))
    }

    type LeaseKeepAliveStream = ReceiverStream<Result<pb::LeaseKeepAliveResponse, Status>>;

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        let credentials = Credentials::of(&request);
        Ok(Response::new(
            self.keep_alive(&credentials, request.into_inner())?,
        ))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        self.callers.require_user(&request)?;
        let req = request.into_inner();
        let out = self.lessor.time_to_live(req.id, req.keys).await?;
        let response = match out.value {
            Some(status) => pb::LeaseTimeToLiveResponse {
                header: self.info.header(out.revision),
                id: req.id,
                ttl: status.remaining_ttl,
                granted_ttl: status.granted_ttl,
                keys: status.keys,
            },
            // etcd reports an unknown lease as already expired rather than as an error.
            None => pb::LeaseTimeToLiveResponse {
                header: self.info.header(out.revision),
                id: req.id,
                ttl: -1,
                granted_ttl: 0,
                keys: Vec::new(),
            },
        };
        Ok(Response::new(response))
    }

    async fn lease_leases(
        &self,
        request: Request<pb::LeaseLeasesRequest>,
    ) -> Result<Response<pb::LeaseLeasesResponse>, Status> {
        self.callers.require_user(&request)?;
        let out = self.lessor.leases().await?;
        Ok(Response::new(pb::LeaseLeasesResponse {
            header: self.info.header(out.revision),
            leases: out
                .value
                .into_iter()
                .map(|id| pb::LeaseStatus { id })
                .collect(),
        }))
    }
}
