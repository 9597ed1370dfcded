//! Pure decisions of the live-run ledger: every "may this write happen, and what does it become"
//! answer that a ledger implementation needs, with no I/O and no clock.
//!
//! **Owns:** nothing. No table, no connection, no time source: the caller reads the rows inside its
//! own transaction, passes a [`RowView`] (and `now_ms` on its own clock), and applies the answer in
//! the same transaction.
//!
//! **Callers:** every `RunLedger` implementation — the SQLite ledger and the in-memory reference
//! ledger the tests use. Both route each decision through this module so that they agree *by
//! construction*: a divergence between them can only be in I/O, never in policy (SPEC §4).
//!
//! **Invariants** (SPEC §4.3, §6.1, §6.2):
//! - Only a change of `owner_gen` fences. An expired lease alone never refuses an owner write
//!   ([`fence_check`] never looks at the lease): an owner whose heartbeat blipped keeps writing until
//!   somebody actually reclaims the row.
//! - Reclaim never takes a row the reclaiming generation owns, whatever its lease or phase
//!   ([`reclaim_selection`]): two copies of one run inside one process could not be told apart by the
//!   generation fence.
//! - `lease_until == now` is expired ([`lease_expired`]).
//! - A hard stop never downgrades to soft ([`strongest_stop`]).
//! - Nothing transitions *into* `attaching`; a row is born there ([`INSERT_PHASE`]) and reclaim merely
//!   keeps it there.
//! - Classification follows SPEC §6.1's order; in particular a row taken from `finishing` closes with
//!   its recorded status *whatever stop is recorded*, because its answer may already have been
//!   delivered ([`classify`]).
//! - A mutating tool in flight at a crash is never re-run ([`settlement`]): "re-running is earned,
//!   never assumed".
//!
//! This module deliberately does not decide about receipt lookups, deletion fences or byte budgets:
//! those are lookups and size checks the ledgers do directly. What it does decide of pruning is what
//! may go and when ([`receipt_expired`], [`generation_prunable`], [`deletion_fence_prunable`]), which
//! SQLite and PostgreSQL compile to the same cutoffs.
//!
//! # Phase machine
//!
//! `live_runs.phase` is a compare-and-swap column; [`phase_transition`] is its whole table.
//!
//! | phase       | what it means to outside observers                                   | legal next (change, who)                                              |
//! |-------------|----------------------------------------------------------------------|-----------------------------------------------------------------------|
//! | (none)      | the thread is free                                                   | `attaching` (admit inserts, any generation)                           |
//! | `attaching` | admitted and reserved; the request is saved, no prompt or step yet   | `live` (Promote, owner), `finishing` (owner), `attaching` (Reclaim)   |
//! | `live`      | running; transcript and step records are being written               | `handoff` (owner), `finishing` (owner), `live` (Reclaim)              |
//! | `handoff`   | the owner is draining and asks any other generation to resume it     | `finishing` (owner), `live` (Reclaim)                                 |
//! | `finishing` | final status and answer committed; the reply may already be out      | `live` (Reclaim — the new owner closes it, never replays)             |
//! | (gone)      | `finish` or `abandon` deleted the row; the thread is free again      | —                                                                     |
//!
//! Refused: `attaching → handoff` (an attaching run has nothing to resume from, so a drain waits
//! for it instead), `finishing → handoff`, `handoff → handoff`, a second `finishing`, and a
//! promotion of anything but an `attaching` row.

use crate::RunId;
use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

/// A live row's phase (SPEC §4.3 "Phases"); stored lowercase in `live_runs.phase`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Admitted and reserved: `meta.request` is saved so a reclaim can restart it, but there is no
    /// prompt, transcript or step record yet.
    Attaching,
    /// Running under its owner: the transcript and step records describe how far it got.
    Live,
    /// Handed off by a draining owner: any other generation may take it at once, lease or not.
    Handoff,
    /// The final status and answer are committed; delivery may or may not have happened, so a
    /// reclaim closes it with the recorded status and never replays it.
    Finishing,
    /// Parked on tool calls a person must approve (SPEC §13): the step record is written, the calls'
    /// approvals are in `state.approvals`, nothing runs until each is decided.
    AwaitingApproval,
}

/// The phase every new row starts in: admission inserts `attaching`, and no transition ever leads
/// back into it.
pub const INSERT_PHASE: Phase = Phase::Attaching;

impl Phase {
    /// The persisted spelling (the same as the serde one).
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Attaching => "attaching",
            Phase::Live => "live",
            Phase::Handoff => "handoff",
            Phase::Finishing => "finishing",
            Phase::AwaitingApproval => "awaiting_approval",
        }
    }

    /// Reads the persisted spelling; `None` for anything else (a corrupt column is the caller's
    /// error to name, not a panic).
    pub fn parse(s: &str) -> Option<Phase> {
        match s {
            "attaching" => Some(Phase::Attaching),
            "live" => Some(Phase::Live),
            "handoff" => Some(Phase::Handoff),
            "finishing" => Some(Phase::Finishing),
            "awaiting_approval" => Some(Phase::AwaitingApproval),
            _ => None,
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A requested stop, stored in `live_runs.stop`. Declared in strength order, so the derived `Ord`
/// has `Hard > Soft` and "keep the strongest" is `max`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum StopMode {
    /// Finish gracefully (`stopped_soft`).
    Soft,
    /// Abort (`stopped_hard`); a reclaim closes such a row and never relaunches it.
    Hard,
}

impl StopMode {
    /// The persisted spelling (the same as the serde one).
    pub fn as_str(self) -> &'static str {
        match self {
            StopMode::Soft => "soft",
            StopMode::Hard => "hard",
        }
    }

    /// Reads the persisted spelling; `None` for anything else.
    pub fn parse(s: &str) -> Option<StopMode> {
        match s {
            "soft" => Some(StopMode::Soft),
            "hard" => Some(StopMode::Hard),
            _ => None,
        }
    }
}

impl fmt::Display for StopMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The stop to store when `requested` arrives on a row holding `current`: the stronger of the two,
/// so a late soft request can never take back a hard one that another generation already asked for.
pub fn strongest_stop(current: Option<StopMode>, requested: StopMode) -> StopMode {
    current.map_or(requested, |c| c.max(requested))
}

/// The view of an existing live row that decisions need; borrowed from whatever the ledger read
/// in its transaction so neither ledger has to build an owned copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowView<'a> {
    pub run_id: &'a str,
    pub owner_gen: &'a str,
    pub phase: Phase,
    /// Milliseconds since the epoch on the clock of the writer that last claimed, reclaimed or
    /// heartbeat the row.
    pub lease_until: i64,
}

/// A requested phase change; see the module's phase table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseChange {
    /// `claim` by the owner: `attaching → live`.
    Promote,
    /// `handoff` by a draining owner: `live → handoff`.
    Handoff,
    /// `finishing` by the owner: the final status and answer are committed.
    Finishing,
    /// `reclaim` by another generation: see [`reclaim_phase`].
    Reclaim,
    /// The owner parks the run on calls awaiting approval: `live → awaiting_approval` (again: a no-op).
    Park,
    /// The owner resumes a parked run once every call is decided: `awaiting_approval → live` (again: a
    /// no-op).
    Unpark,
}

impl PhaseChange {
    /// A stable lowercase name, for logs and error text.
    pub fn as_str(self) -> &'static str {
        match self {
            PhaseChange::Promote => "promote",
            PhaseChange::Handoff => "handoff",
            PhaseChange::Finishing => "finishing",
            PhaseChange::Reclaim => "reclaim",
            PhaseChange::Park => "park",
            PhaseChange::Unpark => "unpark",
        }
    }
}

impl fmt::Display for PhaseChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refused phase change. A result value (SPEC §4.3: `WrongPhase`), never something to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("phase {from} does not allow {change}")]
pub struct WrongPhase {
    pub from: Phase,
    pub change: PhaseChange,
}

