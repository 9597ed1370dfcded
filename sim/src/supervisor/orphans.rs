//! Orphans, simulated: rows of this generation that no actor drives (SPEC §6.1). A row idle for two
//! sweeps becomes an orphan; each sweep re-adopts it as a reclaim would plan it (resume, restart, or
//! close), and after [`MAX_READOPT_FAILURES`] failed attempts closes it `interrupted`
//! (`actors/src/supervisor/recovery.rs`: `attend`, `plan_readoption`).

use std::collections::BTreeSet;

use actors::run::Launch;
use serde_json::Value;
use storage::ledger::{LiveRow, Phase, RunLedger};
use storage::record::RunStatus;

use super::history::{close_row, launch_successor};
use super::{plan_row, purge_killed, Fate, MAX_READOPT_FAILURES};
use crate::run;
use crate::world::{Io, Kind, World};

/// Make orphans of this generation's rows that had no actor two sweeps running, and re-adopt (or, after
/// too many failures, close) every orphan (`Supervisor::attend`).
pub(super) fn attend(w: &mut World, slot: usize, mine: &[String]) {
    let p = &w.procs[slot];
    if p.draining {
        return;
    }
    let registry: BTreeSet<String> = p.registry.unfinished();
    let idle: BTreeSet<String> = mine
        .iter()
        .chain(&registry)
        .filter(|id| {
            !p.runs.contains_key(*id) && !p.handed.contains(*id) && !p.orphans.contains_key(*id)
        })
        .cloned()
        .collect();
    let seen_twice: Vec<String> = idle.intersection(&p.unattended).cloned().collect();
    for id in seen_twice {
        if mine.contains(&id) {
            w.note(|| format!("  {id}: a row of this generation has no actor"));
            w.procs[slot].orphans.insert(id, 0);
        } else {
            w.procs[slot].registry.discard(&id);
        }
    }
    w.procs[slot].unattended = idle;
    if w.cfg.bugs.no_readopt {
        return;
    }
    let orphans: Vec<(String, u32)> = w.procs[slot]
        .orphans
        .iter()
        .map(|(id, n)| (id.clone(), *n))
        .collect();
    for (id, failures) in orphans {
        if w.procs[slot].runs.contains_key(&id) {
            w.procs[slot].orphans.remove(&id);
        } else if failures >= MAX_READOPT_FAILURES {
            let delay = w.io_latency();
            w.spawn_in(slot, delay, Kind::CloseOrphan { run: id });
        } else {
            let delay = w.io_latency();
            w.spawn_in(slot, delay, Kind::Readopt { run: id });
        }
    }
}

#[allow(clippy::large_enum_variant)] // one per re-adoption, moved once
enum Readoption {
    Launch(Launch),
    Gone,
    Closed(Option<(LiveRow, Vec<Value>)>),
}

/// Plan the re-adoption of this generation's own row, as a reclaim would plan it (`plan_readoption`).
fn plan_readoption(
    w: &mut World,
    slot: usize,
    id: &str,
    undelivered: bool,
) -> Result<Readoption, String> {
    let gen = w.procs[slot].gen.clone();
    let Some(row) = w
        .io(slot, Io::Read, |s, _| s.get_live(id))
        .map_err(|e| e.to_string())?
    else {
        return Ok(Readoption::Gone);
    };
    if row.owner_gen != gen || row.phase == Phase::Handoff {
        return Ok(Readoption::Gone);
    }
    if w.io(slot, Io::Read, |s, _| s.is_killed(id))
        .map_err(|e| e.to_string())?
    {
        purge_killed(w, slot, id);
        return Ok(Readoption::Closed(None));
    }
    let last_step = w
        .io(slot, Io::Read, |s, _| s.last_step(id))
        .map_err(|e| e.to_string())?;
    // Its actor lost storage at the gate: the reply never went out, and continues from the saved answer.
    if undelivered && row.phase == Phase::Finishing {
        let events = w
            .io(slot, Io::Read, |s, _| s.live_events(id, 0, usize::MAX >> 1))
            .map_err(|e| e.to_string())?
            .unwrap_or_default();
        let step = last_step.map_or(0, |l| l.step);
        return Ok(Readoption::Launch(Launch::Deliver { row, events, step }));
    }
    // Planned exactly as a reclaim plans a taken row: a row past its finishing gate closes with its final
    // status and is never resumed.
    let phase = row.phase;
    Ok(match plan_row(w, slot, row, phase, last_step, gen)? {
        Fate::Launch(launch) => Readoption::Launch(launch),
        Fate::Closed(successor) => Readoption::Closed(successor),
    })
}

pub(super) fn readopt(w: &mut World, slot: usize, id: String) {
    let undelivered = w.procs[slot].undelivered.remove(&id);
    match plan_readoption(w, slot, &id, undelivered) {
        Ok(Readoption::Launch(launch)) => {
            w.procs[slot].orphans.remove(&id);
            if w.procs[slot].runs.contains_key(&id) {
                return; // an actor came back meanwhile
            }
            w.note(|| format!("  {id}: re-adopted"));
            run::start(w, slot, launch);
        }
        Ok(Readoption::Gone) => {
            let p = &mut w.procs[slot];
            p.orphans.remove(&id);
            if !p.runs.contains_key(&id) {
                p.registry.discard(&id);
            }
        }
        Ok(Readoption::Closed(successor)) => {
            w.procs[slot].orphans.remove(&id);
            launch_successor(w, slot, successor);
        }
        Err(_) => {
            if undelivered {
                w.procs[slot].undelivered.insert(id.clone());
            }
            *w.procs[slot].orphans.entry(id).or_default() += 1
        }
    }
}

pub(super) fn close_orphan(w: &mut World, slot: usize, id: String) {
    let gen = w.procs[slot].gen.clone();
    let closed = (|| -> Result<Readoption, String> {
        let Some(row) = w
            .io(slot, Io::Read, |s, _| s.get_live(&id))
            .map_err(|e| e.to_string())?
        else {
            return Ok(Readoption::Gone);
        };
        if row.owner_gen != gen {
            return Ok(Readoption::Gone);
        }
        // A killed run is purged, never closed (its finish would be refused every sweep).
        if w.io(slot, Io::Read, |s, _| s.is_killed(&id))
            .map_err(|e| e.to_string())?
        {
            purge_killed(w, slot, &id);
            return Ok(Readoption::Closed(None));
        }
        let events = w
            .io(slot, Io::Read, |s, _| {
                s.live_events(&id, 0, usize::MAX >> 1)
            })
            .map_err(|e| e.to_string())?
            .unwrap_or_default();
        w.model.tainted.insert(id.clone());
        let why = format!("could not be re-adopted in {MAX_READOPT_FAILURES} sweeps");
        Ok(Readoption::Closed(close_row(
            w,
            slot,
            &row,
            events,
            RunStatus::Interrupted,
            &why,
            true,
        )?))
    })();
    match closed {
        Ok(Readoption::Closed(successor)) => {
            w.procs[slot].orphans.remove(&id);
            launch_successor(w, slot, successor);
        }
        Ok(_) => {
            w.procs[slot].orphans.remove(&id);
            w.procs[slot].registry.discard(&id);
        }
        Err(_) => {}
    }
}
