//! The live-run ledger (SPEC §4): which runs are live, who owns each (generation + lease), and what a
//! next process needs to resume them — transcript, step records, inbox, state.
//!
//! Owns (SQLite): `live_runs`, `run_steps`, `transcript`, `run_inbox`, `admit_receipts`,
//! `deletion_fences`, `generations`; shares `run_events` with the finished-run history (a live run's
//! events are appended here, and `finish` replaces them with the record's).
//!
//! Invariants every implementation keeps (they call [`decisions`] for every choice):
//! - one live row per thread (`thread_key UNIQUE`); a second run on a thread is refused naming the
//!   live one;
//! - every owner write carries the generation and is checked in the same transaction: another owner is
//!   [`Refusal::Fenced`], no row is [`Refusal::UnknownRun`]; lease expiry alone never fences;
//! - a refusal is a value ([`Refusal`]), never an error string; [`crate::Error`] means "could not
//!   answer";
//! - `finish` is ONE transaction: the record upsert exactly as `RunStore::put` and the deletion of the
//!   run's live rows — `live_runs`, `run_steps`, `transcript` and every `run_inbox` row — so the thread
//!   is free exactly when the record is durable, and a finished run leaves nothing behind but its
//!   record and its receipts (which [`RunLedger::prune`] takes `receipt_ttl_ms` after the end);
//! - reclaim never takes the caller's own rows, and two generations reclaiming at once each take a row
//!   at most once between them.

mod approvals;
mod checks;
pub mod decisions;
mod identity;
mod successor;
mod transcript;

use crate::RunId;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::record::{RunRecord, RunStatus};
use crate::store::{PolicyProposal, PutOutcome};
use crate::Result;
pub use approvals::{
    approvals_patch, change_phase, decide, Approval, Approvals, DecideAnswer, Decided, Decision,
};
pub use checks::{check_events, check_turns, fence_refusal, gate, view_refusal};
pub use decisions::{Phase, StopMode, Strategy};
pub use identity::{label_of, RunIdentity, LABEL_CHARS};
pub use successor::{successor_admission, waiting, Successor, SuccessorFacts, SuccessorPlan};
pub use transcript::{Transcript, TranscriptGap};

/// Keyed receipts one run may hold (SPEC §5.1); a new key past it is held, an earlier one never evicted.
pub const MAX_RECEIPTS_PER_RUN: usize = 256;

/// Messages one thread may hold queued behind its live run (SPEC §5.1 `enqueue`, `interrupt`); one more
/// is refused ([`AdmitOutcome::QueueFull`]), nothing written.
pub const MAX_QUEUED_PER_THREAD: u64 = 100;

/// Largest transcript part (UTF-8 bytes of its JSON); a larger one is refused by name, never truncated.
pub const MAX_TRANSCRIPT_PART_BYTES: usize = 1_500_000;

/// Why the ledger refused an operation. Each is an answer to act on, not an error to retry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("another generation owns run {run_id}")]
    Fenced { run_id: RunId },
    #[error("no live row for run {run_id}")]
    UnknownRun { run_id: RunId },
    /// `push_inbox` / `read_inbox` / `request_stop` on a run without a live row.
    #[error("run {run_id} is not live")]
    NotLive { run_id: RunId },
    /// A different run holds the thread.
    #[error("thread is live with run {run_id}")]
    ThreadLive {
        run_id: RunId,
        agent: Option<String>,
        started_at: i64,
    },
    #[error("run {run_id} is in phase {phase:?}, which does not allow {change}")]
    WrongPhase {
        run_id: RunId,
        phase: Phase,
        change: &'static str,
    },
    #[error("event seq {seq} is {bytes} bytes, over the 64 KiB limit")]
    EventTooLarge { seq: u64, bytes: usize },
    #[error("event at position {index} has no numeric seq")]
    EventWithoutSeq { index: usize },
    #[error("transcript part {idx}.{part} is {bytes} bytes, over the limit")]
    PartTooLarge { idx: u64, part: u64, bytes: usize },
    /// A decision names a call the run is not awaiting approval for.
    #[error("run {run_id} awaits no approval of call {call_id}")]
    UnknownCall { run_id: RunId, call_id: String },
    /// The call was decided already: the first decision wins (SPEC §13).
    #[error("call {call_id} of run {run_id} was decided already")]
    AlreadyDecided {
        run_id: RunId,
        call_id: String,
        decided: Decided,
    },
    /// The finishing gate of a `completed` run found a stop recorded before it
    /// ([`decisions::stop_before_gate`]): the run concludes again under that stop.
    #[error("run {run_id} has a {mode:?} stop recorded before its finishing gate")]
    StopPending { run_id: RunId, mode: StopMode },
}