/// The phase CAS table (SPEC §4.3 "Phases"): the phase `change` leads to from `from`, or
/// [`WrongPhase`]. Who may ask (owner vs another generation) is the caller's fence check; this only
/// answers whether the phase allows it.
pub fn phase_transition(from: Phase, change: PhaseChange) -> Result<Phase, WrongPhase> {
    use Phase::{Attaching, AwaitingApproval, Finishing, Handoff, Live};
    let to = match (from, change) {
        (Attaching, PhaseChange::Promote) => Some(Live),
        // A parked run hands off as it stands: the next owner parks again on the same calls.
        (Live | AwaitingApproval, PhaseChange::Handoff) => Some(Handoff),
        // A dispatch that fails before its prompt finishes from attaching; a handed-off run that
        // completes before anyone reclaims it replies itself; a stop ends an approval wait.
        (Attaching | Live | Handoff | AwaitingApproval, PhaseChange::Finishing) => Some(Finishing),
        (_, PhaseChange::Reclaim) => Some(reclaim_phase(from)),
        (Live | AwaitingApproval, PhaseChange::Park) => Some(AwaitingApproval),
        (AwaitingApproval | Live, PhaseChange::Unpark) => Some(Live),
        // Promote of a promoted row is the claim's idempotent Keep, not a transition; attaching
        // has nothing to resume from, so it is never handed off; a second finishing is refused.
        (Live | Handoff | Finishing | AwaitingApproval, PhaseChange::Promote)
        | (Attaching | Handoff | Finishing, PhaseChange::Handoff)
        | (Finishing, PhaseChange::Finishing)
        | (Attaching | Handoff | Finishing, PhaseChange::Park | PhaseChange::Unpark) => None,
    };
    to.ok_or(WrongPhase { from, change })
}

/// The phase a reclaimed row takes: an `attaching` row stays `attaching` (it is handed out as a
/// restart from its request), every other phase becomes `live` under the new owner.
pub fn reclaim_phase(prior: Phase) -> Phase {
    match prior {
        Phase::Attaching => Phase::Attaching,
        Phase::Live | Phase::Handoff | Phase::Finishing | Phase::AwaitingApproval => Phase::Live,
    }
}

/// The fence answer for an owner write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// The writer owns the row: proceed.
    Owner,
    /// Another generation owns the row (it was reclaimed): refuse and write nothing.
    Fenced,
    /// There is no row for the run (finished, abandoned, or never admitted).
    UnknownRun,
}

/// The fence check every owner write runs first (SPEC §4.3). It compares generations only and
/// deliberately ignores the lease: expiry alone never fences, only a reclaim changes the owner.
pub fn fence_check(row: Option<&RowView>, gen: &str) -> Fence {
    match row {
        None => Fence::UnknownRun,
        Some(r) if r.owner_gen == gen => Fence::Owner,
        Some(_) => Fence::Fenced,
    }
}

/// What a `claim` (promotion) writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimDecision {
    /// Same run and owner in `attaching` → `live` with prompt, tools and state; identity and start
    /// untouched.
    Promote,
    /// Re-claim of a `live` (or later-phase) row by its owner: nothing to write (idempotent).
    Keep,
    /// A different run holds the thread; nothing is written.
    ThreadLive { run_id: RunId },
    /// Same run, another owner (the lease lapsed during attach and another generation reclaimed).
    Fenced,
    /// No row for the run at all: claim only promotes a reservation made by admit.
    UnknownRun,
}

/// The claim decision (SPEC §4.3 `claim`, digest §2.2). `by_thread` is the row holding the
/// claimant's thread key (UNIQUE), `by_run` the row under the run id; either may be absent.
///
/// A different run on the thread answers `ThreadLive` before anything about the run's own row, as
/// the digest's table keys the decision on the thread's row. The run's own row is `by_run`, or the
/// thread's row when that names this run (the two lookups normally find the same row).
pub fn decide_claim(
    by_thread: Option<&RowView>,
    by_run: Option<&RowView>,
    run_id: &RunId,
    gen: &str,
) -> ClaimDecision {
    if let Some(t) = by_thread {
        if t.run_id != run_id {
            return ClaimDecision::ThreadLive {
                run_id: t.run_id.into(),
            };
        }
    }
    let own = by_run.or(by_thread);
    match own {
        None => ClaimDecision::UnknownRun,
        Some(r) if r.owner_gen != gen => ClaimDecision::Fenced,
        Some(r) if r.phase == Phase::Attaching => ClaimDecision::Promote,
        Some(_) => ClaimDecision::Keep,
    }
}

/// What a message does on a thread whose run is live (SPEC §5.1 multitask strategy, after LangGraph's
/// double-texting). An idle thread starts a run whatever the strategy.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Into the live run's inbox (folded at its next step boundary).
    #[default]
    Steer,
    /// Durably queued on the thread: starts its own run when the live one ends, in order.
    Enqueue,
    /// Refused (`409 thread_busy`) while a run is live.
    Reject,
    /// A soft stop of the live run, then the message starts the next run once it has ended.
    Interrupt,
}

impl Strategy {
    pub const ALL: [Strategy; 4] = [
        Strategy::Steer,
        Strategy::Enqueue,
        Strategy::Reject,
        Strategy::Interrupt,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Steer => "steer",
            Strategy::Enqueue => "enqueue",
            Strategy::Reject => "reject",
            Strategy::Interrupt => "interrupt",
        }
    }

    pub fn parse(s: &str) -> Option<Strategy> {
        Strategy::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Whether a message admitted with this strategy waits in the inbox for a run of its own (rather
    /// than being folded into the live run).
    pub fn queues(self) -> bool {
        matches!(self, Strategy::Enqueue | Strategy::Interrupt)
    }
}

/// What `admit` does with a message for a thread (after the receipt and deletion-fence lookups,
/// which are the ledger's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdmitDecision {
    /// The thread is free: insert an `attaching` row ([`INSERT_PHASE`]) with the pre-minted id.
    Insert,
    /// A run holds the thread: append the message to its inbox.
    Steer { run_id: RunId },
    /// The holding run is `finishing` and the message is keyed: a steer would never be read, and a
    /// keyed sender expects an answer it can rely on, so it is told to come back.
    Busy { run_id: RunId },
    /// A run the writer may not see holds the thread: nothing is written.
    Forbidden,
    /// `enqueue` (or an `interrupt` of a run already past its finishing gate, which no stop can reach):
    /// the message waits in the live run's inbox, marked queued, for a run of its own.
    Queue { run_id: RunId },
    /// `interrupt`: queue the message and record a soft stop on the live run, in one transaction.
    Interrupt { run_id: RunId },
    /// `reject`: nothing is written.
    Reject { run_id: RunId },
}

/// Whether a writer who sees `writer` may reach the live run whose `meta_json` is `meta` (SPEC §8.1:
/// visibility applies to writes too). A row without a visibility stamp is `unknown`, never public.
pub fn writer_sees(
    writer: Option<&crate::record::VisibilityFilter>,
    meta: &serde_json::Value,
) -> bool {
    let Some(filter) = writer else { return true };
    let field = |k: &str| {
        meta.get(k)
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
    };
    let visibility = crate::record::ChannelVisibility::parse(field("channelVisibility"))
        .unwrap_or(crate::record::ChannelVisibility::Unknown);
    filter.matches(field("channelId"), field("userId"), visibility)
}

impl AdmitDecision {
    /// Whether the decision queues the message (and so counts against the thread's queue cap).
    pub fn queues(&self) -> bool {
        matches!(
            self,
            AdmitDecision::Queue { .. } | AdmitDecision::Interrupt { .. }
        )
    }

    /// The live run a decision writes into (a steer or a queued message): where a keyed receipt's cap
    /// ([`crate::ledger::MAX_RECEIPTS_PER_RUN`]) is counted.
    pub fn writes_to(&self) -> Option<&RunId> {
        match self {
            AdmitDecision::Steer { run_id }
            | AdmitDecision::Queue { run_id }
            | AdmitDecision::Interrupt { run_id } => Some(run_id),
            _ => None,
        }
    }

