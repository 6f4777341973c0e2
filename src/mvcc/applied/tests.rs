//! The applied index's own rules: whole revisions in order, counts, values within the budget,
//! fills, and reads at past revisions against a model.

use std::collections::BTreeMap;

use super::*;

fn row(key: &str, revision: i64, deleted: bool) -> LogRow {
    put(key, revision, deleted, "")
}

fn put(key: &str, revision: i64, deleted: bool, value: &str) -> LogRow {
    LogRow {
        revision,
        sub: 0,
        key: key.as_bytes().to_vec(),
        created: !deleted,
        deleted,
        create_revision: revision,
        prev_revision: 0,
        version: 1,
        lease: 0,
        value: value.as_bytes().to_vec(),
        old_value: None,
        old_lease: 0,
    }
}

fn apply(applied: &Applied, after: i64, through: i64, rows: &[LogRow]) -> bool {
    let kvs: Vec<_> = rows
        .iter()
        .map(|row| (KeyValue::from_row(row.clone()), row.deleted))
        .collect();
    applied.apply(
        after,
        through,
        kvs.iter().map(|(kv, deleted)| (kv, *deleted)),
    )
}

fn keys(applied: &Applied, range: &KeyRange) -> Vec<String> {
    let view = applied.view();
    view.range(range)
        .map(|(key, _)| String::from_utf8_lossy(key).into_owned())
        .collect()
}

#[test]
fn applies_whole_revisions_in_order_only() {
    let applied = Applied::load(&[row("a", 2, false), row("b", 3, true)], 3, 0, 100);
    let all = KeyRange::from_etcd(b"a".to_vec(), vec![0]);
    assert_eq!(keys(&applied, &all), ["a"]);
    applied.feed();
    assert!(applied.serving());

    assert!(apply(
        &applied,
        3,
        5,
        &[row("b", 4, false), row("a", 5, true)]
    ));
    assert_eq!(keys(&applied, &all), ["b"]);
    assert_eq!(applied.revision(), 5);
    // A range already applied is refused and changes nothing.
    assert!(!apply(&applied, 3, 5, &[row("c", 4, false)]));
    assert_eq!(keys(&applied, &all), ["b"]);
    assert!(applied.serving());
    // A gap is refused, and the index stops serving.
    assert!(!apply(&applied, 6, 7, &[row("c", 7, false)]));
    assert_eq!(applied.revision(), 5);
    assert!(!applied.serving());
}

#[test]
fn counts_ranges() {
    let applied = Applied::load(
        &[
            row("a/1", 2, false),
            row("a/2", 3, false),
            row("b", 4, false),
        ],
        4,
        0,
        100,
    );
    let view = applied.view();
    assert_eq!(
        view.count(&KeyRange::from_etcd(b"a/".to_vec(), b"a0".to_vec())),
        2
    );
    assert_eq!(view.count(&KeyRange::single(b"b".to_vec())), 1);
    assert_eq!(view.count(&KeyRange::single(b"c".to_vec())), 0);
    // Bounds that are not keys themselves, on both sides.
    assert_eq!(
        view.count(&KeyRange::from_etcd(b"a".to_vec(), b"a/2".to_vec())),
        1
    );
    assert_eq!(
        view.count(&KeyRange::from_etcd(b"a/1\0".to_vec(), vec![0])),
        2
    );
    assert_eq!(view.count(&KeyRange::from_etcd(b"c".to_vec(), vec![0])), 0);
    assert_eq!(
        view.count(&KeyRange::from_etcd(b"\0".to_vec(), b"zz".to_vec())),
        3
    );
    assert_eq!(
        view.count(&KeyRange::from_etcd(b"b".to_vec(), b"a".to_vec())),
        0
    );
    assert_eq!(view.revision(), 4);
}

#[tokio::test]
async fn readers_wait_for_their_revision() {
    let applied = Applied::load(&[], 1, 0, 100);
    let short = std::time::Duration::from_millis(20);
    assert!(applied.reached(1, short).await);
    assert!(!applied.reached(2, short).await);
    let later = applied.clone();
    let waiter =
        tokio::spawn(async move { later.reached(3, std::time::Duration::from_secs(30)).await });
    assert!(apply(
        &applied,
        1,
        3,
        &[row("k", 2, false), row("k", 3, false)]
    ));
    assert!(waiter.await.expect("the waiter runs"));
}

