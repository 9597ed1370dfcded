//! Tools an agent may call, and the run workspace they act in (SPEC §8.3).
//!
//! Owns the per-run workspace directory `<workspace_root>/<run_id>/` as far as tools write to it;
//! creating it at admission, recording it in `state.binding` and re-attaching it at resume belong to
//! the run actor.
//!
//! Who calls it: the run actor looks a call's tool up in its [`Toolbox`] and awaits [`Tool::call`] with
//! the run's [`ToolContext`]; it writes the [`ToolOutput`] into the step's results turn. At promotion it
//! stores [`Toolbox::defs`] (with the `side_effect_free` / `rerun_safe` flags a resume uses to settle
//! in-flight calls, SPEC §6.2).
//!
//! Built in:
//!
//! | tool          | args           | side-effect free | rerun safe | output                    |
//! |---------------|----------------|------------------|------------|---------------------------|
//! | `sleep`       | `{ms}`         | yes              | yes        | `slept <ms> ms`           |
//! | `echo`        | `{text}`       | yes              | yes        | the text                  |
//! | `append_file` | `{path, line}` | no               | no         | `appended <n> bytes to <path>` |
//!
//! External tools (SPEC §8.3), built at boot by [`external_tools`] from `[[tools.http]]` and
//! `[[tools.mcp]]`: [`http::HttpTool`] (a POST per call) and [`mcp::McpTool`] (an MCP server's tools over
//! streamable HTTP). They act outside the process, so each call carries the idempotency key
//! `<runId>/<callId>` ([`idempotency_key`]) and is dispatched through [`Tool::call_keyed`]; a mutating
//! one checks the workspace fence ([`with_fence`] with a no-op write) immediately before it sends.
//!
//! Invariants:
//! - a tool never panics and never returns an error type: every failure (bad args, a refused path,
//!   an I/O error) is `ToolOutput { ok: false, output }` with an output that names what went wrong;
//! - no tool writes outside its run's workspace: [`resolve_in_workspace`] refuses absolute paths, `..`
//!   escapes and symlinks leading outside, and a refused call writes nothing;
//! - dropping a call's future abandons it (a hard stop does); `sleep` stops at once;
//! - workspace fencing (SPEC §8.3): a mutating tool writes only while holding the workspace lock
//!   ([`LOCK_FILE`]) and only when the fence ([`FENCE_FILE`]) names its own generation
//!   ([`ToolContext::gen`]); otherwise it answers `ok: false` with an output starting `fenced:` and
//!   writes nothing. A tool never creates, takes or rewrites the fence and never creates the workspace
//!   itself: only [`take_workspace`] does, called by the run actor before any tool runs;
//! - the fence files are reserved: no tool path may name them ([`WorkspaceError::Reserved`]).
//!
//! Fence protocol:
//!
//! | who                           | holds the lock while               | outcome                          |
//! |-------------------------------|------------------------------------|----------------------------------|
//! | new owner: [`take_workspace`] | writing its generation (tmp+fsync+rename) | `Ok`, `Busy` after [`TAKE_LOCK_WAIT`], `Missing` |
//! | mutating tool: [`with_fence`] | reading the fence and writing      | the write, `FencedBy`/`Unfenced`, or `Busy` |
//!
//! Because the check and the write happen under one lock, and a takeover rewrites the fence under
//! the same lock, an old owner's write either lands before the takeover completes (and the new owner
//! settles that call as "effects unknown") or is refused; it never lands after.
//!
//! # Design
//! File work runs on tokio's blocking pool when a runtime is present (actix arbiters are
//! single-threaded; a slow disk must not stall other runs), inline otherwise. The symlink check is a
//! best-effort walk of the existing prefix of the path; it does not defend against a concurrent
//! process swapping a directory for a link between the check and the write (nothing but our own tools
//! writes in a workspace, and none of them creates links).
//!
//! The lock is an advisory OS file lock (`File::try_lock`: `flock` on Unix, `LockFileEx` on Windows)
//! on a separate, never-replaced file, because the fence itself is replaced by rename and a lock on
//! a replaced inode would guard nothing. The OS drops the lock when its holder dies, so a crashed
//! owner never wedges a workspace; a *paused* one (SIGSTOP) keeps it, which is why a take only tries
//! for [`TAKE_LOCK_WAIT`] and answers [`WorkspaceError::Busy`] for the caller to retry later. Locks
//! are polled with `try_lock` rather than a blocking `lock`, so no blocking-pool thread waits forever.

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use storage::RunId;

use crate::agent::ToolDef;

mod external;
pub mod http;
pub mod mcp;

pub use external::{
    external_tools, idempotency_key, ExternalToolError, ExternalToolsSettings, HttpToolSpec,
    McpServerSpec, DEFAULT_EXTERNAL_TIMEOUT, MAX_TOOL_NAME,
};

/// What a tool call knows about its run.
#[derive(Debug, Clone)]
pub struct ToolContext {
    pub run_id: RunId,
    /// The run's workspace (`<workspace_root>/<run_id>`); it may not exist yet.
    pub workspace: PathBuf,
    /// The generation (fencing token) the call runs under: a mutating tool writes only while the
    /// workspace fence names exactly this string (see [`take_workspace`]).
    pub gen: String,
    /// The workspace claim the call runs under (SPEC §10). Work that outlives the call's future keeps a
    /// clone — a blocking write goes on after a hard stop or a fence drops the call — so a kill's drain
    /// waits for that work, not only for the future. `None` outside a run's tool runner.
    pub claim: Option<std::sync::Arc<crate::operations::OperationGuard>>,
}

/// A tool call's outcome, as written into the transcript.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub ok: bool,
    pub output: String,
}

impl ToolOutput {
    pub fn ok(output: impl Into<String>) -> Self {
        ToolOutput {
            ok: true,
            output: output.into(),
        }
    }

    pub fn err(output: impl Into<String>) -> Self {
        ToolOutput {
            ok: false,
            output: output.into(),
        }
    }
}

/// A callable tool.
pub trait Tool: Send + Sync + 'static {
    /// The definition offered to the model, with its resume flags.
    fn def(&self) -> ToolDef;
    /// Runs the call. Never panics; a failure is `ok: false`.
    fn call<'a>(&'a self, ctx: &'a ToolContext, args: &'a Value) -> BoxFuture<'a, ToolOutput>;

    /// Runs the call the model named `call_id` (unique within the run). The run dispatches every call
    /// through here: a tool acting outside the process sends `<runId>/<callId>` ([`idempotency_key`]) as
    /// its idempotency key, so a call re-sent after a resume carries the key of the first attempt. The
    /// default ignores the id and runs [`Tool::call`].
    fn call_keyed<'a>(
        &'a self,
        ctx: &'a ToolContext,
        call_id: &'a str,
        args: &'a Value,
    ) -> BoxFuture<'a, ToolOutput> {
        let _ = call_id;
        self.call(ctx, args)
    }

    /// Whether a call in flight at a crash may be re-sent with the same idempotency key after the
    /// resume (`how: "resent"`, SPEC §6.2) instead of being settled "effects unknown": an HTTP tool
    /// declared `idempotent`, an MCP tool annotated `idempotentHint: true`. Only meaningful for a tool
    /// that is not side-effect free (those are re-run anyway).
    fn idempotent(&self) -> bool {
        self.def().idempotent
    }

    /// Whether every call waits for a person's approval, whichever agent makes it (`[[tools.http]]
    /// approval = true`, SPEC §13).
    fn requires_approval(&self) -> bool {
        false
    }
}