    /// The live run a keyed answer's receipt is counted against (at most
    /// [`crate::ledger::MAX_RECEIPTS_PER_RUN`]): the run it writes to, or the run that refused it.
    pub fn receipt_run(&self) -> Option<&RunId> {
        match self {
            AdmitDecision::Reject { run_id } => Some(run_id),
            _ => self.writes_to(),
        }
    }

    /// The cap that refuses this admission, nothing written: a keyed answer on a run that already holds
    /// [`crate::ledger::MAX_RECEIPTS_PER_RUN`] receipts, or a queued message on a full queue
    /// ([`crate::ledger::MAX_QUEUED_PER_THREAD`]). `count` counts a run's receipts or queued messages in
    /// the backend; it is asked only for a count that decides.
    pub fn refused_by_cap<E>(
        &self,
        keyed: bool,
        mut count: impl FnMut(CapCount, &str) -> Result<u64, E>,
    ) -> Result<Option<crate::ledger::AdmitOutcome>, E> {
        use crate::ledger::AdmitOutcome;
        if let (Some(run_id), true) = (self.receipt_run(), keyed) {
            if count(CapCount::Receipts, run_id)? >= crate::ledger::MAX_RECEIPTS_PER_RUN as u64 {
                return Ok(Some(AdmitOutcome::ReceiptLimit {
                    run_id: run_id.to_owned(),
                }));
            }
        }
        if let (Some(run_id), true) = (self.writes_to(), self.queues()) {
            if count(CapCount::Queued, run_id)? >= crate::ledger::MAX_QUEUED_PER_THREAD {
                return Ok(Some(AdmitOutcome::QueueFull {
                    run_id: run_id.to_owned(),
                }));
            }
        }
        Ok(None)
    }
}

/// What [`AdmitDecision::refused_by_cap`] asks a backend to count for a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapCount {
    /// Its keyed admissions' receipts.
    Receipts,
    /// The messages queued in its inbox for runs of their own.
    Queued,
}

/// The admission decision (SPEC §4.3 `admit`, §5.1 multitask strategy). An unkeyed steer to a
/// finishing run is still steered: it lands in the durable inbox, which finish hands to a successor.
pub fn decide_admit(
    by_thread: Option<&RowView>,
    keyed: bool,
    writer_sees: bool,
    strategy: Strategy,
) -> AdmitDecision {
    let Some(r) = by_thread else {
        return AdmitDecision::Insert;
    };
    if !writer_sees {
        return AdmitDecision::Forbidden;
    }
    let run_id = RunId::from(r.run_id);
    match strategy {
        Strategy::Reject => AdmitDecision::Reject { run_id },
        Strategy::Enqueue => AdmitDecision::Queue { run_id },
        // Past the gate the answer is committed: no stop reaches it, the message just waits its turn.
        Strategy::Interrupt if r.phase == Phase::Finishing => AdmitDecision::Queue { run_id },
        Strategy::Interrupt => AdmitDecision::Interrupt { run_id },
        Strategy::Steer if r.phase == Phase::Finishing && keyed => AdmitDecision::Busy { run_id },
        Strategy::Steer => AdmitDecision::Steer { run_id },
    }
}

/// The finishing gate's check of a recorded stop (SPEC §5.1 interrupt, §5.6): a stop committed to the
/// row before the gate wins over a `completed` the run decided without knowing of it, so the run
/// concludes again under it (`Some(stop)`). Any other status stands.
pub fn stop_before_gate(
    recorded: Option<StopMode>,
    status: crate::record::RunStatus,
) -> Option<StopMode> {
    recorded.filter(|_| status == crate::record::RunStatus::Completed)
}

/// Whether a lease has run out. Equal-now counts as expired, so a reclaim at exactly the lease end
/// takes the row.
pub fn lease_expired(lease_until: i64, now_ms: i64) -> bool {
    lease_until <= now_ms
}

/// Whether a reclaim by `gen` takes a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReclaimSelection {
    /// Take it: owner becomes `gen`, lease renewed, phase := [`reclaim_phase`].
    Take,
    /// `gen`'s own row: never taken (a lapsed lease on it is a heartbeat that could not land).
    Own,
    /// Another generation holds it under a current lease: left alone and reported.
    LiveElsewhere,
    /// Takeable, but the reclaimer still drives it (an actor of its own, or its close, still runs from
    /// before another generation took it): left alone until that ends, so two drivers of one generation
    /// never write one run (SPEC §1.1).
    Driven,
}

/// The reclaim selection (SPEC §4.3 `reclaim`, §6.1 fast reclaim): take a row iff another
/// generation owns it AND (its lease expired, OR it is handed off, OR its owner is provably dead) AND the
/// reclaimer does not still drive it (`driven`: the runs it has an actor or a pending close for).
pub fn reclaim_selection(
    row: &RowView,
    gen: &str,
    now_ms: i64,
    dead_gens: &[String],
    driven: &[RunId],
) -> ReclaimSelection {
    if row.owner_gen == gen {
        ReclaimSelection::Own
    } else if lease_expired(row.lease_until, now_ms)
        || row.phase == Phase::Handoff
        || dead_gens.iter().any(|d| d == row.owner_gen)
    {
        if driven.iter().any(|d| d == row.run_id) {
            ReclaimSelection::Driven
        } else {
            ReclaimSelection::Take
        }
    } else {
        ReclaimSelection::LiveElsewhere
    }
}

/// The last step record's position, as far as completeness needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepCursor {
    pub step: u64,
    /// The transcript turn count when this step's record was written.
    pub turn_index: u64,
}

/// What [`classify`] needs from a taken row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassifyInput<'a> {
    /// The phase before the reclaim (not [`reclaim_phase`] of it).
    pub prior_phase: Phase,
    pub stop: Option<StopMode>,
    /// `state.finalStatus`; an empty string counts as absent.
    pub final_status: Option<&'a str>,
    /// `state.detached` is set.
    pub detached: bool,
    /// `meta.request` is present and readable.
    pub has_request: bool,
    /// Turns in the run's transcript (before its gap, when it has one).
    pub turn_count: u64,
    /// Where the transcript stops short ([`crate::ledger::Transcript::gap`]).
    pub gap: Option<crate::ledger::TranscriptGap>,
    pub last_step: Option<StepCursor>,
}

/// The fate of a taken row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Classification {
    /// Close with this status (from `finishing`); delivery unknown, never replayed.
    CloseFinal { status: String },
    /// Close `stopped_hard`; never relaunched.
    CloseHardStopped,
    /// Close `interrupted`, the reason naming what was found.
    CloseInterrupted { reason: String },
    /// Re-run the saved request under the same id (SPEC §6.3).
    Restart,
    /// Continue from the transcript (SPEC §6.2).
    Resume(ResumePoint),
}

/// Status written when a `finishing` row carries no `state.finalStatus`.
pub const DEFAULT_FINAL_STATUS: &str = "completed";
/// Reason for a detached row: its owner stopped mirroring it, so the ledger's copy cannot be trusted.
pub const DETACHED_REASON: &str =
    "detached: the run stopped writing through to the ledger, so it is not resumable";
/// Reason for an `attaching` row without a request.
pub const NO_REQUEST_REASON: &str =
    "reclaimed while attaching, but no saved request to restart it from";
/// Reason when no step record exists: the seed record is written at start, so it was never seeded.
pub const NO_STEP_RECORD_REASON: &str = "no step record: killed before the seed";

