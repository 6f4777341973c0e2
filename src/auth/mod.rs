//! etcd's auth: users with bcrypt-hashed passwords, roles with key-range permissions, the
//! `root` user and role, tokens, and the checks every request passes while auth is on.
//!
//! # Invariants
//! - **The database holds the truth.** Users, roles, the on/off flag and the auth revision live
//!   in the database ([`backend::AuthRecords`]), so they survive restarts and every instance on
//!   one database shares them. Each process keeps a copy, replaced whole: a check reads one
//!   consistent state.
//! - **Changes are compare-and-set on the auth version** (on/off and revision). A change is
//!   computed on the copy and written only if the database is still at the copy's version;
//!   otherwise the copy is reloaded and the change computed again. So changes from several instances apply one at a
//!   time, each to the state the one before it left, and each is one new revision.
//! - **Other instances' changes arrive within [`REFRESH`].** Processes that may share their
//!   database poll its auth version and reload when it moves; a sole writer (SQLite) never
//!   needs to.
//! - **Checks follow etcd's order**: auth off → allowed; no user → `user name is empty`; a
//!   JWT older than the auth revision → `revision of auth store is old` (clients then
//!   authenticate again); then the user's roles (root may do anything).

mod requests;
pub mod state;
pub mod token;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use prost::Message;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::{self, AuthRecords, AuthVersion, Backend};
use crate::pb::authpb;
pub use state::{Access, AuthError, AuthState, ROOT};
use token::Tokens;
pub use token::{AuthInfo, TokenKind};

/// How often a process that shares its database looks for other instances' auth changes.
pub const REFRESH: Duration = Duration::from_secs(1);

/// What the auth store is started with (etcd's flags).
#[derive(Clone, Debug)]
pub struct Options {
    pub token: TokenKind,
    pub simple_token_ttl: Duration,
    pub bcrypt_cost: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error(transparent)]
    Backend(#[from] backend::Error),
    #[error(transparent)]
    Token(#[from] token::Error),
    /// The database holds a record that is not an authpb record.
    #[error("the auth store holds an unreadable record for {0:?}")]
    Corrupt(String),
    #[error("password hashing failed: {0}")]
    Hash(String),
}

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Clone)]
pub struct AuthStore {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Arc<dyn Backend>,
    state: RwLock<Arc<AuthState>>,
    tokens: Tokens,
    bcrypt_cost: u32,
    /// Local changes one at a time: concurrent ones would only fail each other's compare.
    changing: tokio::sync::Mutex<()>,
}

