//! The `PlanStore` contract (SPEC §9), run against every implementation: in-memory, SQLite and PostgreSQL.
//!
//! Each case is a function over `&mut dyn PlanStore`; the `contract!` macro instantiates it once per
//! implementation, so both run exactly the same assertions. SQLite-only cases at the end use two handles on
//! one database file, as two processes would.

use storage::plan::{
    Card, CardError, Import, Orphan, OrphanCause, PlanBinding, PlanId, PlanRefusal, PlanRequest,
    PlanStore, RequestHolder, RequestId, RequestState, Revision, SettleOutcome, Settlement,
    SnapshotId, TerminalReason, MAX_DIAGNOSTIC_BYTES,
};
use storage::{Generation, MemoryStore, SqliteStore, Synchronous};

const NOW: i64 = 1_800_000_000_000;
const LEASE: i64 = 30_000;

/// Generation `n` (a minted-shape stamp).
fn gen(n: u32) -> Generation {
    Generation::parse(&format!("20270101T000000Z-{n:08x}")).expect("generation")
}

fn pid(s: &str) -> PlanId {
    PlanId::parse(s).expect("plan id")
}

fn snap(s: &str) -> SnapshotId {
    SnapshotId::parse(s).expect("snapshot id")
}

fn binding(plan: &str, revision: u64, snapshot: &str) -> PlanBinding {
    PlanBinding {
        plan_id: pid(plan),
        revision: Revision::new(revision),
        snapshot_id: snap(snapshot),
    }
}

fn import(plan: &str, snapshot: &str, advance: bool) -> Import {
    Import {
        plan_id: pid(plan),
        snapshot_id: snap(snapshot),
        advance_revision: advance,
    }
}

fn cards(titles: &[&str]) -> Vec<Card> {
    titles
        .iter()
        .map(|t| Card {
            title: (*t).to_owned(),
            body: format!("body of {t}"),
        })
        .collect()
}

fn settlement(outcome: SettleOutcome, reason: TerminalReason, diagnostic: &str) -> Settlement {
    Settlement {
        outcome,
        reason,
        diagnostic: diagnostic.to_owned(),
    }
}

/// Allocate as generation 1's coordinator.
fn allocate(s: &mut dyn PlanStore, b: &PlanBinding, now: i64) -> PlanRequest {
    allocate_as(s, &gen(1), b, now)
}

fn allocate_as(
    s: &mut dyn PlanStore,
    holder: &Generation,
    b: &PlanBinding,
    now: i64,
) -> PlanRequest {
    s.allocate_request(b, holder, LEASE, now)
        .expect("allocate")
        .expect("admitted")
}

fn row(s: &mut dyn PlanStore, id: &RequestId) -> PlanRequest {
    s.get_request(id).expect("get").expect("row exists")
}

fn import_creates_a_plan_then_advances_its_revision_and_snapshot(s: &mut dyn PlanStore) {
    assert_eq!(s.plan(&pid("p1")).unwrap(), None);
    let created = s.import(&import("p1", "s1", true), NOW).unwrap();
    assert!(created.created && created.invalidated.is_empty());
    assert_eq!(created.plan.binding(), binding("p1", 1, "s1"));
    // An import that moves nothing is a no-op.
    let same = s.import(&import("p1", "s1", false), NOW).unwrap();
    assert!(!same.created);
    assert_eq!(same.plan.binding(), binding("p1", 1, "s1"));
    let snap_only = s.import(&import("p1", "s2", false), NOW).unwrap();
    assert_eq!(snap_only.plan.binding(), binding("p1", 1, "s2"));
    let advanced = s.import(&import("p1", "s2", true), NOW).unwrap();
    assert_eq!(advanced.plan.binding(), binding("p1", 2, "s2"));
    assert_eq!(
        s.plan(&pid("p1")).unwrap().map(|p| p.binding()),
        Some(binding("p1", 2, "s2"))
    );
    // Plans are independent.
    s.import(&import("p2", "other", true), NOW).unwrap();
    assert_eq!(
        s.plan(&pid("p1")).unwrap().map(|p| p.revision),
        Some(Revision::new(2))
    );
}

