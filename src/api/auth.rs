//! The Auth service, and how every service learns who is calling.
//!
//! A caller is named by a token in the `token` gRPC metadata (`authorization` from the JSON
//! gateway), or, with `--client-cert-auth`, by its certificate's CommonName when it sends no
//! token — etcd's order. Auth management is root's, except that a user may read its own record
//! and the roles it has, as in etcd.

use tonic::{Request, Response, Status};

use super::ServerInfo;
use crate::auth::{AuthError, AuthInfo, AuthStore};
use crate::listener::ConnInfo;
use crate::mvcc::Store;
use crate::pb::etcdserverpb as pb;

/// Who is calling, as far as auth is concerned.
#[derive(Clone)]
pub struct Callers {
    auth: AuthStore,
    client_cert_auth: bool,
}

/// What a request carries that can name a user.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    token: Option<String>,
    certificate: Option<String>,
}

impl Credentials {
    pub fn of<T>(request: &Request<T>) -> Self {
        let metadata = request.metadata();
        let token = metadata
            .get("token")
            .or_else(|| metadata.get("authorization"))
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let certificate = request
            .extensions()
            .get::<ConnInfo>()
            .and_then(|c| c.certificate_name.as_deref().map(str::to_owned));
        Self { token, certificate }
    }
}

impl Callers {
    pub fn new(auth: AuthStore, client_cert_auth: bool) -> Self {
        Self {
            auth,
            client_cert_auth,
        }
    }

    pub fn auth(&self) -> &AuthStore {
        &self.auth
    }

    /// The caller of `request`: `None` while auth is off, or when it carries neither a token
    /// nor (with `--client-cert-auth`) a certificate.
    ///
    /// # Errors
    /// `etcdserver: invalid auth token` for a token that is unknown or expired.
    pub fn of<T>(&self, request: &Request<T>) -> Result<Option<AuthInfo>, Status> {
        Ok(self.resolve(&Credentials::of(request))?)
    }

    /// Who `credentials` name, now (a stream resolves them again at each request it carries,
    /// so a token that expired or was revoked stops working mid-stream).
    ///
    /// # Errors
    /// `InvalidAuthToken` for a token that is unknown or expired.
    pub fn resolve(&self, credentials: &Credentials) -> Result<Option<AuthInfo>, AuthError> {
        if let Some(info) = self.auth.info_from_token(credentials.token.as_deref())? {
            return Ok(Some(info));
        }
        if let (None, true, Some(name)) = (
            &credentials.token,
            self.client_cert_auth,
            &credentials.certificate,
        ) {
            return Ok(self.auth.info_from_certificate(name));
        }
        Ok(None)
    }

    /// Checks that `request` names a user (while auth is on).
    ///
    /// # Errors
    /// An invalid token, or no caller.
    pub fn require_user<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let caller = self.of(request)?;
        Ok(self.auth.check_user(caller.as_ref())?)
    }

    /// As [`Callers::require_admin`], with the error as etcd's Maintenance service hands it on
    /// for Defragment, Hash, HashKV and Snapshot: untranslated, code `Unknown`, `auth: ...`.
    ///
    /// # Errors
    /// As [`Callers::require_admin`].
    pub fn require_admin_untranslated<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let untranslated = |e: AuthError| Status::unknown(e.raw_message());
        let caller = self
            .resolve(&Credentials::of(request))
            .map_err(untranslated)?;
        self.auth.check_admin(caller.as_ref()).map_err(untranslated)
    }

    /// Checks that the caller of `request` is root (while auth is on).
    ///
    /// # Errors
    /// An invalid token, no caller, or a caller without the root role.
    pub fn require_admin<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let caller = self.of(request)?;
        Ok(self.auth.check_admin(caller.as_ref())?)
    }
}

pub struct AuthService {
    callers: Callers,
    store: Store,
    info: ServerInfo,
}

impl AuthService {
    pub fn new(callers: Callers, store: Store, info: ServerInfo) -> Self {
        Self {
            callers,
            store,
            info,
        }
    }

