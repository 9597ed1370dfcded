//! Every choice of the plan store, as pure functions over the rows a transaction read (SPEC §9): what
//! every [`PlanStore`](super::PlanStore) implementation calls, so they decide alike.
//!
//! Pruning (run by the ledger's prune, [`crate::ledger::RunLedger::prune`], in the same pass as the
//! receipts): a request in a terminal state goes `receipt_ttl_ms` after it settled
//! ([`request_prunable`]); a `pending` or `ready` one never, whatever its age. A `plans` row is never
//! pruned: it is the plan's revision high-water mark. Without it the next [`import`] would create the
//! plan again at [`Revision::FIRST`], re-allocating revision numbers that captured bindings, published
//! replies and request history already name — an old binding could then match a new plan by
//! coincidence, and a revision would go backwards. A plan row is one small row per plan id the callers
//! create, so keeping it bounds nothing away.

use super::*;

/// Cut `text` to at most [`MAX_DIAGNOSTIC_BYTES`] of UTF-8 on a character boundary, ending with `…`
/// when anything was cut. Text within the bound is returned whole.
pub fn bound_diagnostic(text: &str) -> String {
    if text.len() <= MAX_DIAGNOSTIC_BYTES {
        return text.to_owned();
    }
    let budget = MAX_DIAGNOSTIC_BYTES - '…'.len_utf8();
    let mut end = budget;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(end + 3);
    out.push_str(&text[..end]);
    out.push('…');
    out
}

/// The invalidation an import or an apply causes, stored on every pending and ready sibling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalidation {
    pub reason: TerminalReason,
    pub diagnostic: String,
}

/// What an import decides: the plan row to write (unchanged when nothing moved) and the cause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportStep {
    pub plan: Plan,
    pub created: bool,
    /// Present when the revision advanced or the snapshot changed.
    pub cause: Option<Invalidation>,
}

pub fn import(existing: Option<&Plan>, import: &Import) -> ImportStep {
    let Some(cur) = existing else {
        let plan = Plan {
            id: import.plan_id.clone(),
            revision: Revision::FIRST,
            snapshot_id: import.snapshot_id.clone(),
        };
        return ImportStep {
            plan,
            created: true,
            cause: None,
        };
    };
    let revision = if import.advance_revision {
        cur.revision.next()
    } else {
        cur.revision
    };
    let snapshot_changed = cur.snapshot_id != import.snapshot_id;
    let plan = Plan {
        id: cur.id.clone(),
        revision,
        snapshot_id: import.snapshot_id.clone(),
    };
    let cause = if revision != cur.revision {
        let mut diagnostic = format!(
            "plan revision advanced from {} to {} by an import",
            cur.revision, revision
        );
        if snapshot_changed {
            diagnostic.push_str(&format!(
                "; snapshot {} replaced by {}",
                cur.snapshot_id.as_str(),
                plan.snapshot_id.as_str()
            ));
        }
        Some(Invalidation {
            reason: TerminalReason::RevisionAdvanced,
            diagnostic: bound_diagnostic(&diagnostic),
        })
    } else if snapshot_changed {
        let diagnostic = format!(
            "plan snapshot {} replaced by {}",
            cur.snapshot_id.as_str(),
            plan.snapshot_id.as_str()
        );
        Some(Invalidation {
            reason: TerminalReason::SnapshotChanged,
            diagnostic: bound_diagnostic(&diagnostic),
        })
    } else {
        None
    };
    ImportStep {
        plan,
        created: false,
        cause,
    }
}

/// Whether a revision advance or a snapshot change invalidates a row in `state`.
pub fn invalidated_by_move(state: RequestState) -> bool {
    matches!(state, RequestState::Pending | RequestState::Ready)
}

/// The row after an invalidation (cards, if any, stay as stale history).
pub fn invalidate(request: &PlanRequest, cause: &Invalidation, now_ms: i64) -> PlanRequest {
    PlanRequest {
        state: RequestState::Invalidated,
        reason: Some(cause.reason),
        diagnostic: Some(cause.diagnostic.clone()),
        settled_at: Some(now_ms),
        ..request.clone()
    }
}

/// Admission: the plan exists, the caller's complete identity is its current one, and none of the
/// plan's `pending` requests is held by a generation other than `holder` (its own are the caller's
/// business: one coordinator per generation tracks them).
pub fn admit(
    plan: Option<&Plan>,
    identity: &PlanBinding,
    pending: &[PlanRequest],
    holder: &Generation,
) -> PlanOutcome<()> {
    let Some(plan) = plan else {
        return Err(PlanRefusal::UnknownPlan {
            plan_id: identity.plan_id.clone(),
        });
    };
    let current = plan.binding();
    if &current != identity {
        return Err(PlanRefusal::IdentityMismatch { current });
    }
    let held = |r: &&PlanRequest| {
        r.state == RequestState::Pending && r.holder.as_ref().map(|h| &h.generation) != Some(holder)
    };
    match pending.iter().find(held) {
        Some(found) => Err(PlanRefusal::Held {
            found: Box::new(found.clone()),
        }),
        None => Ok(()),
    }
}

