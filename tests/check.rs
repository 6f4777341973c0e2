//! `etcdsql check`: a store written by the server passes; a store with a deliberately broken
//! row fails with exit status 1 and says which key and what is wrong. Runs on whichever backend
//! the run targets.

mod common;

use common::{TestServer, etcdsql_tool, execute_sql, on_mysql, on_postgres, test_endpoint};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

/// Runs `etcdsql check ENDPOINT`: (exit status, what it printed).
fn check(endpoint: &str) -> (i32, String) {
    etcdsql_tool(&["check", endpoint])
}

/// `key` as a byte-string literal in the run's dialect.
fn key(key: &str) -> String {
    let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
    if on_postgres() {
        format!("decode('{hex}', 'hex')")
    } else {
        format!("X'{hex}'")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_passes_a_written_store_and_names_each_broken_rule() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = test_endpoint(dir.path());
    let server = TestServer::start(dir.path()).await;
    let mut c = server.client().await;
    for i in 0..20 {
        c.put(format!("k/{i:02}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    c.compact(21, None).await.unwrap();
    for i in 0..10 {
        c.put(format!("k/{i:02}"), "again", None).await.unwrap();
    }
    c.delete("k/05", None).await.unwrap();
    c.put("k/05", "back", None).await.unwrap();
    let lease = c.lease_grant(600, None).await.unwrap().id();
    c.put("leased", "v", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap();
    c.txn(
        Txn::new()
            .when([Compare::version("k/01", CompareOp::Equal, 2)])
            .and_then([TxnOp::put("k/01", "txn", None), TxnOp::delete("k/19", None)]),
    )
    .await
    .unwrap();
    let revision = c
        .put("k/18", "last", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    // Physically compacted: the rows that replaced the removed ones stay consistent.
    c.compact(
        revision - 3,
        Some(etcd_client::CompactionOptions::new().with_physical()),
    )
    .await
    .unwrap();
    server.stop().await;

    let (status, text) = check(&endpoint);
    assert_eq!(status, 0, "{text}");
    assert!(text.contains("ok: no problems found"), "{text}");
    assert!(
        text.contains(&format!("current revision {revision}")),
        "{text}"
    );

    // k/18 was created at revision 20 (the first put is revision 2) and put again last: its
    // first row marked newest as well, and a version that skips some.
    let broken_newest: Vec<String> = if on_postgres() {
        // PostgreSQL: kv_head points back at the first row, and nothing records its
        // replacement.
        execute_sql(
            &endpoint,
            &format!(
                "UPDATE kv_head SET revision = 20 WHERE name = {}",
                key("k/18")
            ),
        )
        .await;
        execute_sql(
            &endpoint,
            &format!(
                "DELETE FROM kv_replaced WHERE revision = 20 AND name = {}",
                key("k/18")
            ),
        )
        .await;
        vec![
            "key \"k/18\": kv_head names revision 20 as its newest, but it has a row at".into(),
            "is neither the newest nor recorded as replaced".into(),
        ]
    } else if on_mysql() {
        execute_sql(
            &endpoint,
            &format!(
                "UPDATE kv_log SET superseded_by = NULL WHERE revision = 20 AND name = {}",
                key("k/18")
            ),
        )
        .await;
        vec![
            "key \"k/18\" has 2 rows marked newest".into(),
            "key \"k/18\": the row marked newest is at revision 20".into(),
        ]
    } else {
        // SQLite keeps the log alone: a stray row of k/18 at revision 21, which its last row
        // skips over.
        execute_sql(
            &endpoint,
            &format!(
                "INSERT INTO kv_log (revision, sub, name, created, deleted, create_revision, \
                 prev_revision, version, lease, value, old_value, old_lease) \
                 VALUES (21, 1, {}, 0, 0, 20, 20, 2, 0, X'', NULL, 0)",
                key("k/18")
            ),
        )
        .await;
        vec![format!(
            "key \"k/18\": the row at revision {revision} follows revision 20, but the key \
             has a row at 21 between them"
        )]
    };
    execute_sql(
        &endpoint,
        &format!(
            "UPDATE kv_log SET version = version + 5 WHERE name = {} AND revision = {revision}",
            key("k/18")
        ),
    )
    .await;
    // And a lease that is gone while a key still names it.
    execute_sql(&endpoint, "DELETE FROM leases").await;
    let (status, text) = check(&endpoint);
    assert_eq!(status, 1, "{text}");
    for expected in broken_newest.iter().map(String::as_str).chain([
        "key \"k/18\": version 7 at revision",
        "key \"leased\" is attached to lease",
        "problems found",
    ]) {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}