/// An operation's answer: the value, or the typed refusal.
pub type Outcome<T> = std::result::Result<T, Refusal>;

/// One row of `live_runs`.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveRow {
    pub run_id: RunId,
    pub thread_key: String,
    pub owner_gen: String,
    pub lease_until: i64,
    pub started_at: i64,
    pub phase: Phase,
    pub stop: Option<StopMode>,
    /// `{agent, model, label, threadKey, channelId, userId, channelVisibility, parentRunId?, deadline, request}`.
    pub meta: Value,
    /// The composed system prompt (empty while attaching).
    pub system_text: String,
    /// Tool definitions, verbatim (`null` while attaching).
    pub tools: Value,
    /// `{finalStatus?, answer?, binding, detached?}`, merged by top-level key.
    pub state: Map<String, Value>,
}

impl Admit {
    /// Whether this message may reach `holder`, the thread's live run (SPEC §8.1: visibility on writes);
    /// a free thread has no run to hide.
    pub fn reaches(&self, holder: Option<&LiveRow>) -> bool {
        holder.is_none_or(|h| decisions::writer_sees(self.writer.as_ref(), &h.meta))
    }
}

/// The keys of a row's `state_json` (SPEC §4.1): written by [`finishing_patch`], the launch's binding and
/// the detach mark, read only through [`LiveRow`]'s typed readers.
pub mod state_keys {
    pub const FINAL_STATUS: &str = "finalStatus";
    pub const ANSWER: &str = "answer";
    pub const BINDING: &str = "binding";
    pub const DETACHED: &str = "detached";
    /// The run's status card in its chat thread (SPEC §12), `{channel, ts}`.
    pub const CARD: &str = "card";
    /// The tool calls awaiting (or past) a person's approval, by call id ([`super::Approvals`]).
    pub const APPROVALS: &str = "approvals";
}

impl LiveRow {
    /// The status the finishing gate committed (`state.finalStatus`), if it has.
    pub fn final_status(&self) -> Option<RunStatus> {
        self.state
            .get(state_keys::FINAL_STATUS)
            .and_then(Value::as_str)
            .and_then(RunStatus::parse)
    }

    /// Whether the finishing gate committed (a final status is saved, whatever its spelling).
    pub fn gated(&self) -> bool {
        self.state.contains_key(state_keys::FINAL_STATUS)
    }

    /// The answer the finishing gate saved (`state.answer`).
    pub fn saved_answer(&self) -> Option<&str> {
        self.state.get(state_keys::ANSWER).and_then(Value::as_str)
    }

    /// The workspace the row is bound to (`state.binding.workspace`).
    pub fn bound_workspace(&self) -> Option<&str> {
        self.state
            .get(state_keys::BINDING)
            .and_then(|b| b.get("workspace"))
            .and_then(Value::as_str)
    }

    /// The row's approvals (`state.approvals`); a value that does not read is none (logged).
    pub fn approvals(&self) -> Approvals {
        match self.state.get(state_keys::APPROVALS) {
            None => Approvals::new(),
            Some(v) => serde_json::from_value(v.clone()).unwrap_or_else(|e| {
                tracing::warn!(run_id = %self.run_id, error = %e, "state.approvals does not read");
                Approvals::new()
            }),
        }
    }

    /// Whether the row was marked detached (`state.detached`, SPEC §5.5).
    pub fn detached(&self) -> bool {
        self.state
            .get(state_keys::DETACHED)
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }

    pub fn view(&self) -> decisions::RowView<'_> {
        decisions::RowView {
            run_id: &self.run_id,
            owner_gen: &self.owner_gen,
            phase: self.phase,
            lease_until: self.lease_until,
        }
    }

    pub fn agent(&self) -> Option<String> {
        self.meta
            .get("agent")
            .and_then(Value::as_str)
            .map(str::to_owned)
    }

    pub fn thread_live(&self) -> Refusal {
        Refusal::ThreadLive {
            run_id: self.run_id.clone(),
            agent: self.agent(),
            started_at: self.started_at,
        }
    }
}

/// An idempotency key on an admitted message (SPEC §5.1): scoped to the caller, with the body's hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptKey {
    /// The calling token's name.
    pub scope: String,
    pub key: String,
    /// SHA-256 hex of the canonical body minus `key`.
    pub body_hash: String,
}