/// The held value of every key, `None` where it is missing.
fn values(applied: &Applied) -> Vec<(String, Option<String>)> {
    let view = applied.view();
    let all = KeyRange::from_etcd(b"\0".to_vec(), vec![0]);
    view.range(&all)
        .map(|(key, entry)| {
            (
                String::from_utf8_lossy(key).into_owned(),
                entry
                    .value
                    .as_ref()
                    .map(|v| String::from_utf8_lossy(v).into_owned()),
            )
        })
        .collect()
}

fn held(pairs: &[(&str, Option<&str>)]) -> Vec<(String, Option<String>)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
        .collect()
}

#[test]
fn values_follow_their_rows_within_the_budget() {
    // Room for two 4-byte values.
    let applied = Applied::load(&[], 1, 2 * cost(b"aaaa"), 100);
    assert!(apply(
        &applied,
        1,
        3,
        &[put("a", 2, false, "a-v1"), put("b", 3, false, "b-v1")]
    ));
    assert_eq!(
        values(&applied),
        held(&[("a", Some("a-v1")), ("b", Some("b-v1"))])
    );
    // A rewrite replaces the value; a delete drops it with the key.
    assert!(apply(
        &applied,
        3,
        5,
        &[put("a", 4, false, "a-v2"), row("b", 5, true)]
    ));
    assert_eq!(values(&applied), held(&[("a", Some("a-v2"))]));
    assert_eq!(applied.size(), (1, cost(b"a-v2")));
    // A third value overflows: the hand drops one, and the total fits again.
    assert!(apply(
        &applied,
        5,
        7,
        &[put("c", 6, false, "c-v1"), put("d", 7, false, "d-v1")]
    ));
    assert_eq!(applied.size(), (3, 2 * cost(b"aaaa")));
    assert_eq!(
        values(&applied).iter().filter(|(_, v)| v.is_none()).count(),
        1
    );
    // A value larger than the whole budget is never held.
    assert!(apply(
        &applied,
        7,
        8,
        &[put("e", 8, false, "longer than the whole budget allows")]
    ));
    assert_eq!(values(&applied).last(), Some(&("e".to_string(), None)));
    assert_eq!(applied.size().1, 2 * cost(b"aaaa"));
}

#[test]
fn a_value_read_since_the_hand_passed_is_spared_once() {
    let applied = Applied::load(&[], 1, 2 * cost(b"aaaa"), 100);
    assert!(apply(
        &applied,
        1,
        3,
        &[put("a", 2, false, "a-v1"), put("b", 3, false, "b-v1")]
    ));
    {
        let view = applied.view();
        let a = KeyRange::single(b"a".to_vec());
        let (_, entry) = view.range(&a).next().expect("a is live");
        assert!(entry.value().is_some());
    }
    assert!(apply(&applied, 3, 4, &[put("c", 4, false, "c-v1")]));
    assert_eq!(
        values(&applied),
        held(&[("a", Some("a-v1")), ("b", None), ("c", Some("c-v1"))])
    );
}

#[test]
fn a_fill_takes_only_the_value_of_the_row_the_key_still_has() {
    let applied = Applied::load(
        &[row("a", 2, false), row("b", 3, false), row("c", 4, false)],
        4,
        1 << 20,
        100,
    );
    assert_eq!(
        values(&applied),
        held(&[("a", None), ("b", None), ("c", None)])
    );
    applied.fill([
        (&b"a"[..], 2, Arc::from(&b"a-v1"[..])),
        // Not b's row: b was read at another revision.
        (&b"b"[..], 9, Arc::from(&b"b-old"[..])),
        (&b"x"[..], 2, Arc::from(&b"absent"[..])),
    ]);
    assert_eq!(
        values(&applied),
        held(&[("a", Some("a-v1")), ("b", None), ("c", None)])
    );
    assert_eq!(applied.size(), (3, cost(b"a-v1")));
}

