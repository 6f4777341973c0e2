//! The auth store's contents and etcd's rules for changing them and for checking a request
//! against them. Pure: no I/O, no clock, so every rule is unit-tested here.
//!
//! # Invariants
//! - A change that alters nothing (granting a role a user already has, enabling auth that is
//!   on) reports `false`. Every other change is one new auth revision, as in etcd, which
//!   clients' tokens are checked against — except turning auth on, which etcd does not count.
//! - Users' roles are kept sorted and without duplicates; a role's permissions are kept sorted
//!   by key, at most one per (key, range end): granting the same range again replaces its type.
//! - While auth is on, `root` stays a user with the `root` role and the `root` role exists
//!   (changes that would break that are `InvalidAuthMgmt`), so someone can always manage auth.

use std::collections::BTreeMap;

use crate::pb::authpb::{self, permission::Type as PermType};

/// The user and role that may do everything.
pub const ROOT: &str = "root";

/// etcd's auth errors, with etcd's messages (clients match on them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("etcdserver: root user does not exist")]
    RootUserNotExist,
    #[error("etcdserver: root user does not have root role")]
    RootRoleNotExist,
    #[error("etcdserver: user name already exists")]
    UserAlreadyExist,
    #[error("etcdserver: user name is empty")]
    UserEmpty,
    #[error("etcdserver: user name not found")]
    UserNotFound,
    #[error("etcdserver: role name already exists")]
    RoleAlreadyExist,
    #[error("etcdserver: role name not found")]
    RoleNotFound,
    #[error("etcdserver: role name is empty")]
    RoleEmpty,
    #[error("etcdserver: authentication failed, invalid user ID or password")]
    AuthFailed,
    #[error("etcdserver: permission denied")]
    PermissionDenied,
    #[error("etcdserver: role is not granted to the user")]
    RoleNotGranted,
    #[error("etcdserver: permission is not granted to the role")]
    PermissionNotGranted,
    #[error("etcdserver: permission not given")]
    PermissionNotGiven,
    #[error("etcdserver: authentication is not enabled")]
    AuthNotEnabled,
    #[error("etcdserver: invalid auth token")]
    InvalidAuthToken,
    #[error("etcdserver: invalid auth management")]
    InvalidAuthMgmt,
    #[error("etcdserver: revision of auth store is old")]
    AuthOldRevision,
    /// A password given for a user created with `--no-password` (etcd's plain error).
    #[error("auth: authentication failed, password was given for no password user")]
    NoPasswordUser,
}

impl AuthError {
    /// The error as etcd's auth package words it, where etcd hands it on untranslated (its
    /// Maintenance checks): `auth: ...` instead of `etcdserver: ...`.
    pub fn raw_message(&self) -> String {
        let message = self.to_string();
        match message.strip_prefix("etcdserver: ") {
            Some(rest) => format!("auth: {rest}"),
            None => message,
        }
    }
}

/// What a request needs on its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

impl Access {
    fn granted_by(self, perm: PermType) -> bool {
        matches!(
            (self, perm),
            (_, PermType::Readwrite)
                | (Access::Read, PermType::Read)
                | (Access::Write, PermType::Write)
        )
    }
}

/// Users, roles, whether auth is on, and the auth revision.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AuthState {
    pub enabled: bool,
    pub revision: i64,
    pub users: BTreeMap<String, authpb::User>,
    pub roles: BTreeMap<String, authpb::Role>,
}

/// The outcome of a change: whether it altered anything.
pub type Changed = Result<bool, AuthError>;

impl AuthState {
    /// Records a change as the next auth revision.
    fn committed(&mut self) -> Changed {
        self.revision += 1;
        Ok(true)
    }

    /// Turns auth on. etcd does not count this as an auth revision: tokens issued before it
    /// stay current.
    pub fn enable(&mut self) -> Changed {
        if self.enabled {
            return Ok(false);
        }
        let root = self.users.get(ROOT).ok_or(AuthError::RootUserNotExist)?;
        if !has_root_role(root) {
            return Err(AuthError::RootRoleNotExist);
        }
        self.enabled = true;
        Ok(true)
    }

    pub fn disable(&mut self) -> Changed {
        if !self.enabled {
            return Ok(false);
        }
        self.enabled = false;
        self.committed()
    }

