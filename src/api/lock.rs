//! The Lock service (`v3lockpb.Lock`): protobuf to [`crate::concurrency`] and back.

use tonic::{Request, Response, Status};

use super::ServerInfo;
use super::auth::Callers;
use super::status::through_client;
use crate::auth::Access;
use crate::concurrency::{Recipes, holders};
use crate::pb::v3lockpb as pb;

pub struct LockService {
    recipes: Recipes,
    info: ServerInfo,
    callers: Callers,
}

impl LockService {
    pub fn new(recipes: Recipes, info: ServerInfo, callers: Callers) -> Self {
        Self {
            recipes,
            info,
            callers,
        }
    }
}

#[tonic::async_trait]
impl pb::lock_server::Lock for LockService {
    async fn lock(
        &self,
        request: Request<pb::LockRequest>,
    ) -> Result<Response<pb::LockResponse>, Status> {
        let caller = self.callers.of(&request).map_err(through_client)?;
        let req = request.into_inner();
        // etcd runs the recipe with the caller's own token: it reads and writes the holders.
        let holders = holders(&req.name);
        for access in [Access::Read, Access::Write] {
            self.callers
                .auth()
                .check_keys(caller.as_ref(), &holders, access)
                .map_err(|e| through_client(e.into()))?;
        }
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
        let caller = self.callers.of(&request).map_err(through_client)?;
        let key = request.into_inner().key;
        self.callers
            .auth()
            .check(caller.as_ref(), &key, &[], Access::Write)
            .map_err(|e| through_client(e.into()))?;
        let revision = self.recipes.unlock(&key).await?;
        Ok(Response::new(pb::UnlockResponse {
            header: self.info.header(revision),
        }))
    }
}