/// The writer takes old values from here: a value must be the one of the row it names, or
/// nothing (then the writer reads the row by `(key, revision)` from the database).
#[test]
fn a_value_is_given_for_the_row_the_key_has_only() {
    let applied = Applied::load(&[row("a", 2, false)], 2, 1 << 20, 100);
    // Loaded without values: a miss.
    assert_eq!(applied.value_at(b"a", 2), None);
    assert!(apply(&applied, 2, 3, &[put("a", 3, false, "a-v3")]));
    assert_eq!(applied.value_at(b"a", 3), Some(b"a-v3".to_vec()));
    // The key's earlier row, a row it never had, a key it lacks: misses, never a wrong value.
    assert_eq!(applied.value_at(b"a", 2), None);
    assert_eq!(applied.value_at(b"a", 4), None);
    assert_eq!(applied.value_at(b"b", 3), None);
    assert!(apply(&applied, 3, 4, &[row("a", 4, true)]));
    assert_eq!(applied.value_at(b"a", 3), None);
}

#[test]
fn counts_and_past_revisions_match_a_model() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let name = |rng: &mut rand::rngs::StdRng| {
        let len = rng.random_range(1..4);
        (0..len)
            .map(|_| rng.random_range(b'a'..=b'e'))
            .collect::<Vec<u8>>()
    };
    let applied = Applied::load(&[], 1, 1 << 20, 300);
    // The live keys with their mod revisions: `model[r - 1]` is revision r.
    let mut model: Vec<BTreeMap<Vec<u8>, i64>> = vec![BTreeMap::new()];
    let mut answered_in_the_past = 0;
    for revision in 1..2000 {
        let key = name(&mut rng);
        let deleted = rng.random_range(0..3) == 0;
        let text = String::from_utf8(key.clone()).expect("ascii");
        assert!(apply(
            &applied,
            revision,
            revision + 1,
            &[put(&text, revision + 1, deleted, "v")]
        ));
        let mut next = model.last().expect("a first revision").clone();
        if deleted {
            next.remove(&key);
        } else {
            next.insert(key, revision + 1);
        }
        model.push(next);

        let view = applied.view();
        let (from, to) = (name(&mut rng), name(&mut rng));
        let past = rng.random_range(1..=revision + 1);
        for range in [
            KeyRange::from_etcd(from.clone(), to.clone()),
            KeyRange::from_etcd(from.clone(), vec![0]),
            KeyRange::single(from.clone()),
        ] {
            assert_eq!(
                view.count(&range),
                view.range(&range).count() as i64,
                "{range:?}"
            );
            let expected: Vec<(Vec<u8>, i64)> = model[(past - 1) as usize]
                .iter()
                .filter(|(k, _)| range.contains(k))
                .map(|(k, r)| (k.clone(), *r))
                .collect();
            match view.at(&range, past) {
                Some((count, items)) => {
                    let got: Vec<(Vec<u8>, i64)> = items
                        .map(|item| (item.key.to_vec(), item.meta.mod_revision))
                        .collect();
                    assert_eq!(got, expected, "{range:?} at {past} of {}", revision + 1);
                    assert_eq!(count, expected.len() as i64, "{range:?} at {past}");
                    answered_in_the_past += usize::from(past <= revision);
                }
                None => assert!(past < view.state.floor, "{past} is above the floor"),
            }
        }
        drop(view);
        if revision % 97 == 0 {
            assert_chains_hold(&applied);
        }
    }
    // The window moved on: the floor rose, and reads above it were answered.
    assert!(applied.floor() > 1500, "floor {}", applied.floor());
    assert!(answered_in_the_past > 100, "{answered_in_the_past}");
}

/// Each key of `range` at `revision` with its mod revision and value, if held.
fn at(
    applied: &Applied,
    range: &KeyRange,
    revision: i64,
) -> Option<Vec<(String, i64, Option<String>)>> {
    let view = applied.view();
    let (_, items) = view.at(range, revision)?;
    Some(
        items
            .map(|item| {
                (
                    String::from_utf8_lossy(item.key).into_owned(),
                    item.meta.mod_revision,
                    item.value.map(|v| String::from_utf8_lossy(v).into_owned()),
                )
            })
            .collect(),
    )
}

