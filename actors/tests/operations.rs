//! The operation coordinator at its boundary: conflict rules, atomic acquisition, cross-app order,
//! FIFO and writer fairness, the compatible-queue bypass, deletion, sessions, nesting and `with_lock`.
//!
//! Operations here are controllable: each one runs until the test tells it to finish. Assertions read
//! the coordinator's own snapshot (who holds, who waits), which changes only inside the coordinator
//! actor's handler steps and reflects every message sent before it, so no assertion depends on timing.
//! Tasks are given time to reach a waiting point by yielding (never sleeping) until the snapshot shows
//! them there; the session cap runs on a `ManualClock`. The coordinator is an actix actor, so tests run
//! in an actix `System` (`#[actix_rt::test]`) and it lives on the test's own runtime: paused tokio time
//! only auto-advances when the coordinator has nothing to do either.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actors::operations::{
    AppId, AppSnapshot, Claim, Claims, Operation, OperationCoordinator, OperationError, Resource,
    SessionEnd, SessionPhase, SESSION_CAP_MS,
};
use futures_util::poll;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use storage::ManualClock;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use Resource::*;

const T0: i64 = 1_700_000_000_000;

fn coordinator() -> (OperationCoordinator, ManualClock) {
    let clock = ManualClock::new(T0);
    (OperationCoordinator::new(Arc::new(clock.clone())), clock)
}

fn app(id: &str) -> AppId {
    AppId::new(id)
}

/// What a recording holds (the seed's list): the working tree and the runtime side, reading the ref.
fn recording_claims() -> Claims {
    Claims::new()
        .write(RepositoryWorktree)
        .write(Provider)
        .write(Runtime)
        .write(RuntimeConfig)
        .write(TestFiles)
        .read(RepositoryRef)
}

/// An operation that, once granted, runs until told to finish.
struct Controlled {
    finish: Option<oneshot::Sender<()>>,
    join: JoinHandle<Result<(), OperationError>>,
}

impl Controlled {
    /// Lets it finish and answers how `run` ended.
    async fn finish(mut self) -> Result<(), OperationError> {
        if let Some(tx) = self.finish.take() {
            let _ = tx.send(());
        }
        self.join.await.expect("operation task panicked")
    }
}

fn spawn_run(
    coord: &OperationCoordinator,
    app: &AppId,
    op: Operation,
    claims: impl Into<Claims>,
) -> Controlled {
    let (tx, rx) = oneshot::channel::<()>();
    let (coord, app, claims) = (coord.clone(), app.clone(), claims.into());
    let join = tokio::spawn(async move {
        coord
            .run(&app, op, claims, async move {
                let _ = rx.await;
            })
            .await
    });
    Controlled {
        finish: Some(tx),
        join,
    }
}

fn spawn_many(
    coord: &OperationCoordinator,
    apps: Vec<(AppId, Claims)>,
    op: Operation,
) -> Controlled {
    let (tx, rx) = oneshot::channel::<()>();
    let coord = coord.clone();
    let join = tokio::spawn(async move {
        coord
            .run_many(apps, op, async move {
                let _ = rx.await;
            })
            .await
    });
    Controlled {
        finish: Some(tx),
        join,
    }
}

/// Yields until `check` holds — letting spawned tasks reach their waiting point — without sleeping.
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if check() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("never reached: {what}");
}

/// The coordinator's picture of `app`, taken after every message sent so far.
async fn snapshot(coord: &OperationCoordinator, app: &AppId) -> AppSnapshot {
    coord
        .snapshot(app)
        .await
        .expect("the coordinator is running")
}

async fn holding(coord: &OperationCoordinator, app: &AppId) -> Vec<String> {
    snapshot(coord, app)
        .await
        .holding_names()
        .into_iter()
        .map(str::to_owned)
        .collect()
}

