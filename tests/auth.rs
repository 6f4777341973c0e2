//! Auth through real clients: who may do what once auth is on, request kind by request kind, and
//! what tokens carry. test.sh runs the `Target` tests against real etcd 3.5 too, so their
//! expectations are etcd's own behaviour; the others cover what only etcdsql has (its database,
//! several instances, certificates).

mod common;

use std::time::Duration;

use common::{Target, TestServer, raw_call, status};
use etcd_client::{
    Client, ConnectOptions, GetOptions, LockOptions, Permission, PutOptions, WatchOptions,
};
use etcdsql::pb::etcdserverpb as pb;
use tonic::Code;

const BOUND: Duration = Duration::from_secs(20);

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {BOUND:?}"))
}

/// (code, message) of a failed call.
fn refused(e: etcd_client::Error) -> (Code, String) {
    let s = status(e);
    (s.code(), s.message().to_owned())
}

fn denied() -> (Code, String) {
    (
        Code::PermissionDenied,
        "etcdserver: permission denied".into(),
    )
}

async fn as_user(url: &str, user: &str, password: &str) -> Client {
    within(
        "connect",
        Client::connect([url], Some(ConnectOptions::new().with_user(user, password))),
    )
    .await
    .expect("authenticates")
}

async fn token(url: &str, user: &str, password: &str) -> String {
    let answer: pb::AuthenticateResponse = raw_call(
        url,
        "/etcdserverpb.Auth/Authenticate",
        pb::AuthenticateRequest {
            name: user.into(),
            password: password.into(),
        },
        None,
    )
    .await
    .expect("authenticates");
    answer.token
}

async fn range(
    url: &str,
    key: &str,
    token: Option<&str>,
) -> Result<pb::RangeResponse, tonic::Status> {
    raw_call(
        url,
        "/etcdserverpb.KV/Range",
        pb::RangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        },
        token,
    )
    .await
}