/// Classifies a taken row in SPEC §6.1's order: `finishing` (whatever stop is recorded) → a hard
/// stop → detached → `attaching` (restart or close) → completeness for `live`/`handoff`.
///
/// `finishing` comes first because its answer may already have reached the thread: closing with
/// the committed status is the only outcome that neither loses it nor says it twice.
pub fn classify(input: &ClassifyInput) -> Classification {
    // A final status is written only by the finishing gate: a row that carries one was past it, even when
    // an earlier reclaimer moved it back to `live` and died before closing it.
    if input.prior_phase == Phase::Finishing || input.final_status.is_some_and(|s| !s.is_empty()) {
        let status = input
            .final_status
            .filter(|s| !s.is_empty())
            .unwrap_or(DEFAULT_FINAL_STATUS);
        return Classification::CloseFinal {
            status: status.to_owned(),
        };
    }
    if input.stop == Some(StopMode::Hard) {
        return Classification::CloseHardStopped;
    }
    if input.detached {
        return Classification::CloseInterrupted {
            reason: DETACHED_REASON.to_owned(),
        };
    }
    match input.prior_phase {
        Phase::Attaching if input.has_request => Classification::Restart,
        Phase::Attaching => Classification::CloseInterrupted {
            reason: NO_REQUEST_REASON.to_owned(),
        },
        // Promoted, but the process died before its seed landed: nothing has run, so the message still
        // gets its answer from a restart (SPEC §6.1).
        Phase::Live | Phase::Handoff if input.last_step.is_none() && input.has_request => {
            Classification::Restart
        }
        Phase::Live | Phase::Handoff | Phase::Finishing | Phase::AwaitingApproval => {
            if let Some(gap) = input.gap {
                return Classification::CloseInterrupted {
                    reason: format!(
                        "transcript gap: {gap} ({} turns before it)",
                        input.turn_count
                    ),
                };
            }
            match completeness(input.turn_count, input.last_step) {
                Ok(point) => Classification::Resume(point),
                Err(reason) => Classification::CloseInterrupted { reason },
            }
        }
    }
}

/// Where a resume re-enters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumePoint {
    /// The transcript ends exactly at the recorded step: resume there and settle its in-flight
    /// calls (check them with [`in_flight_matches`] first).
    ResumeAt { step: u64 },
    /// The next step's turns landed but its record did not, so nothing was dispatched: run its
    /// calls fresh. `step` is that next step (last recorded + 1); the caller also advances
    /// iteration and turn by one from the last record.
    RunStepFresh { step: u64 },
}

impl ResumePoint {
    /// The step the resumed run continues with.
    pub fn step(&self) -> u64 {
        match self {
            ResumePoint::ResumeAt { step } | ResumePoint::RunStepFresh { step } => *step,
        }
    }
}

/// The completeness rule (SPEC §6.2). Transcript turns land before their step record, so the
/// transcript may be ahead of the last record by exactly one step's turns — two (the previous
/// results turn and the assistant turn), or one after the seed record, since step 1 has no
/// previous results. Any other distance is a partial or lost write, and the reason says which.
pub fn completeness(turn_count: u64, last_step: Option<StepCursor>) -> Result<ResumePoint, String> {
    let Some(last) = last_step else {
        return Err(NO_STEP_RECORD_REASON.to_owned());
    };
    let next_turns = if last.step == 0 { 1 } else { 2 };
    if turn_count == last.turn_index {
        Ok(ResumePoint::ResumeAt { step: last.step })
    } else if last.turn_index.checked_add(next_turns) == Some(turn_count) {
        Ok(ResumePoint::RunStepFresh {
            step: last.step.saturating_add(1),
        })
    } else {
        let what = if turn_count < last.turn_index {
            "incomplete transcript"
        } else {
            "partial write"
        };
        Err(format!(
            "{what}: transcript has {turn_count} turns, step {} recorded {}",
            last.step, last.turn_index
        ))
    }
}

/// The in-flight check before a [`ResumePoint::ResumeAt`]: the last assistant turn's calls must
/// equal the recorded in-flight set (as sets of call ids). Otherwise the record and the transcript
/// disagree about what was dispatched, and no settlement can be trusted.
pub fn in_flight_matches(
    recorded: &[String],
    last_assistant_calls: &[String],
) -> Result<(), String> {
    let rec: BTreeSet<&str> = recorded.iter().map(String::as_str).collect();
    let calls: BTreeSet<&str> = last_assistant_calls.iter().map(String::as_str).collect();
    if rec == calls {
        return Ok(());
    }
    let unrecorded: Vec<&str> = calls.difference(&rec).copied().collect();
    let missing: Vec<&str> = rec.difference(&calls).copied().collect();
    Err(format!(
        "in-flight mismatch: the last assistant turn's calls {unrecorded:?} are not recorded, \
         recorded calls {missing:?} are not in it"
    ))
}

/// How an in-flight call is answered at resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Settlement {
    /// Run it again: it is side-effect-free or declared rerun-safe.
    Rerun,
    /// A synthetic error result [`EFFECTS_UNKNOWN_TEXT`]: it may have changed the world.
    EffectsUnknown,
    /// A synthetic result [`NOT_AVAILABLE_TEXT`]: this build does not know the tool.
    NotAvailable,
    /// Send it again with the same idempotency key: its endpoint honours the key, so the effect happens
    /// once and the outcome becomes known.
    Resent,
}

impl Settlement {
    /// The synthetic result text, or `None` when the call is re-run.
    pub fn synthetic_text(self) -> Option<&'static str> {
        match self {
            Settlement::Rerun | Settlement::Resent => None,
            Settlement::EffectsUnknown => Some(EFFECTS_UNKNOWN_TEXT),
            Settlement::NotAvailable => Some(NOT_AVAILABLE_TEXT),
        }
    }
}

pub const EFFECTS_UNKNOWN_TEXT: &str =
    "restarted while this call was in flight; its effects are unknown";
pub const NOT_AVAILABLE_TEXT: &str = "not available";
/// The result of a mutating call a run that no longer writes through its ledger row would dispatch.
pub const UNRECORDED_TEXT: &str =
    "not run: this run can no longer record its calls, so a mutating call could run twice";

/// Whether a call may be dispatched: a run that no longer writes through its row (detached or fenced)
/// runs no mutating call, since no step record names it and a resume elsewhere may ask for it again
/// (SPEC §5.5: a detached run continues best-effort, without effects it cannot record).
pub fn dispatchable(tracked: bool, side_effect_free: bool) -> bool {
    tracked || side_effect_free
}

/// The settlement rule (SPEC §6.2): re-running is earned by the tool's declaration, never assumed; an
/// idempotent external call is re-sent with its key.
pub fn settlement(
    tool_known: bool,
    side_effect_free: bool,
    rerun_safe: bool,
    idempotent: bool,
) -> Settlement {
    if !tool_known {
        Settlement::NotAvailable
    } else if side_effect_free || rerun_safe {
        Settlement::Rerun
    } else if idempotent {
        Settlement::Resent
    } else {
        Settlement::EffectsUnknown
    }
}

/// Whether an inbox item is unread past the cursor (`None` = nothing consumed yet).
pub fn is_unread(seq: u64, consumed: Option<u64>) -> bool {
    consumed.is_none_or(|c| seq > c)
}

/// The unread inbox seqs past the cursor, in their given order.
pub fn unread_after(seqs: &[u64], consumed: Option<u64>) -> Vec<u64> {
    seqs.iter()
        .copied()
        .filter(|&s| is_unread(s, consumed))
        .collect()
}

// ---- pruning (SPEC §4.3 finish: receipts after their TTL, dead generations, purged runs' fences) ----

/// How long an idle generation's row outlives its start before a prune may take it (one day).
pub const GENERATION_PRUNE_AGE_MS: i64 = 86_400_000;

/// The newest end time a receipt may have and still be pruned at `now_ms`: a receipt goes once
/// `receipt_ttl_ms` have passed since its run ended (`ended_at <= cutoff`).
pub fn receipt_cutoff(now_ms: i64, receipt_ttl_ms: i64) -> i64 {
    now_ms.saturating_sub(receipt_ttl_ms.max(0))
}