async fn waiting(coord: &OperationCoordinator, app: &AppId) -> Vec<String> {
    snapshot(coord, app)
        .await
        .waiting_names()
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// Yields until `check` holds for `app`'s snapshot, without sleeping.
async fn until_snapshot(
    coord: &OperationCoordinator,
    app: &AppId,
    what: &str,
    check: impl Fn(&AppSnapshot) -> bool,
) {
    for _ in 0..10_000 {
        if check(&snapshot(coord, app).await) {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("never reached: {what}");
}

async fn until_holding(coord: &OperationCoordinator, app: &AppId, name: &str) {
    until_snapshot(coord, app, &format!("{name} holds on {app}"), |s| {
        s.holding_names().contains(&name)
    })
    .await;
}

async fn until_waiting(coord: &OperationCoordinator, app: &AppId, name: &str) {
    until_snapshot(coord, app, &format!("{name} waits on {app}"), |s| {
        s.waiting_names().contains(&name)
    })
    .await;
}

/// Holds `first`, then requests `second`, and checks whether `second` had to wait.
async fn assert_conflict(first: Claim, second: Claim, conflicts: bool) {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let a = spawn_run(&coord, &ws, Operation::new("first"), first);
    until_holding(&coord, &ws, "first").await;
    let b = spawn_run(&coord, &ws, Operation::new("second"), second);
    if conflicts {
        until_waiting(&coord, &ws, "second").await;
        assert_eq!(
            holding(&coord, &ws).await,
            ["first"],
            "{first:?} then {second:?} must conflict"
        );
        a.finish().await.unwrap();
        until_holding(&coord, &ws, "second").await;
    } else {
        until_holding(&coord, &ws, "second").await;
        assert_eq!(
            holding(&coord, &ws).await,
            ["first", "second"],
            "{first:?} and {second:?} must share"
        );
        a.finish().await.unwrap();
    }
    b.finish().await.unwrap();
    assert_eq!(snapshot(&coord, &ws).await.holding, []);
}

// --- Conflict rules -------------------------------------------------------------------------------

#[actix_rt::test]
async fn read_read_is_compatible() {
    for r in Resource::ALL {
        assert_conflict(Claim::read(r), Claim::read(r), false).await;
    }
}

#[actix_rt::test]
async fn read_write_conflicts_in_both_orders() {
    for r in Resource::ALL {
        assert_conflict(Claim::read(r), Claim::write(r), true).await;
        assert_conflict(Claim::write(r), Claim::read(r), true).await;
    }
}

#[actix_rt::test]
async fn write_write_conflicts() {
    for r in Resource::ALL {
        assert_conflict(Claim::write(r), Claim::write(r), true).await;
    }
}

#[actix_rt::test]
async fn repository_umbrella_conflicts_with_each_subresource_in_its_mode() {
    for sub in [RepositoryRef, RepositoryWorktree] {
        // Umbrella held, subresource requested, and the other way round.
        assert_conflict(Claim::write(Repository), Claim::read(sub), true).await;
        assert_conflict(Claim::write(Repository), Claim::write(sub), true).await;
        assert_conflict(Claim::read(Repository), Claim::write(sub), true).await;
        assert_conflict(Claim::read(sub), Claim::write(Repository), true).await;
        assert_conflict(Claim::write(sub), Claim::write(Repository), true).await;
        assert_conflict(Claim::write(sub), Claim::read(Repository), true).await;
        // Reads of the umbrella and a subresource share.
        assert_conflict(Claim::read(Repository), Claim::read(sub), false).await;
        assert_conflict(Claim::read(sub), Claim::read(Repository), false).await;
    }
}

#[actix_rt::test]
async fn repository_ref_and_worktree_are_independent() {
    for (a, b) in [
        (RepositoryRef, RepositoryWorktree),
        (RepositoryWorktree, RepositoryRef),
    ] {
        assert_conflict(Claim::write(a), Claim::write(b), false).await;
        assert_conflict(Claim::write(a), Claim::read(b), false).await;
    }
}

#[actix_rt::test]
async fn unrelated_domains_do_not_wait_for_each_other() {
    assert_conflict(
        Claim::write(ChatContent),
        Claim::write(ChatMembership),
        false,
    )
    .await;
    assert_conflict(Claim::write(Runtime), Claim::write(RuntimeConfig), false).await;
    assert_conflict(Claim::write(Media), Claim::write(Metadata), false).await;
    assert_conflict(Claim::write(AppPath), Claim::write(Provider), false).await;
}

// --- Atomic acquisition ---------------------------------------------------------------------------

#[actix_rt::test]
async fn acquisition_is_atomic_with_no_partial_hold_while_waiting() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let media = spawn_run(
        &coord,
        &ws,
        Operation::new("media owner"),
        Claim::write(Media),
    );
    until_holding(&coord, &ws, "media owner").await;

    // `both` needs metadata (free) and media (held): it waits holding neither.
    let both = spawn_run(
        &coord,
        &ws,
        Operation::new("both"),
        Claims::new().write(Metadata).write(Media),
    );
    until_waiting(&coord, &ws, "both").await;
    assert_eq!(holding(&coord, &ws).await, ["media owner"]);

    // Cancelling it while it waits leaves nothing behind: a metadata writer goes straight in.
    both.join.abort();
    until_snapshot(&coord, &ws, "cancelled waiter leaves the queue", |s| {
        s.waiting_names().is_empty()
    })
    .await;
    let meta = spawn_run(
        &coord,
        &ws,
        Operation::new("metadata"),
        Claim::write(Metadata),
    );
    until_holding(&coord, &ws, "metadata").await;
    meta.finish().await.unwrap();

    // Once media is free, a waiter gets both claims in one step.
    let both = spawn_run(
        &coord,
        &ws,
        Operation::new("both"),
        Claims::new().write(Metadata).write(Media),
    );
    until_waiting(&coord, &ws, "both").await;
    media.finish().await.unwrap();
    until_holding(&coord, &ws, "both").await;
    let snap = snapshot(&coord, &ws).await;
    assert_eq!(
        snap.holding[0].claims,
        Claims::new().write(Metadata).write(Media)
    );
    both.finish().await.unwrap();
}

#[actix_rt::test]
async fn claims_declared_in_opposite_orders_on_one_app_do_not_deadlock() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let blocker = spawn_run(
        &coord,
        &ws,
        Operation::new("blocker"),
        Claims::new().write(Metadata).write(Media),
    );
    until_holding(&coord, &ws, "blocker").await;
    let x = spawn_run(
        &coord,
        &ws,
        Operation::new("x"),
        [Claim::write(Metadata), Claim::write(Media)],
    );
    let y = spawn_run(
        &coord,
        &ws,
        Operation::new("y"),
        [Claim::write(Media), Claim::write(Metadata)],
    );
    until_snapshot(&coord, &ws, "both wait", |s| {
        s.waiting_names() == ["x", "y"]
    })
    .await;
    blocker.finish().await.unwrap();
    until_holding(&coord, &ws, "x").await;
    assert_eq!(waiting(&coord, &ws).await, ["y"]);
    x.finish().await.unwrap();
    until_holding(&coord, &ws, "y").await;
    y.finish().await.unwrap();
}

// --- Cross-app operations -------------------------------------------------------------------------

#[actix_rt::test]
async fn cross_app_operations_dedupe_apps_and_take_them_in_ascending_bytewise_order() {
    let (coord, _) = coordinator();
    // Bytewise, "10" < "9": the coordinator's order, not numeric order, and not the declared order.
    let (ten, nine) = (app("10"), app("9"));
    let holder = spawn_run(
        &coord,
        &ten,
        Operation::new("holder"),
        Claim::write(Metadata),
    );
    until_holding(&coord, &ten, "holder").await;

    let mv = spawn_many(
        &coord,
        vec![
            (nine.clone(), Claims::new().write(Media)),
            (ten.clone(), Claims::new().write(Metadata)),
            (nine.clone(), Claims::new().read(Metadata)),
        ],
        Operation::new("move"),
    );
    until_waiting(&coord, &ten, "move").await;
    // It waits on "10" first and has taken nothing on "9" meanwhile.
    assert_eq!(snapshot(&coord, &nine).await.holding, []);
    assert_eq!(snapshot(&coord, &nine).await.waiting, []);

    holder.finish().await.unwrap();
    until_holding(&coord, &nine, "move").await;
    // "9" named twice: one entry with the merged claims.
    let snap = snapshot(&coord, &nine).await;
    assert_eq!(snap.holding.len(), 1);
    assert_eq!(
        snap.holding[0].claims,
        Claims::new().write(Media).read(Metadata)
    );
    assert_eq!(holding(&coord, &ten).await, ["move"]);
    mv.finish().await.unwrap();
}

/// Tracks what each running operation holds and fails on any overlap the coordinator should prevent.
#[derive(Clone, Default)]
struct ExclusionCheck(Arc<Mutex<Vec<(usize, AppId, Claim)>>>);

impl ExclusionCheck {
    fn enter(&self, op: usize, claims: &[(AppId, Claims)]) {
        let mut held = self.0.lock().unwrap();
        for (app, set) in claims {
            for claim in set.iter() {
                if let Some((other, _, theirs)) = held
                    .iter()
                    .find(|(_, a, theirs)| a == app && theirs.conflicts_with(&claim))
                {
                    panic!(
                        "op {op} entered {app} with {claim:?} while op {other} holds {theirs:?}"
                    );
                }
            }
        }
        held.extend(
            claims
                .iter()
                .flat_map(|(app, set)| set.iter().map(move |c| (op, app.clone(), c))),
        );
    }

    fn leave(&self, op: usize) {
        self.0.lock().unwrap().retain(|(o, _, _)| *o != op);
    }
}

#[actix_rt::test]
async fn cross_app_operations_in_opposite_orders_never_deadlock_over_1000_interleavings() {
    // Time is paused and nothing here sleeps: the runtime advances the clock only when every task (the
    // coordinator's included) is blocked, so the timeout below fires at once on a deadlock and never
    // otherwise.
    tokio::time::pause();
    let pool = [
        Metadata,
        Media,
        Repository,
        RepositoryRef,
        RepositoryWorktree,
    ];
    let apps = [app("ws-a"), app("ws-b"), app("ws-c")];
    for seed in 0..1000u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let (coord, _) = coordinator();
        let check = ExclusionCheck::default();
        let mut tasks = Vec::new();
        for op in 0..4usize {
            // Op 0 declares a→b, op 1 declares b→a; the others take random apps in random order.
            let order: Vec<AppId> = match op {
                0 => vec![apps[0].clone(), apps[1].clone()],
                1 => vec![apps[1].clone(), apps[0].clone()],
                _ => {
                    let mut v: Vec<AppId> = apps
                        .iter()
                        .filter(|_| rng.random_bool(0.6))
                        .cloned()
                        .collect();
                    if v.is_empty() {
                        v.push(apps[rng.random_range(0..apps.len())].clone());
                    }
                    for i in (1..v.len()).rev() {
                        v.swap(i, rng.random_range(0..=i));
                    }
                    v
                }
            };
            let request: Vec<(AppId, Claims)> = order
                .into_iter()
                .map(|a| {
                    let claims: Claims = (0..rng.random_range(1..=2))
                        .map(|_| {
                            let r = pool[rng.random_range(0..pool.len())];
                            if rng.random_bool(0.5) {
                                Claim::write(r)
                            } else {
                                Claim::read(r)
                            }
                        })
                        .collect();
                    (a, claims)
                })
                .collect();
            let (before, inside) = (rng.random_range(0..6), rng.random_range(0..6));
            let (coord, check) = (coord.clone(), check.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..before {
                    tokio::task::yield_now().await;
                }
                let mut merged: Vec<(AppId, Claims)> = Vec::new();
                for (a, c) in &request {
                    match merged.iter_mut().find(|(m, _)| m == a) {
                        Some((_, set)) => set.merge(c),
                        None => merged.push((a.clone(), c.clone())),
                    }
                }
                coord
                    .run_many(request, Operation::new(format!("op{op}")), async {
                        check.enter(op, &merged);
                        for _ in 0..inside {
                            tokio::task::yield_now().await;
                        }
                        check.leave(op);
                    })
                    .await
            }));
        }
        let all = futures_util::future::join_all(tasks);
        let results = tokio::time::timeout(Duration::from_secs(3600), all)
            .await
            .unwrap_or_else(|_| panic!("deadlock with seed {seed}"));
        for r in results {
            r.expect("task panicked").expect("operation refused");
        }
        for a in &apps {
            assert_eq!(
                snapshot(&coord, a).await.holding,
                [],
                "seed {seed}: {a} still held"
            );
        }
    }
}