fn allocation_compares_the_complete_identity_before_allocating(s: &mut dyn PlanStore) {
    assert_eq!(
        s.allocate_request(&binding("ghost", 1, "s1"), &gen(1), LEASE, NOW)
            .unwrap(),
        Err(PlanRefusal::UnknownPlan {
            plan_id: pid("ghost")
        })
    );
    s.import(&import("p", "s1", true), NOW).unwrap();
    s.import(&import("p", "s1", true), NOW).unwrap();
    let current = binding("p", 2, "s1");
    for wrong in [
        binding("p", 1, "s1"),
        binding("p", 3, "s1"),
        binding("p", 2, "s0"),
    ] {
        assert_eq!(
            s.allocate_request(&wrong, &gen(1), LEASE, NOW).unwrap(),
            Err(PlanRefusal::IdentityMismatch {
                current: current.clone()
            }),
            "{wrong}"
        );
    }
    let a = allocate(s, &current, NOW + 1);
    let b = allocate(s, &current, NOW + 2);
    assert_ne!(
        a.request_id, b.request_id,
        "the store generates a fresh id per allocation"
    );
    assert!(a.request_id.as_str().starts_with("pr_"));
    assert_eq!(
        (a.state, a.binding(), a.created_at, a.settled_at),
        (RequestState::Pending, current, NOW + 1, None)
    );
    assert_eq!(
        (a.reason, a.diagnostic.clone(), a.cards.clone()),
        (None, None, None)
    );
    assert_eq!(
        a.holder,
        Some(RequestHolder {
            generation: gen(1),
            lease_until: NOW + 1 + LEASE
        })
    );
    assert_eq!(row(s, &a.request_id), a);
    assert_eq!(s.get_request(&RequestId::generate()).unwrap(), None);
}

fn completion_is_a_cas_on_the_exact_pending_attempt(s: &mut dyn PlanStore) {
    s.import(&import("p", "s1", true), NOW).unwrap();
    let b = binding("p", 1, "s1");
    let r = allocate(s, &b, NOW);
    let id = r.request_id.clone();
    // A wrong binding is refused naming the row it found, and writes nothing.
    let refused = s
        .complete_suggestions(&id, &binding("p", 1, "other"), &cards(&["a"]), NOW)
        .unwrap();
    assert_eq!(
        refused,
        Err(PlanRefusal::BindingMismatch {
            found: Box::new(r.clone())
        })
    );
    // An invalid card fails the whole reply; nothing is written.
    let mut bad = cards(&["a", "b"]);
    bad[1].title = "t".repeat(201);
    assert_eq!(
        s.complete_suggestions(&id, &b, &bad, NOW).unwrap(),
        Err(PlanRefusal::InvalidCard {
            index: 1,
            error: CardError::TitleTooLong { chars: 201 }
        })
    );
    assert_eq!(row(s, &id), r);
    let ready = s
        .complete_suggestions(&id, &b, &cards(&["a", "b"]), NOW + 5)
        .unwrap()
        .expect("published");
    assert_eq!(
        (ready.state, ready.settled_at, ready.cards.clone()),
        (RequestState::Ready, Some(NOW + 5), Some(cards(&["a", "b"])))
    );
    assert_eq!(row(s, &id), ready);
    // A second completion loses and the ready reply stays as it was.
    let again = s
        .complete_suggestions(&id, &b, &cards(&["x"]), NOW + 6)
        .unwrap();
    assert_eq!(
        again,
        Err(PlanRefusal::NotPending {
            found: Box::new(ready.clone())
        })
    );
    assert_eq!(row(s, &id), ready);
    let ghost = RequestId::generate();
    assert_eq!(
        s.complete_suggestions(&ghost, &b, &cards(&["a"]), NOW)
            .unwrap(),
        Err(PlanRefusal::UnknownRequest { request_id: ghost })
    );
}