/// Whether a receipt is past its TTL: its run has ended (`ended_at` set), at least `receipt_ttl_ms`
/// ago. A receipt of a run still live (`None`) always stays.
pub fn receipt_expired(ended_at: Option<i64>, now_ms: i64, receipt_ttl_ms: i64) -> bool {
    ended_at.is_some_and(|ended| ended <= receipt_cutoff(now_ms, receipt_ttl_ms))
}

/// The latest start a generation may have and still be pruned at `now_ms` (strictly older than
/// [`GENERATION_PRUNE_AGE_MS`]: `started_at < cutoff`).
pub fn generation_cutoff(now_ms: i64) -> i64 {
    now_ms.saturating_sub(GENERATION_PRUNE_AGE_MS)
}

/// Whether a generation's row may be pruned: not one the caller keeps (its own, or any it has not
/// found dead), owning no live row and no pending plan request, and started more than a day ago.
pub fn generation_prunable(started_at: i64, kept: bool, owns_rows: bool, now_ms: i64) -> bool {
    !kept && !owns_rows && started_at < generation_cutoff(now_ms)
}

/// Whether a deletion fence may be pruned: the killed run is purged — nothing of it is left, no live
/// row, record, events, transcript, step or inbox rows (`purged`) — and it was fenced at least
/// `receipt_ttl_ms` ago (`fenced_at <= `[`receipt_cutoff`], the horizon keyed receipts use).
///
/// While the fence exists a later put, claim or admit for the id is refused and the run's owner is
/// fenced. Past that horizon the fence guards nothing a live decision still needs: a purged run has no
/// live row, so every owner write of a stale process answers `UnknownRun` and no claim or reclaim can
/// take the run (writers are fenced by generations anyway); admission never reuses an id (each is
/// pre-minted fresh), and a keyed retry answers its receipt, which goes on the same horizon; a stale
/// process's record write retries for seconds, not for a TTL. A fence of a run not yet purged (a
/// killed run still settling) always stays, whatever its age.
pub fn deletion_fence_prunable(
    fenced_at: i64,
    purged: bool,
    now_ms: i64,
    receipt_ttl_ms: i64,
) -> bool {
    purged && fenced_at <= receipt_cutoff(now_ms, receipt_ttl_ms)
}

/// Longest thread key, in characters (the key column's cap).
pub const MAX_THREAD_KEY_CHARS: usize = 256;

/// Whether a thread key may be stored: non-empty and at most [`MAX_THREAD_KEY_CHARS`] characters.
pub fn is_valid_thread_key(k: &str) -> bool {
    !k.is_empty() && k.chars().count() <= MAX_THREAD_KEY_CHARS
}

#[cfg(test)]
mod tests {
    //! Table-driven: each table row is one scenario, and the tables are left unformatted so a row
    //! stays one line.

    use super::*;
    use Phase::{Attaching, AwaitingApproval, Finishing, Handoff, Live};

    fn row<'a>(run_id: &'a str, owner_gen: &'a str, phase: Phase, lease_until: i64) -> RowView<'a> {
        RowView {
            run_id,
            owner_gen,
            phase,
            lease_until,
        }
    }

    /// A receipt stays while its run lives and for exactly `ttl` after it ended; a generation goes
    /// only when it is not kept, owns nothing and is more than a day old.
    #[test]
    fn receipts_expire_a_ttl_after_their_run_ended_and_only_idle_old_unkept_generations_are_prunable(
    ) {
        const NOW: i64 = 1_800_000_000_000;
        const TTL: i64 = 86_400_000;
        // (ended_at, expired?)
        for (ended, expired) in [
            (None, false),
            (Some(NOW), false),
            (Some(NOW - TTL + 1), false),
            (Some(NOW - TTL), true),
            (Some(0), true),
        ] {
            assert_eq!(receipt_expired(ended, NOW, TTL), expired, "{ended:?}");
        }
        assert!(
            receipt_expired(Some(NOW), NOW, 0),
            "a zero TTL prunes at the next pass"
        );
        let day = GENERATION_PRUNE_AGE_MS;
        // (started_at, kept, owns_rows, prunable?)
        for (started, kept, owns, prunable) in [
            (NOW - day - 1, false, false, true),
            (NOW - day, false, false, false),
            (NOW - day - 1, true, false, false),
            (NOW - day - 1, false, true, false),
            (NOW, false, false, false),
        ] {
            assert_eq!(
                generation_prunable(started, kept, owns, NOW),
                prunable,
                "{started} {kept} {owns}"
            );
        }
    }

    /// A fence stays while anything of its run is left, whatever its age, and for exactly the receipt
    /// TTL after the kill once the run is purged.
    #[test]
    fn a_deletion_fence_goes_only_once_its_run_is_purged_and_a_receipt_ttl_after_the_kill() {
        const NOW: i64 = 1_800_000_000_000;
        const TTL: i64 = 86_400_000;
        // (fenced_at, purged, prunable?)
        for (at, purged, prunable) in [
            (NOW - TTL, true, true),
            (0, true, true),
            (NOW - TTL + 1, true, false),
            (NOW, true, false),
            (NOW - TTL, false, false),
            (0, false, false),
        ] {
            assert_eq!(
                deletion_fence_prunable(at, purged, NOW, TTL),
                prunable,
                "{at} {purged}"
            );
        }
        assert!(
            deletion_fence_prunable(NOW, true, NOW, 0),
            "a zero TTL prunes a purged run's fence at the next pass"
        );
        assert!(
            !deletion_fence_prunable(NOW, false, NOW, 0),
            "never a run still settling"
        );
    }

    #[test]
    fn phase_and_stop_spellings_round_trip() {
        for p in [Attaching, Live, Handoff, Finishing] {
            assert_eq!(Phase::parse(p.as_str()), Some(p));
            assert_eq!(serde_json::to_string(&p).ok(), Some(format!("\"{p}\"")));
        }
        for m in [StopMode::Soft, StopMode::Hard] {
            assert_eq!(StopMode::parse(m.as_str()), Some(m));
            assert_eq!(serde_json::to_string(&m).ok(), Some(format!("\"{m}\"")));
        }
        assert_eq!(Phase::parse("Live"), None);
        assert_eq!(Phase::parse(""), None);
        assert_eq!(StopMode::parse("harder"), None);
    }

    #[test]
    fn hard_stop_never_downgrades() {
        // (stored, requested) → stored afterwards
        #[rustfmt::skip]
        let cases = [
            (None,                 StopMode::Soft, StopMode::Soft),
            (None,                 StopMode::Hard, StopMode::Hard),
            (Some(StopMode::Soft), StopMode::Soft, StopMode::Soft),
            (Some(StopMode::Soft), StopMode::Hard, StopMode::Hard),
            (Some(StopMode::Hard), StopMode::Soft, StopMode::Hard),
            (Some(StopMode::Hard), StopMode::Hard, StopMode::Hard),
        ];
        for (current, requested, want) in cases {
            assert_eq!(
                strongest_stop(current, requested),
                want,
                "{current:?} + {requested:?}"
            );
        }
        assert!(StopMode::Hard > StopMode::Soft);
    }