#[actix_rt::test]
async fn a_cross_app_operation_is_refused_at_a_later_app_closed_meanwhile_and_releases_the_earlier()
{
    let (coord, _) = coordinator();
    let (a, b) = (app("ws-a"), app("ws-b"));
    let holder = spawn_run(&coord, &a, Operation::new("holder"), Claim::write(Media));
    until_holding(&coord, &a, "holder").await;
    let mv = spawn_many(
        &coord,
        vec![
            (a.clone(), Claims::new().write(Media)),
            (b.clone(), Claims::new().write(Media)),
        ],
        Operation::new("move"),
    );
    until_waiting(&coord, &a, "move").await;
    let fence = coord.close_admission(&b).await.unwrap();
    holder.finish().await.unwrap();
    assert_eq!(
        mv.finish().await,
        Err(OperationError::AdmissionClosed {
            app: b.clone(),
            operation: "move".into()
        })
    );
    assert_eq!(snapshot(&coord, &a).await.holding, []);
    drop(fence);
}

// --- FIFO and writer fairness ---------------------------------------------------------------------

#[actix_rt::test]
async fn conflicting_writers_are_granted_in_arrival_order() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let first = spawn_run(&coord, &ws, Operation::new("w0"), Claim::write(Metadata));
    until_holding(&coord, &ws, "w0").await;
    let mut queued = Vec::new();
    for i in 1..=3 {
        let name = format!("w{i}");
        queued.push(spawn_run(
            &coord,
            &ws,
            Operation::new(name.clone()),
            Claim::write(Metadata),
        ));
        until_waiting(&coord, &ws, &name).await;
    }
    assert_eq!(waiting(&coord, &ws).await, ["w1", "w2", "w3"]);
    first.finish().await.unwrap();
    for (i, w) in queued.into_iter().enumerate() {
        let name = format!("w{}", i + 1);
        until_holding(&coord, &ws, &name).await;
        assert_eq!(holding(&coord, &ws).await, [name.as_str()]);
        w.finish().await.unwrap();
    }
}

#[actix_rt::test]
async fn waiters_on_other_arbiters_are_granted_in_arrival_order() {
    // The handle is used from five other arbiters (threads); mailbox order is arrival order.
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let holder = coord
        .acquire(&ws, Operation::new("holder"), Claim::write(Metadata))
        .await
        .unwrap();
    let order: Arc<Mutex<Vec<usize>>> = Arc::default();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut arbiters = Vec::new();
    for i in 0..5 {
        let arbiter = actix::Arbiter::new();
        let (handle, ws2, order, done_tx) =
            (coord.clone(), ws.clone(), order.clone(), done_tx.clone());
        arbiter.spawn(async move {
            let op = Operation::new(format!("w{i}"));
            let out = handle
                .run(&ws2, op, Claim::write(Metadata), async {
                    order.lock().unwrap().push(i)
                })
                .await;
            let _ = done_tx.send(out);
        });
        // The next waiter starts only once this one is queued. Another thread is involved, so this
        // waits on the wall clock (bounded), not by yielding.
        let name = format!("w{i}");
        tokio::time::timeout(Duration::from_secs(10), async {
            while !waiting(&coord, &ws).await.contains(&name) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{name} never queued"));
        arbiters.push(arbiter);
    }
    assert_eq!(waiting(&coord, &ws).await, ["w0", "w1", "w2", "w3", "w4"]);
    drop(holder);
    for _ in 0..5 {
        done_rx
            .recv()
            .await
            .expect("every waiter answers")
            .expect("granted, not refused");
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4]);
    for arbiter in arbiters {
        arbiter.stop();
    }
}

#[actix_rt::test]
async fn a_reader_does_not_pass_a_waiting_writer() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let r1 = spawn_run(&coord, &ws, Operation::new("r1"), Claim::read(Metadata));
    until_holding(&coord, &ws, "r1").await;
    let w = spawn_run(&coord, &ws, Operation::new("w"), Claim::write(Metadata));
    until_waiting(&coord, &ws, "w").await;
    // Compatible with the holder, but a writer waits ahead of it.
    let r2 = spawn_run(&coord, &ws, Operation::new("r2"), Claim::read(Metadata));
    let r3 = spawn_run(&coord, &ws, Operation::new("r3"), Claim::read(Metadata));
    until_snapshot(&coord, &ws, "readers wait behind the writer", |s| {
        s.waiting_names() == ["w", "r2", "r3"]
    })
    .await;
    assert_eq!(holding(&coord, &ws).await, ["r1"]);
    r1.finish().await.unwrap();
    until_holding(&coord, &ws, "w").await;
    assert_eq!(waiting(&coord, &ws).await, ["r2", "r3"]);
    w.finish().await.unwrap();
    // Readers queued behind the writer go in together.
    until_snapshot(&coord, &ws, "both readers hold", |s| {
        s.holding_names() == ["r2", "r3"]
    })
    .await;
    r2.finish().await.unwrap();
    r3.finish().await.unwrap();
}

#[actix_rt::test]
async fn a_cancelled_or_panicking_operation_releases_its_place() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let holder = spawn_run(
        &coord,
        &ws,
        Operation::new("holder"),
        Claim::write(Metadata),
    );
    until_holding(&coord, &ws, "holder").await;
    let cancelled = spawn_run(
        &coord,
        &ws,
        Operation::new("cancelled"),
        Claim::write(Metadata),
    );
    let later = spawn_run(&coord, &ws, Operation::new("later"), Claim::write(Metadata));
    until_snapshot(&coord, &ws, "both wait", |s| {
        s.waiting_names() == ["cancelled", "later"]
    })
    .await;
    cancelled.join.abort();
    until_snapshot(&coord, &ws, "the cancelled waiter left", |s| {
        s.waiting_names() == ["later"]
    })
    .await;
    holder.finish().await.unwrap();
    until_holding(&coord, &ws, "later").await;
    later.finish().await.unwrap();

    // An operation whose work panics releases its claims while unwinding.
    let c = coord.clone();
    let ws2 = ws.clone();
    let panicked = tokio::spawn(async move {
        c.run(
            &ws2,
            Operation::new("panics"),
            Claim::write(Metadata),
            async { panic!("work failed") },
        )
        .await
    });
    assert!(panicked.await.unwrap_err().is_panic());
    assert_eq!(snapshot(&coord, &ws).await.holding, []);
    let after = spawn_run(&coord, &ws, Operation::new("after"), Claim::write(Metadata));
    until_holding(&coord, &ws, "after").await;
    after.finish().await.unwrap();
}

