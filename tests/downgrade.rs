//! Maintenance.Downgrade as etcd answers it. test.sh runs this file against real etcd 3.5 too;
//! the one difference (etcdsql has no version to downgrade to) is asserted only on etcdsql.

mod common;

use common::{Target, status};
use etcd_client::DowngradeOptions;
use tonic::Code;

#[tokio::test]
async fn downgrade_requests_get_etcds_errors() {
    let dir = tempfile::tempdir().unwrap();
    let target = Target::start(dir.path()).await;
    let mut m = target.client().await.maintenance_client();
    let refused = |e: etcd_client::Error| {
        let s = status(e);
        (s.code(), s.message().to_owned())
    };
    let wrong = (
        Code::InvalidArgument,
        "etcdserver: wrong downgrade target version format".to_owned(),
    );
    let invalid = (
        Code::InvalidArgument,
        "etcdserver: invalid downgrade target version".to_owned(),
    );
    for (version, expected) in [
        ("three", &wrong),
        ("v3.4", &wrong),
        ("3", &wrong),
        ("3.3", &invalid),
        ("3.5.0", &invalid),
        ("4.0", &invalid),
    ] {
        for request in [
            DowngradeOptions::Validate(version.into()),
            DowngradeOptions::Enable(version.into()),
        ] {
            let answer = m.downgrade(request.clone()).await.expect_err("refused");
            assert_eq!(&refused(answer), expected, "{request:?}");
        }
    }
    let cancel = m
        .downgrade(DowngradeOptions::Cancel)
        .await
        .expect_err("no job");
    assert_eq!(
        refused(cancel),
        (
            Code::FailedPrecondition,
            "etcdserver: no inflight downgrade job".to_owned()
        )
    );
    if !target.is_reference() {
        // etcd 3.5 would validate a downgrade to 3.4; etcdsql never has one to offer.
        let answer = m
            .downgrade(DowngradeOptions::Validate("3.4".into()))
            .await
            .expect_err("refused");
        assert_eq!(refused(answer), invalid);
    }
    target.stop().await;
}