#[test]
fn past_their_share_the_oldest_history_values_go_and_the_changes_stay() {
    // A quarter of 400 bytes for the history's values: two of 30 bytes (46 with the overhead).
    let applied = Applied::load(&[], 1, 400, 100);
    let value = |r: i64| format!("{r:030}");
    for revision in 2..=10 {
        assert!(apply(
            &applied,
            revision - 1,
            revision,
            &[put("a", revision, false, &value(revision))]
        ));
    }
    let a = KeyRange::single(b"a".to_vec());
    assert_eq!(applied.floor(), 1, "no change forgotten");
    // The two newest replaced values are held; older ones are misses, their rows still known.
    assert_eq!(
        at(&applied, &a, 9),
        Some(vec![("a".into(), 9, Some(value(9)))])
    );
    assert_eq!(
        at(&applied, &a, 8),
        Some(vec![("a".into(), 8, Some(value(8)))])
    );
    assert_eq!(at(&applied, &a, 7), Some(vec![("a".into(), 7, None)]));
    assert_eq!(at(&applied, &a, 2), Some(vec![("a".into(), 2, None)]));
    assert_eq!(at(&applied, &a, 1), Some(vec![]));
    // The number of changes still bounds the window.
    let applied = Applied::load(&[], 1, 400, 3);
    for revision in 2..=10 {
        assert!(apply(
            &applied,
            revision - 1,
            revision,
            &[row("a", revision, false)]
        ));
    }
    assert_eq!(applied.floor(), 7);
    assert_eq!(at(&applied, &a, 6), None);
    assert_eq!(at(&applied, &a, 7).map(|v| v[0].1), Some(7));
}

#[test]
fn a_compaction_forgets_the_changes_it_compacted_past() {
    let applied = Applied::load(&[row("b", 1, false)], 1, 1 << 20, 100);
    for revision in 2..=10 {
        let key = if revision % 2 == 0 { "a" } else { "b" };
        assert!(apply(
            &applied,
            revision - 1,
            revision,
            &[row(key, revision, false)]
        ));
    }
    let all = KeyRange::from_etcd(b"a".to_vec(), b"c".to_vec());
    let before = at(&applied, &all, 6);
    applied.forget_through(6);
    assert_chains_hold(&applied);
    assert_eq!(applied.floor(), 6);
    assert_eq!(at(&applied, &all, 5), None);
    assert_eq!(at(&applied, &all, 6), before);
    assert_eq!(
        before.map(|v| v.into_iter().map(|(k, r, _)| (k, r)).collect::<Vec<_>>()),
        Some(vec![("a".into(), 6), ("b".into(), 5)])
    );
    // Nothing past the index's revision to forget: the window is empty, reads at it still work.
    applied.forget_through(20);
    assert_eq!(applied.floor(), 10);
    assert_eq!(at(&applied, &all, 10).map(|v| v.len()), Some(2));
}

/// One change of a simulated log, with the bookkeeping columns a real row carries.
fn change(
    state: &mut BTreeMap<Vec<u8>, LogRow>,
    key: &[u8],
    revision: i64,
    delete: bool,
    lease: i64,
) -> Option<LogRow> {
    let before = state.get(key).filter(|row| !row.deleted).cloned();
    if delete && before.is_none() {
        return None;
    }
    let created = before.is_none();
    let row = LogRow {
        revision,
        sub: 0,
        key: key.to_vec(),
        created: created && !delete,
        deleted: delete,
        create_revision: before.as_ref().map_or(revision, |b| b.create_revision),
        prev_revision: state.get(key).map_or(0, |b| b.revision),
        version: match (&before, delete) {
            (Some(b), true) => b.version,
            (Some(b), false) => b.version + 1,
            (None, _) => 1,
        },
        lease: if delete { 0 } else { lease },
        value: Vec::new(),
        old_value: None,
        old_lease: before.as_ref().map_or(0, |b| b.lease),
    };
    state.insert(key.to_vec(), row.clone());
    Some(row)
}