    fn auth(&self) -> &AuthStore {
        self.callers.auth()
    }

    /// The header of an answer: the store's current revision.
    async fn header(&self) -> Result<Option<pb::ResponseHeader>, Status> {
        Ok(self.info.header(self.store.revisions().await?.current))
    }
}

#[tonic::async_trait]
impl pb::auth_server::Auth for AuthService {
    async fn auth_enable(
        &self,
        request: Request<pb::AuthEnableRequest>,
    ) -> Result<Response<pb::AuthEnableResponse>, Status> {
        self.callers.require_admin(&request)?;
        self.auth().enable().await?;
        Ok(Response::new(pb::AuthEnableResponse {
            header: self.header().await?,
        }))
    }

    async fn auth_disable(
        &self,
        request: Request<pb::AuthDisableRequest>,
    ) -> Result<Response<pb::AuthDisableResponse>, Status> {
        self.callers.require_admin(&request)?;
        self.auth().disable().await?;
        Ok(Response::new(pb::AuthDisableResponse {
            header: self.header().await?,
        }))
    }

    async fn auth_status(
        &self,
        request: Request<pb::AuthStatusRequest>,
    ) -> Result<Response<pb::AuthStatusResponse>, Status> {
        self.callers.require_admin(&request)?;
        let state = self.auth().state();
        Ok(Response::new(pb::AuthStatusResponse {
            header: self.header().await?,
            enabled: state.enabled,
            auth_revision: u64::try_from(state.revision).unwrap_or(0),
        }))
    }

    async fn authenticate(
        &self,
        request: Request<pb::AuthenticateRequest>,
    ) -> Result<Response<pb::AuthenticateResponse>, Status> {
        let req = request.into_inner();
        let token = self.auth().authenticate(&req.name, &req.password).await?;
        Ok(Response::new(pb::AuthenticateResponse {
            header: self.header().await?,
            token,
        }))
    }

    async fn user_add(
        &self,
        request: Request<pb::AuthUserAddRequest>,
    ) -> Result<Response<pb::AuthUserAddResponse>, Status> {
        self.callers.require_admin(&request)?;
        let req = request.into_inner();
        let no_password = req.options.is_some_and(|o| o.no_password);
        self.auth()
            .user_add(&req.name, &req.password, no_password)
            .await?;
        Ok(Response::new(pb::AuthUserAddResponse {
            header: self.header().await?,
        }))
    }

    async fn user_get(
        &self,
        request: Request<pb::AuthUserGetRequest>,
    ) -> Result<Response<pb::AuthUserGetResponse>, Status> {
        let caller = self.callers.of(&request)?;
        let name = &request.get_ref().name;
        // A user may read its own record.
        if caller.as_ref().is_none_or(|c| &c.user != name) {
            self.auth().check_admin(caller.as_ref())?;
        }
        let roles = self.auth().state().user(name)?.roles.clone();
        Ok(Response::new(pb::AuthUserGetResponse {
            header: self.header().await?,
            roles,
        }))
    }

    async fn user_list(
        &self,
        request: Request<pb::AuthUserListRequest>,
    ) -> Result<Response<pb::AuthUserListResponse>, Status> {
        self.callers.require_admin(&request)?;
        let users = self.auth().state().users.keys().cloned().collect();
        Ok(Response::new(pb::AuthUserListResponse {
            header: self.header().await?,
            users,
        }))
    }

    async fn user_delete(
        &self,
        request: Request<pb::AuthUserDeleteRequest>,
    ) -> Result<Response<pb::AuthUserDeleteResponse>, Status> {
        self.callers.require_admin(&request)?;
        self.auth().user_delete(&request.get_ref().name).await?;
        Ok(Response::new(pb::AuthUserDeleteResponse {
            header: self.header().await?,
        }))
    }