/// A message to admit on a thread (SPEC §4.3 `admit`).
#[derive(Debug, Clone, PartialEq)]
pub struct Admit {
    pub thread_key: String,
    pub gen: String,
    /// Pre-minted id for a run this admission may start.
    pub run_id: RunId,
    /// The admitted message; `meta.request` of a started run, the inbox item of a steer.
    pub request: Value,
    /// The started row's `meta_json` (must carry `request`).
    pub meta: Value,
    pub key: Option<ReceiptKey>,
    pub lease_ms: i64,
    /// What the caller may see: a message reaches a live run only when it may see that run (SPEC §8.1
    /// Auth, visibility on writes); `None` for the process's own admissions (successors, tests).
    pub writer: Option<crate::record::VisibilityFilter>,
    /// What the message does when the thread is busy (SPEC §5.1); `request` carries it too, so a
    /// queued inbox item says it is one.
    pub strategy: Strategy,
}

/// What admission did. Stored verbatim in a keyed receipt and returned verbatim on a retry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum AdmitOutcome {
    /// An `attaching` row was inserted for the pre-minted id.
    Started {
        #[serde(rename = "runId")]
        run_id: RunId,
    },
    /// The message went to the live run's inbox.
    Steered {
        #[serde(rename = "runId")]
        run_id: RunId,
        seq: u64,
    },
    /// The thread's run is finishing and the message is keyed: try again shortly.
    Busy {
        #[serde(rename = "runId")]
        run_id: RunId,
    },
    /// The key was used before with another body.
    KeyConflict,
    /// The live run already holds [`MAX_RECEIPTS_PER_RUN`] keyed receipts: this new key is held (nothing
    /// appended); earlier keys still answer.
    ReceiptLimit {
        #[serde(rename = "runId")]
        run_id: RunId,
    },
    /// The id carries a deletion fence.
    Fenced,
    /// The thread's live run is one the caller may not see: nothing was written (no receipt either).
    Forbidden,
    /// `enqueue`: the message waits on the thread behind `run_id` (the live run), `position` of the
    /// messages queued there (from 1), and starts its own run in turn.
    Queued {
        #[serde(rename = "runId")]
        run_id: RunId,
        position: u64,
    },
    /// `interrupt`: a soft stop of `run_id` is recorded and the message queued behind it.
    Interrupting {
        #[serde(rename = "runId")]
        run_id: RunId,
        position: u64,
    },
    /// `reject` on a busy thread: nothing was written but a keyed message's receipt (the key's answer).
    Rejected {
        #[serde(rename = "runId")]
        run_id: RunId,
    },
    /// [`MAX_QUEUED_PER_THREAD`] messages wait already: nothing was written (no receipt either).
    QueueFull {
        #[serde(rename = "runId")]
        run_id: RunId,
    },
}

impl AdmitOutcome {
    /// Whether this admission started `run_id` (a fresh run of its own).
    pub fn started(&self, run_id: &RunId) -> bool {
        matches!(self, AdmitOutcome::Started { run_id: r } if r == run_id)
    }

    /// Whether this answer put the message on a live run's inbox.
    pub fn wrote_inbox(&self) -> bool {
        matches!(
            self,
            AdmitOutcome::Steered { .. }
                | AdmitOutcome::Queued { .. }
                | AdmitOutcome::Interrupting { .. }
        )
    }

    /// Whether a keyed receipt records this answer, to replay it to a retry: not the answers that say
    /// "come back" or "not you" (busy, a held key, a hidden run, a full queue), which write nothing. A
    /// rejection is kept: it is the key's answer, so an earlier attempt still in flight that commits
    /// later answers it too instead of starting a run its caller was told was refused (SPEC §5.1).
    pub fn kept_in_receipt(&self) -> bool {
        !matches!(
            self,
            AdmitOutcome::Busy { .. }
                | AdmitOutcome::KeyConflict
                | AdmitOutcome::ReceiptLimit { .. }
                | AdmitOutcome::Forbidden
                | AdmitOutcome::QueueFull { .. }
        )
    }

    /// The run and inbox seq a receipt row names (`admit_receipts.run_id`, `seq`).
    pub fn receipt_target(&self) -> (&str, Option<u64>) {
        match self {
            AdmitOutcome::Started { run_id }
            | AdmitOutcome::Queued { run_id, .. }
            | AdmitOutcome::Interrupting { run_id, .. }
            | AdmitOutcome::Rejected { run_id } => (run_id, None),
            AdmitOutcome::Steered { run_id, seq } => (run_id, Some(*seq)),
            _ => ("", None),
        }
    }

