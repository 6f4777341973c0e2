//! The Election service (`v3electionpb.Election`): protobuf to [`crate::concurrency`] and back.

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::ServerInfo;
use super::auth::Callers;
use super::kv::kv_to_pb;
use super::status::{RequestError, through_client};
use crate::auth::Access;
use crate::concurrency::election::Leadership;
use crate::concurrency::{Recipes, holders};
use crate::mvcc::types::KeyRange;
use crate::pb::v3electionpb as pb;

/// Leader updates an Observe stream may have waiting for the client.
const OBSERVE_QUEUE: usize = 16;

pub struct ElectionService {
    recipes: Recipes,
    info: ServerInfo,
    callers: Callers,
}

impl ElectionService {
    pub fn new(recipes: Recipes, info: ServerInfo, callers: Callers) -> Self {
        Self {
            recipes,
            info,
            callers,
        }
    }

    /// etcd runs the recipes with the caller's own token; these are the keys they touch.
    fn check<T>(&self, request: &Request<T>, keys: &KeyRange, write: bool) -> Result<(), Status> {
        let caller = self.callers.of(request).map_err(through_client)?;
        let auth = self.callers.auth();
        let mut needs = vec![Access::Read];
        if write {
            needs.push(Access::Write);
        }
        for access in needs {
            auth.check_keys(caller.as_ref(), keys, access)
                .map_err(|e| through_client(e.into()))?;
        }
        Ok(())
    }
}

fn leadership(leader: Option<pb::LeaderKey>) -> Result<Leadership, RequestError> {
    let leader = leader.ok_or(RequestError::MissingLeaderKey)?;
    Ok(Leadership {
        name: leader.name,
        key: leader.key,
        rev: leader.rev,
        lease: leader.lease,
    })
}

#[tonic::async_trait]
impl pb::election_server::Election for ElectionService {
    async fn campaign(
        &self,
        request: Request<pb::CampaignRequest>,
    ) -> Result<Response<pb::CampaignResponse>, Status> {
        self.check(&request, &holders(&request.get_ref().name), true)?;
        let req = request.into_inner();
        let (leader, revision) = self
            .recipes
            .campaign(&req.name, req.lease, &req.value)
            .await?;
        Ok(Response::new(pb::CampaignResponse {
            header: self.info.header(revision),
            leader: Some(pb::LeaderKey {
                name: leader.name,
                key: leader.key,
                rev: leader.rev,
                lease: leader.lease,
            }),
        }))
    }

    async fn proclaim(
        &self,
        request: Request<pb::ProclaimRequest>,
    ) -> Result<Response<pb::ProclaimResponse>, Status> {
        let leader = leadership(request.get_ref().leader.clone())?;
        self.check(&request, &KeyRange::single(leader.key.clone()), true)?;
        let req = request.into_inner();
        let revision = self.recipes.proclaim(&leader, &req.value).await?;
        Ok(Response::new(pb::ProclaimResponse {
            header: self.info.header(revision),
        }))
    }

    async fn leader(
        &self,
        request: Request<pb::LeaderRequest>,
    ) -> Result<Response<pb::LeaderResponse>, Status> {
        self.check(&request, &holders(&request.get_ref().name), false)?;
        let (revision, kv) = self.recipes.leader(&request.into_inner().name).await?;
        Ok(Response::new(pb::LeaderResponse {
            header: self.info.header(revision),
            kv: Some(kv_to_pb(kv)),
        }))
    }

    type ObserveStream = ReceiverStream<Result<pb::LeaderResponse, Status>>;

    async fn observe(
        &self,
        request: Request<pb::LeaderRequest>,
    ) -> Result<Response<Self::ObserveStream>, Status> {
        self.check(&request, &holders(&request.get_ref().name), false)?;
        let name = request.into_inner().name;
        let (leaders, mut updates) = mpsc::channel(OBSERVE_QUEUE);
        let (out, responses) = mpsc::channel(OBSERVE_QUEUE);
        let recipes = self.recipes.clone();
        let info = self.info.clone();
        tokio::spawn(async move {
            let observing = recipes.observe(&name, leaders);
            tokio::pin!(observing);
            // Once the observer stops (a read failed), what it sent is still delivered; then
            // `updates` ends and so does the stream.
            let mut stopped = false;
            loop {
                tokio::select! {
                    () = &mut observing, if !stopped => stopped = true,
                    () = out.closed() => return,
                    update = updates.recv() => {
                        let Some((revision, kv)) = update else { return };
                        let response = pb::LeaderResponse {
                            header: info.header(revision),
                            kv: Some(kv_to_pb(kv)),
                        };
                        if out.send(Ok(response)).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(responses)))
    }

    async fn resign(
        &self,
        request: Request<pb::ResignRequest>,
    ) -> Result<Response<pb::ResignResponse>, Status> {
        let leader = leadership(request.get_ref().leader.clone())?;
        self.check(&request, &KeyRange::single(leader.key.clone()), true)?;
        let revision = self.recipes.resign(&leader).await?;
        Ok(Response::new(pb::ResignResponse {
            header: self.info.header(revision),
        }))
    }
}
