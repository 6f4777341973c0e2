//! The Maintenance service: Status, Alarm (NOSPACE and CORRUPT, [`crate::mvcc::alarm`]),
//! HashKV (etcd's own hash, so the same history hashes alike on etcd and etcdsql), Hash,
//! Defragment, MoveLeader (this member is the only one, and always the leader) and Downgrade
//! (there is never a version to downgrade to) and Snapshot (a consistent SQLite copy of the
//! store and its SHA-256, [`crate::snapshot`]). While auth is on, everything but Alarm is
//! root's, as in etcd (which words Defragment's, Hash's, HashKV's and Snapshot's refusals as
//! its auth package does: `auth: permission denied`, code `Unknown`).

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::auth::Callers;
use super::status::RequestError;
use super::{RAFT_TERM, ServerInfo};
use crate::mvcc::Store;
use crate::pb::etcdserverpb as pb;
use crate::snapshot;

pub struct MaintenanceService {
    store: Store,
    info: ServerInfo,
    callers: Callers,
}

impl MaintenanceService {
    pub fn new(store: Store, info: ServerInfo, callers: Callers) -> Self {
        Self {
            store,
            info,
            callers,
        }
    }
}

/// Snapshot chunks a stream may have waiting for the client.
const SNAPSHOT_QUEUE: usize = 4;
/// Bytes per snapshot message (etcd sends 32 KiB).
const SNAPSHOT_CHUNK: usize = 32 * 1024;