impl AuthStore {
    /// Loads the auth store; if other processes may change it, follows their changes on
    /// `tasks` until `shutdown`.
    ///
    /// # Errors
    /// The database cannot be read, holds unreadable records, or a JWT key is bad.
    pub async fn start(
        backend: Arc<dyn Backend>,
        options: &Options,
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Result<Self> {
        let state = decode(backend.auth().await?)?;
        let store = AuthStore {
            inner: Arc::new(Inner {
                backend,
                state: RwLock::new(Arc::new(state)),
                tokens: Tokens::new(&options.token, options.simple_token_ttl)?,
                bcrypt_cost: options.bcrypt_cost,
                changing: tokio::sync::Mutex::new(()),
            }),
        };
        if !store.inner.backend.sole_writer() {
            tasks.spawn(follow_changes(store.clone(), shutdown));
        }
        Ok(store)
    }

    /// The current state (a snapshot: later changes replace it, never alter it).
    pub fn state(&self) -> Arc<AuthState> {
        self.inner
            .state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set_state(&self, next: AuthState) {
        let was_enabled = self.state().enabled;
        if was_enabled && !next.enabled {
            self.inner.tokens.clear();
        }
        *self
            .inner
            .state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(next);
    }

    /// Reloads the state from the database.
    async fn reload(&self) -> Result<()> {
        let next = decode(self.inner.backend.auth().await?)?;
        self.set_state(next);
        Ok(())
    }

    /// Who a request's token speaks for: `None` while auth is off or when the request has no
    /// token.
    ///
    /// # Errors
    /// `InvalidAuthToken` for a token this store did not issue, or one that expired.
    pub fn info_from_token(
        &self,
        token: Option<&str>,
    ) -> std::result::Result<Option<AuthInfo>, AuthError> {
        let state = self.state();
        if !state.enabled {
            return Ok(None);
        }
        let Some(token) = token else {
            return Ok(None);
        };
        self.inner
            .tokens
            .info(token, state.revision)
            .map(Some)
            .ok_or(AuthError::InvalidAuthToken)
    }

    /// The identity of a client certificate's CommonName, at the current auth revision.
    pub fn info_from_certificate(&self, common_name: &str) -> Option<AuthInfo> {
        let state = self.state();
        (state.enabled && !common_name.is_empty()).then(|| AuthInfo {
            user: common_name.to_owned(),
            revision: state.revision,
        })
    }

    /// Whether `who` may do `access` on `[key, range_end)`.
    ///
    /// # Errors
    /// etcd's: `UserEmpty` (no identity), `AuthOldRevision`, `PermissionDenied`.
    pub fn check(
        &self,
        who: Option<&AuthInfo>,
        key: &[u8],
        range_end: &[u8],
        access: Access,
    ) -> std::result::Result<(), AuthError> {
        let state = self.state();
        if !state.enabled {
            return Ok(());
        }
        let who = named(who)?;
        if who.revision < state.revision {
            return Err(AuthError::AuthOldRevision);
        }
        if state.permits(&who.user, key, range_end, access) {
            Ok(())
        } else {
            Err(AuthError::PermissionDenied)
        }
    }

    /// Whether `who` names a user at all, which every request but Authenticate needs while auth
    /// is on (even those that need no permission, as in etcd).
    ///
    /// # Errors
    /// `UserEmpty`.
    pub fn check_user(&self, who: Option<&AuthInfo>) -> std::result::Result<(), AuthError> {
        if self.state().enabled {
            named(who)?;
        }
        Ok(())
    }

    /// Whether `who` may manage the cluster (auth, compaction, maintenance): root only.
    ///
    /// # Errors
    /// etcd's: `UserEmpty`, `UserNotFound`, `PermissionDenied`.
    pub fn check_admin(&self, who: Option<&AuthInfo>) -> std::result::Result<(), AuthError> {
        let state = self.state();
        if !state.enabled {
            return Ok(());
        }
        let user = state.user(&named(who)?.user)?;
        if state::has_root_role(user) {
            Ok(())
        } else {
            Err(AuthError::PermissionDenied)
        }
    }

    /// Checks a name and password and issues a token.
    ///
    /// # Errors
    /// `AuthNotEnabled`, `AuthFailed` (unknown user or wrong password), `NoPasswordUser`.
    pub async fn authenticate(&self, name: &str, password: &str) -> Result<String> {
        let state = self.state();
        if !state.enabled {
            return Err(AuthError::AuthNotEnabled.into());
        }
        let user = state.users.get(name).ok_or(AuthError::AuthFailed)?;
        if user.options.as_ref().is_some_and(|o| o.no_password) {
            return Err(AuthError::NoPasswordUser.into());
        }
        let hash = String::from_utf8_lossy(&user.password).into_owned();
        let password = password.to_owned();
        // bcrypt is meant to be slow: keep it off the async workers.
        let matches = tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash))
            .await
            .map_err(|e| Error::Hash(e.to_string()))?
            .unwrap_or(false);
        if !matches {
            return Err(AuthError::AuthFailed.into());
        }
        let info = AuthInfo {
            user: name.to_owned(),
            revision: state.revision,
        };
        self.inner
            .tokens
            .assign(info)
            .ok_or_else(|| Error::Hash("this instance has no private key to sign tokens".into()))
    }

    /// A bcrypt hash of `password` in the `$2a$` form etcd writes.
    async fn hash(&self, password: &str) -> Result<Vec<u8>> {
        let password = password.to_owned();
        let cost = self.inner.bcrypt_cost;
        let hashed = tokio::task::spawn_blocking(move || bcrypt::hash_with_result(password, cost))
            .await
            .map_err(|e| Error::Hash(e.to_string()))?
            .map_err(|e| Error::Hash(e.to_string()))?;
        Ok(hashed
            .format_for_version(bcrypt::Version::TwoA)
            .into_bytes())
    }

    /// Applies `change` to the current state and stores the result (the change moves the auth
    /// revision itself), unless it changed nothing. Retries on a state another instance
    /// changed meanwhile.
    async fn change(&self, mut change: impl FnMut(&mut AuthState) -> state::Changed) -> Result<()> {
        let _one_at_a_time = self.inner.changing.lock().await;
        loop {
            let current = self.state();
            let mut next = (*current).clone();
            if !change(&mut next)? {
                return Ok(());
            }
            if self
                .inner
                .backend
                .replace_auth(version(&current), &encode(&next))
                .await?
            {
                self.set_state(next);
                return Ok(());
            }
            self.reload().await?;
        }
    }