    #[test]
    fn phase_table_allows_exactly_the_spec_transitions() {
        use PhaseChange::{Finishing as Fin, Handoff as Hand, Park, Promote, Reclaim, Unpark};
        // Every (from, change) pair: Some(to) is allowed, None is refused with WrongPhase.
        #[rustfmt::skip]
        let table = [
            (Attaching, Promote, Some(Live)),
            (Attaching, Hand,    None),             // never attaching → handoff
            (Attaching, Fin,     Some(Finishing)),
            (Attaching, Reclaim, Some(Attaching)),  // reclaim keeps attaching
            (Live,      Promote, None),             // a re-claim is Keep, not a transition
            (Live,      Hand,    Some(Handoff)),
            (Live,      Fin,     Some(Finishing)),
            (Live,      Reclaim, Some(Live)),
            (Handoff,   Promote, None),
            (Handoff,   Hand,    None),
            (Handoff,   Fin,     Some(Finishing)),
            (Handoff,   Reclaim, Some(Live)),
            (Finishing, Promote, None),
            (Finishing, Hand,    None),
            (Finishing, Fin,     None),             // a second finishing is refused
            (Finishing, Reclaim, Some(Live)),
            (Attaching, Park,    None),
            (Attaching, Unpark,  None),
            (Live,      Park,    Some(AwaitingApproval)),
            (Live,      Unpark,  Some(Live)),       // a retried unpark is a no-op
            (Handoff,   Park,    None),
            (Handoff,   Unpark,  None),
            (Finishing, Park,    None),
            (Finishing, Unpark,  None),
            (AwaitingApproval, Promote, None),
            (AwaitingApproval, Hand,    Some(Handoff)),   // a drain hands a parked run on as it is
            (AwaitingApproval, Fin,     Some(Finishing)), // a stop ends the wait
            (AwaitingApproval, Reclaim, Some(Live)),      // the next owner parks again
            (AwaitingApproval, Park,    Some(AwaitingApproval)),
            (AwaitingApproval, Unpark,  Some(Live)),
        ];
        assert_eq!(table.len(), 30);
        for (from, change, want) in table {
            let got = phase_transition(from, change);
            match want {
                Some(to) => assert_eq!(got, Ok(to), "{from} {change}"),
                None => assert_eq!(got, Err(WrongPhase { from, change }), "{from} {change}"),
            }
        }
    }

    #[test]
    fn nothing_transitions_into_attaching_except_reclaim_keeping_it() {
        assert_eq!(INSERT_PHASE, Attaching);
        let changes = [
            PhaseChange::Promote,
            PhaseChange::Handoff,
            PhaseChange::Finishing,
            PhaseChange::Reclaim,
            PhaseChange::Park,
            PhaseChange::Unpark,
        ];
        for from in [Live, Handoff, Finishing, AwaitingApproval] {
            for change in changes {
                assert_ne!(
                    phase_transition(from, change),
                    Ok(Attaching),
                    "{from} {change}"
                );
            }
        }
    }

    #[test]
    fn wrong_phase_names_the_phase_and_the_change() {
        let e = WrongPhase {
            from: Finishing,
            change: PhaseChange::Finishing,
        };
        assert_eq!(e.to_string(), "phase finishing does not allow finishing");
    }

    #[test]
    fn reclaim_keeps_attaching_and_makes_everything_else_live() {
        let cases = [
            (Attaching, Attaching),
            (Live, Live),
            (Handoff, Live),
            (Finishing, Live),
            (AwaitingApproval, Live),
        ];
        for (prior, want) in cases {
            assert_eq!(reclaim_phase(prior), want, "{prior}");
        }
    }

    #[test]
    fn fence_passes_only_the_owner_and_ignores_the_lease() {
        let expired = row("r1", "g1", Live, 0); // lease long gone, nobody reclaimed
        let current = row("r1", "g1", Live, i64::MAX);
        #[rustfmt::skip]
        let cases = [
            (Some(&current), "g1", Fence::Owner),
            (Some(&expired), "g1", Fence::Owner), // expiry alone never fences
            (Some(&current), "g2", Fence::Fenced),
            (Some(&expired), "g2", Fence::Fenced),
            (None,           "g1", Fence::UnknownRun),
        ];
        for (r, gen, want) in cases {
            assert_eq!(fence_check(r, gen), want, "{r:?} {gen}");
        }
    }