/// Enables auth with a root user, runs `body`, then disables auth and removes what it added
/// (the reference server is shared by the tests of one run).
#[tokio::test]
async fn every_kind_of_request_is_checked_as_etcd_checks_it() {
    let dir = tempfile::tempdir().unwrap();
    let target = Target::start(dir.path()).await;
    let url = target.url();
    let mut c = target.client().await;
    let alice = target.key("alice");
    let reader = target.key("reader");
    let r = target.key("r/");
    let rw = target.key("rw");
    let secret = target.key("secret");

    let status0: pb::AuthStatusResponse = raw_call(
        &url,
        "/etcdserverpb.Auth/AuthStatus",
        pb::AuthStatusRequest {},
        None,
    )
    .await
    .unwrap();
    assert!(!status0.enabled);
    let start = status0.auth_revision;

    c.user_add("root", "rootpw", None).await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();
    c.user_add(alice.as_str(), "alicepw", None).await.unwrap();
    c.role_add(reader.as_str()).await.unwrap();
    c.role_grant_permission(reader.as_str(), Permission::read(r.as_str()).with_prefix())
        .await
        .unwrap();
    c.role_grant_permission(reader.as_str(), Permission::read_write(rw.as_str()))
        .await
        .unwrap();
    c.user_grant_role(alice.as_str(), reader.as_str())
        .await
        .unwrap();
    c.put(format!("{r}a"), "1", None).await.unwrap();
    c.put(secret.as_str(), "s", None).await.unwrap();
    let lease = c.lease_grant(100, None).await.unwrap().id();
    c.put(
        secret.as_str(),
        "s",
        Some(PutOptions::new().with_lease(lease)),
    )
    .await
    .unwrap();
    c.auth_enable().await.unwrap();
    // Seven changes, each one auth revision; turning auth on is not one.
    let mut root = as_user(&url, "root", "rootpw").await;
    let root_token = token(&url, "root", "rootpw").await;
    let on: pb::AuthStatusResponse = raw_call(
        &url,
        "/etcdserverpb.Auth/AuthStatus",
        pb::AuthStatusRequest {},
        Some(&root_token),
    )
    .await
    .unwrap();
    assert!(on.enabled);
    assert_eq!(on.auth_revision, start + 7);

    // No user; a token nobody issued.
    let anonymous = refused(c.get(format!("{r}a"), None).await.unwrap_err());
    assert_eq!(
        anonymous,
        (
            Code::InvalidArgument,
            "etcdserver: user name is empty".into()
        )
    );
    let forged = range(&url, &format!("{r}a"), Some("forged.1"))
        .await
        .unwrap_err();
    assert_eq!(
        (forged.code(), forged.message()),
        (Code::Unauthenticated, "etcdserver: invalid auth token")
    );
    let status_anonymous: Result<pb::AuthStatusResponse, _> = raw_call(
        &url,
        "/etcdserverpb.Auth/AuthStatus",
        pb::AuthStatusRequest {},
        None,
    )
    .await;
    let status_anonymous = status_anonymous.unwrap_err();
    assert_eq!(
        (status_anonymous.code(), status_anonymous.message()),
        (Code::InvalidArgument, "etcdserver: user name is empty")
    );
    // Requests that need no permission still need a user.
    for anonymous in [
        c.lease_grant(10, None).await.map(drop).unwrap_err(),
        c.member_list().await.map(drop).unwrap_err(),
        c.alarm(
            etcd_client::AlarmAction::Get,
            etcd_client::AlarmType::None,
            None,
        )
        .await
        .map(drop)
        .unwrap_err(),
    ] {
        assert_eq!(
            refused(anonymous),
            (
                Code::InvalidArgument,
                "etcdserver: user name is empty".into()
            )
        );
    }
    let wrong = Client::connect(
        [url.as_str()],
        Some(ConnectOptions::new().with_user(alice.as_str(), "wrong")),
    )
    .await
    .map(drop)
    .unwrap_err();
    assert_eq!(
        refused(wrong),
        (
            Code::InvalidArgument,
            "etcdserver: authentication failed, invalid user ID or password".into()
        )
    );

    // alice: KV as her role allows.
    let mut a = as_user(&url, &alice, "alicepw").await;
    assert_eq!(a.get(format!("{r}a"), None).await.unwrap().kvs().len(), 1);
    assert_eq!(
        a.get(r.as_str(), Some(GetOptions::new().with_prefix()))
            .await
            .unwrap()
            .count(),
        1
    );
    assert_eq!(
        refused(a.get(secret.as_str(), None).await.unwrap_err()),
        denied()
    );
    assert_eq!(
        refused(a.put(format!("{r}a"), "2", None).await.unwrap_err()),
        denied()
    );
    a.put(rw.as_str(), "1", None).await.unwrap();
    assert_eq!(
        refused(
            a.delete(
                r.as_str(),
                Some(etcd_client::DeleteOptions::new().with_prefix())
            )
            .await
            .unwrap_err()
        ),
        denied()
    );
    // A txn is checked as a whole: compares and both branches.
    let txn = |compare_key: &str, failure_key: &str| {
        etcd_client::Txn::new()
            .when([etcd_client::Compare::value(
                compare_key,
                etcd_client::CompareOp::Equal,
                "1",
            )])
            .and_then([etcd_client::TxnOp::put(rw.as_str(), "2", None)])
            .or_else([etcd_client::TxnOp::put(failure_key, "x", None)])
    };
    a.txn(txn(&format!("{r}a"), &rw)).await.unwrap();
    assert_eq!(
        refused(a.txn(txn(&secret, &rw)).await.unwrap_err()),
        denied()
    );
    assert_eq!(
        refused(a.txn(txn(&format!("{r}a"), &secret)).await.unwrap_err()),
        denied()
    );
    assert_eq!(refused(a.compact(1, None).await.unwrap_err()), denied());

    // Watches are refused in the create answer, with etcd's text of the gRPC error.
    let mut refusals = a.watch(secret.as_str(), None).await.unwrap();
    let refusal = within("the watch answer", refusals.message())
        .await
        .unwrap()
        .expect("an answer");
    assert!(refusal.created() && refusal.canceled());
    assert_eq!(refusal.watch_id(), -1);
    assert_eq!(
        refusal.cancel_reason(),
        "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
    );
    let mut allowed = a
        .watch(rw.as_str(), Some(WatchOptions::new().with_prev_key()))
        .await
        .unwrap();
    let created = within("the watch answer", allowed.message())
        .await
        .unwrap()
        .unwrap();
    assert!(created.created() && !created.canceled());

    // Leases: granting needs nothing; revoking needs write permission on the lease's keys.
    let own = a.lease_grant(100, None).await.unwrap().id();
    a.put(rw.as_str(), "3", Some(PutOptions::new().with_lease(own)))
        .await
        .unwrap();
    a.lease_revoke(own).await.unwrap();
    assert_eq!(refused(a.lease_revoke(lease).await.unwrap_err()), denied());
    // Nor may alice attach a key to a lease holding keys she may not write.
    assert_eq!(
        refused(
            a.put(rw.as_str(), "4", Some(PutOptions::new().with_lease(lease)))
                .await
                .unwrap_err()
        ),
        denied()
    );
    let attach = etcd_client::Txn::new().and_then([etcd_client::TxnOp::put(
        rw.as_str(),
        "5",
        Some(PutOptions::new().with_lease(lease)),
    )]);
    assert_eq!(refused(a.txn(attach).await.unwrap_err()), denied());

    // Cluster management is root's; alarms and members are anyone's.
    assert_eq!(
        refused(a.maintenance_client().status().await.map(drop).unwrap_err()),
        denied()
    );
    let alice_token = token(&url, &alice, "alicepw").await;
    let alice_status: Result<pb::AuthStatusResponse, _> = raw_call(
        &url,
        "/etcdserverpb.Auth/AuthStatus",
        pb::AuthStatusRequest {},
        Some(&alice_token),
    )
    .await;
    let alice_status = alice_status.unwrap_err();
    assert_eq!(
        (alice_status.code(), alice_status.message().to_owned()),
        denied()
    );
    a.alarm(
        etcd_client::AlarmAction::Get,
        etcd_client::AlarmType::None,
        None,
    )
    .await
    .unwrap();
    a.member_list().await.unwrap();
    // alice may read her own record and her roles, nothing else of auth.
    assert_eq!(
        a.user_get(alice.as_str()).await.unwrap().roles(),
        std::slice::from_ref(&reader)
    );
    a.role_get(reader.as_str()).await.unwrap();
    assert_eq!(
        refused(a.user_list().await.map(drop).unwrap_err()),
        denied()
    );
    assert_eq!(
        refused(a.user_get("root").await.map(drop).unwrap_err()),
        denied()
    );
    assert_eq!(
        refused(
            a.user_change_password(alice.as_str(), "mine")
                .await
                .map(drop)
                .unwrap_err()
        ),
        denied()
    );

    // Locks run with the caller's rights; etcd hands their errors on as plain errors.
    let no_lock = a
        .lock(
            format!("{r}lock"),
            Some(LockOptions::new().with_lease(lease)),
        )
        .await
        .unwrap_err();
    assert_eq!(
        refused(no_lock),
        (Code::Unknown, "etcdserver: permission denied".into())
    );

    // A simple token stands for its user at whatever the auth store is now: it outlives
    // changes to auth, and sees them at once.
    let fresh = token(&url, &alice, "alicepw").await;
    range(&url, &format!("{r}a"), Some(&fresh)).await.unwrap();
    root.role_add(target.key("another").as_str()).await.unwrap();
    range(&url, &format!("{r}a"), Some(&fresh)).await.unwrap();
    root.user_revoke_role(alice.as_str(), reader.as_str())
        .await
        .unwrap();
    let revoked = range(&url, &format!("{r}a"), Some(&fresh))
        .await
        .unwrap_err();
    assert_eq!(revoked.code(), Code::PermissionDenied);

    // Disabling: everything is open again, and tokens mean nothing.
    root.auth_disable().await.unwrap();
    c.get(secret.as_str(), None).await.unwrap();
    range(&url, &secret, Some(&fresh)).await.unwrap();
    c.user_delete(alice.as_str()).await.unwrap();
    c.user_delete("root").await.unwrap();
    c.role_delete(reader.as_str()).await.unwrap();
    c.role_delete(target.key("another").as_str()).await.unwrap();
    c.lease_revoke(lease).await.unwrap();
    c.delete(
        target.key("").as_str(),
        Some(etcd_client::DeleteOptions::new().with_prefix()),
    )
    .await
    .unwrap();
    target.stop().await;
}

