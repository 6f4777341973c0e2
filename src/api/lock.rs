//! The Lock service (`v3lockpb.Lock`): protobuf to [`crate::concurrency`] and back.

use tonic::{Request, Response, Status};

use super::ServerInfo;
use crate::concurrency::Recipes;
use crate::pb::v3lockpb as pb;

pub struct LockService {
    recipes: Recipes,
    info: ServerInfo,
}

impl LockService {
    pub fn new(recipes: Recipes, info: ServerInfo) -> Self {
        Self { recipes, info }
    }
}

#[tonic::async_trait]
impl pb::lock_server::Lock for LockService {
    async fn lock(
        &self,
        request: Request<pb::LockRequest>,
    ) -> Result<Response<pb::LockResponse>, Status> {
        let req = request.into_inner();
        let held = self.recipes.lock(&req.name, req.lease).await?;
        Ok(Response::new(pb::LockResponse {
            header: self.info.header(held.revision),
            key: held.key,
        }))
    }

    async fn unlock(
        &self,
        request: Request<pb::UnlockRequest>,
    ) -> Result<Response<pb::UnlockResponse>, Status> {
        let revision = self.recipes.unlock(&request.into_inner().key).await?;
        Ok(Response::new(pb::UnlockResponse {
            header: self.info.header(revision),
        }))
    }
}