    pub async fn enable(&self) -> Result<()> {
        self.change(AuthState::enable).await
    }

    pub async fn disable(&self) -> Result<()> {
        self.change(AuthState::disable).await
    }

    /// Adds a user; with `no_password` the password is ignored and the user can only be
    /// authenticated by certificate.
    pub async fn user_add(&self, name: &str, password: &str, no_password: bool) -> Result<()> {
        let hashed = if no_password {
            None
        } else {
            Some(self.hash(password).await?)
        };
        self.change(|s| s.user_add(name, hashed.clone())).await
    }

    pub async fn user_delete(&self, name: &str) -> Result<()> {
        self.change(|s| s.user_delete(name)).await?;
        self.inner.tokens.invalidate_user(name);
        Ok(())
    }

    pub async fn user_change_password(&self, name: &str, password: &str) -> Result<()> {
        // etcd reports an unknown user before hashing anything.
        self.state().user(name)?;
        let hashed = self.hash(password).await?;
        self.change(|s| s.user_change_password(name, hashed.clone()))
            .await?;
        self.inner.tokens.invalidate_user(name);
        Ok(())
    }

    pub async fn user_grant_role(&self, name: &str, role: &str) -> Result<()> {
        self.change(|s| s.user_grant_role(name, role)).await
    }

    pub async fn user_revoke_role(&self, name: &str, role: &str) -> Result<()> {
        self.change(|s| s.user_revoke_role(name, role)).await
    }

    pub async fn role_add(&self, name: &str) -> Result<()> {
        self.change(|s| s.role_add(name)).await
    }

    pub async fn role_delete(&self, name: &str) -> Result<()> {
        self.change(|s| s.role_delete(name)).await
    }

    pub async fn role_grant_permission(
        &self,
        name: &str,
        perm: Option<authpb::Permission>,
    ) -> Result<()> {
        self.change(|s| s.role_grant_permission(name, perm.clone()))
            .await
    }

    pub async fn role_revoke_permission(
        &self,
        name: &str,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<()> {
        self.change(|s| s.role_revoke_permission(name, key, range_end))
            .await
    }
}

/// The caller, if it names a user; etcd's `user name is empty` otherwise.
fn named(who: Option<&AuthInfo>) -> std::result::Result<&AuthInfo, AuthError> {
    who.filter(|w| !w.user.is_empty())
        .ok_or(AuthError::UserEmpty)
}

/// Polls the database's auth version and reloads when another instance moved it (turning auth
/// on leaves the revision alone, so both are compared).
async fn follow_changes(store: AuthStore, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(REFRESH);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let moved = match store.inner.backend.auth_version().await {
            Ok(found) => found != version(&store.state()),
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the auth revision; trying again");
                continue;
            }
        };
        if moved {
            // Under the change lock, so a local change never interleaves with a reload.
            let _quiet = store.inner.changing.lock().await;
            if let Err(e) = store.reload().await {
                tracing::warn!(error = %e, "cannot reload the auth store; trying again");
            }
        }
    }
}

fn version(state: &AuthState) -> AuthVersion {
    AuthVersion {
        enabled: state.enabled,
        revision: state.revision,
    }
}

fn encode(state: &AuthState) -> AuthRecords {
    AuthRecords {
        enabled: state.enabled,
        revision: state.revision,
        users: state
            .users
            .iter()
            .map(|(name, user)| (name.clone(), user.encode_to_vec()))
            .collect(),
        roles: state
            .roles
            .iter()
            .map(|(name, role)| (name.clone(), role.encode_to_vec()))
            .collect(),
    }
}

fn decode(records: AuthRecords) -> Result<AuthState> {
    let mut state = AuthState {
        enabled: records.enabled,
        revision: records.revision,
        ..AuthState::default()
    };
    for (name, record) in records.users {
        let user =
            authpb::User::decode(record.as_slice()).map_err(|_| Error::Corrupt(name.clone()))?;
        state.users.insert(name, user);
    }
    for (name, record) in records.roles {
        let role =
            authpb::Role::decode(record.as_slice()).map_err(|_| Error::Corrupt(name.clone()))?;
        state.roles.insert(name, role);
    }
    Ok(state)
}