/// The tools a run may use, by name. Cheap to clone (the tools are shared).
#[derive(Clone, Default)]
pub struct Toolbox {
    /// By name, so [`Toolbox::defs`] has a stable order; each with its definition, built once.
    tools: BTreeMap<String, (Arc<dyn Tool>, ToolDef)>,
    /// Every definition in name order, shared by the runs that may use every tool.
    defs: Arc<[ToolDef]>,
}

impl std::fmt::Debug for Toolbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Toolbox")
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Toolbox {
    /// No tools.
    pub fn empty() -> Self {
        Toolbox::default()
    }

    /// `sleep`, `echo` and `append_file`.
    pub fn builtin() -> Self {
        Toolbox::empty()
            .with(SleepTool)
            .with(EchoTool)
            .with(AppendFileTool)
    }

    /// Adds (or replaces, by name) a tool.
    pub fn with(self, tool: impl Tool) -> Self {
        self.with_shared(Arc::new(tool))
    }

    /// Adds (or replaces, by name) a shared tool.
    pub fn with_shared(mut self, tool: Arc<dyn Tool>) -> Self {
        let def = tool.def();
        self.tools.insert(def.name.clone(), (tool, def));
        self.defs = self.tools.values().map(|(_, d)| d.clone()).collect();
        self
    }

    /// Adds the external tools [`external_tools`] built. Unlike [`Toolbox::with`] it never replaces:
    /// a name already in the box (a built-in, or another external tool) is
    /// [`ExternalToolError::Taken`], so a config entry cannot silently shadow `append_file`.
    pub fn with_external(mut self, tools: Vec<Arc<dyn Tool>>) -> Result<Self, ExternalToolError> {
        for tool in tools {
            let name = tool.def().name;
            if self.tools.contains_key(&name) {
                return Err(ExternalToolError::Taken { name });
            }
            self = self.with_shared(tool);
        }
        Ok(self)
    }

    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.tools.get(name).map(|(tool, _)| tool.clone())
    }

    /// The tool named `name` with its definition.
    pub fn entry(&self, name: &str) -> Option<(Arc<dyn Tool>, &ToolDef)> {
        self.tools.get(name).map(|(tool, def)| (tool.clone(), def))
    }

    /// The definitions, ordered by name.
    pub fn defs(&self) -> Arc<[ToolDef]> {
        self.defs.clone()
    }
}

/// Why a path was refused, a workspace could not be taken, or a fenced write did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkspaceError {
    #[error("path is empty")]
    Empty,
    #[error("path {0:?} is absolute; paths are relative to the workspace")]
    Absolute(String),
    #[error("path {0:?} escapes the workspace")]
    Escapes(String),
    #[error("path {0:?} goes through a symlink leading outside the workspace")]
    SymlinkOutside(String),
    /// The path names one of the fence files ([`FENCE_FILE`], [`LOCK_FILE`] or the fence's temp file).
    #[error("path {0:?} names a reserved workspace file")]
    Reserved(String),
    #[error("cannot check path {path:?}: {reason}")]
    Io { path: String, reason: String },
    /// [`take_workspace`] with [`TakeMode::Existing`]: the directory is not there (SPEC §8.3: a
    /// workspace missing at resume closes the run `interrupted`; it is never silently recreated).
    #[error("workspace {0:?} is missing")]
    Missing(PathBuf),
    /// The workspace lock stayed held elsewhere for the whole wait (a paused old owner, or a takeover
    /// in progress). Nothing was written; try again later.
    #[error("workspace lock {path:?} is held elsewhere (waited {waited_ms} ms)")]
    Busy { path: PathBuf, waited_ms: u64 },
    /// The fence names another generation: this one no longer owns the workspace.
    #[error("workspace is owned by generation {owner:?}, not {gen:?}")]
    FencedBy { owner: String, gen: String },
    /// No readable fence (a missing workspace, a workspace never taken, an unreadable fence file):
    /// no generation can prove it owns the workspace, so nobody writes.
    #[error("workspace has no readable fence ({reason}); generation {gen:?} does not own it")]
    Unfenced { gen: String, reason: String },
    /// [`take_workspace_async`]: the ledger names another owner of the run, so this taker lost it and
    /// left the fence as it was.
    #[error("generation {gen:?} no longer owns the run: the workspace fence was left as it was")]
    NotOwner { gen: String },
    /// [`take_workspace`] refuses a generation that is empty or holds whitespace or control
    /// characters (the fence is one line and compared exactly).
    #[error("generation {0:?} cannot name a workspace owner")]
    BadGeneration(String),
}

impl WorkspaceError {
    /// Whether this is a fence refusal ([`WorkspaceError::FencedBy`] or [`WorkspaceError::Unfenced`]):
    /// the caller does not own the workspace. Tools report these as `fenced: …`.
    pub fn is_fenced(&self) -> bool {
        matches!(
            self,
            WorkspaceError::FencedBy { .. } | WorkspaceError::Unfenced { .. }
        )
    }
}

/// The fence file inside a workspace: the owning generation, one line (`<gen>\n`).
pub const FENCE_FILE: &str = ".fence";
/// The lock file inside a workspace, locked exclusively by a take and by every mutating tool while it
/// checks the fence and writes. Created by [`take_workspace`], never replaced or removed.
pub const LOCK_FILE: &str = ".fence.lock";
/// The fence's temp file, renamed over [`FENCE_FILE`] by a take.
const FENCE_TMP_FILE: &str = ".fence.tmp";
/// Top-level names no tool path may use (compared ignoring ASCII case, for case-insensitive disks).
const RESERVED_FILES: [&str; 3] = [FENCE_FILE, LOCK_FILE, FENCE_TMP_FILE];

/// How long [`take_workspace`] tries for the lock before answering [`WorkspaceError::Busy`].
pub const TAKE_LOCK_WAIT: Duration = Duration::from_millis(200);
/// How long a mutating tool waits for the lock (a take holds it for one small fsynced write; a
/// longer hold means the holder is paused, and the call fails without writing).
pub const TOOL_LOCK_WAIT: Duration = Duration::from_secs(5);
/// Between two `try_lock` attempts.
const LOCK_POLL: Duration = Duration::from_millis(5);

/// What a new owner expects of the workspace directory when it takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeMode {
    /// A fresh start, or a restart whose row has no binding yet: create the directory if missing.
    Create,
    /// A resume or a re-adoption: the directory must exist; [`WorkspaceError::Missing`] otherwise,
    /// and nothing is created.
    Existing,
}