fn settle_transitions_only_the_exact_pending_attempt(s: &mut dyn PlanStore) {
    s.import(&import("p", "s1", true), NOW).unwrap();
    let b = binding("p", 1, "s1");
    let r = allocate(s, &b, NOW);
    let id = r.request_id.clone();
    let cancel = settlement(
        SettleOutcome::Cancelled,
        TerminalReason::Cancelled,
        "cancelled by u1",
    );
    assert_eq!(
        s.settle_suggestion(&id, &binding("p", 2, "s1"), &cancel, NOW)
            .unwrap(),
        Err(PlanRefusal::BindingMismatch {
            found: Box::new(r.clone())
        })
    );
    let failed = settlement(
        SettleOutcome::Failed,
        TerminalReason::ProviderError,
        "model said no",
    );
    let settled = s
        .settle_suggestion(&id, &b, &failed, NOW + 3)
        .unwrap()
        .expect("settled");
    assert_eq!(settled.state, RequestState::Failed);
    assert_eq!(settled.reason, Some(TerminalReason::ProviderError));
    assert_eq!(settled.diagnostic.as_deref(), Some("model said no"));
    assert_eq!(settled.settled_at, Some(NOW + 3));
    // The first settlement stands; a later one (or a completion) is refused with what it found.
    assert_eq!(
        s.settle_suggestion(&id, &b, &cancel, NOW + 4).unwrap(),
        Err(PlanRefusal::NotPending {
            found: Box::new(settled.clone())
        })
    );
    assert!(matches!(
        s.complete_suggestions(&id, &b, &cards(&["a"]), NOW)
            .unwrap(),
        Err(PlanRefusal::NotPending { .. })
    ));
    assert_eq!(row(s, &id), settled);
    // A ready request is never touched by a cleanup settle.
    let r2 = allocate(s, &b, NOW);
    let ready = s
        .complete_suggestions(&r2.request_id, &b, &cards(&["a"]), NOW)
        .unwrap()
        .unwrap();
    let lost = s
        .settle_suggestion(&r2.request_id, &b, &failed, NOW + 9)
        .unwrap();
    assert_eq!(
        lost,
        Err(PlanRefusal::NotPending {
            found: Box::new(ready.clone())
        })
    );
    assert_eq!(row(s, &r2.request_id), ready);
}

fn an_advance_invalidates_pending_and_ready_and_keeps_history(s: &mut dyn PlanStore) {
    s.import(&import("p", "s1", true), NOW).unwrap();
    s.import(&import("other", "s1", true), NOW).unwrap();
    let b = binding("p", 1, "s1");
    let pending = allocate(s, &b, NOW);
    let ready = allocate(s, &b, NOW);
    let ready = s
        .complete_suggestions(&ready.request_id, &b, &cards(&["kept"]), NOW)
        .unwrap()
        .unwrap();
    let failed = allocate(s, &b, NOW);
    let failed = s
        .settle_suggestion(
            &failed.request_id,
            &b,
            &settlement(SettleOutcome::Failed, TerminalReason::Timeout, "slow"),
            NOW,
        )
        .unwrap()
        .unwrap();
    let consumed = allocate(s, &b, NOW);
    s.complete_suggestions(&consumed.request_id, &b, &cards(&["applied"]), NOW)
        .unwrap()
        .unwrap();
    let consumed = s
        .consume(&consumed.request_id, NOW + 1)
        .unwrap()
        .expect("applied");
    // The apply advanced the revision and invalidated both siblings.
    assert_eq!(consumed.plan.binding(), binding("p", 2, "s1"));
    let mut expect = vec![pending.request_id.clone(), ready.request_id.clone()];
    expect.sort();
    let mut got = consumed.invalidated.clone();
    got.sort();
    assert_eq!(got, expect);
    let p = row(s, &pending.request_id);
    assert_eq!(
        (p.state, p.reason, p.settled_at),
        (
            RequestState::Invalidated,
            Some(TerminalReason::RevisionAdvanced),
            Some(NOW + 1)
        )
    );
    assert!(
        p.diagnostic
            .as_deref()
            .is_some_and(|d| d.contains("applying request")),
        "{p:?}"
    );
    let r = row(s, &ready.request_id);
    assert_eq!(
        (r.state, r.cards.clone()),
        (RequestState::Invalidated, Some(cards(&["kept"]))),
        "a completed reply stays as stale history"
    );
    assert_eq!(row(s, &failed.request_id), failed);
    assert_eq!(
        row(s, &consumed.request.request_id).state,
        RequestState::Consumed
    );
    assert_eq!(
        row(s, &consumed.request.request_id).cards,
        Some(cards(&["applied"]))
    );
    // A further import at a new revision leaves every terminal row as it is.
    let fresh = allocate(s, &binding("p", 2, "s1"), NOW + 2);
    let imported = s.import(&import("p", "s1", true), NOW + 3).unwrap();
    assert_eq!(imported.invalidated, vec![fresh.request_id.clone()]);
    let f = row(s, &fresh.request_id);
    assert_eq!(
        (f.state, f.reason),
        (
            RequestState::Invalidated,
            Some(TerminalReason::RevisionAdvanced)
        )
    );
    assert!(
        f.diagnostic
            .as_deref()
            .is_some_and(|d| d.contains("from 2 to 3")),
        "{f:?}"
    );
    assert_eq!(
        row(s, &consumed.request.request_id).state,
        RequestState::Consumed
    );
    // Another plan's requests are never touched.
    let o = allocate(s, &binding("other", 1, "s1"), NOW);
    s.import(&import("p", "s9", true), NOW).unwrap();
    assert_eq!(row(s, &o.request_id).state, RequestState::Pending);
}

