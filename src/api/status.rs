//! The one place where errors become gRPC statuses, with etcd's exact codes and messages:
//! etcd clients map errors back by message text, so these strings are part of the protocol.

use tonic::{Code, Status};

use crate::auth::AuthError;
use crate::{auth, concurrency, mvcc};

/// A request that was rejected before reaching the store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    /// A txn op with no request inside it; etcd answers it this way.
    #[error("etcdserver: key not found")]
    EmptyOp,
    #[error("etcdserver: value is provided")]
    ValueProvided,
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps,
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    #[error("etcdserver: request is too large")]
    TooLarge,
    #[error("etcdserver: too large lease TTL")]
    LeaseTtlTooLarge,
    /// An enum value this server does not know.
    #[error("etcdserver: unknown {0} {1}")]
    UnknownEnum(&'static str, i32),
    /// MoveLeader to a member other than this one (the only member there is).
    #[error("etcdserver: bad leader transferee")]
    BadLeaderTransferee,
    #[error("etcdserver: wrong downgrade target version format")]
    WrongDowngradeVersionFormat,
    #[error("etcdserver: invalid downgrade target version")]
    InvalidDowngradeTargetVersion,
    #[error("etcdserver: no inflight downgrade job")]
    NoInflightDowngrade,
    /// An action etcd does not know, in a request that has a fixed set of them.
    #[error("etcdserver: unknown method")]
    UnknownMethod,
    /// Proclaim or Resign without the leadership they act on.
    #[error("\"leader\" field must be provided")]
    MissingLeaderKey,
}

impl From<RequestError> for Status {
    fn from(e: RequestError) -> Self {
        let code = match e {
            RequestError::LeaseTtlTooLarge => Code::OutOfRange,
            RequestError::BadLeaderTransferee => Code::FailedPrecondition,
            RequestError::NoInflightDowngrade => Code::FailedPrecondition,
            // Plain errors in etcd, not statuses.
            RequestError::MissingLeaderKey | RequestError::UnknownMethod => Code::Unknown,
            _ => Code::InvalidArgument,
        };
        Status::new(code, e.to_string())
    }
}

impl From<mvcc::Error> for Status {
    fn from(e: mvcc::Error) -> Self {
        match e {
            mvcc::Error::Compacted => {
                Status::out_of_range("etcdserver: mvcc: required revision has been compacted")
            }
            mvcc::Error::FutureRevision => {
                Status::out_of_range("etcdserver: mvcc: required revision is a future revision")
            }
            mvcc::Error::KeyNotFound => Status::invalid_argument("etcdserver: key not found"),
            e @ mvcc::Error::KeyTooLong { .. } => {
                Status::invalid_argument(format!("etcdserver: {e}"))
            }
            mvcc::Error::LeaseNotFound => {
                Status::not_found("etcdserver: requested lease not found")
            }
            mvcc::Error::LeaseExists => {
                Status::failed_precondition("etcdserver: lease already exists")
            }
            mvcc::Error::Backend(e) => {
                Status::unavailable(format!("etcdserver: storage unavailable: {e}"))
            }
            mvcc::Error::ShuttingDown => Status::unavailable("etcdserver: server stopped"),
            e @ mvcc::Error::Rewound { .. } => Status::unavailable(format!("etcdserver: {e}")),
            mvcc::Error::NoSpace => {
                Status::resource_exhausted("etcdserver: mvcc: database space exceeded")
            }
            mvcc::Error::Corrupt => Status::data_loss("etcdserver: corrupt cluster"),
            e @ mvcc::Error::IndexOutOfSync { .. } => Status::internal(format!("etcdserver: {e}")),
        }
    }
}

impl From<AuthError> for Status {
    fn from(e: AuthError) -> Self {
        let code = match e {
            AuthError::RootUserNotExist
            | AuthError::RootRoleNotExist
            | AuthError::UserAlreadyExist
            | AuthError::UserNotFound
            | AuthError::RoleAlreadyExist
            | AuthError::RoleNotFound
            | AuthError::RoleNotGranted
            | AuthError::PermissionNotGranted
            | AuthError::AuthNotEnabled => Code::FailedPrecondition,
            AuthError::UserEmpty
            | AuthError::RoleEmpty
            | AuthError::AuthFailed
            | AuthError::PermissionNotGiven
            | AuthError::InvalidAuthMgmt
            | AuthError::AuthOldRevision => Code::InvalidArgument,
            AuthError::PermissionDenied => Code::PermissionDenied,
            AuthError::InvalidAuthToken => Code::Unauthenticated,
            // A plain error in etcd, not a status.
            AuthError::NoPasswordUser => Code::Unknown,
        };
        Status::new(code, e.to_string())
    }
}