/// Make `gen` the owner of the workspace `dir`: create the directory if `mode` allows, take the
/// workspace lock exclusively (trying for at most [`TAKE_LOCK_WAIT`]), write `gen` into the fence
/// durably (temp file, fsync, rename, fsync of the directory), release the lock.
///
/// From the moment this returns `Ok`, every mutating tool call of another generation is refused, and
/// no such call is still writing. Call it before any tool of the run runs, and before settling the
/// calls a previous owner left in flight. Idempotent: a generation may take its own workspace again
/// (re-adoption). Blocking file I/O; from async code use [`take_workspace_async`].
///
/// Errors: [`WorkspaceError::Missing`] (`Existing` and no directory), [`WorkspaceError::Busy`] (the
/// lock stayed held: retry later, and run no tool meanwhile), [`WorkspaceError::BadGeneration`],
/// [`WorkspaceError::Io`].
pub fn take_workspace(dir: &Path, gen: &str, mode: TakeMode) -> Result<(), WorkspaceError> {
    let held = lock_for_take(dir, gen, mode)?;
    let written = write_fence(dir, gen).map_err(|e| take_io(dir, "write the fence", e));
    drop(held);
    written
}

/// [`take_workspace`] off the async runtime (on tokio's blocking pool when one is present, inline
/// otherwise), so a take waiting for a busy lock never stalls the other runs of an arbiter, and only
/// while `still_owner` confirms, under the workspace lock, that the ledger names the taker as the run's
/// owner (SPEC §8.3: "a new owner rewrites it"). A taker that lost the run between its claim and its
/// take (paused past its lease, a stale closer) leaves the fence as it is, so it can never fence out
/// the real owner: a later owner's take waits for this lock, so it lands after this one.
///
/// `still_owner` answers `Ok(false)` when another generation owns the run (→
/// [`WorkspaceError::NotOwner`]) and `Err` when the ledger could not tell (→ [`WorkspaceError::Busy`]:
/// retry later). It should read once, not retry: the lock is held while it runs.
pub async fn take_workspace_async(
    dir: PathBuf,
    gen: String,
    mode: TakeMode,
    still_owner: impl std::future::Future<Output = Result<bool, String>>,
) -> Result<(), WorkspaceError> {
    let lost = |reason: String| WorkspaceError::Io {
        path: dir.display().to_string(),
        reason: format!("the take did not finish: {reason}"),
    };
    let (d, g) = (dir.clone(), gen.clone());
    let held = off_runtime(move || lock_for_take(&d, &g, mode))
        .await
        .map_err(lost)??;
    match still_owner.await {
        Ok(true) => {}
        Ok(false) => return Err(WorkspaceError::NotOwner { gen }),
        Err(reason) => {
            tracing::debug!(reason = %reason, "could not confirm ownership before the take");
            return Err(WorkspaceError::Busy {
                path: dir.join(LOCK_FILE),
                waited_ms: 0,
            });
        }
    }
    let d = dir.clone();
    off_runtime(move || {
        let written = write_fence(&d, &gen).map_err(|e| take_io(&d, "write the fence", e));
        drop(held);
        written
    })
    .await
    .map_err(lost)?
}

fn take_io(dir: &Path, what: &str, e: std::io::Error) -> WorkspaceError {
    WorkspaceError::Io {
        path: dir.display().to_string(),
        reason: format!("{what}: {e}"),
    }
}

/// The first half of a take: check `gen`, create the directory if `mode` allows, and hold the
/// workspace lock (trying for at most [`TAKE_LOCK_WAIT`]).
fn lock_for_take(dir: &Path, gen: &str, mode: TakeMode) -> Result<WorkspaceLock, WorkspaceError> {
    if gen.is_empty() || gen.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(WorkspaceError::BadGeneration(gen.to_owned()));
    }
    let io = |what: &str, e: std::io::Error| take_io(dir, what, e);
    match mode {
        TakeMode::Create => {
            if !dir.is_dir() {
                std::fs::create_dir_all(dir).map_err(|e| io("create the workspace", e))?;
                if let Some(parent) = dir.parent() {
                    sync_dir(parent).map_err(|e| io("sync the workspaces directory", e))?;
                }
            }
        }
        TakeMode::Existing => match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(io(
                    "check the workspace",
                    std::io::Error::other("not a directory"),
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(WorkspaceError::Missing(dir.to_path_buf()))
            }
            Err(e) => return Err(io("check the workspace", e)),
        },
    }
    let lock_path = dir.join(LOCK_FILE);
    let file = match OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
    {
        Ok(f) => f,
        // Removed between the check and the open.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && mode == TakeMode::Existing => {
            return Err(WorkspaceError::Missing(dir.to_path_buf()))
        }
        Err(e) => return Err(io("open the workspace lock", e)),
    };
    WorkspaceLock::acquire(file, &lock_path, TAKE_LOCK_WAIT).map_err(|e| match e {
        LockError::Busy(b) => b,
        LockError::Io(e) => io("lock the workspace", e),
    })
}

/// Run `write` while holding the workspace lock, if and only if the fence of `workspace` names
/// `gen`. Waits at most `wait` for the lock. Blocking file I/O (call it off the async runtime).
///
/// This is the fence every mutating workspace tool goes through; a tool acting outside the process
/// may call it with a no-op `write` as its ownership check immediately before dispatch (SPEC §8.3).
/// Never creates anything: a missing workspace, lock file or fence is [`WorkspaceError::Unfenced`].
///
/// Errors: [`WorkspaceError::FencedBy`] and [`WorkspaceError::Unfenced`] (see
/// [`WorkspaceError::is_fenced`]), [`WorkspaceError::Busy`]; `write` has not run in any of them.
pub fn with_fence<T>(
    workspace: &Path,
    gen: &str,
    wait: Duration,
    write: impl FnOnce() -> T,
) -> Result<T, WorkspaceError> {
    let unfenced = |reason: String| WorkspaceError::Unfenced {
        gen: gen.to_owned(),
        reason,
    };
    let lock_path = workspace.join(LOCK_FILE);
    let file = match File::open(&lock_path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let what = if workspace.is_dir() {
                "the workspace was never taken"
            } else {
                "the workspace is missing"
            };
            return Err(unfenced(what.into()));
        }
        Err(e) => return Err(unfenced(format!("cannot open the workspace lock: {e}"))),
    };
    let _held = WorkspaceLock::acquire(file, &lock_path, wait).map_err(|e| match e {
        LockError::Busy(b) => b,
        LockError::Io(e) => unfenced(format!("cannot lock the workspace: {e}")),
    })?;
    let owner = read_fence(workspace).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => unfenced("no fence file".into()),
        _ => unfenced(format!("cannot read the fence: {e}")),
    })?;
    if owner != gen {
        return Err(WorkspaceError::FencedBy {
            owner,
            gen: gen.to_owned(),
        });
    }
    Ok(write())
}

/// The generation the fence of `workspace` names (its one line, trimmed), read without the lock:
/// for diagnostics and tests, never for deciding whether to write (use [`with_fence`]).
pub fn fence_owner(workspace: &Path) -> std::io::Result<String> {
    read_fence(workspace)
}

/// An exclusive lock on a workspace's [`LOCK_FILE`]; dropping it unlocks. The lock goes with the
/// open file description, so the guard owns the only handle to it.
struct WorkspaceLock {
    file: File,
}

enum LockError {
    Busy(WorkspaceError),
    Io(std::io::Error),
}