#[actix_rt::test]
async fn a_dropped_guard_releases_and_the_next_waiter_is_granted_in_the_same_step() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let guard = coord
        .acquire(&ws, Operation::new("holder"), Claim::write(Metadata))
        .await
        .unwrap();
    let next = spawn_run(&coord, &ws, Operation::new("next"), Claim::write(Metadata));
    until_waiting(&coord, &ws, "next").await;
    // The guard's Drop sends `Release`; the snapshot asked right after it already shows the grant:
    // there is no step in which the claims are free and "next" still waits.
    drop(guard);
    assert_eq!(holding(&coord, &ws).await, ["next"]);
    assert_eq!(waiting(&coord, &ws).await, Vec::<String>::new());
    next.finish().await.unwrap();
}

#[actix_rt::test]
async fn a_cancelled_waiters_place_and_grant_are_released() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let holder = coord
        .acquire(&ws, Operation::new("holder"), Claim::write(Metadata))
        .await
        .unwrap();

    // Dropped while it waits: polled once (its `Acquire` is queued), then dropped; it leaves the queue.
    let mut pending =
        Box::pin(coord.acquire(&ws, Operation::new("cancelled"), Claim::write(Metadata)));
    assert!(poll!(&mut pending).is_pending());
    assert_eq!(waiting(&coord, &ws).await, ["cancelled"]);
    drop(pending);
    assert_eq!(waiting(&coord, &ws).await, Vec::<String>::new());

    // Dropped as its grant is decided: the holder's `Release` reaches the actor while the waiter's
    // receiver is already gone. The grant is released at once and passes to the next waiter.
    let mut pending = Box::pin(coord.acquire(
        &ws,
        Operation::new("cancelled late"),
        Claim::write(Metadata),
    ));
    assert!(poll!(&mut pending).is_pending());
    let later = spawn_run(&coord, &ws, Operation::new("later"), Claim::write(Metadata));
    until_snapshot(&coord, &ws, "both wait", |s| {
        s.waiting_names() == ["cancelled late", "later"]
    })
    .await;
    drop(holder);
    drop(pending);
    assert_eq!(holding(&coord, &ws).await, ["later"]);
    later.finish().await.unwrap();
    // Nothing is left behind: the resource is grantable to anyone.
    coord
        .run(
            &ws,
            Operation::new("after"),
            Claim::write(Metadata),
            async {},
        )
        .await
        .unwrap();
    let snap = snapshot(&coord, &ws).await;
    assert_eq!((snap.holding, snap.waiting), (vec![], vec![]));
}

// --- The compatible-queue bypass ------------------------------------------------------------------

/// A live recording session on `ws`, opted in to the bypass unless told otherwise.
async fn recording(
    coord: &OperationCoordinator,
    ws: &AppId,
    opt_in: bool,
) -> actors::operations::Session {
    let mut op = Operation::new("recording");
    if opt_in {
        op = op.allow_compatible_queue_bypass();
    }
    coord
        .reserve_session(ws, op, recording_claims())
        .await
        .unwrap()
        .start()
        .await
        .unwrap()
}

#[actix_rt::test]
async fn a_ref_snapshot_passes_a_writer_queued_behind_an_opted_in_session() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let session = recording(&coord, &ws, true).await;
    let commit = spawn_run(
        &coord,
        &ws,
        Operation::new("commit"),
        Claim::write(Repository),
    );
    until_waiting(&coord, &ws, "commit").await;
    // New Chat: a ref-only snapshot plus chat membership. It conflicts with the queued commit only on
    // repository-ref, which the session owns; it is compatible with the session.
    let new_chat = spawn_run(
        &coord,
        &ws,
        Operation::new("new chat"),
        Claims::new().read(RepositoryRef).write(ChatMembership),
    );
    until_holding(&coord, &ws, "new chat").await;
    assert_eq!(waiting(&coord, &ws).await, ["commit"]);
    new_chat.finish().await.unwrap();
    session.end();
    until_holding(&coord, &ws, "commit").await;
    commit.finish().await.unwrap();
}

#[actix_rt::test]
async fn no_bypass_when_the_blocker_did_not_opt_in() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let session = recording(&coord, &ws, false).await;
    let commit = spawn_run(
        &coord,
        &ws,
        Operation::new("commit"),
        Claim::write(Repository),
    );
    until_waiting(&coord, &ws, "commit").await;
    let snapshot = spawn_run(
        &coord,
        &ws,
        Operation::new("snapshot"),
        Claim::read(RepositoryRef),
    );
    until_waiting(&coord, &ws, "snapshot").await;
    assert_eq!(waiting(&coord, &ws).await, ["commit", "snapshot"]);
    session.end();
    until_holding(&coord, &ws, "commit").await;
    commit.finish().await.unwrap();
    until_holding(&coord, &ws, "snapshot").await;
    snapshot.finish().await.unwrap();
}

#[actix_rt::test]
async fn no_bypass_unless_every_direct_blocker_opts_in() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    // Two holders block the commit: an opted-in test run on the worktree and a plain ref reader.
    let test_run = spawn_run(
        &coord,
        &ws,
        Operation::new("test run").allow_compatible_queue_bypass(),
        Claims::new().write(RepositoryWorktree).read(RepositoryRef),
    );
    let reader = spawn_run(
        &coord,
        &ws,
        Operation::new("reader"),
        Claim::read(RepositoryRef),
    );
    until_snapshot(&coord, &ws, "both hold", |s| {
        s.holding_names() == ["test run", "reader"]
    })
    .await;
    let commit = spawn_run(
        &coord,
        &ws,
        Operation::new("commit"),
        Claim::write(Repository),
    );
    until_waiting(&coord, &ws, "commit").await;
    let snapshot = spawn_run(
        &coord,
        &ws,
        Operation::new("snapshot"),
        Claim::read(RepositoryRef),
    );
    until_waiting(&coord, &ws, "snapshot").await;
    assert_eq!(holding(&coord, &ws).await, ["test run", "reader"]);

    // Once the plain reader is gone, the only direct blocker opted in: the snapshot may pass.
    reader.finish().await.unwrap();
    until_holding(&coord, &ws, "snapshot").await;
    assert_eq!(waiting(&coord, &ws).await, ["commit"]);
    snapshot.finish().await.unwrap();
    test_run.finish().await.unwrap();
    until_holding(&coord, &ws, "commit").await;
    commit.finish().await.unwrap();
}