fn a_snapshot_change_invalidates_with_its_own_cause(s: &mut dyn PlanStore) {
    s.import(&import("p", "s1", true), NOW).unwrap();
    let b = binding("p", 1, "s1");
    let r = allocate(s, &b, NOW);
    let imported = s.import(&import("p", "s2", false), NOW + 7).unwrap();
    assert_eq!(imported.plan.binding(), binding("p", 1, "s2"));
    assert_eq!(imported.invalidated, vec![r.request_id.clone()]);
    let got = row(s, &r.request_id);
    assert_eq!(
        (got.state, got.reason, got.settled_at),
        (
            RequestState::Invalidated,
            Some(TerminalReason::SnapshotChanged),
            Some(NOW + 7)
        )
    );
    assert!(
        got.diagnostic
            .as_deref()
            .is_some_and(|d| d.contains("s1") && d.contains("s2")),
        "{got:?}"
    );
    // The late completion and the late cleanup both lose, naming the invalidated row.
    let late = s
        .complete_suggestions(&r.request_id, &b, &cards(&["late"]), NOW + 8)
        .unwrap();
    assert_eq!(
        late,
        Err(PlanRefusal::NotPending {
            found: Box::new(got.clone())
        })
    );
    let cleanup = settlement(SettleOutcome::Failed, TerminalReason::ProviderError, "x");
    assert!(matches!(
        s.settle_suggestion(&r.request_id, &b, &cleanup, NOW)
            .unwrap(),
        Err(PlanRefusal::NotPending { .. })
    ));
    assert_eq!(row(s, &r.request_id), got);
    // The old identity no longer admits.
    assert_eq!(
        s.allocate_request(&b, &gen(1), LEASE, NOW).unwrap(),
        Err(PlanRefusal::IdentityMismatch {
            current: binding("p", 1, "s2")
        })
    );
}

fn an_oversized_diagnostic_is_stored_bounded_with_an_ellipsis(s: &mut dyn PlanStore) {
    s.import(&import("p", "s1", true), NOW).unwrap();
    let b = binding("p", 1, "s1");
    let r = allocate(s, &b, NOW);
    let huge = format!("provider exploded: {}", "∑".repeat(5000));
    let settled = s
        .settle_suggestion(
            &r.request_id,
            &b,
            &settlement(SettleOutcome::Failed, TerminalReason::ProviderError, &huge),
            NOW,
        )
        .unwrap()
        .unwrap();
    let d = settled.diagnostic.clone().expect("diagnostic");
    assert!(
        d.len() <= MAX_DIAGNOSTIC_BYTES && d.len() > MAX_DIAGNOSTIC_BYTES - 8,
        "{}",
        d.len()
    );
    assert!(d.ends_with('…'));
    assert!(huge.starts_with(d.trim_end_matches('…')));
    assert_eq!(row(s, &r.request_id).diagnostic, Some(d));
}

fn apply_needs_a_ready_reply(s: &mut dyn PlanStore) {
    s.import(&import("p", "s1", true), NOW).unwrap();
    let b = binding("p", 1, "s1");
    let r = allocate(s, &b, NOW);
    assert_eq!(
        s.consume(&r.request_id, NOW).unwrap().map(|c| c.plan),
        Err(PlanRefusal::NotReady {
            found: Box::new(r.clone())
        })
    );
    assert_eq!(
        s.plan(&pid("p")).unwrap().map(|p| p.revision),
        Some(Revision::FIRST),
        "a refused apply advances nothing"
    );
    s.complete_suggestions(&r.request_id, &b, &cards(&["a"]), NOW)
        .unwrap()
        .unwrap();
    let c = s.consume(&r.request_id, NOW + 1).unwrap().expect("applied");
    assert_eq!(
        (c.request.state, c.plan.revision, c.invalidated.len()),
        (RequestState::Consumed, Revision::new(2), 0)
    );
    assert!(matches!(
        s.consume(&r.request_id, NOW).unwrap(),
        Err(PlanRefusal::NotReady { .. })
    ));
    let ghost = RequestId::generate();
    assert!(matches!(
        s.consume(&ghost, NOW).unwrap(),
        Err(PlanRefusal::UnknownRequest { .. })
    ));
}