impl WorkspaceLock {
    /// Poll `try_lock` until it succeeds or `wait` has passed.
    fn acquire(file: File, path: &Path, wait: Duration) -> Result<Self, LockError> {
        let started = Instant::now();
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(WorkspaceLock { file }),
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(e)) => return Err(LockError::Io(e)),
            }
            let waited = started.elapsed();
            if waited >= wait {
                return Err(LockError::Busy(WorkspaceError::Busy {
                    path: path.to_path_buf(),
                    waited_ms: waited.as_millis() as u64,
                }));
            }
            std::thread::sleep(LOCK_POLL.min(wait - waited));
        }
    }
}

impl Drop for WorkspaceLock {
    fn drop(&mut self) {
        // Closing the file releases the lock too; unlocking first also covers a handle that a child
        // process might have inherited.
        let _ = self.file.unlock();
    }
}

/// Write `gen` as the fence: temp file, then rename over the fence (a reader sees the old fence or the
/// new one, never a torn one). Callers hold the workspace lock (the temp name is not unique).
///
/// No fsync: the fence orders processes that are alive at the same time, and they share the page cache
/// (or, on NFS, close-to-open consistency). After a power loss no old owner is alive, and the next owner
/// rewrites the fence before any tool runs, so a fence lost with the page cache fences nobody wrongly.
/// Two fsyncs a run saved (`bench commits`).
fn write_fence(dir: &Path, gen: &str) -> std::io::Result<()> {
    let tmp = dir.join(FENCE_TMP_FILE);
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        f.write_all(format!("{gen}\n").as_bytes())?;
    }
    std::fs::rename(&tmp, dir.join(FENCE_FILE))
}

/// The fence's generation. A fence is a few dozen bytes; a larger file is read up to a bound and will
/// simply not match any generation.
pub fn read_fence(dir: &Path) -> std::io::Result<String> {
    let mut text = String::new();
    File::open(dir.join(FENCE_FILE))?
        .take(4096)
        .read_to_string(&mut text)?;
    Ok(text.trim().to_owned())
}

/// Make a directory's entries durable (a created child, a rename).
#[cfg(unix)]
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> std::io::Result<()> {
    Ok(())
}

thread_local! {
    /// Set by [`blocking_inline_on_this_thread`]: this thread runs its blocking work itself.
    static INLINE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// From now on, blocking work started on this thread runs on it, in place, instead of on tokio's
/// blocking pool: the simulator's one thread stays the only thread (a pool thread's timing would make
/// a seed's order of events depend on the machine).
pub fn blocking_inline_on_this_thread() {
    INLINE.with(|i| i.set(true));
}

/// Run blocking work on tokio's blocking pool when a runtime is present, inline otherwise (or when this
/// thread asked for it). `Err` when the work panicked or the runtime shut down.
async fn off_runtime<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) if !INLINE.with(|i| i.get()) => {
            rt.spawn_blocking(work).await.map_err(|e| e.to_string())
        }
        _ => Ok(work()),
    }
}

/// `<root>/<run_id>`: `root` is `[storage] workspace_root` (default `<data dir>/workspaces`, SPEC §8.3).
///
/// Run ids are UUIDs; any character outside `[A-Za-z0-9._-]` (and a bare `.` or `..`) is replaced by `_`
/// so that no id can name a directory outside `root`.
pub fn workspace_dir(root: &Path, run_id: &RunId) -> PathBuf {
    let mut name: String = run_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() || name == "." || name == ".." {
        name = "_".repeat(name.len().max(1));
    }
    root.join(name)
}

/// The path `rel` names inside `workspace`, lexically normalized (no `.` or `..` left in it).
///
/// Refuses an empty path, an absolute one, one whose `..` climbs above the workspace, one naming a
/// fence file, and one whose existing prefix goes through a symlink resolving outside the workspace
/// (or a dangling one, which cannot be checked). The workspace itself need not exist.
pub fn resolve_in_workspace(workspace: &Path, rel: &str) -> Result<PathBuf, WorkspaceError> {
    if rel.is_empty() {
        return Err(WorkspaceError::Empty);
    }
    let rel_path = Path::new(rel);
    if rel_path.is_absolute() || rel_path.has_root() {
        return Err(WorkspaceError::Absolute(rel.to_owned()));
    }
    let mut inside: Vec<&std::ffi::OsStr> = Vec::new();
    for c in rel_path.components() {
        match c {
            Component::Normal(s) => inside.push(s),
            Component::CurDir => {}
            Component::ParentDir => {
                if inside.pop().is_none() {
                    return Err(WorkspaceError::Escapes(rel.to_owned()));
                }
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(WorkspaceError::Absolute(rel.to_owned()))
            }
        }
    }
    if inside.is_empty() {
        return Err(WorkspaceError::Empty);
    }
    if let Some(first) = inside.first().and_then(|s| s.to_str()) {
        if RESERVED_FILES.iter().any(|r| r.eq_ignore_ascii_case(first)) {
            return Err(WorkspaceError::Reserved(rel.to_owned()));
        }
    }
    let io = |e: std::io::Error| WorkspaceError::Io {
        path: rel.to_owned(),
        reason: e.to_string(),
    };
    // Walk the prefixes that exist; a symlink among them must resolve inside the workspace.
    let mut path = workspace.to_path_buf();
    let mut root: Option<PathBuf> = None;
    for s in &inside {
        path.push(s);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
            Err(e) => return Err(io(e)),
        };
        if meta.file_type().is_symlink() {
            if root.is_none() {
                root = Some(workspace.canonicalize().map_err(io)?);
            }
            let inside_ws = match path.canonicalize() {
                Ok(target) => root.as_ref().is_some_and(|r| target.starts_with(r)),
                Err(_) => false, // dangling: where it would lead cannot be checked
            };
            if !inside_ws {
                return Err(WorkspaceError::SymlinkOutside(rel.to_owned()));
            }
        }
    }
    Ok(inside
        .iter()
        .fold(workspace.to_path_buf(), |p, s| p.join(s)))
}

/// The arguments object, or a message saying it is not one.
fn args_object(args: &Value) -> Result<&Map<String, Value>, String> {
    args.as_object()
        .ok_or_else(|| "args must be a JSON object".to_owned())
}

fn string_arg<'a>(args: &'a Map<String, Value>, field: &str) -> Result<&'a str, String> {
    match args.get(field) {
        None => Err(format!("missing field `{field}`")),
        Some(v) => v
            .as_str()
            .ok_or_else(|| format!("field `{field}` must be a string")),
    }
}

fn u64_arg(args: &Map<String, Value>, field: &str) -> Result<u64, String> {
    match args.get(field) {
        None => Err(format!("missing field `{field}`")),
        Some(v) => v
            .as_u64()
            .ok_or_else(|| format!("field `{field}` must be a non-negative integer")),
    }
}

/// `sleep {ms}`: waits; no effect outside the process.
#[derive(Debug, Clone, Copy, Default)]
pub struct SleepTool;

