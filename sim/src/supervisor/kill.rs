//! Stop and kill (SPEC §5.6), as the simulated supervisor does them.

use storage::ledger::RunLedger;
use storage::RunStore;

use crate::run::ActorMsg;
use crate::world::{Io, Kind, World};

pub(super) fn stop_run(w: &mut World, slot: usize, run: String, mode: storage::ledger::StopMode) {
    if w.procs[slot]
        .registry
        .row(&run)
        .is_some_and(|r| r.finished_at.is_some())
    {
        return;
    }
    let local = w.procs[slot].runs.get(&run).copied();
    match w.io(slot, Io::Write, |s, now| s.request_stop(&run, mode, now)) {
        Ok(Ok(_)) => {}
        Ok(Err(_)) if local.is_none() => return,
        Ok(Err(_)) => {}
        Err(_) => return, // 503: nothing is aborted
    }
    if let Some(actor) = local {
        w.spawn_in(
            slot,
            0,
            Kind::Msg {
                actor,
                msg: ActorMsg::Stop(mode),
            },
        );
    }
}

pub(super) fn kill_run(w: &mut World, slot: usize, run: String) {
    let local = w.procs[slot].runs.get(&run).copied();
    let gen = w.procs[slot].gen.clone();
    let known = w.procs[slot].registry.row(&run).is_some()
        || matches!(w.io(slot, Io::Read, |s, _| s.get_live(&run)), Ok(Some(_)))
        || matches!(
            w.io(slot, Io::Read, |s, now| s.get_summary(&run, now)),
            Ok(Some(_))
        );
    if !known {
        return;
    }
    let answer = w.io(slot, Io::Write, |s, now| s.kill(&run, now));
    // The model learns of the deletion fence whatever the operator was told.
    if w.peek().is_killed(&run).unwrap_or(false) {
        let thread = w.model.run_threads.get(&run).cloned().unwrap_or_default();
        w.model.killed(&run, &thread);
    }
    let Ok(answer) = answer else { return };
    match (local, answer.live_owner) {
        (Some(actor), _) => w.spawn_in(
            slot,
            0,
            Kind::Msg {
                actor,
                msg: ActorMsg::Killed,
            },
        ),
        (None, Some(owner)) if owner != gen && answer.owner_lease_live => {}
        _ => purge_killed(w, slot, &run),
    }
}

pub(super) fn purge_killed(w: &mut World, slot: usize, run: &str) {
    if let Ok(true) = w.io(slot, Io::Write, |s, _| s.purge(run)) {
        w.procs[slot].registry.discard(run);
        w.model.workspace_deleted(run);
    }
}