fn dismissal_is_its_own_operation_on_a_ready_reply(s: &mut dyn PlanStore) {
    s.import(&import("p", "s1", true), NOW).unwrap();
    let b = binding("p", 1, "s1");
    let r = allocate(s, &b, NOW);
    // A pending request is not dismissed (it is cancelled, through settlement).
    assert_eq!(
        s.dismiss(&r.request_id, NOW).unwrap(),
        Err(PlanRefusal::NotReady {
            found: Box::new(r.clone())
        })
    );
    s.complete_suggestions(&r.request_id, &b, &cards(&["a"]), NOW)
        .unwrap()
        .unwrap();
    let d = s
        .dismiss(&r.request_id, NOW + 2)
        .unwrap()
        .expect("dismissed");
    assert_eq!(
        (d.state, d.reason, d.settled_at),
        (
            RequestState::Cancelled,
            Some(TerminalReason::Dismissed),
            Some(NOW + 2)
        )
    );
    assert_eq!(
        d.cards,
        Some(cards(&["a"])),
        "the dismissed reply stays as history"
    );
    // Repeating a dismissal answers the same row.
    assert_eq!(s.dismiss(&r.request_id, NOW + 3).unwrap(), Ok(d.clone()));
    assert_eq!(row(s, &r.request_id), d);
    assert_eq!(
        s.plan(&pid("p")).unwrap().map(|p| p.revision),
        Some(Revision::FIRST),
        "a dismissal advances nothing"
    );
}

fn another_generations_pending_request_holds_the_plan(s: &mut dyn PlanStore) {
    s.import(&import("p", "s1", true), NOW).unwrap();
    s.import(&import("q", "s1", true), NOW).unwrap();
    let b = binding("p", 1, "s1");
    let a = allocate_as(s, &gen(1), &b, NOW);
    // The holder's own generation may allocate again: one coordinator per generation tracks its requests.
    let again = allocate_as(s, &gen(1), &b, NOW + 1);
    // Another generation is refused, naming the oldest pending request it found; nothing is allocated.
    assert_eq!(
        s.allocate_request(&b, &gen(2), LEASE, NOW + 2).unwrap(),
        Err(PlanRefusal::Held {
            found: Box::new(a.clone())
        })
    );
    // Another plan is independent.
    allocate_as(s, &gen(2), &binding("q", 1, "s1"), NOW);
    // A stale identity is refused as such first, held or not.
    let stale = s
        .allocate_request(&binding("p", 2, "s1"), &gen(2), LEASE, NOW)
        .unwrap();
    assert!(
        matches!(stale, Err(PlanRefusal::IdentityMismatch { .. })),
        "{stale:?}"
    );
    // Once nothing of another generation is pending, the plan admits generation 2.
    let failed = settlement(SettleOutcome::Failed, TerminalReason::ProviderError, "x");
    s.settle_suggestion(&a.request_id, &b, &failed, NOW + 3)
        .unwrap()
        .unwrap();
    assert_eq!(
        s.allocate_request(&b, &gen(2), LEASE, NOW + 4).unwrap(),
        Err(PlanRefusal::Held {
            found: Box::new(again.clone())
        })
    );
    s.complete_suggestions(&again.request_id, &b, &cards(&["a"]), NOW + 5)
        .unwrap()
        .unwrap();
    let theirs = allocate_as(s, &gen(2), &b, NOW + 6);
    assert_eq!(theirs.holder.map(|h| h.generation), Some(gen(2)));
    // …and now generation 1 is the one held off.
    assert!(matches!(
        s.allocate_request(&b, &gen(1), LEASE, NOW + 7).unwrap(),
        Err(PlanRefusal::Held { .. })
    ));
}