impl Tool for SleepTool {
    fn def(&self) -> ToolDef {
        ToolDef {
            name: "sleep".into(),
            description: "Wait for the given number of milliseconds.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"ms": {"type": "integer", "minimum": 0, "description": "milliseconds to wait"}},
                "required": ["ms"],
                "additionalProperties": false,
            }),
            side_effect_free: true,
            rerun_safe: true,
            idempotent: false,
        }
    }

    fn call<'a>(&'a self, _ctx: &'a ToolContext, args: &'a Value) -> BoxFuture<'a, ToolOutput> {
        async move {
            let ms = match args_object(args).and_then(|a| u64_arg(a, "ms")) {
                Ok(ms) => ms,
                Err(e) => return ToolOutput::err(e),
            };
            // A zero wait is no wait: tokio's timer would still hold it to its next millisecond tick.
            if ms > 0 {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            ToolOutput::ok(format!("slept {ms} ms"))
        }
        .boxed()
    }
}

/// `echo {text}`: answers the text.
#[derive(Debug, Clone, Copy, Default)]
pub struct EchoTool;

impl Tool for EchoTool {
    fn def(&self) -> ToolDef {
        ToolDef {
            name: "echo".into(),
            description: "Return the given text unchanged.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"text": {"type": "string", "description": "text to return"}},
                "required": ["text"],
                "additionalProperties": false,
            }),
            side_effect_free: true,
            rerun_safe: true,
            idempotent: false,
        }
    }

    fn call<'a>(&'a self, _ctx: &'a ToolContext, args: &'a Value) -> BoxFuture<'a, ToolOutput> {
        async move {
            match args_object(args).and_then(|a| string_arg(a, "text")) {
                Ok(text) => ToolOutput::ok(text),
                Err(e) => ToolOutput::err(e),
            }
        }
        .boxed()
    }
}

/// `append_file {path, line}`: appends `line` and a newline to a file in the run's workspace.
/// Mutating and not rerun-safe: a resume gives an in-flight call the "effects are unknown" result.
#[derive(Debug, Clone, Copy, Default)]
pub struct AppendFileTool;

impl Tool for AppendFileTool {
    fn def(&self) -> ToolDef {
        ToolDef {
            name: "append_file".into(),
            description: "Append one line to a file in the run's workspace, creating it if needed."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "file path relative to the workspace"},
                    "line": {"type": "string", "description": "text to append; a newline is added"},
                    "ms": {"type": "integer", "minimum": 0, "description": "optional: how long the write takes"},
                },
                "required": ["path", "line"],
                "additionalProperties": false,
            }),
            side_effect_free: false,
            rerun_safe: false,
            idempotent: false,
        }
    }

    fn call<'a>(&'a self, ctx: &'a ToolContext, args: &'a Value) -> BoxFuture<'a, ToolOutput> {
        async move {
            let (rel, line) = match args_object(args).and_then(|a| {
                Ok((
                    string_arg(a, "path")?.to_owned(),
                    string_arg(a, "line")?.to_owned(),
                ))
            }) {
                Ok(v) => v,
                Err(e) => return ToolOutput::err(e),
            };
            // Optional `ms`: how long the write takes (a slow mutating call, so a crash can land while
            // it is in flight — the case a resume must never re-run).
            if let Some(ms) = args.get("ms").and_then(Value::as_u64).filter(|ms| *ms > 0) {
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            }
            let workspace = ctx.workspace.clone();
            let gen = ctx.gen.clone();
            let claim = ctx.claim.clone();
            off_runtime(move || {
                let written = append_line(&workspace, &gen, &rel, &line);
                drop(claim);
                written
            })
            .await
            .unwrap_or_else(|e| ToolOutput::err(format!("append_file did not finish: {e}")))
        }
        .boxed()
    }
}

/// The blocking part of `append_file`: refuse the path, then check the fence and write under the
/// workspace lock.
fn append_line(workspace: &Path, gen: &str, rel: &str, line: &str) -> ToolOutput {
    let path = match resolve_in_workspace(workspace, rel) {
        Ok(p) => p,
        Err(e) => return ToolOutput::err(format!("refused: {e}")),
    };
    let write = || -> std::io::Result<usize> {
        create_subdirs(workspace, &path)?;
        let mut file = OpenOptions::new().create(true).append(true).open(&path)?;
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        file.write_all(&bytes)?;
        Ok(bytes.len())
    };
    match with_fence(workspace, gen, TOOL_LOCK_WAIT, write) {
        Ok(Ok(n)) => ToolOutput::ok(format!("appended {n} bytes to {rel}")),
        Ok(Err(e)) => ToolOutput::err(format!("cannot append to {rel:?}: {e}")),
        Err(e) if e.is_fenced() => ToolOutput::err(format!("fenced: {e}")),
        Err(e) => ToolOutput::err(format!("cannot append to {rel:?}: {e}")),
    }
}

