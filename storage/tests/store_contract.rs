//! The `RunStore` contract (SPEC §3), run against every implementation: in-memory, SQLite and PostgreSQL.
//!
//! Each case is a function over `&mut dyn RunStore`; the `contract!` macro instantiates it once per
//! implementation, so both run exactly the same assertions.

use serde_json::{json, Value};
use storage::record::{validate_record, RetentionPolicy, RunRecord, RunStatus, VisibilityFilter};
use storage::store::{Cursor, ListQuery, PolicyProposal, RunStore, Search, MAX_FUTURE_MS};
use storage::RunId;
use storage::{MemoryStore, SqliteStore, Synchronous};

const NOW: i64 = 1_800_000_000_000;
const DAY: i64 = 86_400_000;

fn record_json(id: &str, finished_at: i64) -> Value {
    json!({
        "id": id, "agent": "demo", "channelId": "C1", "userId": "U1", "threadKey": "C1:t1",
        "channelVisibility": "public", "startedAt": finished_at - 1000, "finishedAt": finished_at,
        "status": "completed", "eventCount": 2, "storedEventCount": 2, "truncated": false,
        "events": [
            {"type": "input", "seq": 1, "at": finished_at - 1000, "text": "hi", "source": "request"},
            {"type": "answer", "seq": 2, "at": finished_at, "text": "done"}
        ],
        "diagnosis": {"byCategory": {}}
    })
}

fn record(id: &str, finished_at: i64) -> RunRecord {
    validate_record(&record_json(id, finished_at)).expect("valid test record")
}

fn with(id: &str, finished_at: i64, patch: Value) -> RunRecord {
    let mut v = record_json(id, finished_at);
    for (k, val) in patch.as_object().expect("patch object") {
        v[k] = val.clone();
    }
    validate_record(&v).expect("valid test record")
}

fn all() -> ListQuery {
    ListQuery::visible_to(VisibilityFilter::All)
}

fn ids(store: &mut dyn RunStore, q: &ListQuery, now: i64) -> Vec<RunId> {
    store
        .list(q, now)
        .expect("list")
        .items
        .into_iter()
        .map(|i| i.head.id)
        .collect()
}

fn policy(days: u32, runs: u32, bytes: u64, at: i64) -> PolicyProposal {
    PolicyProposal {
        policy: RetentionPolicy {
            retention_days: days,
            max_runs: runs,
            max_bytes: bytes,
        },
        updated_at: at,
    }
}

fn two_megabyte_record_round_trips(s: &mut dyn RunStore) {
    let events: Vec<Value> = (1..=40)
        .map(|i| json!({"type": "tool_result", "seq": i, "at": NOW, "summary": "x".repeat(50_000), "callId": format!("c{i}"), "extra": {"kept": i}}))
        .collect();
    let r = with(
        "big",
        NOW,
        json!({"events": events, "eventCount": 40, "storedEventCount": 40, "futureField": {"a": [1, 2]}}),
    );
    assert!(r.encoded_len() > 2_000_000);
    let out = s.put(&r, None, NOW).expect("put");
    assert!(out.stored && !out.rewritten);
    assert_eq!(
        s.get(&RunId::from("big"), NOW).expect("get"),
        Some(r.clone())
    );
    let page = s.list(&all(), NOW).expect("list");
    assert_eq!(page.items.len(), 1);
    assert_eq!(page.items[0].bytes, Some(r.encoded_len() as u64));
    assert_eq!(page.items[0].head, r.head);
}

fn bad_ids_are_not_found_on_every_method(s: &mut dyn RunStore) {
    s.put(&record("good", NOW), None, NOW).expect("put");
    for bad in ["../../etc/x", "has space", &"a".repeat(65), ""] {
        assert_eq!(s.get(&RunId::from(bad), NOW).expect("get"), None, "{bad}");
        assert_eq!(
            s.get_summary(&RunId::from(bad), NOW).expect("summary"),
            None,
            "{bad}"
        );
        assert_eq!(
            s.events(&RunId::from(bad), 0, None, NOW).expect("events"),
            None,
            "{bad}"
        );
        assert!(!s.delete(&RunId::from(bad)).expect("delete"), "{bad}");
        let mut r = record("good", NOW);
        r.head.id = RunId::from(bad);
        assert!(
            s.put(&r, None, NOW).is_err(),
            "put of {bad:?} must be refused"
        );
    }
    assert_eq!(ids(s, &all(), NOW), vec!["good"]);
}

fn list_is_newest_first_with_default_and_cap(s: &mut dyn RunStore) {
    for i in 0..250 {
        s.put(&record(&format!("r{i:03}"), NOW - 250 + i), None, NOW)
            .expect("put");
    }
    let got = ids(s, &all(), NOW);
    assert_eq!(got.len(), 50);
    assert_eq!(got[0], "r249");
    assert_eq!(got[49], "r200");
    let q = ListQuery {
        limit: Some(1000),
        ..all()
    };
    let page = s.list(&q, NOW).expect("list");
    assert_eq!(page.items.len(), 200);
    assert!(page.next_before.is_some());
    assert!(page.items.iter().all(|i| i.bytes.is_some()));
}