    /// The answer's `outcome` spelling (`admit_receipts.outcome`).
    pub fn kind(&self) -> &'static str {
        match self {
            AdmitOutcome::Started { .. } => "started",
            AdmitOutcome::Steered { .. } => "steered",
            AdmitOutcome::Busy { .. } => "busy",
            AdmitOutcome::KeyConflict => "key_conflict",
            AdmitOutcome::ReceiptLimit { .. } => "receipt_limit",
            AdmitOutcome::Fenced => "fenced",
            AdmitOutcome::Forbidden => "forbidden",
            AdmitOutcome::Queued { .. } => "queued",
            AdmitOutcome::Interrupting { .. } => "interrupting",
            AdmitOutcome::Rejected { .. } => "rejected",
            AdmitOutcome::QueueFull { .. } => "queue_full",
        }
    }
}

/// Read a stored receipt's answer (`admit_receipts.answer_json`): every SQL backend's one decoding of
/// it (the memory backend keeps answers typed). A row that does not decode is logged as a warning with
/// the key's scope, the run the row names and the [`DecodeProblem`] (`problem`: `invalid_json` or
/// `unsupported_schema`) — never the stored bytes, the key or the decoder's message, which can quote
/// them — and answered as [`crate::Error::Corrupt`] naming only the problem. Admission then fails as
/// storage that could not answer (SPEC §5.1, §2.5: 503, nothing written): a retry of a key that
/// already has a run never starts a second one, and gets the same answer until the receipt's TTL ends.
pub fn decode_receipt_answer(scope: &str, run_id: &str, answer_json: &str) -> Result<AdmitOutcome> {
    serde_json::from_str(answer_json).map_err(|e| {
        let problem = crate::DecodeProblem::of(&e);
        tracing::warn!(
            scope,
            run_id,
            problem = problem.as_str(),
            "a stored admit receipt does not decode"
        );
        crate::Error::corrupt("admit_receipts.answer_json", problem)
    })
}

/// What a promotion writes onto the reserved row.
#[derive(Debug, Clone, PartialEq)]
pub struct Promotion {
    pub system_text: String,
    pub tools: Value,
    /// Merged into the row's state.
    pub state: Map<String, Value>,
    pub lease_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimed {
    /// `attaching` → `live`.
    Promoted,
    /// The owner re-claimed a row already promoted: nothing written.
    AlreadyLive,
}

/// Whether a claim found the row already promoted AND past its seed (a step record after step 0): then
/// the claimant did not promote it — another generation restarted the run meanwhile and ran steps — and
/// a launch must not seed it again (SPEC §1.1: one driver per run). A re-claim after an uncertain answer
/// finds at most its own seed.
pub fn ran_past_its_seed(claimed: Claimed, last_step: Option<&StepRecord>) -> bool {
    claimed == Claimed::AlreadyLive && last_step.is_some_and(|s| s.step > 0)
}

/// A tool call a step is about to dispatch.
/// One step's durable write: its transcript turns from `first_idx`, its events, a state patch (the
/// workspace binding of the step that first needs it), then its record.
#[derive(Debug, Clone, PartialEq)]
pub struct StepWrite {
    pub first_idx: u64,
    pub turns: Vec<Turn>,
    pub record: StepRecord,
    pub events: Vec<Value>,
    /// Merged into the row's `state` (empty: nothing).
    pub state: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InFlight {
    pub call_id: String,
    pub tool: String,
}

/// One `run_steps` row (SPEC §4.3 `step`), written after the step's transcript turns and before its tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepRecord {
    /// 0 for the seed record; ordinary steps from 1.
    pub step: u64,
    /// The registry event seq last published.
    pub seq: u64,
    /// Transcript turn count after this step's turns were written.
    pub turn_index: u64,
    pub in_flight: Vec<InFlight>,
    /// Highest inbox seq folded into the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inbox_consumed_seq: Option<u64>,
    pub remaining_ms: i64,
    pub turn: u64,
    pub iteration: u64,
}

impl StepRecord {
    pub fn cursor(&self) -> decisions::StepCursor {
        decisions::StepCursor {
            step: self.step,
            turn_index: self.turn_index,
        }
    }
}

/// A provider-neutral message: `{role: system|user|assistant|tool_results, parts}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    pub role: String,
    pub parts: Vec<Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct InboxItem {
    pub seq: u64,
    pub message: Value,
}

impl InboxItem {
    /// The strategy the message was admitted with (`steer` when it names none).
    pub fn strategy(&self) -> Strategy {
        self.message
            .get("strategy")
            .and_then(Value::as_str)
            .and_then(Strategy::parse)
            .unwrap_or_default()
    }

