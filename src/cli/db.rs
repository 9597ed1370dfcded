//! `runs list|get|events --db PATH`: store-only reads of a stopped server's SQLite database, through the
//! storage crate's read-only open (never created, never migrated: an older schema is read as is, a newer
//! one refused by name).
//!
//! Invariants: it never writes (only the store's readers are called), and it refuses with exit 2 what
//! needs a live server — stop, kill, retry, `--follow`, `--status active` — before opening anything. It
//! sees no live state: a provisional record renders as unfinished, never as `interrupted`.

use std::path::Path;

use actors::runs_service::{EventPage, NextBefore, RunList, RunView};
use anyhow::Context;
use storage::record::VisibilityFilter;
use storage::store::{Cursor, ListQuery, LIST_DEFAULT_LIMIT};
use storage::{Clock, RunId, RunStore, SqliteStore};

use super::print::{events_out, list_table, pretty, run_text, with_outcome};
use super::{fail, Exit, ListArgs, RunsArgs, RunsCommand, StatusArg};

pub(super) fn from_db(db: &Path, args: &RunsArgs) -> anyhow::Result<String> {
    match &args.command {
        RunsCommand::Stop(_) | RunsCommand::Kill(_) | RunsCommand::Retry(_) => return fail(
            Exit::Usage,
            "--db reads a stopped server's history; stop, kill and retry need a running server (--url)",
        ),
        RunsCommand::Events(a) if a.follow => {
            return fail(
                Exit::Usage,
                "--db reads a stopped server's history; --follow needs a running server (--url)",
            )
        }
        RunsCommand::List(a) if a.status == StatusArg::Active => return fail(
            Exit::Usage,
            "--db reads finished-run history only: --status active needs a running server (--url)",
        ),
        _ => {}
    }
    // Read-only through the storage crate: never created, never migrated, an older schema read as is,
    // a newer one refused by name (SPEC §1.2, §8.2).
    let mut store = SqliteStore::open_read_only(db)
        .with_context(|| format!("open database {} read-only", db.display()))?;
    let now = storage::SystemClock.now_ms();
    match &args.command {
        RunsCommand::List(a) => {
            let list = db_list(&mut store, a, now)?;
            if args.json {
                return Ok(pretty(&serde_json::to_value(&list)?));
            }
            Ok(list_table(&list, now))
        }
        RunsCommand::Get(a) => {
            let Some(record) = RunStore::get(&mut store, &a.id, now).context("read the run")?
            else {
                return fail(Exit::NotFound, format!("run {} not found", a.id));
            };
            let usage = record
                .head
                .extra
                .get("usage")
                .filter(|u| u.as_object().is_some_and(|m| !m.is_empty()))
                .cloned();
            let view = RunView {
                events: Some(record.events),
                ..RunView::from_head(&record.head)
            };
            let mut v = serde_json::to_value(&view)?;
            // The record's own per-model sum (SPEC §2 `usage`), which the view does not carry.
            if let (Some(u), Some(obj)) = (usage, v.as_object_mut()) {
                obj.insert("usage".into(), u);
            }
            with_outcome(&mut v, a.events);
            if args.json {
                return Ok(pretty(&v));
            }
            run_text(&v, now)
        }
        RunsCommand::Events(a) => {
            let mut after = a.after_seq;
            let mut events = Vec::new();
            let mut next;
            loop {
                let want = a
                    .limit
                    .map(|l| {
                        if a.all {
                            l
                        } else {
                            l.saturating_sub(events.len() as u64).max(1)
                        }
                    })
                    .map(|l| l as usize);
                let Some(page) =
                    RunStore::events(&mut store, &a.id, after, want, now).context("read events")?
                else {
                    return fail(Exit::NotFound, format!("run {} not found", a.id));
                };
                let got = page.events.len();
                events.extend(page.events);
                next = page.next_after_seq;
                let more_wanted = a.all || a.limit.is_some_and(|l| (events.len() as u64) < l);
                match next {
                    Some(n) if more_wanted && n > after && got > 0 => after = n,
                    _ => break,
                }
            }
            Ok(events_out(
                EventPage {
                    events,
                    next_after_seq: next,
                },
                args.json,
            ))
        }
        RunsCommand::Stop(_) | RunsCommand::Kill(_) | RunsCommand::Retry(_) => {
            unreachable!("refused above")
        }
    }
}

/// `runs list --db`: one store page; a terminal status is the store's own filter (one indexed query; a
/// tombstone matches none: it is shown as unfinished, not as `interrupted`).
fn db_list(store: &mut SqliteStore, a: &ListArgs, now: i64) -> anyhow::Result<RunList> {
    let limit = a.limit.map_or(LIST_DEFAULT_LIMIT, |l| l as usize);
    let query = ListQuery {
        visible_to: VisibilityFilter::All,
        limit: Some(limit),
        before: a.before.map(|finished_at| Cursor {
            finished_at,
            id: a.before_id.clone().map(RunId::into_string),
        }),
        since_ms: a.since,
        agent: a.agent.clone(),
        channel: a.channel.clone(),
        thread_key: a.thread_key.clone(),
        parent_run_id: a.parent_run_id.clone(),
        search: None,
        status: a
            .status
            .terminal()
            .and_then(storage::record::RunStatus::parse),
    };
    let page = store.list(&query, now).context("list runs")?;
    let runs = page
        .items
        .iter()
        .map(|i| RunView::from_head(&i.head))
        .collect();
    let next_before = page.next_before;
    Ok(RunList {
        runs,
        next_before: next_before.map(|c| NextBefore {
            finished_at: c.finished_at,
            id: c.id,
        }),
        store_unavailable: false,
        ledger_unavailable: false,
    })
}