fn cursor_keeps_same_millisecond_siblings_across_a_page_boundary(s: &mut dyn RunStore) {
    for id in ["a", "b", "c"] {
        s.put(&record(id, NOW - 10), None, NOW).expect("put");
    }
    s.put(&record("d", NOW - 20), None, NOW).expect("put");
    s.put(&record("e", NOW - 5), None, NOW).expect("put");
    let q = ListQuery {
        limit: Some(2),
        ..all()
    };
    let p1 = s.list(&q, NOW).expect("page 1");
    assert_eq!(
        p1.items
            .iter()
            .map(|i| i.head.id.as_str())
            .collect::<Vec<_>>(),
        ["e", "c"]
    );
    let c1 = p1.next_before.expect("full page has a cursor");
    assert_eq!(
        c1,
        Cursor {
            finished_at: NOW - 10,
            id: Some("c".into())
        }
    );
    let p2 = s
        .list(
            &ListQuery {
                before: Some(c1),
                ..q.clone()
            },
            NOW,
        )
        .expect("page 2");
    assert_eq!(
        p2.items
            .iter()
            .map(|i| i.head.id.as_str())
            .collect::<Vec<_>>(),
        ["b", "a"]
    );
    let p3 = s
        .list(
            &ListQuery {
                before: p2.next_before,
                ..q.clone()
            },
            NOW,
        )
        .expect("page 3");
    assert_eq!(
        p3.items
            .iter()
            .map(|i| i.head.id.as_str())
            .collect::<Vec<_>>(),
        ["d"]
    );
    assert_eq!(p3.next_before, None);
    // `before` alone: strictly older than the millisecond.
    let older = ListQuery {
        before: Some(Cursor {
            finished_at: NOW - 10,
            id: None,
        }),
        ..all()
    };
    assert_eq!(ids(s, &older, NOW), ["d"]);
}

fn filters_and_visibility_narrow_the_list(s: &mut dyn RunStore) {
    s.put(
        &with(
            "pub1",
            NOW - 1,
            json!({"channelId": "C1", "userId": "U1", "agent": "demo", "threadKey": "C1:a"}),
        ),
        None,
        NOW,
    )
    .unwrap();
    s.put(&with("priv", NOW - 2, json!({"channelId": "C2", "userId": "U2", "agent": "other", "channelVisibility": "private", "threadKey": "C2:b", "parentRunId": "pub1"})), None, NOW).unwrap();
    s.put(&with("dm1", NOW - 3 * DAY, json!({"channelId": "D1", "userId": "U1", "channelVisibility": "dm", "threadKey": "D1:c"})), None, NOW).unwrap();
    let mut legacy = record_json("legacy", NOW - 4);
    legacy.as_object_mut().unwrap().remove("channelVisibility");
    s.put(&validate_record(&legacy).unwrap(), None, NOW)
        .unwrap();

    let q = |f: fn(&mut ListQuery)| {
        let mut q = all();
        f(&mut q);
        q
    };
    assert_eq!(
        ids(s, &q(|q| q.agent = Some("other".into())), NOW),
        ["priv"]
    );
    assert_eq!(ids(s, &q(|q| q.channel = Some("D1".into())), NOW), ["dm1"]);
    assert_eq!(
        ids(s, &q(|q| q.thread_key = Some("C1:a".into())), NOW),
        ["pub1"]
    );
    assert_eq!(
        ids(s, &q(|q| q.parent_run_id = Some("pub1".into())), NOW),
        ["priv"]
    );
    assert_eq!(
        ids(s, &q(|q| q.since_ms = Some(NOW - DAY)), NOW),
        ["pub1", "priv", "legacy"]
    );

    let vis = |v: Value| ListQuery::visible_to(VisibilityFilter::parse(&v).expect("filter"));
    assert_eq!(
        ids(s, &vis(json!({"kind": "none"})), NOW),
        Vec::<String>::new()
    );
    assert_eq!(
        ids(
            s,
            &vis(json!({"kind": "channels-in", "ids": ["C2", "D1"]})),
            NOW
        ),
        ["priv", "dm1"]
    );
    assert_eq!(
        ids(s, &vis(json!({"kind": "user-is", "id": "U1"})), NOW),
        ["pub1", "legacy", "dm1"]
    );
    assert_eq!(
        ids(
            s,
            &vis(json!({"kind": "visibility-in", "values": ["unknown"]})),
            NOW
        ),
        ["legacy"]
    );
    assert_eq!(
        ids(s, &vis(json!({"kind": "or", "of": []})), NOW),
        Vec::<String>::new()
    );
    assert_eq!(
        ids(s, &vis(json!({"kind": "and", "of": []})), NOW),
        Vec::<String>::new()
    );
    assert_eq!(
        ids(
            s,
            &vis(
                json!({"kind": "and", "of": [{"kind": "user-is", "id": "U1"}, {"kind": "visibility-in", "values": ["public", "dm"]}]})
            ),
            NOW
        ),
        ["pub1", "dm1"]
    );
    assert_eq!(
        ids(
            s,
            &vis(
                json!({"kind": "or", "of": [{"kind": "user-is", "id": "U2"}, {"kind": "channels-in", "ids": ["D1"]}]})
            ),
            NOW
        ),
        ["priv", "dm1"]
    );
    // Visibility is ANDed with the other filters.
    let mut both = vis(json!({"kind": "user-is", "id": "U1"}));
    both.channel = Some("C1".into());
    assert_eq!(ids(s, &both, NOW), ["pub1", "legacy"]);
    let legacy = s.get(&RunId::from("legacy"), NOW).unwrap().expect("legacy");
    assert_eq!(
        legacy.head.channel_visibility,
        storage::record::ChannelVisibility::Unknown
    );
}