#[actix_rt::test]
async fn no_bypass_for_work_incompatible_with_the_blocker() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let session = recording(&coord, &ws, true).await;
    let commit = spawn_run(
        &coord,
        &ws,
        Operation::new("commit"),
        Claim::write(Repository),
    );
    until_waiting(&coord, &ws, "commit").await;
    // A ref writer conflicts with the session's ref read: it cannot pass the commit.
    let retag = spawn_run(
        &coord,
        &ws,
        Operation::new("retag"),
        Claim::write(RepositoryRef),
    );
    until_waiting(&coord, &ws, "retag").await;
    assert_eq!(waiting(&coord, &ws).await, ["commit", "retag"]);
    session.end();
    until_holding(&coord, &ws, "commit").await;
    assert_eq!(waiting(&coord, &ws).await, ["retag"]);
    commit.finish().await.unwrap();
    until_holding(&coord, &ws, "retag").await;
    retag.finish().await.unwrap();
}

#[actix_rt::test]
async fn no_bypass_that_would_reorder_an_unrelated_domain() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let session = recording(&coord, &ws, true).await;
    // The queued writer also deletes chat content, which the session does not own.
    let restore = spawn_run(
        &coord,
        &ws,
        Operation::new("restore"),
        Claims::new().write(Repository).write(ChatContent),
    );
    until_waiting(&coord, &ws, "restore").await;
    // Passing it would reorder chat-content work: refused, it waits in FIFO order.
    let edit = spawn_run(
        &coord,
        &ws,
        Operation::new("edit chat"),
        Claims::new().read(RepositoryRef).write(ChatContent),
    );
    until_waiting(&coord, &ws, "edit chat").await;
    // The same snapshot without the chat-content claim passes.
    let snapshot = spawn_run(
        &coord,
        &ws,
        Operation::new("snapshot"),
        Claim::read(RepositoryRef),
    );
    until_holding(&coord, &ws, "snapshot").await;
    assert_eq!(waiting(&coord, &ws).await, ["restore", "edit chat"]);
    snapshot.finish().await.unwrap();
    session.end();
    until_holding(&coord, &ws, "restore").await;
    assert_eq!(waiting(&coord, &ws).await, ["edit chat"]);
    restore.finish().await.unwrap();
    until_holding(&coord, &ws, "edit chat").await;
    edit.finish().await.unwrap();
}

#[actix_rt::test]
async fn normal_fairness_resumes_when_the_owner_releases() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let session = recording(&coord, &ws, true).await;
    let commit = spawn_run(
        &coord,
        &ws,
        Operation::new("commit"),
        Claim::write(Repository),
    );
    until_waiting(&coord, &ws, "commit").await;
    let s1 = spawn_run(
        &coord,
        &ws,
        Operation::new("s1"),
        Claim::read(RepositoryRef),
    );
    until_holding(&coord, &ws, "s1").await;

    // The owner releases while s1 (which passed) still holds: the commit is now blocked only by s1,
    // which did not opt in, so a new snapshot queues behind the commit again.
    session.end();
    let s2 = spawn_run(
        &coord,
        &ws,
        Operation::new("s2"),
        Claim::read(RepositoryRef),
    );
    until_waiting(&coord, &ws, "s2").await;
    assert_eq!(waiting(&coord, &ws).await, ["commit", "s2"]);
    s1.finish().await.unwrap();
    until_holding(&coord, &ws, "commit").await;
    assert_eq!(waiting(&coord, &ws).await, ["s2"]);
    commit.finish().await.unwrap();
    until_holding(&coord, &ws, "s2").await;
    s2.finish().await.unwrap();
}

// --- Deletion -------------------------------------------------------------------------------------

#[actix_rt::test]
async fn closed_admission_refuses_new_work() {
    let (coord, _) = coordinator();
    let (ws, other) = (app("ws-1"), app("ws-2"));
    let fence = coord.close_admission(&ws).await.unwrap();
    assert!(!snapshot(&coord, &ws).await.admission_open);

    let refused = coord
        .run(
            &ws,
            Operation::new("append_file"),
            Claim::write(RepositoryWorktree),
            async {},
        )
        .await;
    assert_eq!(
        refused,
        Err(OperationError::AdmissionClosed {
            app: ws.clone(),
            operation: "append_file".into()
        })
    );
    // A cross-app operation naming it is refused too, holding nothing on the open app.
    let refused = coord
        .run_many(
            [
                (other.clone(), Claims::new().write(Media)),
                (ws.clone(), Claims::new().write(Media)),
            ],
            Operation::new("move media"),
            async {},
        )
        .await;
    assert!(matches!(refused, Err(OperationError::AdmissionClosed { app, .. }) if app == ws));
    assert_eq!(snapshot(&coord, &other).await.holding, []);
    // Sessions cannot start; a second deleter is told one is under way.
    assert!(matches!(
        coord
            .reserve_session(&ws, Operation::new("recording"), recording_claims())
            .await,
        Err(OperationError::AdmissionClosed { .. })
    ));
    assert!(
        matches!(coord.close_admission(&ws).await, Err(OperationError::DeletionInProgress { app }) if app == ws)
    );
    // Other apps are untouched.
    coord
        .run(
            &other,
            Operation::new("append_file"),
            Claim::write(RepositoryWorktree),
            async {},
        )
        .await
        .unwrap();

    // Dropping the fence before draining (deletion abandoned) reopens admission.
    drop(fence);
    assert!(snapshot(&coord, &ws).await.admission_open);
    coord
        .run(
            &ws,
            Operation::new("append_file"),
            Claim::write(RepositoryWorktree),
            async {},
        )
        .await
        .unwrap();
}

#[actix_rt::test]
async fn drain_waits_for_admitted_work_then_hands_over_the_deletion_handle() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let running = spawn_run(
        &coord,
        &ws,
        Operation::new("running"),
        Claim::write(RepositoryWorktree),
    );
    until_holding(&coord, &ws, "running").await;
    let queued = spawn_run(
        &coord,
        &ws,
        Operation::new("queued"),
        Claim::write(RepositoryWorktree),
    );
    until_waiting(&coord, &ws, "queued").await;

    let fence = coord.close_admission(&ws).await.unwrap();
    let mut drain = Box::pin(fence.drain());
    assert!(poll!(&mut drain).is_pending());
    running.finish().await.unwrap();
    // Work admitted before the close still runs.
    until_holding(&coord, &ws, "queued").await;
    assert!(poll!(&mut drain).is_pending());
    queued.finish().await.unwrap();
    let handle = drain.await;
    assert_eq!(handle.app(), &ws);

    // Deletion-only work goes through the handle; ordinary handlers are still refused meanwhile.
    let (tx, rx) = oneshot::channel::<()>();
    let deleting = handle.run(
        Operation::new("remove workspace"),
        Claim::write(AppPath),
        async move {
            let _ = rx.await;
        },
    );
    let mut deleting = Box::pin(deleting);
    assert!(poll!(&mut deleting).is_pending());
    assert_eq!(holding(&coord, &ws).await, ["remove workspace"]);
    let refused = coord
        .run(
            &ws,
            Operation::new("append_file"),
            Claim::write(RepositoryWorktree),
            async {},
        )
        .await;
    assert!(matches!(
        refused,
        Err(OperationError::AdmissionClosed { .. })
    ));
    tx.send(()).unwrap();
    deleting.await.unwrap();

    // Dropping the handle reopens the id (a resumed run may create the workspace again).
    drop(handle);
    assert!(snapshot(&coord, &ws).await.admission_open);
    coord
        .run(
            &ws,
            Operation::new("append_file"),
            Claim::write(RepositoryWorktree),
            async {},
        )
        .await
        .unwrap();
}

