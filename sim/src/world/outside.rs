//! What reaches the processes from outside: the clients' messages, a person's decisions on calls awaiting
//! approval, and the faults.

use super::*;
use storage::RunId;

impl World {
    /// A person decides a call awaiting approval, through some running process.
    pub(super) fn decide(&mut self, run_id: RunId, call_id: String) {
        let booted: Vec<Addr<Supervisor>> = self
            .procs
            .iter()
            .filter(|p| p.alive)
            .filter_map(Proc::addr)
            .collect();
        if booted.is_empty() {
            return;
        }
        let supervisor = booted[self.rng.random_range(0..booted.len())].clone();
        let decision = if self.rng.random_bool(0.7) {
            Decision::Approve
        } else {
            Decision::Deny
        };
        self.note(|| format!("decide {run_id}/{call_id}: {}", decision.as_str()));
        tokio::task::spawn_local(async move {
            let _ = supervisor
                .send(DecideApproval {
                    run_id,
                    call_id,
                    decision,
                    who: "sim:person".into(),
                    note: None,
                })
                .await;
        });
    }

    /// A client sends its message to a running process (keyed messages retry with the same key).
    pub(super) fn send(&mut self, c: usize) {
        let now = self.now();
        let targets: Vec<usize> = self
            .procs
            .iter()
            .enumerate()
            .filter(|(_, p)| {
                p.alive && !p.draining.load(Ordering::SeqCst) && p.supervisor.borrow().is_some()
            })
            .map(|(i, _)| i)
            .collect();
        if targets.is_empty() {
            self.clients[c].send_at = now + 200;
            return;
        }
        let i = targets[self.rng.random_range(0..targets.len())];
        let msg = self.clients[c].msg;
        let (thread, text, keyed, attempts, strategy) = {
            let m = &mut self.model.borrow_mut().messages[msg];
            m.in_flight = true;
            m.attempts += 1;
            (
                m.thread.clone(),
                m.text.clone(),
                m.keyed,
                m.attempts,
                m.strategy,
            )
        };
        let inc = self.procs[i].inc;
        self.note(|| format!("client sends {text} on {thread} to incarnation {inc}"));
        let request = Request {
            thread,
            channel: "c".into(),
            user: "u".into(),
            text: text.clone(),
            agent: None,
            visibility: None,
            parent_run_id: None,
            source: if self.chat {
                actors::run::Source::Slack
            } else {
                actors::run::Source::Api
            },
            strategy: Some(strategy),
        };
        let key = keyed.then(|| ReceiptKey {
            scope: "sim".into(),
            key: format!("k{msg}"),
            body_hash: format!("{msg:064x}"),
        });
        let supervisor = self.procs[i].addr().expect("a booted target");
        let model = self.model.clone();
        tokio::task::spawn_local(async move {
            let sent = supervisor.send(AdmitMessage {
                request,
                key,
                writer: None,
            });
            // `None`: refused before anything was written (send again); `Some(None)`: no answer (the
            // admission may or may not have landed).
            let answer = tokio::time::timeout(CLIENT_WAIT, sent).await;
            let said = format!("{answer:?}");
            let told = match answer {
                Ok(Ok(Ok(admitted))) => {
                    let run = match admitted {
                        Admitted::Started { run_id, .. }
                        | Admitted::Steered { run_id, .. }
                        | Admitted::Queued { run_id, .. } => run_id,
                    };
                    Some(Some((Told::Accepted, Some(run))))
                }
                Ok(Ok(Err(AdmitError::Draining | AdmitError::ThreadBusy))) => None,
                Ok(Ok(Err(AdmitError::Unavailable(_)))) | Ok(Err(_)) | Err(_) => Some(None),
                Ok(Ok(Err(e))) => Some(Some((Told::Refused(e.to_string()), None))),
            };
            let mut model = model.borrow_mut();
            let m = &mut model.messages[msg];
            m.in_flight = false;
            m.answers.push(said);
            match told {
                Some(Some((told, run))) => {
                    m.told = told;
                    m.run = run;
                }
                None if attempts < 20 => {}
                // A keyed message is sent again with its key: the receipt answers a landed one.
                Some(None) if keyed && attempts < 6 => {}
                None | Some(None) => m.told = Told::Uncertain,
            }
        });
    }

    /// Land one fault, by the seed.
    pub(super) fn fault(&mut self) {
        let faults: Vec<Fault> = self.cfg.faults.iter().copied().collect();
        let fault = faults[self.rng.random_range(0..faults.len())];
        let alive: Vec<usize> = (0..self.procs.len())
            .filter(|i| self.procs[*i].alive && self.procs[*i].addr().is_some())
            .collect();
        if alive.is_empty() {
            return;
        }
        let i = alive[self.rng.random_range(0..alive.len())];
        let (slot, inc) = (self.procs[i].slot, self.procs[i].inc);
        let now = self.now();
        self.faults_left -= 1;
        *self.faults_landed.entry(fault.as_str()).or_default() += 1;
        self.note(|| {
            format!(
                "FAULT {} at slot {slot} (incarnation {inc})",
                fault.as_str()
            )
        });
        match fault {
            Fault::Crash => self.bury(i, true),
            Fault::Pause => self.procs[i].paused_until = now + self.rng.random_range(500..6_000),
            Fault::ExpireLeases => {
                for p in &mut self.procs {
                    p.paused_until = now + LEASE_MS + 1_500;
                }
            }
            Fault::Outage => self.procs[i].outage_until = now + self.rng.random_range(100..4_000),
            Fault::LostReply => self.procs[i].lose_next_reply = true,
            Fault::Permanent => self.procs[i].fail_next_write = true,
            // One panic is restarted; two in a row take a run past its restart policy (one restart in
            // ten minutes), which closes it `failed`.
            Fault::Panic => self.procs[i].panic_models += self.rng.random_range(1..=2),
            Fault::Drain => {
                let p = &self.procs[i];
                if p.draining.swap(true, Ordering::SeqCst) {
                    return;
                }
                let (supervisor, exited) = (p.addr().expect("booted"), p.exited.clone());
                tokio::task::spawn_local(async move {
                    let _ = supervisor
                        .send(Drain {
                            deadline: Duration::from_secs(20),
                            handoff_budget: Duration::from_secs(2),
                        })
                        .await;
                    *exited.borrow_mut() = true;
                });
            }
            Fault::Stop | Fault::Kill => {
                let runs: Vec<RunId> = self.model.borrow().runs.keys().cloned().collect();
                if runs.is_empty() {
                    return;
                }
                let run_id = runs[self.rng.random_range(0..runs.len())].clone();
                let supervisor = self.procs[i].addr().expect("booted");
                if fault == Fault::Kill {
                    self.model.borrow_mut().killed.insert(run_id.clone());
                    tokio::task::spawn_local(async move {
                        let _ = supervisor.send(KillRun { run_id }).await;
                    });
                } else {
                    let mode = if self.rng.random_bool(0.5) {
                        StopMode::Soft
                    } else {
                        StopMode::Hard
                    };
                    self.model.borrow_mut().stopped.insert(run_id.clone());
                    tokio::task::spawn_local(async move {
                        let _ = supervisor
                            .send(StopRun {
                                run_id,
                                mode,
                                actor: StopActor {
                                    kind: "sim".into(),
                                    id: "operator".into(),
                                },
                            })
                            .await;
                    });
                }
            }
        }
    }
}