    /// Whether the message waits for a run of its own (`enqueue`, `interrupt`) rather than steering
    /// the live run: a run never folds it, whatever its inbox cursor says.
    pub fn queued(&self) -> bool {
        self.strategy().queues()
    }
}

/// The follow-ups a run folds: the steering messages among `items` (queued ones wait for their own run).
pub fn steering(items: Vec<InboxItem>) -> Vec<InboxItem> {
    items.into_iter().filter(|i| !i.queued()).collect()
}

#[derive(Debug, Clone, PartialEq)]
pub struct HeartbeatAnswer {
    pub stop: Option<StopMode>,
    pub phase: Phase,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StopAnswer {
    /// The stop now recorded (the strongest requested so far).
    pub stop: StopMode,
    pub owner_gen: String,
    /// Whether the owner's lease is current, i.e. its next heartbeat will relay the stop.
    pub owner_lease_live: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandoffResult {
    HandedOff,
    NotOwner,
    WrongPhase,
}

/// A row a reclaim took, with everything a resume or a close needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Reclaimed {
    /// The row as it is now: owned by the reclaiming generation, phase per `reclaim_phase`.
    pub row: LiveRow,
    pub prior_phase: Phase,
    pub prior_owner: String,
    pub last_step: Option<StepRecord>,
    /// Inbox items past the last step's `inboxConsumedSeq`.
    pub unread_inbox: Vec<InboxItem>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ReclaimAnswer {
    pub taken: Vec<Reclaimed>,
    /// Rows under another generation's current lease.
    pub live_elsewhere: Vec<LiveRow>,
}

/// What a kill found (SPEC §5.6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillAnswer {
    /// The generation owning the run's live row, if it is live.
    pub live_owner: Option<String>,
    /// Whether that owner's lease is current (its heartbeat will see the kill).
    pub owner_lease_live: bool,
    /// A finished (or provisional) record exists.
    pub had_record: bool,
}

/// How long a keyed receipt answers retries after its run ended, unless configured (`[ledger]
/// receipt_ttl_ms`): one day.
pub const DEFAULT_RECEIPT_TTL_MS: i64 = 86_400_000;

/// Most runs whose leftover rows (transcript, step or inbox rows without a live row, as builds before
/// finish deleted them left behind) one prune removes; the next pass takes the rest.
pub const PRUNE_LEFTOVER_RUNS: usize = 500;

/// Most deletion fences, and most plan requests, one [`RunLedger::prune`] removes; the next pass takes
/// the rest, so one pass stays a short transaction however large a backlog it finds.
pub const PRUNE_BATCH: usize = 1_000;

/// SQL (the same for SQLite and PostgreSQL): the condition, on a `deletion_fences` row aliased `f`, that its
/// run is purged — nothing of it is left in any table that holds a run's rows (the `purged` fact of
/// [`decisions::deletion_fence_prunable`]).
pub(crate) const FENCE_PURGED_SQL: &str =
    "NOT EXISTS (SELECT 1 FROM live_runs x WHERE x.run_id = f.run_id)
    AND NOT EXISTS (SELECT 1 FROM runs x WHERE x.run_id = f.run_id)
    AND NOT EXISTS (SELECT 1 FROM run_events x WHERE x.run_id = f.run_id)
    AND NOT EXISTS (SELECT 1 FROM transcript x WHERE x.run_id = f.run_id)
    AND NOT EXISTS (SELECT 1 FROM run_steps x WHERE x.run_id = f.run_id)
    AND NOT EXISTS (SELECT 1 FROM run_inbox x WHERE x.run_id = f.run_id)";

/// What one [`RunLedger::prune`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// Receipts whose run ended at least `receipt_ttl_ms` ago.
    pub receipts: u64,
    /// Generations not kept, owning no rows, started more than a day ago.
    pub generations: u64,
    /// Runs without a live row whose transcript, step or inbox rows were still there.
    pub leftover_runs: u64,
    /// Deletion fences of purged runs killed at least `receipt_ttl_ms` ago
    /// ([`decisions::deletion_fence_prunable`]).
    pub deletion_fences: u64,
    /// Plan requests in a terminal state settled at least `receipt_ttl_ms` ago
    /// ([`crate::plan::decisions::request_prunable`]). `plans` rows are never pruned (see there).
    pub plan_requests: u64,
}

impl PruneReport {
    pub fn is_empty(&self) -> bool {
        *self == PruneReport::default()
    }
}

/// Row counts of the storage tables (SPEC §4.1): what bounded growth is checked against. A full count
/// — for tests, forensics and an occasional gauge, not a hot path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableRows {
    /// Finished (and provisional) records.
    pub runs: u64,
    /// Events of records and of live runs.
    pub run_events: u64,
    pub live_runs: u64,
    pub run_steps: u64,
    /// Transcript parts.
    pub transcript: u64,
    pub run_inbox: u64,
    pub admit_receipts: u64,
    pub deletion_fences: u64,
    pub generations: u64,
}