#[actix_rt::test]
async fn deletion_ends_the_session_then_drains() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let mut session = recording(&coord, &ws, true).await;
    let fence = coord.close_admission(&ws).await.unwrap();
    let mut drain = Box::pin(fence.drain());
    // A live session is admitted work: drain waits for it...
    assert!(poll!(&mut drain).is_pending());
    // ...until the deleting handler ends it (the seed's endRecordingForApp).
    coord.end_session(&ws);
    let handle = drain.await;
    assert_eq!(session.ended().await, SessionEnd::TornDown);
    assert!(!session.is_live().await);
    handle
        .run(
            Operation::new("remove workspace"),
            Claim::write(AppPath),
            async {},
        )
        .await
        .unwrap();
}

// --- Sessions -------------------------------------------------------------------------------------

#[actix_rt::test]
async fn refuse_when_session_refuses_conflicting_work_without_queueing_it() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let session = recording(&coord, &ws, true).await;
    let refused = coord
        .run(
            &ws,
            Operation::new("restore").refuse_when_session("restore to message"),
            Claim::write(Repository),
            async {},
        )
        .await;
    assert_eq!(
        refused,
        Err(OperationError::RefusedBySession {
            app: ws.clone(),
            action: "restore to message".into(),
            session: "recording".into(),
        })
    );
    assert_eq!(waiting(&coord, &ws).await, Vec::<String>::new());
    // Work that does not conflict with the session is not refused.
    coord
        .run(
            &ws,
            Operation::new("rename chat").refuse_when_session("rename chat"),
            Claim::write(ChatContent),
            async {},
        )
        .await
        .unwrap();
    // Without the flag, conflicting work queues behind the session (no timeout).
    let queued = spawn_run(
        &coord,
        &ws,
        Operation::new("commit"),
        Claim::write(Repository),
    );
    until_waiting(&coord, &ws, "commit").await;
    session.end();
    until_holding(&coord, &ws, "commit").await;
    queued.finish().await.unwrap();
}

#[actix_rt::test]
async fn refusal_is_applied_per_app_by_that_apps_claims() {
    // Moving media claims media on both apps and repository only on the target.
    let (coord, _) = coordinator();
    let (source, target) = (app("ws-source"), app("ws-target"));
    let move_media = |coord: OperationCoordinator, source: AppId, target: AppId| async move {
        coord
            .run_many(
                [
                    (source, Claims::new().write(Media)),
                    (target, Claims::new().write(Media).write(Repository)),
                ],
                Operation::new("move media").refuse_when_session("move media"),
                async {},
            )
            .await
    };
    // A recording on the source does not stop the media moving out.
    let session = recording(&coord, &source, true).await;
    move_media(coord.clone(), source.clone(), target.clone())
        .await
        .unwrap();
    session.end();
    // A recording on the target refuses it, and nothing stays held on the source.
    let session = recording(&coord, &target, true).await;
    let refused = move_media(coord.clone(), source.clone(), target.clone()).await;
    assert!(matches!(refused, Err(OperationError::RefusedBySession { app, .. }) if app == target));
    assert_eq!(snapshot(&coord, &source).await.holding, []);
    session.end();
}

#[actix_rt::test]
async fn a_reserved_session_already_refuses_so_there_is_no_window() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    // The session reserves before its first await; the request arrives during its setup.
    let reservation = coord
        .reserve_session(&ws, Operation::new("recording"), recording_claims())
        .await
        .unwrap();
    let refused = coord
        .run(
            &ws,
            Operation::new("restore").refuse_when_session("restore"),
            Claim::write(Repository),
            async {},
        )
        .await;
    assert!(matches!(
        refused,
        Err(OperationError::RefusedBySession { .. })
    ));
    // The other order: the request is admitted first, so the session queues behind it, not the reverse.
    drop(reservation);
    let request = spawn_run(
        &coord,
        &ws,
        Operation::new("restore").refuse_when_session("restore"),
        Claim::write(Repository),
    );
    until_holding(&coord, &ws, "restore").await;
    let reservation = coord
        .reserve_session(&ws, Operation::new("recording"), recording_claims())
        .await
        .unwrap();
    let c = coord.clone();
    let start = tokio::spawn(reservation.start());
    until_waiting(&c, &ws, "recording").await;
    assert_eq!(
        snapshot(&coord, &ws).await.session.unwrap().phase,
        SessionPhase::Acquiring
    );
    request.finish().await.unwrap();
    let session = start.await.unwrap().unwrap();
    assert!(session.is_live().await);
}

#[test]
fn a_session_starting_concurrently_with_a_refused_request_leaves_no_window() {
    // Both race on two worker threads, while the coordinator actor runs on the system's own thread.
    let two_workers = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    };
    let system =
        actix_rt::System::with_tokio_rt(|| two_workers().expect("build a two-worker runtime"));
    system.block_on(session_and_request_race());
}

async fn session_and_request_race() {
    // Either the request is refused, or it is admitted first and runs before the session holds
    // anything; it never queues behind the session. The session stays live until the request is done,
    // so a request arriving "after" the session cannot slip in either.
    let (mut refused, mut ran_first) = (0, 0);
    let mut rng = StdRng::seed_from_u64(8);
    for _ in 0..300 {
        let (session_yields, request_yields) = (rng.random_range(0..4), rng.random_range(0..4));
        let (coord, _) = coordinator();
        let ws = app("ws-1");
        let log: Arc<Mutex<Vec<&'static str>>> = Arc::default();
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let (done_tx, mut done_rx) = oneshot::channel::<()>();
        let session_task = {
            let (coord, ws, log, barrier) =
                (coord.clone(), ws.clone(), log.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                for _ in 0..session_yields {
                    tokio::task::yield_now().await;
                }
                let reservation = coord
                    .reserve_session(&ws, Operation::new("recording"), recording_claims())
                    .await
                    .unwrap();
                let session = reservation.start().await.unwrap();
                log.lock().unwrap().push("session live");
                // Hold until the request is done; seeing it queued behind us is the window.
                let queued_behind = loop {
                    if done_rx.try_recv().is_ok() {
                        break false;
                    }
                    if snapshot(&coord, &ws)
                        .await
                        .waiting_names()
                        .contains(&"restore")
                    {
                        break true;
                    }
                    tokio::task::yield_now().await;
                };
                session.end();
                queued_behind
            })
        };
        let request_task = {
            let (coord, ws, log, barrier) =
                (coord.clone(), ws.clone(), log.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                for _ in 0..request_yields {
                    tokio::task::yield_now().await;
                }
                let op = Operation::new("restore").refuse_when_session("restore");
                let out = coord
                    .run(&ws, op, Claim::write(Repository), async {
                        log.lock().unwrap().push("request ran")
                    })
                    .await;
                let _ = done_tx.send(());
                out
            })
        };
        let outcome = request_task.await.unwrap();
        assert!(
            !session_task.await.unwrap(),
            "the request queued behind the session"
        );
        let log = log.lock().unwrap().clone();
        match outcome {
            Ok(()) => {
                assert_eq!(log, ["request ran", "session live"]);
                ran_first += 1;
            }
            Err(OperationError::RefusedBySession { .. }) => {
                assert_eq!(log, ["session live"]);
                refused += 1;
            }
            Err(e) => panic!("unexpected refusal: {e}"),
        }
    }
    assert_eq!(refused + ran_first, 300);
    // Both orders happened (the yields are seeded; the threads still race, so only loosely).
    eprintln!("refused {refused}, ran first {ran_first}");
}

