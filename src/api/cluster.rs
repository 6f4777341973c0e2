//! The Cluster service: one member, this server. Membership changes are meaningless without
//! raft and answer `Unimplemented`.

use tonic::{Request, Response, Status};

use super::ServerInfo;
use super::auth::Callers;
use crate::pb::etcdserverpb as pb;

pub struct ClusterService {
    info: ServerInfo,
    callers: Callers,
}

impl ClusterService {
    pub fn new(info: ServerInfo, callers: Callers) -> Self {
        Self { info, callers }
    }
}

fn unimplemented(what: &str) -> Status {
    Status::unimplemented(format!(
        "etcdsql: {what} is not supported: the cluster has one member per endpoint"
    ))
}

#[tonic::async_trait]
impl pb::cluster_server::Cluster for ClusterService {
    async fn member_add(
        &self,
        _request: Request<pb::MemberAddRequest>,
    ) -> Result<Response<pb::MemberAddResponse>, Status> {
        Err(unimplemented("member add"))
    }

    async fn member_remove(
        &self,
        _request: Request<pb::MemberRemoveRequest>,
    ) -> Result<Response<pb::MemberRemoveResponse>, Status> {
        Err(unimplemented("member remove"))
    }

    async fn member_update(
        &self,
        _request: Request<pb::MemberUpdateRequest>,
    ) -> Result<Response<pb::MemberUpdateResponse>, Status> {
        Err(unimplemented("member update"))
    }

    async fn member_list(
        &self,
        request: Request<pb::MemberListRequest>,
    ) -> Result<Response<pb::MemberListResponse>, Status> {
        self.callers.require_user(&request)?;
        // etcd answers membership from raft, not the key space: its header has no revision.
        Ok(Response::new(pb::MemberListResponse {
            header: self.info.header(0),
            members: vec![pb::Member {
                id: self.info.member_id,
                name: self.info.name.clone(),
                peer_ur_ls: Vec::new(),
                client_ur_ls: self.info.client_urls.clone(),
                is_learner: false,
            }],
        }))
    }

    async fn member_promote(
        &self,
        _request: Request<pb::MemberPromoteRequest>,
    ) -> Result<Response<pb::MemberPromoteResponse>, Status> {
        Err(unimplemented("member promote"))
    }
}
