//! [`ActivityProbe`]: whether a process has a PostgreSQL transaction or statement open right now — what
//! `switchboard chaos` checks before it pauses a `serve` process (SIGSTOP), so the paused process does not
//! hold locks its peers wait on. The PostgreSQL twin of [`crate::WriteLockProbe`]. It lives here because
//! only this crate opens database connections (SPEC §1.2), and because it reads the name [`super::connect`]
//! gives every connection of a process (`switchboard/<pid>`).

use std::str::FromStr;
use std::time::Duration;

use postgres::{Client, NoTls};

use crate::{Error, Result};

/// How long after a first look the second look comes: a query the stopped process sent just before the
/// stop is read by its backend within this, and then shows as `active` or `idle in transaction`.
const SETTLE: Duration = Duration::from_millis(20);

/// One connection reading `pg_stat_activity`, named `switchboard-probe` (never `switchboard/<pid>`, so it
/// never counts as a process's own connection).
pub struct ActivityProbe {
    client: Client,
}

impl std::fmt::Debug for ActivityProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActivityProbe").finish_non_exhaustive()
    }
}

impl ActivityProbe {
    pub fn connect(url: &str) -> Result<ActivityProbe> {
        let mut config = postgres::Config::from_str(url)?;
        config
            .application_name("switchboard-probe")
            .connect_timeout(super::CONNECT_TIMEOUT);
        Ok(ActivityProbe {
            client: config.connect(NoTls)?,
        })
    }

    /// `true` when every backend of process `pid` is `idle` (outside a transaction), twice in a row
    /// [`SETTLE`] apart with no state change between (so a query still in flight when the process was
    /// stopped is not missed). A process with no connection at all is an error: the probe could not tell.
    pub fn is_idle(&mut self, pid: u32) -> Result<bool> {
        let first = self.look(pid)?;
        if first.busy > 0 {
            return Ok(false);
        }
        std::thread::sleep(SETTLE);
        let second = self.look(pid)?;
        Ok(
            second.busy == 0
                && second.changed == first.changed
                && second.backends == first.backends,
        )
    }

    fn look(&mut self, pid: u32) -> Result<Look> {
        let row = self.client.query_one(
            "SELECT count(*) FILTER (WHERE state IS DISTINCT FROM 'idle'), count(*), coalesce(max(state_change)::text, '')
             FROM pg_stat_activity WHERE application_name = $1",
            &[&super::application_name(pid)],
        )?;
        let look = Look {
            busy: row.get(0),
            backends: row.get(1),
            changed: row.get(2),
        };
        if look.backends == 0 {
            return Err(Error::Unavailable(format!(
                "no PostgreSQL connection is named {}",
                super::application_name(pid)
            )));
        }
        Ok(look)
    }
}

/// One look at a process's backends.
struct Look {
    /// Backends in a transaction or a statement.
    busy: i64,
    backends: i64,
    /// The latest state change among them.
    changed: String,
}