/// Streams the database file at `path` in chunks, then its SHA-256, as etcd streams its
/// snapshots.
async fn send_snapshot(
    path: &std::path::Path,
    header: Option<pb::ResponseHeader>,
    version: &str,
    out: &mpsc::Sender<Result<pb::SnapshotResponse, Status>>,
) -> Result<(), Status> {
    use sha2::Digest;
    use tokio::io::AsyncReadExt;
    let unreadable = |e: std::io::Error| Status::internal(format!("etcdserver: snapshot: {e}"));
    let mut file = tokio::fs::File::open(path).await.map_err(unreadable)?;
    let total = file.metadata().await.map_err(unreadable)?.len();
    let mut hasher = sha2::Sha256::new();
    let mut sent = 0_u64;
    loop {
        let mut blob = vec![0; SNAPSHOT_CHUNK];
        let mut filled = 0;
        while filled < blob.len() {
            let n = file.read(&mut blob[filled..]).await.map_err(unreadable)?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        if filled == 0 {
            break;
        }
        blob.truncate(filled);
        hasher.update(&blob);
        sent += filled as u64;
        let chunk = pb::SnapshotResponse {
            header,
            remaining_bytes: total.saturating_sub(sent),
            blob,
            version: version.to_owned(),
        };
        if out.send(Ok(chunk)).await.is_err() {
            return Ok(());
        }
    }
    let checksum = pb::SnapshotResponse {
        header,
        remaining_bytes: 0,
        blob: hasher.finalize().to_vec(),
        version: version.to_owned(),
    };
    let _ = out.send(Ok(checksum)).await;
    Ok(())
}

fn snapshot_status(e: snapshot::Error) -> Status {
    match e {
        snapshot::Error::Backend(e) => crate::mvcc::Error::from(e).into(),
        e => Status::internal(format!("etcdserver: snapshot: {e}")),
    }
}

/// An alarm as etcd's `AlarmMember.String()` prints it.
fn alarm_text(member_id: u64, alarm: i32) -> String {
    let name = pb::AlarmType::try_from(alarm).map_or("UNKNOWN", |a| a.as_str_name());
    format!("memberID:{member_id} alarm:{name} ")
}

#[tonic::async_trait]
impl pb::maintenance_server::Maintenance for MaintenanceService {
    async fn alarm(
        &self,
        request: Request<pb::AlarmRequest>,
    ) -> Result<Response<pb::AlarmResponse>, Status> {
        use pb::alarm_request::AlarmAction;
        self.callers.require_user(&request)?;
        let req = request.into_inner();
        let member = |alarm| pb::AlarmMember {
            member_id: self.info.member_id,
            alarm,
        };
        // As etcd: GET lists every alarm; ACTIVATE and DEACTIVATE answer with the alarm they
        // changed, and with nothing when there was nothing to change (or the alarm is NONE).
        let alarms = match AlarmAction::try_from(req.action) {
            Ok(AlarmAction::Get) => self
                .store
                .alarms()
                .into_iter()
                .filter(|&a| req.alarm == pb::AlarmType::None as i32 || a == req.alarm)
                .map(member)
                .collect(),
            Ok(action) => {
                let raise = action == AlarmAction::Activate;
                if req.alarm == pb::AlarmType::None as i32 {
                    Vec::new()
                } else if pb::AlarmType::try_from(req.alarm).is_err() {
                    return Err(RequestError::UnknownEnum("alarm type", req.alarm).into());
                } else if self.store.set_alarm(req.alarm, raise).await? || raise {
                    vec![member(req.alarm)]
                } else {
                    Vec::new()
                }
            }
            Err(_) => return Err(RequestError::UnknownEnum("alarm action", req.action).into()),
        };
        let revisions = self.store.revisions().await?;
        Ok(Response::new(pb::AlarmResponse {
            header: self.info.header(revisions.current),
            alarms,
        }))
    }

    async fn status(
        &self,
        request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        self.callers.require_admin(&request)?;
        let revisions = self.store.revisions().await?;
        let size = self.store.size().await?;
        let index = u64::try_from(revisions.current).unwrap_or_default();
        Ok(Response::new(pb::StatusResponse {
            header: self.info.header(revisions.current),
            version: self.info.version.clone(),
            db_size: size.total,
            leader: self.info.member_id,
            raft_index: index,
            raft_term: RAFT_TERM,
            raft_applied_index: index,
            // etcd lists the alarms raised here, as their text form.
            errors: self
                .store
                .alarms()
                .into_iter()
                .map(|alarm| alarm_text(self.info.member_id, alarm))
                .collect(),
            db_size_in_use: size.in_use,
            is_learner: false,
            ..Default::default()
        }))
    }

    async fn defragment(
        &self,
        request: Request<pb::DefragmentRequest>,
    ) -> Result<Response<pb::DefragmentResponse>, Status> {
        self.callers.require_admin_untranslated(&request)?;
        self.store.defragment().await?;
        let revisions = self.store.revisions().await?;
        Ok(Response::new(pb::DefragmentResponse {
            header: self.info.header(revisions.current),
        }))
    }

    async fn hash(
        &self,
        request: Request<pb::HashRequest>,
    ) -> Result<Response<pb::HashResponse>, Status> {
        self.callers.require_admin_untranslated(&request)?;
        let (hash, current) = self.store.hash_log().await?;
        Ok(Response::new(pb::HashResponse {
            header: self.info.header(current),
            hash,
        }))
    }

    async fn hash_kv(
        &self,
        request: Request<pb::HashKvRequest>,
    ) -> Result<Response<pb::HashKvResponse>, Status> {
        self.callers.require_admin_untranslated(&request)?;
        let out = self.store.hash_kv(request.get_ref().revision).await?;
        Ok(Response::new(pb::HashKvResponse {
            header: self.info.header(out.current),
            hash: out.hash,
            compact_revision: out.compact_revision,
            hash_revision: out.revision,
        }))
    }

    type SnapshotStream = ReceiverStream<Result<pb::SnapshotResponse, Status>>;

    async fn snapshot(
        &self,
        request: Request<pb::SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        self.callers.require_admin_untranslated(&request)?;
        let revision = self.store.revisions().await?.current;
        let (dir, path) = snapshot::take(self.store.backend())
            .await
            .map_err(snapshot_status)?;
        let header = self.info.header(revision);
        let version = self.info.version.clone();
        let (out, responses) = mpsc::channel(SNAPSHOT_QUEUE);
        tokio::spawn(async move {
            // The copy lives in `dir` until everything is sent.
            let _dir = dir;
            if let Err(e) = send_snapshot(&path, header, &version, &out).await {
                let _ = out.send(Err(e)).await;
            }
        });
        Ok(Response::new(ReceiverStream::new(responses)))
    }

    async fn move_leader(
        &self,
        request: Request<pb::MoveLeaderRequest>,
    ) -> Result<Response<pb::MoveLeaderResponse>, Status> {
        self.callers.require_admin(&request)?;
        // Leadership can only move to this member, which has it already.
        if request.get_ref().target_id != self.info.member_id {
            return Err(RequestError::BadLeaderTransferee.into());
        }
        let revisions = self.store.revisions().await?;
        Ok(Response::new(pb::MoveLeaderResponse {
            header: self.info.header(revisions.current),
        }))
    }

    async fn downgrade(
        &self,
        request: Request<pb::DowngradeRequest>,
    ) -> Result<Response<pb::DowngradeResponse>, Status> {
        self.callers.require_admin(&request)?;
        use pb::downgrade_request::DowngradeAction;
        let req = request.into_inner();
        // etcdsql answers as an etcd with no version to downgrade to: its data has no format
        // that an older etcd would need, so there is never a downgrade job to validate, start
        // or cancel. Requests are still checked as etcd checks them, in etcd's order.
        Err(match DowngradeAction::try_from(req.action) {
            Ok(DowngradeAction::Validate | DowngradeAction::Enable) => {
                if cluster_version(&req.version).is_none() {
                    RequestError::WrongDowngradeVersionFormat
                } else {
                    RequestError::InvalidDowngradeTargetVersion
                }
            }
            Ok(DowngradeAction::Cancel) => RequestError::NoInflightDowngrade,
            Err(_) => RequestError::UnknownMethod,
        }
        .into())
    }
}

/// The major.minor a downgrade target names, read as etcd reads it: a semantic version
/// (`3.4.0`, `3.4.1-rc.0+build`) or just `major.minor`.
fn cluster_version(version: &str) -> Option<(u64, u64)> {
    let semver = |v: &str| -> Option<(u64, u64)> {
        // Build metadata and a pre-release tag do not count; the rest is exactly three numbers.
        let core = v.split_once('+').map_or(v, |(core, _)| core);
        let core = core.split_once('-').map_or(core, |(core, _)| core);
        let parts: Vec<&str> = core.split('.').collect();
        let numbers: Option<Vec<u64>> = parts
            .iter()
            .map(|p| {
                (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| p.parse().ok())
                    .flatten()
            })
            .collect();
        match numbers?.as_slice() {
            [major, minor, _patch] => Some((*major, *minor)),
            _ => None,
        }
    };
    semver(version).or_else(|| semver(&format!("{version}.0")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downgrade_targets_are_semantic_versions_or_major_minor() {
        assert_eq!(cluster_version("3.4"), Some((3, 4)));
        assert_eq!(cluster_version("3.4.0"), Some((3, 4)));
        assert_eq!(cluster_version("3.4.1-rc.0+build.5"), Some((3, 4)));
        for wrong in ["", "3", "v3.4", "3.4.x", "3..4", "3.4.0.1", "three.four"] {
            assert_eq!(cluster_version(wrong), None, "{wrong:?}");
        }
    }
}