impl From<auth::Error> for Status {
    fn from(e: auth::Error) -> Self {
        match e {
            auth::Error::Auth(e) => e.into(),
            auth::Error::Backend(e) => mvcc::Error::from(e).into(),
            e @ (auth::Error::Token(_) | auth::Error::Corrupt(_) | auth::Error::Hash(_)) => {
                Status::internal(format!("etcdserver: {e}"))
            }
        }
    }
}

/// An error as etcd's Lock and Election services hand it on: they run through etcd's own client,
/// which turns a status it knows by message into a plain error (code `Unknown`, same message).
pub fn through_client(status: Status) -> Status {
    Status::unknown(status.message())
}

impl From<concurrency::Error> for Status {
    fn from(e: concurrency::Error) -> Self {
        match e {
            // etcd runs locks and elections through its own client, which turns a status it
            // knows by message into a plain error: the caller gets code Unknown with etcd's
            // message. What etcd does not know by message (the database is unreachable) keeps
            // its code.
            concurrency::Error::Store(e) => {
                let known = !matches!(
                    e,
                    mvcc::Error::Backend(_)
                        | mvcc::Error::IndexOutOfSync { .. }
                        | mvcc::Error::Rewound { .. }
                );
                let status = Status::from(e);
                if known {
                    through_client(status)
                } else {
                    status
                }
            }
            e @ (concurrency::Error::SessionExpired
            | concurrency::Error::NotLeader
            | concurrency::Error::NoLeader) => Status::unknown(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_codes_and_messages() {
        let cases: Vec<(Status, Code, &str)> = vec![
            (
                mvcc::Error::Compacted.into(),
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
            ),
            (
                mvcc::Error::FutureRevision.into(),
                Code::OutOfRange,
                "etcdserver: mvcc: required revision is a future revision",
            ),
            (
                mvcc::Error::KeyNotFound.into(),
                Code::InvalidArgument,
                "etcdserver: key not found",
            ),
            (
                RequestError::EmptyKey.into(),
                Code::InvalidArgument,
                "etcdserver: key is not provided",
            ),
            (
                RequestError::TooLarge.into(),
                Code::InvalidArgument,
                "etcdserver: request is too large",
            ),
            (
                mvcc::Error::LeaseNotFound.into(),
                Code::NotFound,
                "etcdserver: requested lease not found",
            ),
            (
                mvcc::Error::LeaseExists.into(),
                Code::FailedPrecondition,
                "etcdserver: lease already exists",
            ),
            (
                RequestError::LeaseTtlTooLarge.into(),
                Code::OutOfRange,
                "etcdserver: too large lease TTL",
            ),
            (
                RequestError::TooManyOps.into(),
                Code::InvalidArgument,
                "etcdserver: too many operations in txn request",
            ),
            (
                RequestError::DuplicateKey.into(),
                Code::InvalidArgument,
                "etcdserver: duplicate key given in txn request",
            ),
            (
                mvcc::Error::NoSpace.into(),
                Code::ResourceExhausted,
                "etcdserver: mvcc: database space exceeded",
            ),
            (
                mvcc::Error::Corrupt.into(),
                Code::DataLoss,
                "etcdserver: corrupt cluster",
            ),
            (
                RequestError::WrongDowngradeVersionFormat.into(),
                Code::InvalidArgument,
                "etcdserver: wrong downgrade target version format",
            ),
            (
                RequestError::InvalidDowngradeTargetVersion.into(),
                Code::InvalidArgument,
                "etcdserver: invalid downgrade target version",
            ),
            (
                RequestError::NoInflightDowngrade.into(),
                Code::FailedPrecondition,
                "etcdserver: no inflight downgrade job",
            ),
            (
                RequestError::BadLeaderTransferee.into(),
                Code::FailedPrecondition,
                "etcdserver: bad leader transferee",
            ),
        ];
        for (status, code, message) in cases {
            assert_eq!(status.code(), code);
            assert_eq!(status.message(), message);
        }
    }
}