/// A process that ran against this database (`generations` table), for fast reclaim (SPEC §6.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenerationInfo {
    pub gen: String,
    /// The machine's hostname, where `pid` and `proc_start` mean something.
    pub host: String,
    /// The process's host identity (`[server] host_id`, default the hostname): fast reclaim of a dead
    /// generation applies only to generations of the reclaiming process's own host_id; generations of
    /// other hosts wait for the lease (SPEC §1.3).
    pub host_id: String,
    pub pid: u32,
    /// The process start time as the OS reports it (e.g. `/proc/<pid>/stat` field 22), to tell a
    /// reused pid apart.
    pub proc_start: String,
    pub started_at: i64,
}

/// [`RunLedger::write_step`] as its four methods, one after another (the trait's default).
pub fn write_step_by_methods<L: RunLedger + ?Sized>(
    l: &mut L,
    run_id: &RunId,
    gen: &str,
    write: &StepWrite,
) -> Result<Outcome<()>> {
    if let Err(refusal) = l.write_transcript(run_id, gen, write.first_idx, &write.turns)? {
        return Ok(Err(refusal));
    }
    if !write.events.is_empty() {
        if let Err(refusal) = l.append(run_id, gen, &write.events)? {
            return Ok(Err(refusal));
        }
    }
    if !write.state.is_empty() {
        if let Err(refusal) = l.set_state(run_id, gen, &write.state)? {
            return Ok(Err(refusal));
        }
    }
    l.step(run_id, gen, &write.record)
}

/// The live-run ledger (SPEC §4.3). Each method is one transaction.
pub trait RunLedger: Send {
    fn record_generation(&mut self, info: &GenerationInfo) -> Result<()>;
    fn generations(&mut self) -> Result<Vec<GenerationInfo>>;