    /// Adds a user; `password` is the bcrypt hash, `None` for a user without a password.
    pub fn user_add(&mut self, name: &str, password: Option<Vec<u8>>) -> Changed {
        if name.is_empty() {
            return Err(AuthError::UserEmpty);
        }
        if self.users.contains_key(name) {
            return Err(AuthError::UserAlreadyExist);
        }
        let no_password = password.is_none();
        self.users.insert(
            name.to_owned(),
            authpb::User {
                name: name.as_bytes().to_vec(),
                password: password.unwrap_or_default(),
                roles: Vec::new(),
                options: Some(authpb::UserAddOptions { no_password }),
            },
        );
        self.committed()
    }

    pub fn user_delete(&mut self, name: &str) -> Changed {
        if self.enabled && name == ROOT {
            return Err(AuthError::InvalidAuthMgmt);
        }
        self.users.remove(name).ok_or(AuthError::UserNotFound)?;
        self.committed()
    }

    pub fn user_change_password(&mut self, name: &str, password: Vec<u8>) -> Changed {
        let user = self.users.get_mut(name).ok_or(AuthError::UserNotFound)?;
        user.password = password;
        self.committed()
    }

    pub fn user_grant_role(&mut self, name: &str, role: &str) -> Changed {
        if !self.users.contains_key(name) {
            return Err(AuthError::UserNotFound);
        }
        // The root role needs no role record to be granted: that is how auth gets started.
        if role != ROOT && !self.roles.contains_key(role) {
            return Err(AuthError::RoleNotFound);
        }
        let user = self.users.get_mut(name).ok_or(AuthError::UserNotFound)?;
        match user.roles.binary_search_by(|r| r.as_str().cmp(role)) {
            Ok(_) => Ok(false),
            Err(at) => {
                user.roles.insert(at, role.to_owned());
                self.committed()
            }
        }
    }

    pub fn user_revoke_role(&mut self, name: &str, role: &str) -> Changed {
        if self.enabled && name == ROOT && role == ROOT {
            return Err(AuthError::InvalidAuthMgmt);
        }
        let user = self.users.get_mut(name).ok_or(AuthError::UserNotFound)?;
        let at = user
            .roles
            .binary_search_by(|r| r.as_str().cmp(role))
            .map_err(|_| AuthError::RoleNotGranted)?;
        user.roles.remove(at);
        self.committed()
    }

    pub fn user(&self, name: &str) -> Result<&authpb::User, AuthError> {
        self.users.get(name).ok_or(AuthError::UserNotFound)
    }

    pub fn role_add(&mut self, name: &str) -> Changed {
        if name.is_empty() {
            return Err(AuthError::RoleEmpty);
        }
        if self.roles.contains_key(name) {
            return Err(AuthError::RoleAlreadyExist);
        }
        self.roles.insert(
            name.to_owned(),
            authpb::Role {
                name: name.as_bytes().to_vec(),
                key_permission: Vec::new(),
            },
        );
        self.committed()
    }

    /// Deletes a role and takes it from every user who had it.
    pub fn role_delete(&mut self, name: &str) -> Changed {
        if self.enabled && name == ROOT {
            return Err(AuthError::InvalidAuthMgmt);
        }
        self.roles.remove(name).ok_or(AuthError::RoleNotFound)?;
        for user in self.users.values_mut() {
            user.roles.retain(|r| r != name);
        }
        self.committed()
    }

    pub fn role(&self, name: &str) -> Result<&authpb::Role, AuthError> {
        self.roles.get(name).ok_or(AuthError::RoleNotFound)
    }

    pub fn role_grant_permission(
        &mut self,
        name: &str,
        perm: Option<authpb::Permission>,
    ) -> Changed {
        let perm = perm.ok_or(AuthError::PermissionNotGiven)?;
        if !valid_permission_range(&perm.key, &perm.range_end) {
            return Err(AuthError::InvalidAuthMgmt);
        }
        let role = self.roles.get_mut(name).ok_or(AuthError::RoleNotFound)?;
        let perms = &mut role.key_permission;
        if let Some(same) = perms
            .iter_mut()
            .find(|p| p.key == perm.key && p.range_end == perm.range_end)
        {
            same.perm_type = perm.perm_type;
        } else {
            let at = perms.partition_point(|p| p.key <= perm.key);
            perms.insert(at, perm);
        }
        self.committed()
    }

