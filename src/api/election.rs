//! The Election service (`v3electionpb.Election`): protobuf to [`crate::concurrency`] and back.

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::ServerInfo;
use super::kv::kv_to_pb;
use super::status::RequestError;
use crate::concurrency::Recipes;
use crate::concurrency::election::Leadership;
use crate::pb::v3electionpb as pb;

/// Leader updates an Observe stream may have waiting for the client.
const OBSERVE_QUEUE: usize = 16;

pub struct ElectionService {
    recipes: Recipes,
    info: ServerInfo,
}

impl ElectionService {
    pub fn new(recipes: Recipes, info: ServerInfo) -> Self {
        Self { recipes, info }
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
        let req = request.into_inner();
        let leader = leadership(req.leader)?;
        let revision = self.recipes.proclaim(&leader, &req.value).await?;
        Ok(Response::new(pb::ProclaimResponse {
            header: self.info.header(revision),
        }))
    }

    async fn leader(
        &self,
        request: Request<pb::LeaderRequest>,
    ) -> Result<Response<pb::LeaderResponse>, Status> {
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
        let leader = leadership(request.into_inner().leader)?;
        let revision = self.recipes.resign(&leader).await?;
        Ok(Response::new(pb::ResignResponse {
            header: self.info.header(revision),
        }))
    }
}