    #[test]
    fn claim_decision_table() {
        // The claimant is run r1 under generation g1.
        let attaching = row("r1", "g1", Attaching, 10);
        let live = row("r1", "g1", Live, 10);
        let handoff = row("r1", "g1", Handoff, 10);
        let finishing = row("r1", "g1", Finishing, 10);
        let reclaimed = row("r1", "g2", Live, 10);
        let reclaimed_attaching = row("r1", "g2", Attaching, 10);
        let other = row("r9", "g2", Live, 10);
        let thread_live = ClaimDecision::ThreadLive {
            run_id: "r9".into(),
        };
        // (scenario, row on the thread, row under the run id, decision)
        #[rustfmt::skip]
        let cases: [(&str, Option<&RowView>, Option<&RowView>, ClaimDecision); 11] = [
            ("owner promotes its reservation",              Some(&attaching), Some(&attaching), ClaimDecision::Promote),
            ("re-claim of a live row is kept",              Some(&live),      Some(&live),      ClaimDecision::Keep),
            ("re-claim of a handoff row is kept",           Some(&handoff),   Some(&handoff),   ClaimDecision::Keep),
            ("re-claim of a finishing row is kept",         Some(&finishing), Some(&finishing), ClaimDecision::Keep),
            ("another run on the thread is thread-live",    Some(&other),     None,             thread_live.clone()),
            ("thread-live wins over the run's own row",     Some(&other),     Some(&attaching), thread_live),
            ("same run, another owner is fenced",           Some(&reclaimed), Some(&reclaimed), ClaimDecision::Fenced),
            ("fenced even while attaching",                 Some(&reclaimed_attaching), Some(&reclaimed_attaching), ClaimDecision::Fenced),
            ("no row at all is unknown",                    None,             None,             ClaimDecision::UnknownRun),
            ("run row found only by id still promotes",     None,             Some(&attaching), ClaimDecision::Promote),
            ("run row found only by thread still promotes", Some(&attaching), None,             ClaimDecision::Promote),
        ];
        for (name, by_thread, by_run, want) in cases {
            assert_eq!(
                decide_claim(by_thread, by_run, &RunId::from("r1"), "g1"),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn a_writer_sees_a_live_run_through_its_filter_and_an_unstamped_row_is_unknown() {
        use crate::record::VisibilityFilter;
        let meta =
            serde_json::json!({"channelId": "C1", "userId": "U1", "channelVisibility": "private"});
        let machine_only: VisibilityFilter = serde_json::from_value(
            serde_json::json!({"kind": "visibility-in", "values": ["machine"]}),
        )
        .unwrap();
        let private: VisibilityFilter = serde_json::from_value(
            serde_json::json!({"kind": "visibility-in", "values": ["private"]}),
        )
        .unwrap();
        let public: VisibilityFilter = serde_json::from_value(
            serde_json::json!({"kind": "visibility-in", "values": ["public"]}),
        )
        .unwrap();
        assert!(writer_sees(None, &meta), "the process's own admissions");
        assert!(!writer_sees(Some(&machine_only), &meta));
        assert!(writer_sees(Some(&private), &meta));
        assert!(
            !writer_sees(
                Some(&public),
                &serde_json::json!({"channelId": "C1", "userId": "U1"})
            ),
            "unstamped reads unknown"
        );
        assert!(writer_sees(Some(&VisibilityFilter::All), &meta));
    }

    #[test]
    fn admit_decision_table() {
        let live = row("r1", "g1", Live, 10);
        let attaching = row("r1", "g1", Attaching, 10);
        let finishing = row("r1", "g1", Finishing, 10);
        let steer = AdmitDecision::Steer {
            run_id: "r1".into(),
        };
        let busy = AdmitDecision::Busy {
            run_id: "r1".into(),
        };
        // (scenario, row on the thread, keyed, the writer sees the row, decision)
        #[rustfmt::skip]
        let cases = [
            ("free thread inserts",         None,             false, true,  AdmitDecision::Insert),
            ("free thread inserts keyed",   None,             true,  true,  AdmitDecision::Insert),
            ("a free thread has no run to hide", None,        false, false, AdmitDecision::Insert),
            ("live row steers",             Some(&live),      false, true,  steer.clone()),
            ("live row steers keyed",       Some(&live),      true,  true,  steer.clone()),
            ("attaching row steers",        Some(&attaching), true,  true,  steer.clone()),
            ("finishing + unkeyed steers",  Some(&finishing), false, true,  steer),
            ("finishing + keyed is busy",   Some(&finishing), true,  true,  busy),
            ("an unseen live row is forbidden", Some(&live),  false, false, AdmitDecision::Forbidden),
            ("an unseen finishing row is forbidden", Some(&finishing), true, false, AdmitDecision::Forbidden),
        ];
        for (name, by_thread, keyed, sees, want) in cases {
            assert_eq!(
                decide_admit(by_thread, keyed, sees, Strategy::Steer),
                want,
                "{name}"
            );
        }
        let queue = AdmitDecision::Queue {
            run_id: "r1".into(),
        };
        let interrupt = AdmitDecision::Interrupt {
            run_id: "r1".into(),
        };
        let reject = AdmitDecision::Reject {
            run_id: "r1".into(),
        };
        // (scenario, row on the thread, strategy, decision); keyed or not decides nothing here.
        #[rustfmt::skip]
        let strategies = [
            ("an idle thread starts whatever the strategy", None, Strategy::Reject, AdmitDecision::Insert),
            ("an idle thread starts an enqueue",   None,             Strategy::Enqueue,   AdmitDecision::Insert),
            ("an idle thread starts an interrupt", None,             Strategy::Interrupt, AdmitDecision::Insert),
            ("enqueue queues on a live run",       Some(&live),      Strategy::Enqueue,   queue.clone()),
            ("enqueue queues on a finishing run",  Some(&finishing), Strategy::Enqueue,   queue.clone()),
            ("reject refuses a live run",          Some(&attaching), Strategy::Reject,    reject.clone()),
            ("reject refuses a finishing run",     Some(&finishing), Strategy::Reject,    reject),
            ("interrupt stops a live run",         Some(&live),      Strategy::Interrupt, interrupt.clone()),
            ("interrupt stops an attaching run",   Some(&attaching), Strategy::Interrupt, interrupt),
            ("interrupt past the gate only queues", Some(&finishing), Strategy::Interrupt, queue),
        ];
        for (name, by_thread, strategy, want) in strategies {
            for keyed in [false, true] {
                assert_eq!(
                    decide_admit(by_thread, keyed, true, strategy),
                    want,
                    "{name}"
                );
            }
            let hidden = if by_thread.is_some() {
                AdmitDecision::Forbidden
            } else {
                AdmitDecision::Insert
            };
            assert_eq!(
                decide_admit(by_thread, false, false, strategy),
                hidden,
                "{name}, unseen"
            );
        }
    }

    #[test]
    fn lease_equal_to_now_is_expired() {
        // (lease_until, now, expired)
        let cases = [
            (99, 100, true),
            (100, 100, true),
            (101, 100, false),
            (i64::MIN, 0, true),
        ];
        for (until, now, want) in cases {
            assert_eq!(lease_expired(until, now), want, "{until} vs {now}");
        }
    }

    #[test]
    fn reclaim_selection_table() {
        // Generation "gme" reclaims at `now`; "gdead" is provably gone.
        let now = 1_000;
        let dead = vec!["gdead".to_owned()];
        #[rustfmt::skip]
        let cases = [
            // Own rows are never taken, whatever the lease or phase.
            ("own expired live",               row("r", "gme",   Live,      0),       ReclaimSelection::Own),
            ("own handoff",                    row("r", "gme",   Handoff,   now + 5), ReclaimSelection::Own),
            ("own expired attaching",          row("r", "gme",   Attaching, 0),       ReclaimSelection::Own),
            // Another generation's rows.
            ("expired live",                   row("r", "g2",    Live,      now - 1), ReclaimSelection::Take),
            ("lease ending now",               row("r", "g2",    Live,      now),     ReclaimSelection::Take),
            ("expired attaching",              row("r", "g2",    Attaching, now),     ReclaimSelection::Take),
            ("expired finishing",              row("r", "g2",    Finishing, now),     ReclaimSelection::Take),
            ("handoff under a current lease",  row("r", "g2",    Handoff,   now + 5), ReclaimSelection::Take),
            ("dead gen under a current lease", row("r", "gdead", Live,      now + 5), ReclaimSelection::Take),
            ("current lease",                  row("r", "g2",    Live,      now + 1), ReclaimSelection::LiveElsewhere),
            ("current lease finishing",        row("r", "g2",    Finishing, now + 1), ReclaimSelection::LiveElsewhere),
            // A run the reclaimer still drives (its old actor, or its close) waits until that ends.
            ("driven, expired",                row("d", "g2",    Live,      now - 1), ReclaimSelection::Driven),
            ("driven, handoff",                row("d", "g2",    Handoff,   now + 5), ReclaimSelection::Driven),
            ("driven, dead gen",               row("d", "gdead", Live,      now + 5), ReclaimSelection::Driven),
            ("driven, current lease",          row("d", "g2",    Live,      now + 1), ReclaimSelection::LiveElsewhere),
            ("driven, own",                    row("d", "gme",   Live,      0),       ReclaimSelection::Own),
        ];
        let driven = vec![RunId::from("d")];
        for (name, r, want) in cases {
            assert_eq!(
                reclaim_selection(&r, "gme", now, &dead, &driven),
                want,
                "{name}"
            );
        }
        // Naming ourselves as dead still never takes our own row.
        let own = row("r", "gme", Live, 0);
        assert_eq!(
            reclaim_selection(&own, "gme", now, &["gme".to_owned()], &[]),
            ReclaimSelection::Own
        );
    }

    /// A row that would resume at step 2 unless a case changes something.
    fn input(prior_phase: Phase) -> ClassifyInput<'static> {
        ClassifyInput {
            prior_phase,
            stop: None,
            final_status: None,
            detached: false,
            has_request: true,
            turn_count: 5,
            gap: None,
            last_step: Some(StepCursor {
                step: 2,
                turn_index: 5,
            }),
        }
    }

    #[test]
    fn classification_follows_the_spec_order() {
        let interrupted = |reason: &str| Classification::CloseInterrupted {
            reason: reason.to_owned(),
        };
        let final_ = |status: &str| Classification::CloseFinal {
            status: status.to_owned(),
        };
        let resume_at = |step| Classification::Resume(ResumePoint::ResumeAt { step });
        let hard = Some(StopMode::Hard);
        #[rustfmt::skip]
        let cases: Vec<(&str, ClassifyInput, Classification)> = vec![
            ("finishing closes with its status",            ClassifyInput { final_status: Some("failed"), ..input(Finishing) }, final_("failed")),
            ("finishing without status is completed",       input(Finishing), final_("completed")),
            ("finishing with empty status is completed",    ClassifyInput { final_status: Some(""), ..input(Finishing) }, final_("completed")),
            ("finishing wins over a hard stop",             ClassifyInput { stop: hard, final_status: Some("completed"), ..input(Finishing) }, final_("completed")),
            ("finishing wins over detached",                ClassifyInput { detached: true, ..input(Finishing) }, final_("completed")),
            ("a final status closes a row reclaimed back to live", ClassifyInput { final_status: Some("stopped_soft"), ..input(Live) }, final_("stopped_soft")),
            ("hard stop beats resume",                      ClassifyInput { stop: hard, ..input(Live) }, Classification::CloseHardStopped),
            ("hard stop beats restart",                     ClassifyInput { stop: hard, ..input(Attaching) }, Classification::CloseHardStopped),
            ("hard stop beats detached",                    ClassifyInput { stop: hard, detached: true, ..input(Handoff) }, Classification::CloseHardStopped),
            ("soft stop still resumes",                     ClassifyInput { stop: Some(StopMode::Soft), ..input(Live) }, resume_at(2)),
            ("detached closes interrupted",                 ClassifyInput { detached: true, ..input(Live) }, interrupted(DETACHED_REASON)),
            ("detached beats restart",                      ClassifyInput { detached: true, ..input(Attaching) }, interrupted(DETACHED_REASON)),
            ("attaching with request restarts",             input(Attaching), Classification::Restart),
            ("attaching without request closes naming why", ClassifyInput { has_request: false, ..input(Attaching) }, interrupted(NO_REQUEST_REASON)),
            ("attaching ignores completeness",              ClassifyInput { last_step: None, turn_count: 0, ..input(Attaching) }, Classification::Restart),
            ("live with a whole transcript resumes",        input(Live), resume_at(2)),
            ("handoff with a whole transcript resumes",     input(Handoff), resume_at(2)),
            ("live with the next step's turns runs fresh",  ClassifyInput { turn_count: 7, ..input(Live) }, Classification::Resume(ResumePoint::RunStepFresh { step: 3 })),
            ("live with a gap closes naming it",            ClassifyInput { turn_count: 6, ..input(Live) }, interrupted("partial write: transcript has 6 turns, step 2 recorded 5")),
            ("a hole in the transcript closes naming it",   ClassifyInput { turn_count: 3, gap: Some(crate::ledger::TranscriptGap::Turn { idx: 3 }), ..input(Live) }, interrupted("transcript gap: turn 3 is missing (3 turns before it)")),
            ("a missing part closes naming it",             ClassifyInput { turn_count: 5, gap: Some(crate::ledger::TranscriptGap::Part { idx: 5, part: 1 }), ..input(Handoff) }, interrupted("transcript gap: part 1 of turn 5 is missing (5 turns before it)")),
            ("live with no step record restarts",           ClassifyInput { last_step: None, ..input(Live) }, Classification::Restart),
            ("handoff with no step record restarts",        ClassifyInput { last_step: None, ..input(Handoff) }, Classification::Restart),
            ("no step record and no request closes",        ClassifyInput { last_step: None, has_request: false, ..input(Live) }, interrupted(NO_STEP_RECORD_REASON)),
        ];
        for (name, inp, want) in cases {
            assert_eq!(classify(&inp), want, "{name}");
        }
    }

    /// (scenario, transcript turns, last step record, finding)
    type CompletenessCase = (
        &'static str,
        u64,
        Option<StepCursor>,
        Result<ResumePoint, String>,
    );

    #[test]
    fn completeness_table() {
        let at = |step, turn_index| Some(StepCursor { step, turn_index });
        let resume_at = |step| Ok(ResumePoint::ResumeAt { step });
        let fresh = |step| Ok(ResumePoint::RunStepFresh { step });
        let gap = |s: &str| Err(s.to_owned());
        let top = u64::MAX;
        #[rustfmt::skip]
        let cases: [CompletenessCase; 10] = [
            ("no record",                         3,   None,          gap(NO_STEP_RECORD_REASON)),
            ("equal at the seed",                 2,   at(0, 2),      resume_at(0)),
            ("equal at a step",                   9,   at(3, 9),      resume_at(3)),
            ("+1 after step 0 runs step 1 fresh", 3,   at(0, 2),      fresh(1)),
            ("+2 after step 3 runs step 4 fresh", 11,  at(3, 9),      fresh(4)),
            ("+2 after step 0 is a gap",          4,   at(0, 2),      gap("partial write: transcript has 4 turns, step 0 recorded 2")),
            ("+1 after step 3 is a gap",          10,  at(3, 9),      gap("partial write: transcript has 10 turns, step 3 recorded 9")),
            ("+3 is a gap",                       8,   at(3, 5),      gap("partial write: transcript has 8 turns, step 3 recorded 5")),
            ("fewer turns than recorded",         4,   at(3, 9),      gap("incomplete transcript: transcript has 4 turns, step 3 recorded 9")),
            ("no overflow at the top",            top, at(3, top - 1), Err(format!("partial write: transcript has {top} turns, step 3 recorded {}", top - 1))),
        ];
        for (name, turns, last, want) in cases {
            assert_eq!(completeness(turns, last), want, "{name}");
        }
        assert_eq!(ResumePoint::RunStepFresh { step: 4 }.step(), 4);
        assert_eq!(ResumePoint::ResumeAt { step: 3 }.step(), 3);
    }

    #[test]
    fn in_flight_must_equal_the_last_assistant_calls_as_sets() {
        let ids = |xs: &[&str]| xs.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        // (scenario, recorded in flight, last assistant turn's calls, matches)
        #[rustfmt::skip]
        let cases = [
            ("both empty",                  ids(&[]),         ids(&[]),         true),
            ("same order",                  ids(&["a", "b"]), ids(&["a", "b"]), true),
            ("other order",                 ids(&["b", "a"]), ids(&["a", "b"]), true),
            ("duplicates collapse",         ids(&["a", "a"]), ids(&["a"]),      true),
            ("unrecorded call",             ids(&["a"]),      ids(&["a", "c"]), false),
            ("recorded call missing",       ids(&["a", "b"]), ids(&["a"]),      false),
            ("nothing recorded, calls made", ids(&[]),        ids(&["a"]),      false),
        ];
        for (name, recorded, calls, ok) in cases {
            assert_eq!(in_flight_matches(&recorded, &calls).is_ok(), ok, "{name}");
        }
        // The reason names both sides of the mismatch.
        let err = in_flight_matches(&ids(&["a", "b"]), &ids(&["a", "c"])).err();
        assert_eq!(
            err.as_deref(),
            Some(
                "in-flight mismatch: the last assistant turn's calls [\"c\"] are not recorded, \
                 recorded calls [\"b\"] are not in it"
            )
        );
    }

    #[test]
    fn settlement_table() {
        use Settlement::{EffectsUnknown, NotAvailable, Rerun, Resent};
        // (known, side_effect_free, rerun_safe) → settlement
        #[rustfmt::skip]
        let cases = [
            (false, false, false, NotAvailable),
            (false, true,  false, NotAvailable),
            (false, false, true,  NotAvailable),
            (false, true,  true,  NotAvailable),
            (true,  false, false, EffectsUnknown),
            (true,  true,  false, Rerun),
            (true,  false, true,  Rerun),
            (true,  true,  true,  Rerun),
        ];
        for (known, sef, safe, want) in cases {
            assert_eq!(
                settlement(known, sef, safe, false),
                want,
                "{known} {sef} {safe}"
            );
        }
        assert_eq!(
            settlement(true, false, false, true),
            Resent,
            "an idempotent call is re-sent"
        );
        assert_eq!(
            settlement(true, true, false, true),
            Rerun,
            "a read-only one is simply re-run"
        );
        assert_eq!(settlement(false, false, false, true), NotAvailable);
        assert_eq!(Resent.synthetic_text(), None);
        assert_eq!(Rerun.synthetic_text(), None);
        assert_eq!(EffectsUnknown.synthetic_text(), Some(EFFECTS_UNKNOWN_TEXT));
        assert_eq!(NotAvailable.synthetic_text(), Some("not available"));
        assert_eq!(
            serde_json::to_string(&EffectsUnknown).ok().as_deref(),
            Some("\"effects_unknown\"")
        );
    }

    #[test]
    fn unread_inbox_is_strictly_past_the_cursor() {
        let seqs = [1, 2, 3, 5, 8];
        // (consumed cursor, unread)
        #[rustfmt::skip]
        let cases: [(Option<u64>, &[u64]); 5] = [
            (None,    &[1, 2, 3, 5, 8]),
            (Some(0), &[1, 2, 3, 5, 8]),
            (Some(3), &[5, 8]),
            (Some(4), &[5, 8]),
            (Some(8), &[]),
        ];
        for (consumed, want) in cases {
            assert_eq!(unread_after(&seqs, consumed), want, "{consumed:?}");
        }
        assert!(unread_after(&[], None).is_empty());
    }

    #[test]
    fn thread_keys_are_non_empty_and_at_most_256_chars() {
        let cases = [
            (String::new(), false),
            ("t".to_owned(), true),
            ("x".repeat(256), true),
            ("x".repeat(257), false),
            ("é".repeat(256), true), // counted in chars, not bytes
            ("é".repeat(257), false),
        ];
        for (k, want) in cases {
            assert_eq!(is_valid_thread_key(&k), want, "len {}", k.chars().count());
        }
    }
}