/// Users, roles and the on/off switch are in the database: a restart keeps them.
#[tokio::test]
async fn auth_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    c.user_add("root", "rootpw", None).await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();
    c.role_add("reader").await.unwrap();
    c.role_grant_permission("reader", Permission::read("k"))
        .await
        .unwrap();
    c.user_add("alice", "alicepw", None).await.unwrap();
    c.user_grant_role("alice", "reader").await.unwrap();
    c.auth_enable().await.unwrap();
    server.stop().await;

    let server = TestServer::start(dir.path()).await;
    let url = server.url();
    let mut c = server.client().await;
    assert_eq!(
        refused(c.get("k", None).await.unwrap_err()).1,
        "etcdserver: user name is empty"
    );
    let mut a = as_user(&url, "alice", "alicepw").await;
    a.get("k", None).await.unwrap();
    assert_eq!(refused(a.put("k", "v", None).await.unwrap_err()), denied());
    let mut root = as_user(&url, "root", "rootpw").await;
    let roles = root.role_get("reader").await.unwrap();
    assert_eq!(roles.permissions().len(), 1);
    server.stop().await;
}

/// JWT tokens: signed by the server's key, they name the user and the auth revision, and an
/// instance with the same key accepts them (on SQLite, a second server on another file).
#[tokio::test]
async fn jwt_tokens_are_accepted_wherever_the_key_is() {
    let keys = tempfile::tempdir().unwrap();
    let secret = keys.path().join("jwt.secret");
    std::fs::write(&secret, b"a secret shared by every instance").unwrap();
    let flag = format!("jwt,priv-key={},sign-method=HS256,ttl=5m", secret.display());
    let jwt = |c: &mut etcdsql::Config| {
        c.auth_token = etcdsql::auth::TokenKind::parse(&flag).unwrap();
    };
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(dir.path(), jwt).await;
    let url = server.url();
    let mut c = server.client().await;
    c.user_add("root", "rootpw", None).await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();
    c.put("k", "v", None).await.unwrap();
    c.auth_enable().await.unwrap();
    let token = token(&url, "root", "rootpw").await;
    assert_eq!(
        token.split('.').count(),
        3,
        "a JWT: header.claims.signature"
    );
    range(&url, "k", Some(&token)).await.unwrap();
    let mut tampered = token.clone();
    tampered.pop();
    assert_eq!(
        range(&url, "k", Some(&tampered)).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    // A JWT carries the auth revision it was issued at: after a change it is old.
    let mut root = as_user(&url, "root", "rootpw").await;
    root.role_add("another").await.unwrap();
    let old = range(&url, "k", Some(&token)).await.unwrap_err();
    assert_eq!(
        (old.code(), old.message()),
        (
            Code::InvalidArgument,
            "etcdserver: revision of auth store is old"
        )
    );
    let fresh = self::token(&url, "root", "rootpw").await;
    range(&url, "k", Some(&fresh)).await.unwrap();
    server.stop().await;
}
