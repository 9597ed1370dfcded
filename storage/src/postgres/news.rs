//! Both ends of PostgreSQL's cross-host news (SPEC §1.3, [`crate::news`]): the writers' `pg_notify`
//! inside their transactions, and the one listener connection per process.
//!
//! The listener is a plain thread with its own connection (the storage actor's connection is busy with
//! transactions, and a reader's belongs to the pool). It `LISTEN`s, says [`News::Resync`] (notes before
//! this moment were missed), then hands every parsed note to the [`NewsFeed`]. A lost connection is
//! reconnected with a growing pause (0.1 s doubling to 5 s) and followed by another `Resync`. The
//! thread ends when the feed is gone (every [`crate::StorageHandle`] of it dropped).

use std::sync::Weak;
use std::time::{Duration, Instant};

use postgres::fallible_iterator::FallibleIterator;

use super::Db;
use crate::news::{News, NewsFeed, CHANNEL};
use crate::Result;

/// How long the listener waits for a note before checking that its feed and connection still live.
const IDLE_CHECK: Duration = Duration::from_secs(1);
/// How often an idle listener proves its connection with a round trip (a silently dead peer shows no
/// error until something is sent).
const PROBE_EVERY: Duration = Duration::from_secs(10);
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// Send `news` to every listener when the enclosing transaction commits (with its `COMMIT`,
/// [`Db::note`]).
pub(super) fn notify(c: &mut Db, news: &News) -> Result<()> {
    c.note(news.payload());
    Ok(())
}

/// Start the listener thread for `url`, feeding `feed` while it lives.
pub(crate) fn spawn_listener(url: String, feed: Weak<NewsFeed>) {
    let spawned = std::thread::Builder::new()
        .name("pg-news".into())
        .spawn(move || listen(&url, &feed));
    if let Err(e) = spawned {
        tracing::error!(error = %e, "could not start the news listener; readers fall back to polling");
    }
}

fn listen(url: &str, feed: &Weak<NewsFeed>) {
    let mut pause = RECONNECT_FIRST;
    while feed.strong_count() > 0 {
        match super::connect(url).and_then(|mut client| {
            client.batch_execute(&format!("LISTEN {CHANNEL}"))?;
            Ok(client)
        }) {
            Ok(mut client) => {
                pause = RECONNECT_FIRST;
                match follow(&mut client, feed) {
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
        std::thread::sleep(pause);
        pause = (pause * 2).min(RECONNECT_MAX);
    }
}

/// Hand notes to the feed until it is gone (`Ok`) or the connection fails (`Err`).
fn follow(client: &mut postgres::Client, feed: &Weak<NewsFeed>) -> Result<()> {
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
    let mut probed = Instant::now();
    loop {
        let next = client.notifications().timeout_iter(IDLE_CHECK).next()?;
        match next {
            Some(note) => {
                if let Some(news) = News::parse(note.payload()) {
                    if !publish(news) {
                        return Ok(());
                    }
                }
            }
            None if feed.strong_count() == 0 => return Ok(()),
            None if probed.elapsed() >= PROBE_EVERY => {
                client.is_valid(super::CONNECT_TIMEOUT)?;
                probed = Instant::now();
            }
            None => {}
        }
    }
}