fn events_page_strictly_after_the_cursor(s: &mut dyn RunStore) {
    let events: Vec<Value> = (1..=20).map(|i| json!({"type": "note", "seq": i, "at": NOW, "kind": "k", "summary": format!("e{i}")})).collect();
    s.put(
        &with(
            "ev",
            NOW,
            json!({"events": events, "eventCount": 20, "storedEventCount": 20}),
        ),
        None,
        NOW,
    )
    .unwrap();
    let p = s
        .events(&RunId::from("ev"), 10, Some(5), NOW)
        .unwrap()
        .expect("page");
    assert_eq!(
        p.events
            .iter()
            .map(|e| e["seq"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [11, 12, 13, 14, 15]
    );
    assert_eq!(p.next_after_seq, Some(15));
    let p = s
        .events(&RunId::from("ev"), 15, Some(5), NOW)
        .unwrap()
        .expect("last page");
    assert_eq!(p.events.len(), 5);
    assert_eq!(p.next_after_seq, None);
    assert_eq!(
        s.events(&RunId::from("ev"), 20, None, NOW)
            .unwrap()
            .expect("past the end")
            .events,
        Vec::<Value>::new()
    );
    assert_eq!(
        s.events(&RunId::from("nosuch"), 0, None, NOW).unwrap(),
        None
    );
    s.put(
        &with(
            "empty",
            NOW,
            json!({"events": [], "eventCount": 0, "storedEventCount": 0}),
        ),
        None,
        NOW,
    )
    .unwrap();
    assert_eq!(
        s.events(&RunId::from("empty"), 0, None, NOW)
            .unwrap()
            .expect("known run")
            .events,
        Vec::<Value>::new()
    );
    // Registry seqs are kept: 2001..=7000 page from 6500 by stored seq.
    let events: Vec<Value> = (2001..=7000)
        .map(|i| json!({"type": "note", "seq": i, "at": NOW, "summary": "s"}))
        .collect();
    s.put(
        &with(
            "big",
            NOW,
            json!({"events": events, "eventCount": 7000, "storedEventCount": 5000}),
        ),
        None,
        NOW,
    )
    .unwrap();
    let p = s
        .events(&RunId::from("big"), 6500, None, NOW)
        .unwrap()
        .expect("page");
    assert_eq!(p.events.len(), 500);
    assert_eq!(p.events[0]["seq"], 6501);
    assert_eq!(p.next_after_seq, None);
    let p = s
        .events(&RunId::from("big"), 0, Some(100_000), NOW)
        .unwrap()
        .expect("capped page");
    assert_eq!(p.events.len(), 5000);
    let p = s
        .events(&RunId::from("big"), 0, None, NOW)
        .unwrap()
        .expect("default page");
    assert_eq!((p.events.len(), p.next_after_seq), (1000, Some(3000)));
}

fn retention_hides_expired_rows_on_every_read_before_any_write(s: &mut dyn RunStore) {
    s.put(&record("old", NOW - 29 * DAY), None, NOW).unwrap();
    s.put(&record("new", NOW), None, NOW).unwrap();
    assert_eq!(ids(s, &all(), NOW), ["new", "old"]);
    let later = NOW + 2 * DAY; // "old" is now 31 days old; no write happens in between
    assert_eq!(ids(s, &all(), later), ["new"]);
    assert_eq!(s.get(&RunId::from("old"), later).unwrap(), None);
    assert_eq!(s.get_summary(&RunId::from("old"), later).unwrap(), None);
    assert_eq!(s.events(&RunId::from("old"), 0, None, later).unwrap(), None);
    assert!(s.get_summary(&RunId::from("new"), later).unwrap().is_some());
}

fn expire_removes_what_the_policy_no_longer_keeps_with_no_write(s: &mut dyn RunStore) {
    s.put(&record("old", NOW - 29 * DAY), None, NOW).unwrap();
    s.put(&record("new", NOW), None, NOW).unwrap();
    let out = s.expire(NOW, "").unwrap();
    assert_eq!((out.runs, out.orphaned), (0, 0), "both kept");
    // Two days on, with no put in between: "old" is past the 30-day policy and goes from disk.
    let out = s.expire(NOW + 2 * DAY, "").unwrap();
    assert_eq!(out.runs, 1);
    assert!(
        !s.delete(&RunId::from("old")).unwrap(),
        "nothing of it stays on disk"
    );
    assert!(s.get(&RunId::from("new"), NOW + 2 * DAY).unwrap().is_some());
    assert_eq!(
        s.expire(NOW + 2 * DAY, "").unwrap().runs,
        0,
        "a second pass finds nothing"
    );
}

fn put_outside_policy_is_not_stored(s: &mut dyn RunStore) {
    let out = s
        .put(&record("ancient", NOW - 31 * DAY), None, NOW)
        .unwrap();
    assert!(!out.stored);
    assert_eq!(s.get(&RunId::from("ancient"), NOW).unwrap(), None);
    assert!(
        !s.delete(&RunId::from("ancient")).unwrap(),
        "nothing of it stays on disk"
    );
}

/// A put answers how many rows the policy keeps after it, counting itself only when it is within the
/// cutoff: a new row past it, and a row rewritten past it, are not kept.
fn a_put_counts_what_the_policy_retains_around_the_cutoff(s: &mut dyn RunStore) {
    let p = policy(30, 1_000, 1 << 30, NOW);
    let out = s.put(&record("young", NOW - DAY), Some(&p), NOW).unwrap();
    assert_eq!((out.stored, out.retained), (true, 1));
    let out = s
        .put(&record("ancient", NOW - 31 * DAY), Some(&p), NOW)
        .unwrap();
    assert_eq!((out.stored, out.retained), (false, 1));
    let out = s
        .put(&record("young", NOW - 31 * DAY), Some(&p), NOW)
        .unwrap();
    assert_eq!((out.stored, out.retained), (false, 0));
    let out = s.put(&record("again", NOW), Some(&p), NOW).unwrap();
    assert_eq!((out.stored, out.rewritten, out.retained), (true, false, 1));
    let out = s.put(&record("again", NOW - 1), Some(&p), NOW).unwrap();
    assert_eq!((out.stored, out.rewritten, out.retained), (true, true, 1));
    assert_eq!(ids(s, &all(), NOW), vec!["again".to_owned()]);
}

fn identical_repeat_is_not_a_rewrite_and_a_change_replaces_events_whole(s: &mut dyn RunStore) {
    let five: Vec<Value> = (1..=5)
        .map(|i| json!({"type": "note", "seq": i, "at": NOW, "summary": "s"}))
        .collect();
    let r = with(
        "x",
        NOW,
        json!({"events": five, "eventCount": 5, "storedEventCount": 5}),
    );
    assert!(!s.put(&r, None, NOW).unwrap().rewritten);
    let again = s.put(&r, None, NOW).unwrap();
    assert!(again.stored && !again.rewritten);
    let three: Vec<Value> = (1..=3)
        .map(|i| json!({"type": "note", "seq": i, "at": NOW, "summary": "t"}))
        .collect();
    let r2 = with(
        "x",
        NOW,
        json!({"events": three, "eventCount": 3, "storedEventCount": 3}),
    );
    let out = s.put(&r2, None, NOW).unwrap();
    assert!(out.stored && out.rewritten);
    assert_eq!(
        s.events(&RunId::from("x"), 0, None, NOW)
            .unwrap()
            .unwrap()
            .events
            .len(),
        3
    );
    assert_eq!(s.get(&RunId::from("x"), NOW).unwrap(), Some(r2));
}

fn provisional_put_over_a_final_record_writes_nothing(s: &mut dyn RunStore) {
    let tomb = with(
        "t",
        NOW - 100,
        json!({"status": "interrupted", "provisional": true, "finishedAt": NOW - 1000}),
    );
    assert!(s.put(&tomb, None, NOW).unwrap().stored);
    // The final record replaces the tombstone whole.
    let fin = record("t", NOW);
    let out = s.put(&fin, None, NOW).unwrap();
    assert!(out.stored && out.rewritten);
    // A late provisional write is stood down by the floor.
    let out = s.put(&tomb, None, NOW).unwrap();
    assert!(out.stored && !out.rewritten);
    let got = s
        .get(&RunId::from("t"), NOW)
        .unwrap()
        .expect("final record");
    assert_eq!(got, fin);
    assert_eq!(got.head.status, RunStatus::Completed);
    assert!(!got.head.provisional);
}

fn a_put_trims_at_most_500_rows_and_the_next_put_finishes(s: &mut dyn RunStore) {
    for i in 0..600 {
        s.put(&record(&format!("r{i:03}"), NOW - 10_000 + i), None, NOW)
            .unwrap();
    }
    // A proposal keeping one run: the put hides 600 rows and physically trims the 500 oldest.
    let out = s
        .put(
            &record("keep1", NOW),
            Some(&policy(30, 1, 2 << 30, NOW)),
            NOW,
        )
        .unwrap();
    assert!(out.stored);
    assert_eq!(out.retained, 1);
    assert_eq!(
        ids(
            s,
            &ListQuery {
                limit: Some(200),
                ..all()
            },
            NOW
        ),
        ["keep1"]
    );
    assert_eq!(
        s.get(&RunId::from("r599"), NOW).unwrap(),
        None,
        "hidden on read while still on disk"
    );
    s.put(&record("keep2", NOW + 1), None, NOW).unwrap();
    let remaining = (0..600)
        .filter(|i| s.delete(&RunId::from(format!("r{i:03}"))).unwrap())
        .count();
    assert_eq!(remaining, 0, "the second put finished the trim");
    assert!(s.delete(&RunId::from("keep2")).unwrap());
}

fn a_trim_never_removes_more_than_500_in_one_put(s: &mut dyn RunStore) {
    for i in 0..600 {
        s.put(&record(&format!("r{i:03}"), NOW - 10_000 + i), None, NOW)
            .unwrap();
    }
    s.put(
        &record("keep1", NOW),
        Some(&policy(30, 1, 2 << 30, NOW)),
        NOW,
    )
    .unwrap();
    let remaining: Vec<usize> = (0..600)
        .filter(|i| s.delete(&RunId::from(format!("r{i:03}"))).unwrap())
        .collect();
    assert_eq!(remaining.len(), 100);
    assert_eq!(remaining[0], 500, "oldest first");
}

fn max_runs_and_max_bytes_keep_the_newest(s: &mut dyn RunStore) {
    for (i, id) in ["a", "b", "c", "d"].iter().enumerate() {
        s.put(&record(id, NOW - 10 + i as i64), None, NOW).unwrap();
    }
    s.put(&record("e", NOW), Some(&policy(30, 3, 2 << 30, NOW)), NOW)
        .unwrap();
    assert_eq!(ids(s, &all(), NOW), ["e", "d", "c"]);
    assert_eq!(
        s.get_summary(&RunId::from("b"), NOW).unwrap(),
        None,
        "summary hides what list hides"
    );
    // maxBytes: 16 MiB keeps the newest records whose sizes fit.
    let blob = |id: &str, t: i64| {
        with(
            id,
            t,
            json!({"events": [{"type": "note", "seq": 1, "at": t, "summary": "y".repeat(3 << 20)}], "eventCount": 1, "storedEventCount": 1}),
        )
    };
    for i in 0..6 {
        s.put(
            &blob(&format!("m{i}"), NOW + 100 + i),
            Some(&policy(30, 100, 16 << 20, NOW + 1)),
            NOW + 2,
        )
        .unwrap();
    }
    // Each blob is just over 3 MiB: five fit in 16 MiB, the sixth (oldest) and the small ones go.
    assert_eq!(ids(s, &all(), NOW + 2), ["m5", "m4", "m3", "m2", "m1"]);
}

fn policy_proposals_take_the_store_clock_and_newer_wins(s: &mut dyn RunStore) {
    assert_eq!(s.policy().unwrap().policy, RetentionPolicy::default());
    // A future-dated stamp is stored at the store's clock…
    s.put(
        &record("a", NOW),
        Some(&policy(10, 100, 1 << 30, NOW + 365 * DAY)),
        NOW,
    )
    .unwrap();
    let p = s.policy().unwrap();
    assert_eq!((p.policy.retention_days, p.updated_at), (10, Some(NOW)));
    // …so a later, correct proposal still wins.
    s.put(
        &record("b", NOW + 2000),
        Some(&policy(20, 100, 1 << 30, NOW + 1000)),
        NOW + 2000,
    )
    .unwrap();
    assert_eq!(s.policy().unwrap().policy.retention_days, 20);
    // An older proposal is ignored.
    s.put(
        &record("c", NOW + 3000),
        Some(&policy(5, 100, 1 << 30, NOW + 500)),
        NOW + 3000,
    )
    .unwrap();
    assert_eq!(s.policy().unwrap().policy.retention_days, 20);
}

fn finished_at_far_ahead_is_clamped_to_a_day_past_now(s: &mut dyn RunStore) {
    s.put(&record("future", NOW + 365 * DAY), None, NOW)
        .unwrap();
    let got = s.get(&RunId::from("future"), NOW).unwrap().expect("stored");
    assert_eq!(got.head.finished_at, NOW + MAX_FUTURE_MS);
}

fn delete_removes_the_run_and_its_events(s: &mut dyn RunStore) {
    s.put(&record("gone", NOW), None, NOW).unwrap();
    assert!(s.delete(&RunId::from("gone")).unwrap());
    assert_eq!(s.get(&RunId::from("gone"), NOW).unwrap(), None);
    assert_eq!(s.events(&RunId::from("gone"), 0, None, NOW).unwrap(), None);
    assert!(!s.delete(&RunId::from("gone")).unwrap());
}

fn a_terminal_status_lists_final_records_with_that_status_and_never_a_tombstone(
    s: &mut dyn RunStore,
) {
    s.put(&record("ok1", NOW - 1), None, NOW).unwrap();
    s.put(
        &with("bad1", NOW - 2, json!({"status": "failed"})),
        None,
        NOW,
    )
    .unwrap();
    s.put(
        &with(
            "bad2",
            NOW - 3,
            json!({"status": "failed", "agent": "other"}),
        ),
        None,
        NOW,
    )
    .unwrap();
    s.put(
        &with("cut", NOW - 4, json!({"status": "interrupted"})),
        None,
        NOW,
    )
    .unwrap();
    s.put(
        &with(
            "tomb",
            NOW - 5,
            json!({"status": "interrupted", "provisional": true}),
        ),
        None,
        NOW,
    )
    .unwrap();
    let q = |status: RunStatus| ListQuery {
        status: Some(status),
        ..all()
    };
    assert_eq!(ids(s, &q(RunStatus::Failed), NOW), ["bad1", "bad2"]);
    assert_eq!(ids(s, &q(RunStatus::Completed), NOW), ["ok1"]);
    assert_eq!(
        ids(s, &q(RunStatus::Interrupted), NOW),
        ["cut"],
        "the tombstone shows as unfinished, not interrupted"
    );
    assert_eq!(
        ids(s, &q(RunStatus::StoppedSoft), NOW),
        Vec::<String>::new()
    );
    // With the other filters and the cursor.
    assert_eq!(
        ids(
            s,
            &ListQuery {
                agent: Some("other".into()),
                ..q(RunStatus::Failed)
            },
            NOW
        ),
        ["bad2"]
    );
    let page = s
        .list(
            &ListQuery {
                limit: Some(1),
                ..q(RunStatus::Failed)
            },
            NOW,
        )
        .unwrap();
    let next = ListQuery {
        before: page.next_before,
        ..q(RunStatus::Failed)
    };
    assert_eq!(ids(s, &next, NOW), ["bad2"]);
}

fn card(ts: &str) -> Value {
    json!({"channel": "C1", "ts": ts})
}

/// `s`'s open cards finished by `before`, read at `NOW`, at most `limit`.
fn open_cards(s: &mut dyn RunStore, before: i64, limit: usize) -> Vec<RunId> {
    s.open_cards(before, limit, NOW).expect("open_cards")
}

/// The orphan sweep's worklist (SPEC §12): final records with a card and no `cardClosed: true`, finished
/// by the bound, oldest first then by id, at most the clamped limit — never a tombstone, a closed card or
/// a record without one.
fn open_cards_lists_final_records_whose_card_waits_for_its_closing_frame(s: &mut dyn RunStore) {
    let put = |s: &mut dyn RunStore, id: &str, at: i64, patch: Value| {
        s.put(&with(id, at, patch), None, NOW).expect("put");
    };
    put(s, "late", NOW - 5, json!({"card": card("5")}));
    put(
        s,
        "open-c",
        NOW - 20,
        json!({"card": card("3"), "cardClosed": false}),
    );
    put(s, "open-b", NOW - 20, json!({"card": card("2")}));
    put(s, "open-a", NOW - 30, json!({"card": card("1")}));
    put(
        s,
        "tomb",
        NOW - 40,
        json!({"card": card("0"), "provisional": true, "status": "interrupted"}),
    );
    put(
        s,
        "closed",
        NOW - 40,
        json!({"card": card("9"), "cardClosed": true}),
    );
    put(s, "plain", NOW - 40, json!({}));
    put(s, "not-a-card", NOW - 40, json!({"card": "1.5"}));
    assert_eq!(open_cards(s, NOW - 10, 100), ["open-a", "open-b", "open-c"]);
    assert_eq!(
        open_cards(s, NOW - 20, 100),
        ["open-a", "open-b", "open-c"],
        "the bound is inclusive"
    );
    assert_eq!(open_cards(s, NOW - 21, 100), ["open-a"]);
    assert_eq!(
        open_cards(s, NOW, 100),
        ["open-a", "open-b", "open-c", "late"]
    );
    assert_eq!(open_cards(s, NOW, 2), ["open-a", "open-b"]);
    assert_eq!(open_cards(s, NOW, 0), ["open-a"], "a limit of 0 reads as 1");
    assert_eq!(open_cards(s, NOW - 31, 100), Vec::<String>::new());
    // The cap: at most 100, whatever the limit asked for.
    for i in 0..105 {
        put(
            s,
            &format!("many{i:03}"),
            NOW - 1000 + i,
            json!({"card": card("7")}),
        );
    }
    let got = open_cards(s, NOW, 1000);
    assert_eq!(got.len(), 100);
    assert_eq!((got[0].as_str(), got[99].as_str()), ("many000", "many099"));
}

/// Like every read, the worklist applies the persisted policy first: a record it no longer keeps is
/// not on it, though still on disk.
fn open_cards_applies_the_policy_first(s: &mut dyn RunStore) {
    s.put(
        &with("old", NOW - 1000, json!({"card": card("1")})),
        Some(&policy(1, 100, 1 << 30, NOW)),
        NOW,
    )
    .expect("put");
    assert_eq!(s.open_cards(NOW, 100, NOW).unwrap(), ["old"]);
    assert_eq!(
        s.open_cards(NOW + 2 * DAY, 100, NOW + 2 * DAY).unwrap(),
        Vec::<String>::new()
    );
}

/// `close_card` answers true once, then false; the record reads back `cardClosed: true` everywhere,
/// with its events, and leaves the worklist. A put of the closed record is an identical repeat; a put
/// replacing it with another open card puts it back on the worklist.
fn close_card_answers_true_once_and_the_record_reads_back_closed(s: &mut dyn RunStore) {
    let open = with("run", NOW - 100, json!({"card": card("1")}));
    let closed = with(
        "run",
        NOW - 100,
        json!({"card": card("1"), "cardClosed": true}),
    );
    s.put(&open, None, NOW).expect("put");
    assert_eq!(open_cards(s, NOW, 10), ["run"]);

    assert!(s.close_card(&RunId::from("run")).expect("close"));
    assert!(
        !s.close_card(&RunId::from("run")).expect("close again"),
        "already closed"
    );
    assert_eq!(open_cards(s, NOW, 10), Vec::<String>::new());
    assert_eq!(
        s.get(&RunId::from("run"), NOW).unwrap(),
        Some(closed.clone())
    );
    let summary = s
        .get_summary(&RunId::from("run"), NOW)
        .unwrap()
        .expect("summary");
    assert_eq!(summary.head, closed.head);
    assert_eq!(
        summary.bytes,
        Some(closed.encoded_len() as u64),
        "the size is the closed record's"
    );
    let page = s.list(&all(), NOW).unwrap();
    assert_eq!(page.items, vec![summary]);
    assert_eq!(
        s.events(&RunId::from("run"), 0, None, NOW)
            .unwrap()
            .unwrap()
            .events,
        open.events
    );

    // A put of the closed record is an identical repeat: nothing rewritten, still closed.
    let out = s.put(&closed, None, NOW).unwrap();
    assert!(out.stored && !out.rewritten, "{out:?}");
    assert_eq!(open_cards(s, NOW, 10), Vec::<String>::new());

    // Another open card under the id replaces the record and is on the worklist again.
    let again = with("run", NOW - 100, json!({"card": card("2")}));
    let out = s.put(&again, None, NOW).unwrap();
    assert!(out.stored && out.rewritten, "{out:?}");
    assert_eq!(open_cards(s, NOW, 10), ["run"]);
    assert!(s.close_card(&RunId::from("run")).unwrap());
    assert_eq!(
        s.get(&RunId::from("run"), NOW)
            .unwrap()
            .unwrap()
            .head
            .extra
            .get("cardClosed"),
        Some(&json!(true))
    );

    // Nothing to close: unknown and bad ids, a tombstone, no card, a card already closed.
    s.put(
        &with(
            "tomb",
            NOW,
            json!({"card": card("3"), "provisional": true, "status": "interrupted"}),
        ),
        None,
        NOW,
    )
    .unwrap();
    s.put(&with("plain", NOW, json!({})), None, NOW).unwrap();
    s.put(
        &with("shut", NOW, json!({"card": card("4"), "cardClosed": true})),
        None,
        NOW,
    )
    .unwrap();
    for id in ["nobody", "../x", "", "tomb", "plain", "shut"] {
        let before = s.get(&RunId::from(id), NOW).unwrap();
        assert!(!s.close_card(&RunId::from(id)).unwrap(), "{id:?}");
        assert_eq!(
            s.get(&RunId::from(id), NOW).unwrap(),
            before,
            "{id:?} is unchanged"
        );
    }
}

fn search(text: &str) -> ListQuery {
    ListQuery {
        search: Search::new(text),
        ..all()
    }
}

fn a_search_matches_an_id_prefix_or_a_label_substring_without_ascii_case(s: &mut dyn RunStore) {
    for (id, at, label) in [
        ("0193abcd-1111", NOW - 1, Some("Deploy the Billing service")),
        ("0193abce-2222", NOW - 2, Some("rotate keys")),
        ("0194ffff-3333", NOW - 3, Some("nightly REPORT for billing")),
        ("0195aaaa-4444", NOW - 4, None),
        (
            "x0193abcd-5555",
            NOW - 5,
            Some("an id that only contains the prefix"),
        ),
    ] {
        let patch = match label {
            Some(l) => json!({"label": l}),
            None => json!({}),
        };
        s.put(&with(id, at, patch), None, NOW).expect("put");
    }
    // An id prefix (ASCII case folded), never an id's middle.
    assert_eq!(
        ids(s, &search("0193ab"), NOW),
        ["0193abcd-1111", "0193abce-2222"]
    );
    assert_eq!(ids(s, &search("0193ABCD"), NOW), ["0193abcd-1111"]);
    assert_eq!(ids(s, &search("abcd"), NOW), Vec::<String>::new());
    // A label substring, any ASCII case, newest first; a run without a label matches by id alone.
    assert_eq!(
        ids(s, &search("BILLING"), NOW),
        ["0193abcd-1111", "0194ffff-3333"]
    );
    assert_eq!(ids(s, &search("0195"), NOW), ["0195aaaa-4444"]);
    // Trimmed; blank is no search.
    assert_eq!(ids(s, &search("  rotate "), NOW), ["0193abce-2222"]);
    assert!(Search::new("   ").is_none());
    // Combined with the other filters and the cursor.
    let q = ListQuery {
        limit: Some(1),
        ..search("billing")
    };
    let page = s.list(&q, NOW).expect("list");
    assert_eq!(page.items.len(), 1);
    let next = ListQuery {
        before: page.next_before,
        ..q.clone()
    };
    assert_eq!(ids(s, &next, NOW), ["0194ffff-3333"]);
    let q = ListQuery {
        status: Some(RunStatus::Failed),
        ..search("billing")
    };
    assert_eq!(ids(s, &q, NOW), Vec::<String>::new());
}

fn a_search_takes_like_wildcards_literally(s: &mut dyn RunStore) {
    for (id, at, label) in [
        ("w1", NOW - 1, "100% done"),
        ("w2", NOW - 2, "1000 done"),
        ("w3", NOW - 3, "snake_case name"),
        ("w4", NOW - 4, "snakeXcase name"),
        ("w5", NOW - 5, r"a\b path"),
        ("w6", NOW - 6, "ab path"),
    ] {
        s.put(&with(id, at, json!({"label": label})), None, NOW)
            .expect("put");
    }
    assert_eq!(ids(s, &search("100%"), NOW), ["w1"]);
    assert_eq!(ids(s, &search("%"), NOW), ["w1"]);
    assert_eq!(ids(s, &search("e_c"), NOW), ["w3"]);
    assert_eq!(ids(s, &search("_"), NOW), ["w3"]);
    assert_eq!(ids(s, &search(r"a\b"), NOW), ["w5"]);
    assert_eq!(ids(s, &search(r"\"), NOW), ["w5"]);
    // `_` in an id prefix is a character, not "any one".
    assert_eq!(ids(s, &search("w_"), NOW), Vec::<String>::new());
    // Non-ASCII letters compare exactly on every backend.
    s.put(
        &with("u1", NOW - 7, json!({"label": "Ärger im Büro"})),
        None,
        NOW,
    )
    .expect("put");
    assert_eq!(ids(s, &search("ärger"), NOW), Vec::<String>::new());
    assert_eq!(ids(s, &search("Ärger"), NOW), ["u1"]);
    assert_eq!(ids(s, &search("BÜRO"), NOW), Vec::<String>::new());
    assert_eq!(ids(s, &search("büro"), NOW), ["u1"]);
}

macro_rules! contract {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(#[test] fn $case() { super::$case(&mut storage::MemoryStore::new()); })*
        }
        mod sqlite {
            $(#[test] fn $case() {
                let dir = tempfile::tempdir().expect("tempdir");
                let mut s = storage::SqliteStore::open(&dir.path().join("t.db"), storage::Synchronous::Normal).expect("open");
                super::$case(&mut s);
            })*
        }
        mod postgres {
            $(#[test] fn $case() {
                let mut s = storage::PgStore::open(&storage::testing::pg::database()).expect("open");
                super::$case(&mut s);
            })*
        }
    };
}

contract!(
    two_megabyte_record_round_trips,
    bad_ids_are_not_found_on_every_method,
    list_is_newest_first_with_default_and_cap,
    cursor_keeps_same_millisecond_siblings_across_a_page_boundary,
    filters_and_visibility_narrow_the_list,
    events_page_strictly_after_the_cursor,
    retention_hides_expired_rows_on_every_read_before_any_write,
    expire_removes_what_the_policy_no_longer_keeps_with_no_write,
    put_outside_policy_is_not_stored,
    a_put_counts_what_the_policy_retains_around_the_cutoff,
    identical_repeat_is_not_a_rewrite_and_a_change_replaces_events_whole,
    provisional_put_over_a_final_record_writes_nothing,
    a_put_trims_at_most_500_rows_and_the_next_put_finishes,
    a_trim_never_removes_more_than_500_in_one_put,
    max_runs_and_max_bytes_keep_the_newest,
    policy_proposals_take_the_store_clock_and_newer_wins,
    finished_at_far_ahead_is_clamped_to_a_day_past_now,
    delete_removes_the_run_and_its_events,
    a_terminal_status_lists_final_records_with_that_status_and_never_a_tombstone,
    open_cards_lists_final_records_whose_card_waits_for_its_closing_frame,
    open_cards_applies_the_policy_first,
    close_card_answers_true_once_and_the_record_reads_back_closed,
    a_search_matches_an_id_prefix_or_a_label_substring_without_ascii_case,
    a_search_takes_like_wildcards_literally,
);

// Keep the imports used by the macro's expansions visible to the compiler's unused-import check.
#[allow(dead_code)]
fn _implementations(_: MemoryStore, _: Option<SqliteStore>, _: Synchronous) {}