    pub fn role_revoke_permission(&mut self, name: &str, key: &[u8], range_end: &[u8]) -> Changed {
        let role = self.roles.get_mut(name).ok_or(AuthError::RoleNotFound)?;
        let at = role
            .key_permission
            .iter()
            .position(|p| p.key == key && p.range_end == range_end)
            .ok_or(AuthError::PermissionNotGranted)?;
        role.key_permission.remove(at);
        self.committed()
    }

    /// Whether `user` may do `access` on `[key, range_end)` (etcd's encoding: an empty end is
    /// the one key, `"\0"` every key from `key` on). Auth must be on and the user known.
    pub fn permits(&self, user: &str, key: &[u8], range_end: &[u8], access: Access) -> bool {
        let Some(user) = self.users.get(user) else {
            return false;
        };
        if has_root_role(user) {
            return true;
        }
        let mut granted: Vec<Interval> = user
            .roles
            .iter()
            .filter_map(|r| self.roles.get(r))
            .flat_map(|r| &r.key_permission)
            .filter(|p| PermType::try_from(p.perm_type).is_ok_and(|t| access.granted_by(t)))
            .map(|p| Interval::of(&p.key, &p.range_end))
            .collect();
        granted.sort_by(|a, b| a.start.cmp(&b.start));
        covers(&granted, &Interval::of(key, range_end))
    }

    /// Whether `user` exists and has the root role.
    pub fn is_root(&self, user: &str) -> bool {
        self.users.get(user).is_some_and(has_root_role)
    }
}

pub fn has_root_role(user: &authpb::User) -> bool {
    user.roles.iter().any(|r| r == ROOT)
}

/// A permission's range as etcd accepts it: a key, and an end that is empty, `"\0"` or after
/// the key.
fn valid_permission_range(key: &[u8], range_end: &[u8]) -> bool {
    !key.is_empty() && (range_end.is_empty() || range_end == [0] || key < range_end)
}

/// `[start, end)` of keys; `end: None` is unbounded.
#[derive(Debug, PartialEq, Eq)]
struct Interval {
    start: Vec<u8>,
    end: Option<Vec<u8>>,
}

impl Interval {
    fn of(key: &[u8], range_end: &[u8]) -> Self {
        let end = match range_end {
            // One key: it and nothing after it.
            [] => Some([key, &[0]].concat()),
            [0] => None,
            end => Some(end.to_vec()),
        };
        Self {
            start: key.to_vec(),
            end,
        }
    }
}

