//! Both ends of PostgreSQL's cross-host news (SPEC §1.3): the writers' `pg_notify` inside their
//! transactions, and the one listener connection per process.
//!
//! The listener is a plain thread with its own connection (the storage actor's connection is busy with
//! transactions, and a reader's belongs to the pool). It `LISTEN`s, says [`News::Resync`] (notes before
//! this moment were missed), then hands every parsed note to the [`NewsFeed`]. A lost connection is
//! reconnected with a growing pause (0.1 s doubling to 5 s) and followed by another `Resync`. The
//! thread ends when the feed is gone (every [`crate::StorageHandle`] of it dropped).
//!
//! It also keeps the process's [`Audience`]: every [`AUDIENCE_EVERY`] it looks for another process
//! connected to the database — another listener (named [`LISTENER_NAME`]), or any connection of another
//! Switchboard process (an older build's listener carries its process's name) — and a new listener
//! says hello ([`HELLO`]) when it starts, so the others hear of it at once. While it cannot tell (no
//! connection), the process's commits send their notes.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use postgres::fallible_iterator::FallibleIterator;

use super::Db;
use crate::news::{Audience, News, NewsFeed, CHANNEL};
use crate::Result;

/// How long the listener waits for a note before checking that its feed and connection still live.
const IDLE_CHECK: Duration = Duration::from_secs(1);
/// How often the listener looks for another process on the database (the look is also the round trip
/// that proves an idle connection alive: a silently dead peer shows no error until something is sent).
const AUDIENCE_EVERY: Duration = Duration::from_secs(1);
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);
/// What every listener's connection is named.
pub(crate) const LISTENER_NAME: &str = "switchboard-news";
/// The note a listener sends when it starts listening (no [`News`]: every build ignores what it cannot
/// parse).
const HELLO: &str = "h";

/// Send `news` to every listener when the enclosing transaction commits (with its `COMMIT`,
/// [`Db::note`]).
pub(super) fn notify(c: &mut Db, news: &News) -> Result<()> {
    c.note(news.payload());
    Ok(())
}

/// Start the listener thread for `url`, feeding `feed` while it lives and keeping `audience`.
pub(crate) fn spawn_listener(url: String, feed: Weak<NewsFeed>, audience: Arc<Audience>) {
    let spawned = std::thread::Builder::new()
        .name("pg-news".into())
        .spawn(move || listen(&url, &feed, &audience));
    if let Err(e) = spawned {
        tracing::error!(error = %e, "could not start the news listener; readers fall back to polling");
    }
}

fn listen(url: &str, feed: &Weak<NewsFeed>, audience: &Audience) {
    let mut pause = RECONNECT_FIRST;
    while feed.strong_count() > 0 {
        match super::connect_as(url, LISTENER_NAME).and_then(|mut client| {
            client.batch_execute(&format!("LISTEN {CHANNEL}"))?;
            let own: i32 = client.query_one("SELECT pg_backend_pid()", &[])?.get(0);
            Ok((client, own))
        }) {
            Ok((mut client, own)) => {
                pause = RECONNECT_FIRST;
                match follow(&mut client, own, feed, audience) {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::warn!(error = %e, "news listener lost its connection; reconnecting")
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in_ms = pause.as_millis() as u64, "news listener cannot connect")
            }
        }
        // Nobody can tell who listens now: every commit sends its notes until the next look.
        audience.unsure();
        std::thread::sleep(pause);
        pause = (pause * 2).min(RECONNECT_MAX);
    }
}

/// Hand notes to the feed until it is gone (`Ok`) or the connection fails (`Err`). `own` is this
/// connection's backend, whose hello is not news.
fn follow(
    client: &mut postgres::Client,
    own: i32,
    feed: &Weak<NewsFeed>,
    audience: &Audience,
) -> Result<()> {
    let publish = |news: News| match feed.upgrade() {
        Some(feed) => {
            feed.publish(news);
            true
        }
        None => false,
    };
    if !publish(News::Resync) {
        return Ok(());
    }
    client.batch_execute(&format!("NOTIFY {CHANNEL}, '{HELLO}'"))?;
    let mut looked: Option<Instant> = None;
    loop {
        if looked.is_none_or(|at| at.elapsed() >= AUDIENCE_EVERY) {
            look(client, audience)?;
            looked = Some(Instant::now());
        }
        let next = client.notifications().timeout_iter(IDLE_CHECK).next()?;
        match next {
            // Another listener started (this one's own hello parses as nothing below).
            Some(note) if note.payload() == HELLO && note.process_id() != own => {
                hear(client, audience)?;
            }
            Some(note) => {
                if let Some(news) = News::parse(note.payload()) {
                    if !publish(news) {
                        return Ok(());
                    }
                }
            }
            None if feed.strong_count() == 0 => return Ok(()),
            None => {}
        }
    }
}

/// Whether another process is connected to the database: its listener, or any connection named for
/// another process.
fn look(client: &mut postgres::Client, audience: &Audience) -> Result<()> {
    let others: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()
                   AND (application_name = $1
                        OR (application_name LIKE 'switchboard/%' AND application_name <> $2)))",
            &[&LISTENER_NAME, &super::application_name(std::process::id())],
        )?
        .get(0);
    if others {
        hear(client, audience)?;
    } else {
        audience.alone();
    }
    Ok(())
}

/// Someone else listens. If nobody did before, everyone re-reads once this process's quiet commits have
/// answered: what they wrote was said to nobody.
fn hear(client: &mut postgres::Client, audience: &Audience) -> Result<()> {
    if audience.heard(super::STATEMENT_TIMEOUT) {
        client.batch_execute(&format!("NOTIFY {CHANNEL}, '{}'", News::Resync.payload()))?;
    }
    Ok(())
}