    async fn user_change_password(
        &self,
        request: Request<pb::AuthUserChangePasswordRequest>,
    ) -> Result<Response<pb::AuthUserChangePasswordResponse>, Status> {
        self.callers.require_admin(&request)?;
        let req = request.into_inner();
        self.auth()
            .user_change_password(&req.name, &req.password)
            .await?;
        Ok(Response::new(pb::AuthUserChangePasswordResponse {
            header: self.header().await?,
        }))
    }

    async fn user_grant_role(
        &self,
        request: Request<pb::AuthUserGrantRoleRequest>,
    ) -> Result<Response<pb::AuthUserGrantRoleResponse>, Status> {
        self.callers.require_admin(&request)?;
        let req = request.into_inner();
        self.auth().user_grant_role(&req.user, &req.role).await?;
        Ok(Response::new(pb::AuthUserGrantRoleResponse {
            header: self.header().await?,
        }))
    }

    async fn user_revoke_role(
        &self,
        request: Request<pb::AuthUserRevokeRoleRequest>,
    ) -> Result<Response<pb::AuthUserRevokeRoleResponse>, Status> {
        self.callers.require_admin(&request)?;
        let req = request.into_inner();
        self.auth().user_revoke_role(&req.name, &req.role).await?;
        Ok(Response::new(pb::AuthUserRevokeRoleResponse {
            header: self.header().await?,
        }))
    }

    async fn role_add(
        &self,
        request: Request<pb::AuthRoleAddRequest>,
    ) -> Result<Response<pb::AuthRoleAddResponse>, Status> {
        self.callers.require_admin(&request)?;
        self.auth().role_add(&request.get_ref().name).await?;
        Ok(Response::new(pb::AuthRoleAddResponse {
            header: self.header().await?,
        }))
    }

    async fn role_get(
        &self,
        request: Request<pb::AuthRoleGetRequest>,
    ) -> Result<Response<pb::AuthRoleGetResponse>, Status> {
        let caller = self.callers.of(&request)?;
        let role = &request.get_ref().role;
        let state = self.auth().state();
        // A user may read the roles it has.
        let own = caller.as_ref().is_some_and(|c| {
            state
                .users
                .get(&c.user)
                .is_some_and(|u| u.roles.iter().any(|r| r == role))
        });
        if !own {
            self.auth().check_admin(caller.as_ref())?;
        }
        let perm = state.role(role)?.key_permission.clone();
        Ok(Response::new(pb::AuthRoleGetResponse {
            header: self.header().await?,
            perm,
        }))
    }

    async fn role_list(
        &self,
        request: Request<pb::AuthRoleListRequest>,
    ) -> Result<Response<pb::AuthRoleListResponse>, Status> {
        self.callers.require_admin(&request)?;
        let roles = self.auth().state().roles.keys().cloned().collect();
        Ok(Response::new(pb::AuthRoleListResponse {
            header: self.header().await?,
            roles,
        }))
    }

    async fn role_delete(
        &self,
        request: Request<pb::AuthRoleDeleteRequest>,
    ) -> Result<Response<pb::AuthRoleDeleteResponse>, Status> {
        self.callers.require_admin(&request)?;
        self.auth().role_delete(&request.get_ref().role).await?;
        Ok(Response::new(pb::AuthRoleDeleteResponse {
            header: self.header().await?,
        }))
    }

    async fn role_grant_permission(
        &self,
        request: Request<pb::AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<pb::AuthRoleGrantPermissionResponse>, Status> {
        self.callers.require_admin(&request)?;
        let req = request.into_inner();
        self.auth()
            .role_grant_permission(&req.name, req.perm)
            .await?;
        Ok(Response::new(pb::AuthRoleGrantPermissionResponse {
            header: self.header().await?,
        }))
    }

    async fn role_revoke_permission(
        &self,
        request: Request<pb::AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<pb::AuthRoleRevokePermissionResponse>, Status> {
        self.callers.require_admin(&request)?;
        let req = request.into_inner();
        self.auth()
            .role_revoke_permission(&req.role, &req.key, &req.range_end)
            .await?;
        Ok(Response::new(pb::AuthRoleRevokePermissionResponse {
            header: self.header().await?,
        }))
    }
}