/// The freshly allocated row, held by `holder` until `now_ms + lease_ms`.
pub fn new_request(
    request_id: RequestId,
    identity: &PlanBinding,
    holder: &Generation,
    lease_ms: i64,
    now_ms: i64,
) -> PlanRequest {
    PlanRequest {
        request_id,
        plan_id: identity.plan_id.clone(),
        revision: identity.revision,
        snapshot_id: identity.snapshot_id.clone(),
        state: RequestState::Pending,
        reason: None,
        diagnostic: None,
        cards: None,
        created_at: now_ms,
        settled_at: None,
        holder: Some(RequestHolder {
            generation: holder.clone(),
            lease_until: now_ms.saturating_add(lease_ms),
        }),
    }
}

/// The renewed row, when `holder` may renew it (it is pending and `holder`'s).
pub fn renew(
    request: &PlanRequest,
    holder: &Generation,
    lease_ms: i64,
    now_ms: i64,
) -> Option<PlanRequest> {
    let h = request
        .holder
        .as_ref()
        .filter(|h| &h.generation == holder && request.state == RequestState::Pending)?;
    let holder = RequestHolder {
        generation: h.generation.clone(),
        lease_until: now_ms.saturating_add(lease_ms),
    };
    Some(PlanRequest {
        holder: Some(holder),
        ..request.clone()
    })
}

/// Why `request` is an orphan, if it is: pending, and its holder absent, among `dead`, or past its
/// lease at `now_ms`.
pub fn orphaned(request: &PlanRequest, dead: &[Generation], now_ms: i64) -> Option<OrphanCause> {
    if request.state != RequestState::Pending {
        return None;
    }
    match &request.holder {
        None => Some(OrphanCause::NoHolder),
        Some(h) if dead.contains(&h.generation) => Some(OrphanCause::HolderGone {
            generation: h.generation.clone(),
        }),
        Some(h) if h.lease_until <= now_ms => Some(OrphanCause::LeaseExpired {
            generation: h.generation.clone(),
            lease_until: h.lease_until,
        }),
        Some(_) => None,
    }
}

/// The exact-pending-attempt guard shared by completion and settlement.
fn exact_pending(
    request: Option<&PlanRequest>,
    request_id: &RequestId,
    binding: &PlanBinding,
) -> PlanOutcome<()> {
    let Some(found) = request else {
        return Err(PlanRefusal::UnknownRequest {
            request_id: request_id.clone(),
        });
    };
    if &found.binding() != binding {
        return Err(PlanRefusal::BindingMismatch {
            found: Box::new(found.clone()),
        });
    }
    if found.state != RequestState::Pending {
        return Err(PlanRefusal::NotPending {
            found: Box::new(found.clone()),
        });
    }
    Ok(())
}

/// Completion CAS: the exact pending attempt, the plan still at its binding, every card valid.
pub fn complete(
    plan: Option<&Plan>,
    request: Option<&PlanRequest>,
    request_id: &RequestId,
    binding: &PlanBinding,
    cards: &[Card],
) -> PlanOutcome<()> {
    exact_pending(request, request_id, binding)?;
    let Some(plan) = plan else {
        return Err(PlanRefusal::UnknownPlan {
            plan_id: binding.plan_id.clone(),
        });
    };
    if &plan.binding() != binding {
        return Err(PlanRefusal::PlanMoved {
            current: plan.binding(),
        });
    }
    validate_cards(cards)
}

/// The ready row.
pub fn completed(request: &PlanRequest, cards: &[Card], now_ms: i64) -> PlanRequest {
    PlanRequest {
        state: RequestState::Ready,
        cards: Some(cards.to_vec()),
        settled_at: Some(now_ms),
        ..request.clone()
    }
}

/// Settlement CAS: the exact pending attempt at its captured binding.
pub fn settle(
    request: Option<&PlanRequest>,
    request_id: &RequestId,
    binding: &PlanBinding,
) -> PlanOutcome<()> {
    exact_pending(request, request_id, binding)
}

/// The settled row (the diagnostic cut to the bound).
pub fn settled(request: &PlanRequest, settlement: &Settlement, now_ms: i64) -> PlanRequest {
    PlanRequest {
        state: settlement.outcome.state(),
        reason: Some(settlement.reason),
        diagnostic: Some(bound_diagnostic(&settlement.diagnostic)),
        settled_at: Some(now_ms),
        ..request.clone()
    }
}