#[actix_rt::test]
async fn block_session_start_refuses_starts_until_every_token_drops() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let first = coord.block_session_start(&ws, "restoring to a message");
    let second = coord.block_session_start(&ws, "copying the app");
    assert_eq!(
        snapshot(&coord, &ws).await.session_start_blocks,
        ["restoring to a message", "copying the app"]
    );
    assert_eq!(
        coord
            .reserve_session(&ws, Operation::new("recording"), recording_claims())
            .await
            .unwrap_err(),
        OperationError::SessionStartBlocked {
            app: ws.clone(),
            reason: "restoring to a message".into()
        }
    );
    drop(first);
    assert!(matches!(
        coord.reserve_session(&ws, Operation::new("recording"), recording_claims()).await,
        Err(OperationError::SessionStartBlocked { reason, .. }) if reason == "copying the app"
    ));
    // With the token held, a preflight refusal is race-free.
    coord
        .refuse_if_session(&ws, &Claims::new().write(Repository), "restore")
        .await
        .unwrap();
    drop(second);
    let session = coord
        .reserve_session(&ws, Operation::new("recording"), recording_claims())
        .await
        .unwrap()
        .start()
        .await
        .unwrap();
    // A block taken while a session runs does not end it.
    let block = coord.block_session_start(&ws, "late");
    assert!(session.is_live().await);
    assert!(matches!(
        coord
            .refuse_if_session(&ws, &Claims::new().write(Repository), "restore")
            .await,
        Err(OperationError::RefusedBySession { .. })
    ));
    drop(block);
}

#[actix_rt::test]
async fn a_second_session_on_an_app_is_refused() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let _reservation = coord
        .reserve_session(&ws, Operation::new("recording"), recording_claims())
        .await
        .unwrap();
    assert_eq!(
        coord
            .reserve_session(&ws, Operation::new("test run"), Claim::write(TestFiles))
            .await
            .unwrap_err(),
        OperationError::SessionActive {
            app: ws.clone(),
            session: "recording".into()
        }
    );
    // Another app is independent.
    let _other = coord
        .reserve_session(
            &app("ws-2"),
            Operation::new("test run"),
            Claim::write(TestFiles),
        )
        .await
        .unwrap();
}

#[actix_rt::test]
async fn teardown_during_setup_tombstones_the_start() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let reservation = coord
        .reserve_session(&ws, Operation::new("recording"), recording_claims())
        .await
        .unwrap();
    reservation.check().await.unwrap();
    // Setup awaits (swap .env.local, restart the dev server)...
    tokio::task::yield_now().await;
    // ...and a concurrent stop tears the app down in between.
    coord.end_session(&ws);
    let cancelled = OperationError::SessionCancelled {
        app: ws.clone(),
        session: "recording".into(),
    };
    assert_eq!(reservation.check().await, Err(cancelled.clone()));
    assert_eq!(reservation.start().await.unwrap_err(), cancelled);
    let snap = snapshot(&coord, &ws).await;
    assert_eq!(
        (snap.session, snap.holding, snap.waiting),
        (None, vec![], vec![])
    );
}

#[actix_rt::test]
async fn teardown_while_the_start_is_queued_cancels_it() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let holder = spawn_run(
        &coord,
        &ws,
        Operation::new("holder"),
        Claim::write(RepositoryWorktree),
    );
    until_holding(&coord, &ws, "holder").await;
    let reservation = coord
        .reserve_session(&ws, Operation::new("recording"), recording_claims())
        .await
        .unwrap();
    let start = tokio::spawn(reservation.start());
    until_waiting(&coord, &ws, "recording").await;
    coord.end_session(&ws);
    assert!(matches!(
        start.await.unwrap(),
        Err(OperationError::SessionCancelled { .. })
    ));
    assert_eq!(waiting(&coord, &ws).await, Vec::<String>::new());
    holder.finish().await.unwrap();
}

#[actix_rt::test]
async fn a_cancelled_attempt_cannot_release_its_successors_reservation() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let first = coord
        .reserve_session(&ws, Operation::new("first"), recording_claims())
        .await
        .unwrap();
    coord.end_session(&ws);
    // The successor reserves while the cancelled attempt is still unwinding.
    let second = coord
        .reserve_session(&ws, Operation::new("second"), recording_claims())
        .await
        .unwrap();
    assert!(first.check().await.is_err());
    // The cancelled attempt releases (drop, as its handler gives up): the successor keeps its slot.
    drop(first);
    second.check().await.unwrap();
    assert_eq!(
        coord
            .reserve_session(&ws, Operation::new("third"), recording_claims())
            .await
            .unwrap_err(),
        OperationError::SessionActive {
            app: ws.clone(),
            session: "second".into()
        }
    );
    let second = second.start().await.unwrap();

    // The same at the live stage: a torn-down session's handle cannot end its successor.
    coord.end_session(&ws);
    let stale = second;
    let successor = recording(&coord, &ws, true).await;
    drop(stale);
    assert!(successor.is_live().await);
    assert_eq!(holding(&coord, &ws).await, ["recording"]);
}

#[actix_rt::test]
async fn a_session_is_capped_30_minutes_after_its_claims_were_granted() {
    let (coord, clock) = coordinator();
    let ws = app("ws-1");
    // The start waits 10 minutes behind another operation: the cap counts from the grant.
    let holder = spawn_run(
        &coord,
        &ws,
        Operation::new("holder"),
        Claim::write(RepositoryWorktree),
    );
    until_holding(&coord, &ws, "holder").await;
    let reservation = coord
        .reserve_session(&ws, Operation::new("recording"), recording_claims())
        .await
        .unwrap();
    let start = tokio::spawn(reservation.start());
    until_waiting(&coord, &ws, "recording").await;
    clock.advance(10 * 60 * 1000);
    holder.finish().await.unwrap();
    let mut session = start.await.unwrap().unwrap();
    let granted_at = T0 + 10 * 60 * 1000;
    assert_eq!(session.deadline_ms(), granted_at + SESSION_CAP_MS);
    assert_eq!(SESSION_CAP_MS, 30 * 60 * 1000);

    let commit = spawn_run(
        &coord,
        &ws,
        Operation::new("commit"),
        Claim::write(Repository),
    );
    until_waiting(&coord, &ws, "commit").await;
    clock.set(granted_at + SESSION_CAP_MS - 1);
    coord.expire_sessions();
    assert!(session.is_live().await);
    assert_eq!(waiting(&coord, &ws).await, ["commit"]);

    clock.set(granted_at + SESSION_CAP_MS);
    coord.expire_sessions();
    assert_eq!(session.ended().await, SessionEnd::Capped);
    assert!(!session.is_live().await);
    until_holding(&coord, &ws, "commit").await;
    // Ending it afterwards is a no-op.
    session.end();
    assert_eq!(holding(&coord, &ws).await, ["commit"]);
    commit.finish().await.unwrap();
}

#[actix_rt::test]
async fn the_cap_is_enforced_by_any_coordinator_call() {
    let (coord, clock) = coordinator();
    let ws = app("ws-1");
    let mut session = recording(&coord, &ws, true).await;
    clock.advance(SESSION_CAP_MS);
    // No explicit sweep: the next request sees the session gone and is not refused.
    coord
        .run(
            &ws,
            Operation::new("restore").refuse_when_session("restore"),
            Claim::write(Repository),
            async {},
        )
        .await
        .unwrap();
    assert_eq!(session.ended().await, SessionEnd::Capped);
}