/// Create the directories between `workspace` (which exists: its fence was just read) and `path`'s
/// parent, one level at a time, so a workspace removed meanwhile is never recreated by a tool.
fn create_subdirs(workspace: &Path, path: &Path) -> std::io::Result<()> {
    let Some(parent) = path.parent() else {
        return Ok(());
    };
    let Ok(below) = parent.strip_prefix(workspace) else {
        return Ok(());
    };
    let mut dir = workspace.to_path_buf();
    for c in below.components() {
        dir.push(c);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The owner before the takeover, and the one after (generation stamps, SPEC §6.1).
    const GEN_A: &str = "20260101T000000Z-aaaaaaaa";
    const GEN_B: &str = "20260101T000500Z-bbbbbbbb";

    fn ctx(dir: &Path) -> ToolContext {
        ctx_as(dir, GEN_A)
    }

    fn ctx_as(dir: &Path, gen: &str) -> ToolContext {
        ToolContext {
            run_id: "r1".into(),
            workspace: workspace_dir(dir, &RunId::from("r1")),
            gen: gen.into(),
            claim: None,
        }
    }

    /// Holds the workspace lock from outside, like an owner paused in the middle of a write.
    fn hold_lock(ws: &Path) -> File {
        let holder = File::open(ws.join(LOCK_FILE)).unwrap();
        holder.lock().unwrap();
        holder
    }

    /// A hard stop or a fence drops a tool call's future, but a blocking write it started goes on: the
    /// call's claim lasts until that write has ended, so a kill's drain — and the workspace deletion
    /// behind it — waits for the write instead of racing it (SPEC §5.6, §10).
    #[actix_rt::test]
    async fn a_dropped_call_holds_its_claim_until_its_blocking_write_ends() {
        use crate::operations::{AppId, Claim, Operation, OperationCoordinator, Resource};
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path());
        take_workspace(&c.workspace, GEN_A, TakeMode::Create).unwrap();
        let coord = OperationCoordinator::new(Arc::new(storage::ManualClock::new(0)));
        let app = AppId::new("r1");
        let claim = Claim::write(Resource::RepositoryWorktree);
        let guard = coord.acquire(&app, Operation::new("append_file"), claim);
        let c = ToolContext {
            claim: Some(Arc::new(guard.await.unwrap())),
            ..c
        };
        // Someone else holds the workspace lock: the write waits for it on a blocking thread.
        let lock = File::open(c.workspace.join(LOCK_FILE)).unwrap();
        lock.lock().unwrap();
        let args = json!({"path": "out.txt", "line": "landed"});
        let mut call = AppendFileTool.call(&c, &args);
        assert!(futures_util::poll!(&mut call).is_pending());
        // The run is stopped: its future and its context go.
        drop(call);
        drop(c);
        let drained = coord.close_admission(&app).await.unwrap().drain();
        let unlock = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(lock);
        });
        let _deletion = drained.await;
        let written =
            std::fs::read_to_string(workspace_dir(dir.path(), &RunId::from("r1")).join("out.txt"));
        assert_eq!(
            written.ok().as_deref(),
            Some("landed\n"),
            "the drain ended after the write it was holding for"
        );
        unlock.join().unwrap();
    }

    #[test]
    fn builtin_toolbox_offers_three_tools_with_their_flags() {
        let tb = Toolbox::builtin();
        let flags: Vec<(String, bool, bool)> = tb
            .defs()
            .iter()
            .map(|d| (d.name.clone(), d.side_effect_free, d.rerun_safe))
            .collect();
        assert_eq!(
            flags,
            vec![
                ("append_file".to_owned(), false, false),
                ("echo".to_owned(), true, true),
                ("sleep".to_owned(), true, true),
            ]
        );
        assert!(tb.get("sleep").is_some());
        assert!(tb.get("rm_rf").is_none());
        assert_eq!(
            tb.entry("sleep").map(|(_, d)| d.side_effect_free),
            Some(true)
        );
        for def in tb.defs().iter() {
            assert_eq!(
                def.parameters["type"], "object",
                "{} has an object schema",
                def.name
            );
        }
    }

    #[test]
    fn workspace_dir_is_under_workspaces_and_cannot_be_steered_out() {
        let data = Path::new("/data/workspaces");
        assert_eq!(
            workspace_dir(data, &RunId::from("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")),
            Path::new("/data/workspaces/0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")
        );
        assert_eq!(
            workspace_dir(data, &RunId::from("../etc")),
            Path::new("/data/workspaces/.._etc")
        );
        assert_eq!(
            workspace_dir(data, &RunId::from("/etc")),
            Path::new("/data/workspaces/_etc")
        );
        assert_eq!(
            workspace_dir(data, &RunId::from("..")),
            Path::new("/data/workspaces/__")
        );
        assert_eq!(
            workspace_dir(data, &RunId::from("")),
            Path::new("/data/workspaces/_")
        );
    }

    #[test]
    fn resolve_in_workspace_normalizes_or_refuses_lexically() {
        let ws = Path::new("/nonexistent-ws");
        let cases: Vec<(&str, Result<PathBuf, WorkspaceError>)> = vec![
            ("steps.log", Ok(ws.join("steps.log"))),
            ("./a/b.txt", Ok(ws.join("a/b.txt"))),
            ("a/../b.txt", Ok(ws.join("b.txt"))),
            ("", Err(WorkspaceError::Empty)),
            (".", Err(WorkspaceError::Empty)),
            ("a/..", Err(WorkspaceError::Empty)),
            (
                "/etc/passwd",
                Err(WorkspaceError::Absolute("/etc/passwd".into())),
            ),
            (".fence", Err(WorkspaceError::Reserved(".fence".into()))),
            (
                "./.fence.lock",
                Err(WorkspaceError::Reserved("./.fence.lock".into())),
            ),
            (
                "a/../.FENCE.tmp",
                Err(WorkspaceError::Reserved("a/../.FENCE.tmp".into())),
            ),
            (".fence/x", Err(WorkspaceError::Reserved(".fence/x".into()))),
            ("sub/.fence", Ok(ws.join("sub/.fence"))),
            (".fenced.log", Ok(ws.join(".fenced.log"))),
            ("../x", Err(WorkspaceError::Escapes("../x".into()))),
            (
                "a/../../x",
                Err(WorkspaceError::Escapes("a/../../x".into())),
            ),
        ];
        for (rel, want) in cases {
            assert_eq!(resolve_in_workspace(ws, rel), want, "resolve {rel:?}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn resolve_in_workspace_refuses_symlinks_leading_outside() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        symlink(&outside, ws.join("out")).unwrap();
        symlink(ws.join("sub"), ws.join("in")).unwrap();
        symlink(dir.path().join("missing"), ws.join("dangling")).unwrap();
        symlink(outside.join("f.txt"), ws.join("file-out")).unwrap();

        assert_eq!(
            resolve_in_workspace(&ws, "out/f.txt"),
            Err(WorkspaceError::SymlinkOutside("out/f.txt".into()))
        );
        assert_eq!(
            resolve_in_workspace(&ws, "dangling"),
            Err(WorkspaceError::SymlinkOutside("dangling".into()))
        );
        assert_eq!(
            resolve_in_workspace(&ws, "file-out"),
            Err(WorkspaceError::SymlinkOutside("file-out".into()))
        );
        // A link that stays inside is fine, and `..` after a link is resolved lexically, never by the OS.
        assert_eq!(
            resolve_in_workspace(&ws, "in/f.txt"),
            Ok(ws.join("in/f.txt"))
        );
        assert_eq!(
            resolve_in_workspace(&ws, "out/../f.txt"),
            Ok(ws.join("f.txt"))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn sleep_waits_the_given_ms() {
        let dir = Path::new("/nonexistent");
        let start = tokio::time::Instant::now();
        let out = SleepTool.call(&ctx(dir), &json!({"ms": 200})).await;
        assert_eq!(out, ToolOutput::ok("slept 200 ms"));
        assert_eq!(start.elapsed(), Duration::from_millis(200));
    }

    /// A zero wait answers at once: it never waits for the timer's next millisecond tick (which cost a
    /// 3-step run of `sleep {ms: 0}` calls 3 ms at concurrency 1).
    #[tokio::test]
    async fn a_zero_sleep_answers_on_its_first_poll() {
        let dir = Path::new("/nonexistent");
        let (c, args) = (ctx(dir), json!({"ms": 0}));
        let mut call = SleepTool.call(&c, &args);
        match futures_util::poll!(&mut call) {
            std::task::Poll::Ready(out) => assert_eq!(out, ToolOutput::ok("slept 0 ms")),
            std::task::Poll::Pending => panic!("a zero sleep waited for the timer"),
        }
    }

    #[tokio::test]
    async fn bad_args_name_the_field() {
        let c = ctx(Path::new("/nonexistent"));
        let cases: Vec<(&dyn Tool, Value, &str)> = vec![
            (&SleepTool, json!({}), "missing field `ms`"),
            (
                &SleepTool,
                json!({"ms": -1}),
                "field `ms` must be a non-negative integer",
            ),
            (
                &SleepTool,
                json!({"ms": "5"}),
                "field `ms` must be a non-negative integer",
            ),
            (&SleepTool, json!([1]), "args must be a JSON object"),
            (&EchoTool, json!({"txt": "x"}), "missing field `text`"),
            (
                &EchoTool,
                json!({"text": 3}),
                "field `text` must be a string",
            ),
            (
                &AppendFileTool,
                json!({"line": "x"}),
                "missing field `path`",
            ),
            (
                &AppendFileTool,
                json!({"path": "a"}),
                "missing field `line`",
            ),
            (&AppendFileTool, Value::Null, "args must be a JSON object"),
        ];
        for (tool, args, want) in cases {
            assert_eq!(
                tool.call(&c, &args).await,
                ToolOutput::err(want),
                "{} {args}",
                tool.def().name
            );
        }
    }

    #[tokio::test]
    async fn echo_answers_the_text() {
        let out = EchoTool
            .call(&ctx(Path::new("/nonexistent")), &json!({"text": "step 1"}))
            .await;
        assert_eq!(out, ToolOutput::ok("step 1"));
    }

    #[tokio::test]
    async fn append_file_appends_lines_in_a_workspace_its_generation_took() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path());
        take_workspace(&c.workspace, GEN_A, TakeMode::Create).unwrap();
        let tool = Toolbox::builtin().get("append_file").unwrap();
        let first = tool
            .call(&c, &json!({"path": "logs/steps.log", "line": "step 1"}))
            .await;
        assert_eq!(first, ToolOutput::ok("appended 7 bytes to logs/steps.log"));
        let second = tool
            .call(&c, &json!({"path": "logs/steps.log", "line": "step 2"}))
            .await;
        assert!(second.ok, "{second:?}");
        let text = std::fs::read_to_string(c.workspace.join("logs/steps.log")).unwrap();
        assert_eq!(text, "step 1\nstep 2\n");
    }

    #[tokio::test]
    async fn append_file_outside_the_workspace_is_refused_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path());
        let out = AppendFileTool
            .call(&c, &json!({"path": "../../escaped.txt", "line": "x"}))
            .await;
        assert!(!out.ok);
        assert!(out.output.starts_with("refused: "), "{}", out.output);
        assert!(
            out.output.contains("escapes the workspace"),
            "{}",
            out.output
        );
        let abs = dir.path().join("abs.txt");
        let out = AppendFileTool
            .call(&c, &json!({"path": abs.to_str().unwrap(), "line": "x"}))
            .await;
        assert!(!out.ok && out.output.contains("absolute"), "{}", out.output);
        assert!(!abs.exists());
        assert!(!dir.path().join("escaped.txt").exists());
        assert!(!c.workspace.exists(), "a refused call creates nothing");
    }

    #[test]
    fn append_file_works_without_a_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path());
        take_workspace(&c.workspace, GEN_A, TakeMode::Create).unwrap();
        let out = AppendFileTool
            .call(&c, &json!({"path": "a.txt", "line": "hi"}))
            .now_or_never();
        assert_eq!(out, Some(ToolOutput::ok("appended 3 bytes to a.txt")));
    }

    // ---- workspace fencing (SPEC §8.3) ----

    #[test]
    fn a_fresh_take_creates_the_workspace_and_writes_the_fence() {
        let dir = tempfile::tempdir().unwrap();
        let ws = workspace_dir(dir.path(), &RunId::from("r1"));
        assert!(!ws.exists());
        take_workspace(&ws, GEN_A, TakeMode::Create).unwrap();
        assert!(ws.is_dir());
        assert_eq!(
            std::fs::read_to_string(ws.join(FENCE_FILE)).unwrap(),
            format!("{GEN_A}\n")
        );
        assert_eq!(fence_owner(&ws).unwrap(), GEN_A);
        assert!(ws.join(LOCK_FILE).is_file());
        assert!(
            !ws.join(FENCE_TMP_FILE).exists(),
            "the temp file was renamed over the fence"
        );
        // Taking again is idempotent: a re-adoption by the same generation, with or without `Create`.
        take_workspace(&ws, GEN_A, TakeMode::Create).unwrap();
        take_workspace(&ws, GEN_A, TakeMode::Existing).unwrap();
        assert_eq!(fence_owner(&ws).unwrap(), GEN_A);
        // An existing workspace without a fence (made before fencing existed) can be taken.
        let old = dir.path().join("old");
        std::fs::create_dir_all(&old).unwrap();
        std::fs::write(old.join("steps.log"), "step 1\n").unwrap();
        take_workspace(&old, GEN_B, TakeMode::Existing).unwrap();
        assert_eq!(fence_owner(&old).unwrap(), GEN_B);
        assert_eq!(
            std::fs::read_to_string(old.join("steps.log")).unwrap(),
            "step 1\n"
        );
    }

    #[test]
    fn a_resume_take_of_a_missing_workspace_answers_missing_and_creates_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let ws = workspace_dir(&dir.path().join("workspaces"), &RunId::from("r1"));
        assert_eq!(
            take_workspace(&ws, GEN_B, TakeMode::Existing),
            Err(WorkspaceError::Missing(ws.clone()))
        );
        assert!(!ws.exists());
        assert!(!dir.path().join("workspaces").exists());
    }

    #[test]
    fn a_take_refuses_a_generation_that_cannot_be_a_fence_line() {
        let dir = tempfile::tempdir().unwrap();
        for gen in ["", "a b", "a\nb"] {
            assert_eq!(
                take_workspace(&dir.path().join("ws"), gen, TakeMode::Create),
                Err(WorkspaceError::BadGeneration(gen.into()))
            );
        }
        assert!(!dir.path().join("ws").exists());
    }

    #[tokio::test]
    async fn after_a_takeover_the_old_generation_is_fenced_and_writes_nothing() {
        // A owns the workspace and writes step 1.
        let dir = tempfile::tempdir().unwrap();
        let a = ctx_as(dir.path(), GEN_A);
        take_workspace(&a.workspace, GEN_A, TakeMode::Create).unwrap();
        let step1 = AppendFileTool
            .call(&a, &json!({"path": "steps.log", "line": "step 1"}))
            .await;
        assert!(step1.ok, "{step1:?}");
        // A is paused; B resumes the run and takes the workspace over.
        take_workspace_async(
            a.workspace.clone(),
            GEN_B.into(),
            TakeMode::Existing,
            async { Ok(true) },
        )
        .await
        .unwrap();
        assert_eq!(fence_owner(&a.workspace).unwrap(), GEN_B);
        // A continues: its write is refused and the file is unchanged, in the file and in a new one.
        for path in ["steps.log", "new/other.log"] {
            let late = AppendFileTool
                .call(&a, &json!({"path": path, "line": "step 2"}))
                .await;
            assert!(!late.ok, "{late:?}");
            assert!(late.output.starts_with("fenced: "), "{}", late.output);
            assert!(
                late.output.contains(GEN_B),
                "names the owner: {}",
                late.output
            );
        }
        assert_eq!(
            std::fs::read_to_string(a.workspace.join("steps.log")).unwrap(),
            "step 1\n"
        );
        assert!(!a.workspace.join("new").exists());
        // B writes.
        let b = ctx_as(dir.path(), GEN_B);
        let step3 = AppendFileTool
            .call(&b, &json!({"path": "steps.log", "line": "step 3"}))
            .await;
        assert!(step3.ok, "{step3:?}");
        assert_eq!(
            std::fs::read_to_string(a.workspace.join("steps.log")).unwrap(),
            "step 1\nstep 3\n"
        );
    }

    #[test]
    fn a_write_waiting_for_the_lock_sees_the_takeover_that_held_it() {
        // The SIGSTOP race: A's call is about to write when B's take holds the lock and rewrites the
        // fence. A must wait for the lock, then read B's fence, then refuse.
        let dir = tempfile::tempdir().unwrap();
        let a = ctx_as(dir.path(), GEN_A);
        take_workspace(&a.workspace, GEN_A, TakeMode::Create).unwrap();
        let taker = hold_lock(&a.workspace);
        let ws = a.workspace.clone();
        let late = std::thread::spawn(move || {
            AppendFileTool
                .call(&a, &json!({"path": "steps.log", "line": "step 2"}))
                .now_or_never()
                .unwrap()
        });
        std::thread::sleep(Duration::from_millis(50));
        write_fence(&ws, GEN_B).unwrap();
        taker.unlock().unwrap();
        let late = late.join().unwrap();
        assert!(late.output.starts_with("fenced: ") && !late.ok, "{late:?}");
        assert!(!ws.join("steps.log").exists());
    }

    #[test]
    fn a_take_while_another_holder_keeps_the_lock_answers_busy_within_bounded_time() {
        let dir = tempfile::tempdir().unwrap();
        let ws = workspace_dir(dir.path(), &RunId::from("r1"));
        take_workspace(&ws, GEN_A, TakeMode::Create).unwrap();
        // Owner A is paused while holding the lock.
        let paused = hold_lock(&ws);
        let started = Instant::now();
        let answer = take_workspace(&ws, GEN_B, TakeMode::Existing);
        let took = started.elapsed();
        assert!(
            matches!(&answer, Err(WorkspaceError::Busy { path, .. }) if *path == ws.join(LOCK_FILE)),
            "{answer:?}"
        );
        assert!(
            took >= TAKE_LOCK_WAIT && took < TAKE_LOCK_WAIT + Duration::from_secs(2),
            "took {took:?}"
        );
        assert_eq!(
            fence_owner(&ws).unwrap(),
            GEN_A,
            "a busy take changes nothing"
        );
        // A tool call meanwhile fails the same way after its own bounded wait, writing nothing.
        let short: Result<(), _> = with_fence(&ws, GEN_A, Duration::from_millis(20), || {
            unreachable!("must not write")
        });
        assert!(
            matches!(short, Err(WorkspaceError::Busy { .. })),
            "{short:?}"
        );
        // A continues and lets go; the next sweep's take succeeds.
        drop(paused);
        take_workspace(&ws, GEN_B, TakeMode::Existing).unwrap();
        assert_eq!(fence_owner(&ws).unwrap(), GEN_B);
    }

    #[tokio::test]
    async fn a_workspace_without_a_readable_fence_is_written_by_nobody() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path());
        let args = json!({"path": "steps.log", "line": "x"});
        // Missing workspace: refused, and not recreated by the tool.
        let out = AppendFileTool.call(&c, &args).await;
        assert!(
            out.output.starts_with("fenced: ") && out.output.contains("missing"),
            "{out:?}"
        );
        assert!(!c.workspace.exists());
        // A directory nobody took.
        std::fs::create_dir_all(&c.workspace).unwrap();
        let out = AppendFileTool.call(&c, &args).await;
        assert!(
            out.output.starts_with("fenced: ") && out.output.contains("never taken"),
            "{out:?}"
        );
        // A taken workspace whose fence was lost.
        take_workspace(&c.workspace, GEN_A, TakeMode::Existing).unwrap();
        std::fs::remove_file(c.workspace.join(FENCE_FILE)).unwrap();
        let out = AppendFileTool.call(&c, &args).await;
        assert!(
            out.output.starts_with("fenced: ") && out.output.contains("no fence file"),
            "{out:?}"
        );
        assert!(!c.workspace.join("steps.log").exists());
    }

    #[tokio::test]
    async fn a_tool_cannot_write_the_fence_files() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path());
        take_workspace(&c.workspace, GEN_A, TakeMode::Create).unwrap();
        for path in [FENCE_FILE, LOCK_FILE, FENCE_TMP_FILE] {
            let out = AppendFileTool
                .call(&c, &json!({"path": path, "line": GEN_B}))
                .await;
            assert!(
                out.output.starts_with("refused: ") && out.output.contains("reserved"),
                "{out:?}"
            );
        }
        assert_eq!(fence_owner(&c.workspace).unwrap(), GEN_A);
        assert!(!c.workspace.join(FENCE_TMP_FILE).exists());
    }

    #[tokio::test]
    async fn take_workspace_async_answers_like_the_blocking_take() {
        let dir = tempfile::tempdir().unwrap();
        let ws = workspace_dir(dir.path(), &RunId::from("r1"));
        let missing = take_workspace_async(ws.clone(), GEN_A.into(), TakeMode::Existing, async {
            Ok(true)
        })
        .await;
        assert_eq!(missing, Err(WorkspaceError::Missing(ws.clone())));
        take_workspace_async(ws.clone(), GEN_A.into(), TakeMode::Create, async {
            Ok(true)
        })
        .await
        .unwrap();
        assert_eq!(fence_owner(&ws).unwrap(), GEN_A);
    }

    #[tokio::test]
    async fn a_take_whose_taker_no_longer_owns_the_run_leaves_the_fence() {
        let dir = tempfile::tempdir().unwrap();
        let ws = workspace_dir(dir.path(), &RunId::from("r1"));
        take_workspace(&ws, GEN_B, TakeMode::Create).unwrap();
        // A stale taker (A lost the run to B between its claim and its take) changes nothing.
        let stale = take_workspace_async(ws.clone(), GEN_A.into(), TakeMode::Existing, async {
            Ok(false)
        })
        .await;
        assert_eq!(stale, Err(WorkspaceError::NotOwner { gen: GEN_A.into() }));
        assert_eq!(fence_owner(&ws).unwrap(), GEN_B);
        // A ledger that cannot tell: busy, retried later; the fence stays too.
        let unsure = take_workspace_async(ws.clone(), GEN_A.into(), TakeMode::Existing, async {
            Err("storage down".into())
        })
        .await;
        assert!(
            matches!(unsure, Err(WorkspaceError::Busy { .. })),
            "{unsure:?}"
        );
        assert_eq!(fence_owner(&ws).unwrap(), GEN_B);
        // The ownership check runs under the lock: a tool of B waiting meanwhile writes after it.
        let (confirm_tx, confirm_rx) = tokio::sync::oneshot::channel::<bool>();
        let take = tokio::spawn(take_workspace_async(
            ws.clone(),
            GEN_A.into(),
            TakeMode::Existing,
            async move { Ok(confirm_rx.await.unwrap_or(false)) },
        ));
        // Wait until the take holds the lock (a tool's try then fails busy at once).
        while !matches!(
            with_fence(&ws, GEN_B, Duration::ZERO, || ()),
            Err(WorkspaceError::Busy { .. })
        ) {
            assert!(
                !take.is_finished(),
                "the take ended before asking the ledger"
            );
            tokio::task::yield_now().await;
        }
        confirm_tx.send(true).unwrap();
        take.await.unwrap().unwrap();
        assert_eq!(fence_owner(&ws).unwrap(), GEN_A);
    }
}