    /// Admission: receipt lookup, steer into the thread's live run, or reserve an `attaching` row.
    fn admit(&mut self, admit: &Admit, now_ms: i64) -> Result<AdmitOutcome>;
    /// Promotion of this generation's `attaching` reservation to `live`.
    fn claim(
        &mut self,
        run_id: &RunId,
        gen: &str,
        promotion: &Promotion,
        now_ms: i64,
    ) -> Result<Outcome<Claimed>>;
    /// [`RunLedger::claim`] of the row this very transaction's [`RunLedger::admit`] just reserved (it
    /// answered `Started` for it, so the row is this generation's, `attaching`, with no state and no
    /// deletion fence). The default claims as ever; a backend whose reads cost a round trip promotes
    /// without reading the row back.
    fn claim_admitted(
        &mut self,
        run_id: &RunId,
        gen: &str,
        promotion: &Promotion,
        now_ms: i64,
    ) -> Result<Outcome<Claimed>> {
        self.claim(run_id, gen, promotion, now_ms)
    }
    /// Append events keyed by their `seq` (an identical retry is a no-op).
    fn append(&mut self, run_id: &RunId, gen: &str, events: &[Value]) -> Result<Outcome<()>>;
    fn step(&mut self, run_id: &RunId, gen: &str, record: &StepRecord) -> Result<Outcome<()>>;
    /// Write turns at `first_idx, first_idx + 1, …`; a row already written stays as it was (never edited).
    fn write_transcript(
        &mut self,
        run_id: &RunId,
        gen: &str,
        first_idx: u64,
        turns: &[Turn],
    ) -> Result<Outcome<()>>;
    fn read_transcript(&mut self, run_id: &RunId) -> Result<Transcript>;
    /// A durable step's writes (SPEC §5.2 step 6), in this order: its turns, its events, its state
    /// patch, its step record; the first refusal answers, and what was written before it stays (the
    /// caller's atomic unit decides). The default is those four methods one after another; a backend
    /// may send them in fewer statements, with the same outcome.
    fn write_step(&mut self, run_id: &RunId, gen: &str, write: &StepWrite) -> Result<Outcome<()>> {
        write_step_by_methods(self, run_id, gen, write)
    }
    /// Merge `patch` into the row's state by top-level key.
    fn set_state(
        &mut self,
        run_id: &RunId,
        gen: &str,
        patch: &Map<String, Value>,
    ) -> Result<Outcome<()>>;
    /// Extend the owner's lease to `now + lease_ms`; answers the stop any generation requested and the phase.
    fn heartbeat(
        &mut self,
        run_id: &RunId,
        gen: &str,
        lease_ms: i64,
        now_ms: i64,
    ) -> Result<Outcome<HeartbeatAnswer>>;
    /// Record a stop from any generation (not fenced); hard never downgrades.
    fn request_stop(
        &mut self,
        run_id: &RunId,
        mode: StopMode,
        now_ms: i64,
    ) -> Result<Outcome<StopAnswer>>;
    fn handoff(&mut self, gen: &str, run_ids: &[RunId]) -> Result<Vec<(RunId, HandoffResult)>>;
    /// The owner's phase change with `patch` merged into the state, in one transaction ([`change_phase`]):
    /// parking a run on approvals and resuming it (SPEC §13).
    fn set_phase(
        &mut self,
        run_id: &RunId,
        gen: &str,
        change: decisions::PhaseChange,
        patch: &Map<String, Value>,
    ) -> Result<Outcome<Phase>>;
    /// Record a person's decision on a call awaiting approval ([`decide`]); not fenced: any process may
    /// take it, and the owner applies it.
    fn decide(
        &mut self,
        run_id: &RunId,
        call_id: &str,
        decided: &Decided,
        now_ms: i64,
    ) -> Result<Outcome<DecideAnswer>>;
    /// The gate before the reply: commit `state.finalStatus` and the answer, phase → `finishing`.
    fn finishing(
        &mut self,
        run_id: &RunId,
        gen: &str,
        status: RunStatus,
        answer: Option<&str>,
    ) -> Result<Outcome<()>>;
    /// A seal's reads, before it writes anything (SPEC §5.2 steps 3 and 8): the checks of
    /// [`RunLedger::finishing`] for `record`'s run — the owner, a fence, the phase, a recorded stop —
    /// writing nothing (the seal's finish deletes the row in the same transaction, so what `finishing`
    /// would write there is never read), and when they pass, what its successor's admission decides on,
    /// as [`RunLedger::successor_facts`] reads it (before the seal writes its last step, which the caller
    /// then lays over them: [`SuccessorFacts::stepped`]). `proposal` is what the seal's finish of
    /// `record` proposes: a backend may read what that finish's put decides on in the same round trip.
    fn seal_gate(
        &mut self,
        gen: &str,
        status: RunStatus,
        record: &RunRecord,
        proposal: Option<&PolicyProposal>,
        now_ms: i64,
    ) -> Result<Outcome<SuccessorFacts>>;
    /// ONE transaction: upsert the record as `put` does and delete the run's live rows, step records,
    /// transcript and every inbox row (a caller that hands unread follow-ups to a successor reads them
    /// first, in the same transaction — see `StorageHandle::finish`); the run's receipts are stamped
    /// with its end, from which [`RunLedger::prune`] counts their TTL.
    fn finish(
        &mut self,
        run_id: &RunId,
        gen: &str,
        record: &RunRecord,
        proposal: Option<&PolicyProposal>,
        now_ms: i64,
    ) -> Result<Outcome<PutOutcome>>;
    /// The owner drops its row without a record, and with it the run's step records, transcript and
    /// inbox (nothing will ever read them).
    fn abandon(&mut self, run_id: &RunId, gen: &str) -> Result<Outcome<()>>;
    fn push_inbox(&mut self, run_id: &RunId, message: &Value) -> Result<Outcome<u64>>;
    fn read_inbox(
        &mut self,
        run_id: &RunId,
        after_seq: Option<u64>,
    ) -> Result<Outcome<Vec<InboxItem>>>;
    /// Inbox rows past `after_seq`, without the live-row check of `read_inbox`: how a finishing run hands
    /// its unread follow-ups to the next run without a window to lose one — read inside the finish's
    /// transaction, just before `finish` deletes them.
    fn inbox_after(&mut self, run_id: &RunId, after_seq: Option<u64>) -> Result<Vec<InboxItem>>;
    /// The run's highest step record (re-adopting a run this generation owns).
    fn last_step(&mut self, run_id: &RunId) -> Result<Option<StepRecord>>;
    /// What a finish's successor admission decides on (SPEC §5.2 step 8), inside the finish's
    /// transaction: the live row (`None`: not live), its highest step record and its whole inbox. The
    /// default is `get_live`, `last_step` and `inbox_after` one after another; a backend may read them
    /// in one statement.
    fn successor_facts(&mut self, run_id: &RunId) -> Result<Option<SuccessorFacts>> {
        let Some(row) = self.get_live(run_id)? else {
            return Ok(None);
        };
        Ok(Some(SuccessorFacts {
            last_step: self.last_step(run_id)?,
            inbox: self.inbox_after(run_id, None)?,
            row,
        }))
    }
    /// Take the rows [`decisions::reclaim_selection`] selects for `gen`; `driven` are the runs `gen`
    /// still drives (an actor, or a pending close), which it never takes back while it does.
    fn reclaim(
        &mut self,
        gen: &str,
        now_ms: i64,
        lease_ms: i64,
        dead_gens: &[String],
        driven: &[RunId],
    ) -> Result<ReclaimAnswer>;
    fn list_live(&mut self) -> Result<Vec<LiveRow>>;
    fn get_live(&mut self, run_id: &RunId) -> Result<Option<LiveRow>>;
    /// Kill (SPEC §5.6): write the deletion fence and `stop = hard` in one transaction. From then on a put,
    /// claim, admit or finish for the id is refused, and the owner's heartbeat answers `Fenced` — for as
    /// long as the fence stands (see [`RunLedger::purge`]: a prune takes it only once the run is purged).
    fn kill(&mut self, run_id: &RunId, now_ms: i64) -> Result<KillAnswer>;
    /// Once a killed run has settled: delete its live rows, transcript, inbox, record and events (its
    /// receipts stay until [`RunLedger::prune`] takes them; the deletion fence stays until a prune
    /// `receipt_ttl_ms` after the kill, [`decisions::deletion_fence_prunable`]). A no-op (`false`) for a
    /// run without a deletion fence.
    fn purge(&mut self, run_id: &RunId) -> Result<bool>;
    fn is_killed(&mut self, run_id: &RunId) -> Result<bool>;
    /// Live events strictly after `after_seq`, in seq order; `None` when the run has no live row.
    fn live_events(
        &mut self,
        run_id: &RunId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Option<Vec<Value>>>;
    /// Which of `run_ids` carry a deletion fence (SPEC §5.6): each fenced id once, sorted; an empty
    /// answer for an empty question. One bounded, indexed read however many ids are asked (chunked), so a
    /// reader can drop killed runs from a whole listing at once.
    fn killed_among(&mut self, run_ids: &[RunId]) -> Result<Vec<RunId>>;
    /// ONE transaction that keeps the ledger's tables bounded (SPEC §4.3 finish; run by the reclaim
    /// sweep once per pass):
    /// - a receipt of a run with no live row that carries no end yet is stamped `now_ms` (a run that
    ///   ended by abandon or purge, or before this build stamped ends);
    /// - receipts whose run ended at least `receipt_ttl_ms` ago go ([`decisions::receipt_expired`]);
    /// - generations that are not in `keep_gens` (the caller's own and every one it has not found
    ///   dead), own no live row and no pending plan request, and started more than a day ago go
    ///   ([`decisions::generation_prunable`]);
    /// - transcript, step and inbox rows of runs without a live row go, at most
    ///   [`PRUNE_LEFTOVER_RUNS`] runs per call;
    /// - deletion fences of purged runs (nothing of the run left) killed at least `receipt_ttl_ms` ago go
    ///   ([`decisions::deletion_fence_prunable`]), at most [`PRUNE_BATCH`] per call;
    /// - plan requests in a terminal state (consumed, failed, cancelled, invalidated) settled at least
    ///   `receipt_ttl_ms` ago go ([`crate::plan::decisions::request_prunable`]), at most [`PRUNE_BATCH`]
    ///   per call; pending and ready ones, and every `plans` row, stay.
    fn prune(
        &mut self,
        now_ms: i64,
        receipt_ttl_ms: i64,
        keep_gens: &[String],
    ) -> Result<PruneReport>;
    /// Row counts of every table (see [`TableRows`]).
    fn table_rows(&mut self) -> Result<TableRows>;
}

/// The state `finishing` commits: the final status and, when there is one, the answer.
pub fn finishing_patch(status: RunStatus, answer: Option<&str>) -> Map<String, Value> {
    let mut patch = Map::new();
    patch.insert(
        state_keys::FINAL_STATUS.to_owned(),
        Value::from(status.as_str()),
    );
    if let Some(answer) = answer {
        patch.insert(state_keys::ANSWER.to_owned(), Value::from(answer));
    }
    patch
}

/// Merge a state patch by top-level key.
pub fn merge_state(state: &mut Map<String, Value>, patch: &Map<String, Value>) {
    for (k, v) in patch {
        state.insert(k.clone(), v.clone());
    }
}
