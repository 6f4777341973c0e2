//! etcd's gRPC services and HTTP endpoints: protobuf in, domain types to the store, protobuf out.
//!
//! Requests are validated here, once, as they are converted; errors become `tonic::Status` only
//! in [`status`].

pub mod auth;
pub mod cluster;
pub mod codec;
pub mod election;
pub mod gateway;
pub mod http;
pub mod kv;
pub mod lease;
pub mod lock;
pub mod maintenance;
pub mod status;
pub mod watch;

use crate::pb::etcdserverpb::ResponseHeader;

/// What this server says about itself in every response, fixed at start-up.
#[derive(Clone, Debug)]
pub struct ServerInfo {
    /// Chosen once per database, so every instance and restart reports the same cluster.
    pub cluster_id: u64,
    /// Derived from the cluster id and member name: stable across restarts, never 0.
    pub member_id: u64,
    pub name: String,
    pub client_urls: Vec<String>,
    /// The etcd version this server claims to be (clients switch features on it).
    pub version: String,
    pub max_request_bytes: usize,
    pub max_txn_ops: usize,
}

/// etcd reports the raft term; with no raft, one term that never changes is the honest answer.
pub const RAFT_TERM: u64 = 1;

impl ServerInfo {
    pub fn header(&self, revision: i64) -> Option<ResponseHeader> {
        Some(ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.member_id,
            revision,
            raft_term: RAFT_TERM,
        })
    }

    /// The version of the cluster as etcd reports it: major.minor.0.
    pub fn cluster_version(&self) -> String {
        let mut parts = self.version.split('.');
        let major = parts.next().unwrap_or("3");
        let minor = parts.next().unwrap_or("5");
        format!("{major}.{minor}.0")
    }

    /// Rejects a request whose encoding exceeds `--max-request-bytes`, as etcd does.
    pub fn check_size(&self, message: &impl prost::Message) -> Result<(), status::RequestError> {
        if message.encoded_len() > self.max_request_bytes {
            Err(status::RequestError::TooLarge)
        } else {
            Ok(())
        }
    }
}

/// A member id that depends only on the cluster and the member's name.
pub fn member_id(cluster_id: u64, name: &str) -> u64 {
    // FNV-1a: stable across Rust versions, unlike the std hasher.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in cluster_id.to_be_bytes().iter().chain(name.as_bytes()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_id_is_stable_and_non_zero() {
        assert_eq!(member_id(42, "default"), member_id(42, "default"));
        assert_ne!(member_id(42, "default"), member_id(43, "default"));
        assert_ne!(member_id(42, "default"), 0);
    }
}