#[test]
fn a_window_taken_from_the_log_answers_as_one_that_saw_the_changes() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    // `seen` takes every change as it happens; `loaded` is loaded at the end from the newest
    // rows and the changes since revision 300, as a process starting on that log would be.
    let seen = Applied::load(&[], 1, 1 << 20, 10_000);
    let mut state = BTreeMap::new();
    let mut rows = Vec::new();
    let mut revision = 1;
    while revision < 1000 {
        let key = vec![rng.random_range(b'a'..=b'h')];
        let delete = rng.random_range(0..4) == 0;
        let Some(row) = change(
            &mut state,
            &key,
            revision + 1,
            delete,
            rng.random_range(0..3),
        ) else {
            continue;
        };
        assert!(apply(
            &seen,
            revision,
            revision + 1,
            std::slice::from_ref(&row)
        ));
        rows.push(row);
        revision += 1;
    }
    let heads: Vec<LogRow> = state.values().cloned().collect();
    let loaded = Applied::load(&heads, revision, 1 << 20, 10_000);
    let since: Vec<LogRow> = rows.iter().filter(|r| r.revision > 300).cloned().collect();
    loaded.remember_since(300, &since);
    assert_eq!(loaded.floor(), 300);
    let all = KeyRange::from_etcd(b"a".to_vec(), vec![0]);
    let some = KeyRange::from_etcd(b"b".to_vec(), b"e".to_vec());
    let metas = |applied: &Applied, range: &KeyRange, at: i64| {
        let view = applied.view();
        view.at(range, at).map(|(count, items)| {
            let items: Vec<_> = items.map(|i| (i.key.to_vec(), i.meta)).collect();
            (count, items)
        })
    };
    let singles: Vec<KeyRange> = (b'a'..=b'i').map(|k| KeyRange::single(vec![k])).collect();
    for at in 300..=revision {
        for range in [&all, &some].into_iter().chain(&singles) {
            assert_eq!(
                metas(&loaded, range, at),
                metas(&seen, range, at),
                "{range:?} at {at}"
            );
        }
    }
    assert_eq!(metas(&loaded, &all, 299), None);
    assert_chains_hold(&loaded);
    assert_chains_hold(&seen);
    // Each lease's keys at each revision: the live keys whose newest row then names it.
    let leased_then = |lease: i64, at: i64| {
        let mut newest = BTreeMap::new();
        for row in rows.iter().take_while(|r| r.revision <= at) {
            newest.insert(row.key.clone(), row);
        }
        newest
            .into_iter()
            .filter(|(_, row)| !row.deleted && row.lease == lease)
            .map(|(key, _)| key)
            .collect::<Vec<_>>()
    };
    let mut leased_seen = 0;
    for at in 300..=revision {
        for lease in 1..3 {
            let expected = leased_then(lease, at);
            leased_seen += expected.len();
            assert_eq!(
                loaded.view().leased_at(lease, at).as_ref(),
                Some(&expected),
                "lease {lease} at {at}"
            );
            assert_eq!(seen.view().leased_at(lease, at), Some(expected));
        }
    }
    assert!(leased_seen > 1000, "{leased_seen}");
    assert_eq!(loaded.view().leased_at(1, 299), None);
    // A window smaller than the changes keeps the newest, its floor raised to match.
    let small = Applied::load(&heads, revision, 1 << 20, 100);
    small.remember_since(300, &since);
    assert_eq!(small.floor(), revision - 100);
    for range in [&all].into_iter().chain(&singles) {
        assert_eq!(
            metas(&small, range, revision - 100),
            metas(&seen, range, revision - 100),
            "{range:?}"
        );
    }
    assert_chains_hold(&small);
}

/// Every key's changes in the window are chained newest to oldest, from its live entry or,
/// for a key whose newest change deleted it, from `gone`, which holds exactly those keys.
fn assert_chains_hold(applied: &Applied) {
    let view = applied.view();
    let state = &view.state;
    let mut newest: BTreeMap<&[u8], Position> = BTreeMap::new();
    let mut chained = 0;
    for (i, change) in state.history.iter().enumerate() {
        let position = state.first_position + i as Position;
        let prev = newest.insert(&change.key, position);
        let expected = prev.unwrap_or(NO_CHANGE);
        // A change whose predecessor left the window may name it or nothing.
        if expected != NO_CHANGE || change.prev >= state.first_position {
            assert_eq!(change.prev, expected, "change at {position}");
        }
        chained += usize::from(prev.is_some());
    }
    let mut gone = BTreeMap::new();
    for (key, position) in newest {
        match state.keys.get(key) {
            Some(entry) => assert_eq!(entry.last_change, position, "{key:?}"),
            None => {
                assert!(
                    state.change_at(position).is_some_and(|c| c.deleted),
                    "{key:?}"
                );
                gone.insert(key.to_vec(), position);
            }
        }
    }
    let held: BTreeMap<Vec<u8>, Position> =
        state.gone.iter().map(|(k, p)| (k.to_vec(), *p)).collect();
    assert_eq!(held, gone);
    assert!(chained > 0 || state.history.len() < 2);
}