fn renewal_extends_only_the_holders_pending_requests(s: &mut dyn PlanStore) {
    s.import(&import("p", "s1", true), NOW).unwrap();
    s.import(&import("q", "s1", true), NOW).unwrap();
    let (bp, bq) = (binding("p", 1, "s1"), binding("q", 1, "s1"));
    let mine = allocate_as(s, &gen(1), &bp, NOW);
    let theirs = allocate_as(s, &gen(2), &bq, NOW);
    let settled = allocate_as(s, &gen(1), &bp, NOW);
    let settled = s
        .settle_suggestion(
            &settled.request_id,
            &bp,
            &settlement(SettleOutcome::Cancelled, TerminalReason::Cancelled, "c"),
            NOW,
        )
        .unwrap()
        .unwrap();
    let ids = [
        mine.request_id.clone(),
        theirs.request_id.clone(),
        settled.request_id.clone(),
        RequestId::generate(),
    ];
    assert_eq!(
        s.renew_requests(&gen(1), &ids, LEASE, NOW + 100).unwrap(),
        1
    );
    let renewed = row(s, &mine.request_id);
    assert_eq!(
        renewed.holder,
        Some(RequestHolder {
            generation: gen(1),
            lease_until: NOW + 100 + LEASE
        })
    );
    assert_eq!(
        PlanRequest {
            holder: mine.holder.clone(),
            ..renewed
        },
        mine,
        "a renewal changes the lease only"
    );
    assert_eq!(
        row(s, &theirs.request_id),
        theirs,
        "another generation's request is not ours to renew"
    );
    assert_eq!(
        row(s, &settled.request_id),
        settled,
        "a settled request is not renewed"
    );
}

fn orphans_are_pending_requests_whose_holder_is_dead_or_past_its_lease(s: &mut dyn PlanStore) {
    s.import(&import("p", "s1", true), NOW).unwrap();
    s.import(&import("q", "s1", true), NOW).unwrap();
    s.import(&import("r", "s1", true), NOW).unwrap();
    let a = allocate_as(s, &gen(1), &binding("p", 1, "s1"), NOW);
    let b = allocate_as(s, &gen(2), &binding("q", 1, "s1"), NOW + 1);
    let c = allocate_as(s, &gen(2), &binding("r", 1, "s1"), NOW + 2);
    let c = s
        .complete_suggestions(
            &c.request_id,
            &binding("r", 1, "s1"),
            &cards(&["done"]),
            NOW + 3,
        )
        .unwrap()
        .unwrap();
    // Every holder alive and within its lease: no orphans.
    assert_eq!(s.orphaned_requests(&[], NOW + 10).unwrap(), vec![]);
    assert_eq!(s.orphaned_requests(&[gen(3)], NOW + 10).unwrap(), vec![]);
    // A dead holder's pending request is an orphan at once; its settled one is history.
    let gone = |r: &PlanRequest, g| Orphan {
        request: r.clone(),
        cause: OrphanCause::HolderGone { generation: gen(g) },
    };
    assert_eq!(
        s.orphaned_requests(&[gen(2)], NOW + 10).unwrap(),
        vec![gone(&b, 2)]
    );
    // A lease runs out at `lease_until` whoever holds it, oldest first.
    assert_eq!(s.orphaned_requests(&[], NOW + LEASE - 1).unwrap(), vec![]);
    let expired = |r: &PlanRequest, g| Orphan {
        request: r.clone(),
        cause: OrphanCause::LeaseExpired {
            generation: gen(g),
            lease_until: r.holder.as_ref().unwrap().lease_until,
        },
    };
    assert_eq!(
        s.orphaned_requests(&[], NOW + LEASE).unwrap(),
        vec![expired(&a, 1)]
    );
    assert_eq!(
        s.orphaned_requests(&[], NOW + LEASE + 1).unwrap(),
        vec![expired(&a, 1), expired(&b, 2)]
    );
    // A renewal keeps the live holder's request; a dead holder's stays an orphan whatever its lease.
    s.renew_requests(
        &gen(1),
        std::slice::from_ref(&a.request_id),
        LEASE,
        NOW + LEASE - 1,
    )
    .unwrap();
    let a = row(s, &a.request_id);
    assert_eq!(
        s.orphaned_requests(&[gen(2)], NOW + LEASE + 1).unwrap(),
        vec![gone(&b, 2)]
    );
    // Finding orphans writes nothing; settling one through the CAS takes it off the list.
    assert_eq!(
        (
            row(s, &a.request_id),
            row(s, &b.request_id),
            row(s, &c.request_id)
        ),
        (a.clone(), b.clone(), c)
    );
    let orphan = gone(&b, 2);
    let settled = s
        .settle_suggestion(
            &b.request_id,
            &b.binding(),
            &orphan.cause.settlement(),
            NOW + 20,
        )
        .unwrap()
        .unwrap();
    assert_eq!(
        (settled.state, settled.reason),
        (RequestState::Failed, Some(TerminalReason::Interrupted))
    );
    assert!(
        settled
            .diagnostic
            .as_deref()
            .is_some_and(|d| d.contains(gen(2).as_str())),
        "{settled:?}"
    );
    assert_eq!(
        s.orphaned_requests(&[gen(2)], NOW + LEASE + 1).unwrap(),
        vec![]
    );
    // The plan then admits another generation.
    allocate_as(s, &gen(3), &binding("q", 1, "s1"), NOW + 30);
}