/// Apply: the request is ready (hence bound to the plan's current revision and snapshot, which the
/// check repeats). Answers the advanced plan and the cause stored on the siblings.
pub fn consume(
    plan: Option<&Plan>,
    request: Option<&PlanRequest>,
    request_id: &RequestId,
) -> PlanOutcome<(Plan, Invalidation)> {
    let Some(found) = request else {
        return Err(PlanRefusal::UnknownRequest {
            request_id: request_id.clone(),
        });
    };
    if found.state != RequestState::Ready {
        return Err(PlanRefusal::NotReady {
            found: Box::new(found.clone()),
        });
    }
    let Some(plan) = plan else {
        return Err(PlanRefusal::UnknownPlan {
            plan_id: found.plan_id.clone(),
        });
    };
    if plan.binding() != found.binding() {
        return Err(PlanRefusal::PlanMoved {
            current: plan.binding(),
        });
    }
    let next = Plan {
        revision: plan.revision.next(),
        ..plan.clone()
    };
    let diagnostic = format!(
        "plan revision advanced from {} to {} by applying request {}",
        plan.revision,
        next.revision,
        found.request_id.as_str()
    );
    Ok((
        next,
        Invalidation {
            reason: TerminalReason::RevisionAdvanced,
            diagnostic: bound_diagnostic(&diagnostic),
        },
    ))
}

/// The consumed row.
pub fn consumed(request: &PlanRequest, now_ms: i64) -> PlanRequest {
    PlanRequest {
        state: RequestState::Consumed,
        settled_at: Some(now_ms),
        ..request.clone()
    }
}

/// Dismissal: `Ok(true)` moves a ready row to cancelled/dismissed, `Ok(false)` is a repeat.
pub fn dismiss(request: Option<&PlanRequest>, request_id: &RequestId) -> PlanOutcome<bool> {
    let Some(found) = request else {
        return Err(PlanRefusal::UnknownRequest {
            request_id: request_id.clone(),
        });
    };
    match (found.state, found.reason) {
        (RequestState::Ready, _) => Ok(true),
        (RequestState::Cancelled, Some(TerminalReason::Dismissed)) => Ok(false),
        _ => Err(PlanRefusal::NotReady {
            found: Box::new(found.clone()),
        }),
    }
}

/// The dismissed row (cards kept).
pub fn dismissed(request: &PlanRequest, now_ms: i64) -> PlanRequest {
    PlanRequest {
        state: RequestState::Cancelled,
        reason: Some(TerminalReason::Dismissed),
        diagnostic: Some("dismissed by the user".to_owned()),
        settled_at: Some(now_ms),
        ..request.clone()
    }
}

/// The states a request never leaves: what a prune may take once they are old enough. `pending` (an
/// invocation may still publish or settle it) and `ready` (waiting to be applied or dismissed) are
/// not among them.
pub const TERMINAL_STATES: [RequestState; 4] = [
    RequestState::Consumed,
    RequestState::Failed,
    RequestState::Cancelled,
    RequestState::Invalidated,
];

/// Whether a request row may be pruned at `now_ms`: it is in one of the [`TERMINAL_STATES`] and settled
/// at least `ttl_ms` ago (`settled_at <= `[`receipt_cutoff`](crate::ledger::decisions::receipt_cutoff),
/// the horizon keyed receipts use). A terminal row without a settle time stays (no row is written so).
pub fn request_prunable(
    state: RequestState,
    settled_at: Option<i64>,
    now_ms: i64,
    ttl_ms: i64,
) -> bool {
    TERMINAL_STATES.contains(&state)
        && settled_at
            .is_some_and(|at| at <= crate::ledger::decisions::receipt_cutoff(now_ms, ttl_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a terminal request goes, and only once the TTL has passed since it settled; a pending or
    /// ready one stays whatever its age.
    #[test]
    fn only_terminal_requests_settled_a_ttl_ago_are_prunable() {
        const NOW: i64 = 1_800_000_000_000;
        const TTL: i64 = 86_400_000;
        for state in TERMINAL_STATES {
            assert!(
                request_prunable(state, Some(NOW - TTL), NOW, TTL),
                "{state:?}"
            );
            assert!(request_prunable(state, Some(0), NOW, TTL), "{state:?}");
            assert!(
                !request_prunable(state, Some(NOW - TTL + 1), NOW, TTL),
                "{state:?} settled within the TTL"
            );
            assert!(
                !request_prunable(state, None, NOW, TTL),
                "{state:?} without a settle time"
            );
        }
        for state in [RequestState::Pending, RequestState::Ready] {
            assert!(
                !request_prunable(state, Some(0), NOW, TTL),
                "{state:?} is never pruned"
            );
            assert!(
                !request_prunable(state, None, NOW + 100 * TTL, 0),
                "{state:?} is never pruned"
            );
        }
        // Every state is either terminal or one of the two live ones.
        for s in [
            "pending",
            "ready",
            "consumed",
            "failed",
            "cancelled",
            "invalidated",
        ] {
            let state = RequestState::parse(s).expect("a state");
            let live = matches!(state, RequestState::Pending | RequestState::Ready);
            assert_eq!(TERMINAL_STATES.contains(&state), !live, "{s}");
        }
    }
}