/// Whether the union of `granted` (sorted by start) contains all of `wanted`.
fn covers(granted: &[Interval], wanted: &Interval) -> bool {
    let mut reached = wanted.start.clone();
    for interval in granted {
        if interval.start > reached {
            // A gap before this interval, and every later one starts later still.
            break;
        }
        match &interval.end {
            None => return true,
            Some(end) if *end > reached => reached.clone_from(end),
            Some(_) => {}
        }
        if wanted.end.as_ref().is_some_and(|end| reached >= *end) {
            return true;
        }
    }
    wanted.end.as_ref().is_some_and(|end| reached >= *end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perm(perm_type: PermType, key: &str, end: &str) -> authpb::Permission {
        authpb::Permission {
            perm_type: perm_type as i32,
            key: key.as_bytes().to_vec(),
            range_end: end.as_bytes().to_vec(),
        }
    }

    /// root (with the root role) and alice (with `reader`).
    fn state(perms: Vec<authpb::Permission>) -> AuthState {
        let mut s = AuthState::default();
        s.user_add(ROOT, Some(b"hash".to_vec())).unwrap();
        s.user_add("alice", Some(b"hash".to_vec())).unwrap();
        s.user_grant_role(ROOT, ROOT).unwrap();
        s.role_add("reader").unwrap();
        for p in perms {
            s.role_grant_permission("reader", Some(p)).unwrap();
        }
        s.user_grant_role("alice", "reader").unwrap();
        s
    }

    #[test]
    fn enabling_needs_root_with_the_root_role() {
        let mut s = AuthState::default();
        assert_eq!(s.enable(), Err(AuthError::RootUserNotExist));
        s.user_add(ROOT, None).unwrap();
        assert_eq!(s.enable(), Err(AuthError::RootRoleNotExist));
        s.user_grant_role(ROOT, ROOT).unwrap();
        assert_eq!(s.enable(), Ok(true));
        assert_eq!(s.enable(), Ok(false));
        assert_eq!(s.user_delete(ROOT), Err(AuthError::InvalidAuthMgmt));
        assert_eq!(
            s.user_revoke_role(ROOT, ROOT),
            Err(AuthError::InvalidAuthMgmt)
        );
        assert_eq!(s.disable(), Ok(true));
        assert_eq!(s.disable(), Ok(false));
    }

    #[test]
    fn users_and_roles_follow_etcds_rules() {
        let mut s = state(vec![]);
        assert_eq!(s.user_add("", None), Err(AuthError::UserEmpty));
        assert_eq!(s.user_add("alice", None), Err(AuthError::UserAlreadyExist));
        assert_eq!(s.role_add(""), Err(AuthError::RoleEmpty));
        assert_eq!(s.role_add("reader"), Err(AuthError::RoleAlreadyExist));
        assert_eq!(s.user_grant_role("alice", "reader"), Ok(false));
        assert_eq!(
            s.user_grant_role("alice", "nosuch"),
            Err(AuthError::RoleNotFound)
        );
        assert_eq!(
            s.user_grant_role("bob", "reader"),
            Err(AuthError::UserNotFound)
        );
        s.role_add("a-role").unwrap();
        s.user_grant_role("alice", "a-role").unwrap();
        assert_eq!(s.user("alice").unwrap().roles, ["a-role", "reader"]);
        assert_eq!(s.role_delete("reader"), Ok(true));
        assert_eq!(s.user("alice").unwrap().roles, ["a-role"]);
        assert_eq!(
            s.user_revoke_role("alice", "reader"),
            Err(AuthError::RoleNotGranted)
        );
        assert_eq!(s.role_delete("reader"), Err(AuthError::RoleNotFound));
    }

    #[test]
    fn granting_a_range_again_replaces_its_type_and_permissions_stay_sorted() {
        let mut s = state(vec![
            perm(PermType::Write, "/w", "/x"),
            perm(PermType::Read, "/a", ""),
        ]);
        s.role_grant_permission("reader", Some(perm(PermType::Read, "/w", "/x")))
            .unwrap();
        let perms = &s.role("reader").unwrap().key_permission;
        assert_eq!(
            perms,
            &vec![
                perm(PermType::Read, "/a", ""),
                perm(PermType::Read, "/w", "/x")
            ]
        );
        assert_eq!(
            s.role_grant_permission("reader", None),
            Err(AuthError::PermissionNotGiven)
        );
        for (key, end) in [("", ""), ("b", "a"), ("b", "b")] {
            assert_eq!(
                s.role_grant_permission("reader", Some(perm(PermType::Read, key, end))),
                Err(AuthError::InvalidAuthMgmt),
                "{key:?}..{end:?}"
            );
        }
        assert_eq!(
            s.role_revoke_permission("reader", b"/w", b""),
            Err(AuthError::PermissionNotGranted)
        );
        assert_eq!(s.role_revoke_permission("reader", b"/w", b"/x"), Ok(true));
    }

    #[test]
    fn permissions_cover_keys_and_ranges_by_their_union() {
        let s = state(vec![
            perm(PermType::Read, "/r/", "/r0"),
            perm(PermType::Readwrite, "/rw", ""),
            perm(PermType::Read, "a", "c"),
            perm(PermType::Read, "c", "e"),
            perm(PermType::Write, "z", "\0"),
        ]);
        let read =
            |key: &str, end: &str| s.permits("alice", key.as_bytes(), end.as_bytes(), Access::Read);
        let write = |key: &str, end: &str| {
            s.permits("alice", key.as_bytes(), end.as_bytes(), Access::Write)
        };
        assert!(read("/r/a", ""));
        assert!(read("/r/", "/r0"));
        assert!(!read("/r/", "/s"));
        assert!(!write("/r/a", ""));
        assert!(read("/rw", "") && write("/rw", ""));
        assert!(!read("/rw0", ""));
        // Two adjacent grants cover a range across both.
        assert!(read("b", "d"));
        assert!(!read("b", "f"));
        assert!(write("zz", "\0") && write("z", ""));
        assert!(!write("y", "\0"));
        assert!(!read("\0", "\0"));
        // root may do anything; an unknown user nothing.
        assert!(s.permits(ROOT, b"\0", b"\0", Access::Write));
        assert!(!s.permits("bob", b"/rw", b"", Access::Read));
    }
}