macro_rules! contract {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(#[test] fn $case() { super::$case(&mut storage::MemoryStore::new()); })*
        }
        mod memory_plan_store {
            $(#[test] fn $case() { super::$case(&mut storage::plan::MemoryPlanStore::new()); })*
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
    import_creates_a_plan_then_advances_its_revision_and_snapshot,
    allocation_compares_the_complete_identity_before_allocating,
    completion_is_a_cas_on_the_exact_pending_attempt,
    settle_transitions_only_the_exact_pending_attempt,
    an_advance_invalidates_pending_and_ready_and_keeps_history,
    a_snapshot_change_invalidates_with_its_own_cause,
    an_oversized_diagnostic_is_stored_bounded_with_an_ellipsis,
    apply_needs_a_ready_reply,
    dismissal_is_its_own_operation_on_a_ready_reply,
    another_generations_pending_request_holds_the_plan,
    renewal_extends_only_the_holders_pending_requests,
    orphans_are_pending_requests_whose_holder_is_dead_or_past_its_lease,
);

// Keep the imports used by the macro's expansions visible to the compiler's unused-import check.
#[allow(dead_code)]
fn _implementations(_: MemoryStore, _: Option<SqliteStore>, _: Synchronous) {}

fn open(path: &std::path::Path) -> SqliteStore {
    SqliteStore::open(path, Synchronous::Normal).expect("open")
}

/// Two processes on one file: one completes the request first; the other's cleanup settle (its provider
/// failed, or it timed out) loses without touching the ready result, and reads back what won.
#[test]
fn another_process_completing_first_makes_the_cleanup_settle_lose() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("plans.db");
    let mut a = open(&path);
    let mut b = open(&path);
    a.import(&import("p", "s1", true), NOW).unwrap();
    let bind = binding("p", 1, "s1");
    let r = allocate(&mut a, &bind, NOW);
    let ready = b
        .complete_suggestions(&r.request_id, &bind, &cards(&["from b"]), NOW + 1)
        .unwrap()
        .expect("b publishes");
    for (outcome, reason) in [
        (SettleOutcome::Failed, TerminalReason::ProviderError),
        (SettleOutcome::Failed, TerminalReason::Timeout),
        (SettleOutcome::Cancelled, TerminalReason::Shutdown),
    ] {
        let lost = a
            .settle_suggestion(
                &r.request_id,
                &bind,
                &settlement(outcome, reason, "cleanup"),
                NOW + 2,
            )
            .unwrap();
        assert_eq!(
            lost,
            Err(PlanRefusal::NotPending {
                found: Box::new(ready.clone())
            })
        );
    }
    assert!(matches!(
        a.complete_suggestions(&r.request_id, &bind, &cards(&["from a"]), NOW + 3)
            .unwrap(),
        Err(PlanRefusal::NotPending { .. })
    ));
    assert_eq!(open(&path).get_request(&r.request_id).unwrap(), Some(ready));
}

/// The same race in threads released by one barrier, round after round: each request has exactly one
/// winner, and the durable row is the winner's.
#[test]
fn a_completion_and_a_cleanup_racing_on_one_file_have_exactly_one_winner() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("race.db");
    let mut setup = open(&path);
    setup.import(&import("p", "s1", true), NOW).unwrap();
    let bind = binding("p", 1, "s1");
    for round in 0..50 {
        let r = allocate(&mut setup, &bind, NOW + round);
        let barrier = std::sync::Barrier::new(2);
        let (published, settled) = std::thread::scope(|scope| {
            let complete = scope.spawn(|| {
                let mut s = open(&path);
                barrier.wait();
                s.complete_suggestions(&r.request_id, &bind, &cards(&["won"]), NOW)
                    .unwrap()
            });
            let settle = scope.spawn(|| {
                let mut s = open(&path);
                barrier.wait();
                s.settle_suggestion(
                    &r.request_id,
                    &bind,
                    &settlement(
                        SettleOutcome::Failed,
                        TerminalReason::ProviderError,
                        "lost?",
                    ),
                    NOW,
                )
                .unwrap()
            });
            (
                complete.join().expect("complete thread"),
                settle.join().expect("settle thread"),
            )
        });
        let stored = setup.get_request(&r.request_id).unwrap().expect("row");
        match (published, settled) {
            (Ok(ready), Err(PlanRefusal::NotPending { found })) => {
                assert_eq!((&stored, &*found), (&ready, &ready));
                assert_eq!(stored.state, RequestState::Ready);
            }
            (Err(PlanRefusal::NotPending { found }), Ok(failed)) => {
                assert_eq!((&stored, &*found), (&failed, &failed));
                assert_eq!(stored.state, RequestState::Failed);
            }
            other => panic!("round {round}: not exactly one winner: {other:?}"),
        }
    }
}