#[actix_rt::test]
async fn the_session_reaper_ends_capped_sessions_without_other_traffic() {
    // Tokio time is paused: the reaper's interval fires only when every task is blocked, so nothing
    // really waits. The cap itself is read from the manual clock.
    tokio::time::pause();
    let (coord, clock) = coordinator();
    let ws = app("ws-1");
    let mut session = recording(&coord, &ws, true).await;
    let reaper = coord.spawn_session_reaper(Duration::from_secs(1));
    clock.advance(SESSION_CAP_MS);
    assert_eq!(session.ended().await, SessionEnd::Capped);
    assert_eq!(snapshot(&coord, &ws).await.session, None);
    // The reaper holds only a weak reference: it stops once the coordinator is gone.
    drop(session);
    drop(coord);
    reaper.await.unwrap();
}

#[actix_rt::test]
async fn ending_a_session_releases_its_claims() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let session = recording(&coord, &ws, true).await;
    assert_eq!(
        snapshot(&coord, &ws).await.session.unwrap().phase,
        SessionPhase::Live
    );
    let queued = spawn_run(
        &coord,
        &ws,
        Operation::new("stop runtime"),
        Claim::write(Runtime),
    );
    until_waiting(&coord, &ws, "stop runtime").await;
    let mut watcher = session;
    let ended = {
        let coord = coord.clone();
        let ws = ws.clone();
        tokio::spawn(async move {
            let why = watcher.ended().await;
            drop(watcher);
            (why, snapshot(&coord, &ws).await.session)
        })
    };
    // The owner is told how it ended when a teardown (Stop) ends it.
    coord.end_session(&ws);
    let (why, slot) = ended.await.unwrap();
    assert_eq!((why, slot), (SessionEnd::TornDown, None));
    until_holding(&coord, &ws, "stop runtime").await;
    queued.finish().await.unwrap();
    // Ending it again finds no session.
    coord.end_session(&ws);
    assert_eq!(snapshot(&coord, &ws).await.session, None);
}

// --- Nesting --------------------------------------------------------------------------------------

#[actix_rt::test]
async fn a_nested_operation_on_the_same_app_is_refused_by_name() {
    let (coord, _) = coordinator();
    let ws = app("ws-1");
    let inner = coord
        .run(
            &ws,
            Operation::new("copy app"),
            Claim::read(AppPath),
            async {
                coord
                    .run(
                        &ws,
                        Operation::new("update metadata"),
                        Claim::write(Metadata),
                        async {},
                    )
                    .await
            },
        )
        .await
        .unwrap();
    let err = inner.unwrap_err();
    assert_eq!(
        err,
        OperationError::NestedOperation {
            app: ws.clone(),
            outer: "copy app".into(),
            inner: "update metadata".into()
        }
    );
    let message = err.to_string();
    assert!(
        message.contains("copy app") && message.contains("update metadata"),
        "{message}"
    );

    // The same through a guard's scope, through run_many, and from inside a session's work.
    let guard = coord
        .acquire(&ws, Operation::new("outer"), Claim::read(Media))
        .await
        .unwrap();
    let nested = guard
        .scope(coord.run_many(
            [(app("ws-0"), Claims::new()), (ws.clone(), Claims::new())],
            Operation::new("many"),
            async {},
        ))
        .await;
    assert!(
        matches!(nested, Err(OperationError::NestedOperation { outer, .. }) if outer == "outer")
    );
    drop(guard);
    let session = recording(&coord, &ws, true).await;
    let nested = session
        .scope(coord.run(
            &ws,
            Operation::new("restart"),
            Claim::write(Runtime),
            async {},
        ))
        .await;
    assert!(
        matches!(nested, Err(OperationError::NestedOperation { outer, .. }) if outer == "recording")
    );
}

#[actix_rt::test]
async fn nested_operations_may_only_take_greater_apps() {
    let (coord, _) = coordinator();
    let (a, b, c) = (app("ws-a"), app("ws-b"), app("ws-c"));
    let (lower, higher) = coord
        .run(&b, Operation::new("outer"), Claim::write(Media), async {
            let lower = coord
                .run(&a, Operation::new("lower"), Claim::write(Media), async {})
                .await;
            let higher = coord
                .run(&c, Operation::new("higher"), Claim::write(Media), async {})
                .await;
            (lower, higher)
        })
        .await
        .unwrap();
    assert_eq!(
        lower,
        Err(OperationError::AppOrder {
            operation: "lower".into(),
            held: b.clone(),
            requested: a
        })
    );
    higher.unwrap();
}

// --- with_lock ------------------------------------------------------------------------------------

#[actix_rt::test]
async fn with_lock_runs_callers_of_one_key_one_at_a_time_in_arrival_order() {
    let (coord, _) = coordinator();
    let order: Arc<Mutex<Vec<usize>>> = Arc::default();
    let inside: Arc<Mutex<Option<usize>>> = Arc::default();
    let mut finishers = Vec::new();
    let mut joins = Vec::new();
    for i in 0..3 {
        let (tx, rx) = oneshot::channel::<()>();
        finishers.push(tx);
        let arrived = Arc::new(Mutex::new(false));
        let (coord, order, inside, flag) = (
            coord.clone(),
            order.clone(),
            inside.clone(),
            arrived.clone(),
        );
        joins.push(tokio::spawn(async move {
            // Set, then enqueue on the key in the same poll: once the test sees the flag, it waits.
            *flag.lock().unwrap() = true;
            coord
                .with_lock("/srv/workspaces/ws-1/.env.local", async {
                    assert_eq!(
                        inside.lock().unwrap().replace(i),
                        None,
                        "two holders of one key"
                    );
                    order.lock().unwrap().push(i);
                    let _ = rx.await;
                    inside.lock().unwrap().take();
                })
                .await
        }));
        until("caller reached the lock", || *arrived.lock().unwrap()).await;
        tokio::task::yield_now().await;
    }
    // The first caller's grant travels back through the mailbox; the later callers stay queued.
    until("the first caller holds the key", || {
        *order.lock().unwrap() == [0]
    })
    .await;
    assert_eq!(coord.active_lock_keys().await.unwrap(), 1);
    assert_eq!(
        *order.lock().unwrap(),
        [0],
        "later callers wait for the key"
    );
    for (tx, join) in finishers.into_iter().zip(joins) {
        tx.send(()).unwrap();
        join.await.unwrap().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2]);
    assert_eq!(
        coord.active_lock_keys().await.unwrap(),
        0,
        "unused keys are pruned"
    );
}

#[actix_rt::test]
async fn with_lock_keys_are_independent_and_refuse_nesting_on_the_same_key() {
    let (coord, _) = coordinator();
    let out = coord
        .with_lock("token-refresh:openai", async {
            let other = coord.with_lock("/srv/file", async { 7 }).await;
            let same = coord.with_lock("token-refresh:openai", async { 8 }).await;
            (other, same)
        })
        .await
        .unwrap();
    assert_eq!(out.0, Ok(7));
    assert_eq!(
        out.1,
        Err(OperationError::NestedLock {
            key: "token-refresh:openai".into()
        })
    );
    // An app operation inside a lock (and the reverse) is fine: different identities.
    let ws = app("ws-1");
    coord
        .with_lock(
            "/srv/file",
            coord.run(
                &ws,
                Operation::new("append_file"),
                Claim::write(RepositoryWorktree),
                async {},
            ),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(coord.active_lock_keys().await.unwrap(), 0);
}