/// A restart (a fresh handle on the file) reads back the classification, reason and bounded diagnostic.
#[test]
fn a_restart_preserves_classification_and_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("restart.db");
    let mut s = open(&path);
    s.import(&import("p", "s1", true), NOW).unwrap();
    let bind = binding("p", 1, "s1");
    let r = allocate(&mut s, &bind, NOW);
    let huge = "x".repeat(10 * MAX_DIAGNOSTIC_BYTES);
    let settled = s
        .settle_suggestion(
            &r.request_id,
            &bind,
            &settlement(SettleOutcome::Failed, TerminalReason::ProviderError, &huge),
            NOW,
        )
        .unwrap()
        .unwrap();
    let ready = allocate(&mut s, &bind, NOW);
    let ready = s
        .complete_suggestions(&ready.request_id, &bind, &cards(&["a", "b"]), NOW)
        .unwrap()
        .unwrap();
    drop(s);
    let mut again = open(&path);
    assert_eq!(again.get_request(&r.request_id).unwrap(), Some(settled));
    assert_eq!(again.get_request(&ready.request_id).unwrap(), Some(ready));
    assert_eq!(
        again.plan(&pid("p")).unwrap().map(|p| p.binding()),
        Some(bind)
    );
}

/// A request allocated before holders were recorded (schema v3) has no holder after the migration: it is an
/// orphan at once, it holds its plan against every generation until settled, and the sweep settles it.
#[test]
fn a_pending_request_from_before_holders_were_recorded_is_an_orphan() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v3.db");
    {
        let conn = rusqlite::Connection::open(&path).expect("open raw");
        for sql in &storage::sqlite::schema::MIGRATIONS[..3] {
            conn.execute_batch(sql).expect("old schema");
        }
        conn.pragma_update(None, "user_version", 3)
            .expect("stamp v3");
        conn.execute_batch(
            "INSERT INTO plans (plan_id, revision, snapshot_id) VALUES ('p', 1, 's1');
             INSERT INTO plan_requests (request_id, plan_id, revision, snapshot_id, state, created_at)
             VALUES ('pr_old', 'p', 1, 's1', 'pending', 5);",
        )
        .expect("old rows");
    }
    let mut s = open(&path);
    let old = row(&mut s, &RequestId::parse("pr_old").unwrap());
    assert_eq!(
        (old.state, old.holder.clone(), old.created_at),
        (RequestState::Pending, None, 5)
    );
    let bind = binding("p", 1, "s1");
    assert_eq!(
        s.allocate_request(&bind, &gen(1), LEASE, NOW).unwrap(),
        Err(PlanRefusal::Held {
            found: Box::new(old.clone())
        })
    );
    let orphans = s.orphaned_requests(&[], NOW).unwrap();
    assert_eq!(
        orphans,
        vec![Orphan {
            request: old.clone(),
            cause: OrphanCause::NoHolder
        }]
    );
    let settled = s
        .settle_suggestion(&old.request_id, &bind, &orphans[0].cause.settlement(), NOW)
        .unwrap()
        .unwrap();
    assert_eq!(
        (settled.state, settled.reason),
        (RequestState::Failed, Some(TerminalReason::Interrupted))
    );
    assert_eq!(
        allocate(&mut s, &bind, NOW).holder.map(|h| h.generation),
        Some(gen(1))
    );
}

/// The sweep reads pending requests through the partial index, not by scanning every settled request.
#[test]
fn the_orphan_scan_uses_the_pending_index() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = open(&dir.path().join("plan.db"));
    let plan: String = s
        .connection()
        .query_row(
            "EXPLAIN QUERY PLAN SELECT * FROM plan_requests WHERE state = 'pending' ORDER BY created_at, request_id",
            [],
            |r| r.get(3),
        )
        .expect("query plan");
    assert!(plan.contains("plan_requests_pending"), "{plan}");
}
