//! Tools an agent may call, and the run workspace they act in (SPEC §8.3).
//!
//! Owns the per-run workspace directory `<data dir>/workspaces/<run_id>/` as far as tools write to it;
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
//! Invariants:
//! - a tool never panics and never returns an error type: every failure (bad args, a refused path,
//!   an I/O error) is `ToolOutput { ok: false, output }` with an output that names what went wrong;
//! - no tool writes outside its run's workspace: [`resolve_in_workspace`] refuses absolute paths, `..`
//!   escapes and symlinks leading outside, and a refused call writes nothing;
//! - dropping a call's future abandons it (a hard stop does); `sleep` stops at once.
//!
//! # Design
//! File work runs on tokio's blocking pool when a runtime is present (actix arbiters are
//! single-threaded; a slow disk must not stall other runs), inline otherwise. The symlink check is a
//! best-effort walk of the existing prefix of the path; it does not defend against a concurrent
//! process swapping a directory for a link between the check and the write (nothing but our own tools
//! writes in a workspace, and none of them creates links).

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::agent::ToolDef;

/// What a tool call knows about its run.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolContext {
    pub run_id: String,
    /// The run's workspace (`<data dir>/workspaces/<run_id>`); it may not exist yet.
    pub workspace: PathBuf,
}

/// A tool call's outcome, as written into the transcript.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub ok: bool,
    pub output: String,
}

impl ToolOutput {
    pub fn ok(output: impl Into<String>) -> Self {
        ToolOutput { ok: true, output: output.into() }
    }

    pub fn err(output: impl Into<String>) -> Self {
        ToolOutput { ok: false, output: output.into() }
    }
}

/// A callable tool.
pub trait Tool: Send + Sync + 'static {
    /// The definition offered to the model, with its resume flags.
    fn def(&self) -> ToolDef;
    /// Runs the call. Never panics; a failure is `ok: false`.
    fn call<'a>(&'a self, ctx: &'a ToolContext, args: &'a Value) -> BoxFuture<'a, ToolOutput>;
}

/// The tools a run may use, by name. Cheap to clone (the tools are shared).
#[derive(Clone, Default)]
pub struct Toolbox {
    /// By name, so [`Toolbox::defs`] has a stable order.
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

impl std::fmt::Debug for Toolbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Toolbox").field("tools", &self.tools.keys().collect::<Vec<_>>()).finish()
    }
}

impl Toolbox {
    /// No tools.
    pub fn empty() -> Self {
        Toolbox::default()
    }

    /// `sleep`, `echo` and `append_file`.
    pub fn builtin() -> Self {
        Toolbox::empty().with(SleepTool).with(EchoTool).with(AppendFileTool)
    }

    /// Adds (or replaces, by name) a tool.
    pub fn with(mut self, tool: impl Tool) -> Self {
        self.tools.insert(tool.def().name, Arc::new(tool));
        self
    }

    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.tools.get(name).cloned()
    }

    /// The definitions, ordered by name.
    pub fn defs(&self) -> Vec<ToolDef> {
        self.tools.values().map(|t| t.def()).collect()
    }
}

/// Why a path was refused.
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
    #[error("cannot check path {path:?}: {reason}")]
    Io { path: String, reason: String },
}

/// `<data dir>/workspaces/<run_id>`.
///
/// Run ids are UUIDs; any character outside `[A-Za-z0-9._-]` (and a bare `.` or `..`) is replaced by `_`
/// so that no id can name a directory outside `workspaces/`.
pub fn workspace_dir(data_dir: &Path, run_id: &str) -> PathBuf {
    let mut name: String = run_id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
        .collect();
    if name.is_empty() || name == "." || name == ".." {
        name = "_".repeat(name.len().max(1));
    }
    data_dir.join("workspaces").join(name)
}

/// The path `rel` names inside `workspace`, lexically normalized (no `.` or `..` left in it).
///
/// Refuses an empty path, an absolute one, one whose `..` climbs above the workspace, and one whose
/// existing prefix goes through a symlink resolving outside the workspace (or a dangling one, which
/// cannot be checked). The workspace itself need not exist.
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
            Component::RootDir | Component::Prefix(_) => return Err(WorkspaceError::Absolute(rel.to_owned())),
        }
    }
    if inside.is_empty() {
        return Err(WorkspaceError::Empty);
    }
    let io = |e: std::io::Error| WorkspaceError::Io { path: rel.to_owned(), reason: e.to_string() };
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
    Ok(inside.iter().fold(workspace.to_path_buf(), |p, s| p.join(s)))
}

/// The arguments object, or a message saying it is not one.
fn args_object(args: &Value) -> Result<&Map<String, Value>, String> {
    args.as_object().ok_or_else(|| "args must be a JSON object".to_owned())
}

fn string_arg<'a>(args: &'a Map<String, Value>, field: &str) -> Result<&'a str, String> {
    match args.get(field) {
        None => Err(format!("missing field `{field}`")),
        Some(v) => v.as_str().ok_or_else(|| format!("field `{field}` must be a string")),
    }
}

fn u64_arg(args: &Map<String, Value>, field: &str) -> Result<u64, String> {
    match args.get(field) {
        None => Err(format!("missing field `{field}`")),
        Some(v) => v.as_u64().ok_or_else(|| format!("field `{field}` must be a non-negative integer")),
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
        }
    }

    fn call<'a>(&'a self, _ctx: &'a ToolContext, args: &'a Value) -> BoxFuture<'a, ToolOutput> {
        async move {
            let ms = match args_object(args).and_then(|a| u64_arg(a, "ms")) {
                Ok(ms) => ms,
                Err(e) => return ToolOutput::err(e),
            };
            tokio::time::sleep(Duration::from_millis(ms)).await;
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
            description: "Append one line to a file in the run's workspace, creating it if needed.".into(),
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
        }
    }

    fn call<'a>(&'a self, ctx: &'a ToolContext, args: &'a Value) -> BoxFuture<'a, ToolOutput> {
        async move {
            let (rel, line) = match args_object(args)
                .and_then(|a| Ok((string_arg(a, "path")?.to_owned(), string_arg(a, "line")?.to_owned())))
            {
                Ok(v) => v,
                Err(e) => return ToolOutput::err(e),
            };
            // Optional `ms`: how long the write takes (a slow mutating call, so a crash can land while
            // it is in flight — the case a resume must never re-run).
            if let Some(ms) = args.get("ms").and_then(Value::as_u64).filter(|ms| *ms > 0) {
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            }
            let workspace = ctx.workspace.clone();
            let work = move || append_line(&workspace, &rel, &line);
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => match rt.spawn_blocking(work).await {
                    Ok(out) => out,
                    Err(e) => ToolOutput::err(format!("append_file did not finish: {e}")),
                },
                Err(_) => work(),
            }
        }
        .boxed()
    }
}

/// The blocking part of `append_file`.
fn append_line(workspace: &Path, rel: &str, line: &str) -> ToolOutput {
    let path = match resolve_in_workspace(workspace, rel) {
        Ok(p) => p,
        Err(e) => return ToolOutput::err(format!("refused: {e}")),
    };
    let written = (|| -> std::io::Result<usize> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        file.write_all(&bytes)?;
        Ok(bytes.len())
    })();
    match written {
        Ok(n) => ToolOutput::ok(format!("appended {n} bytes to {rel}")),
        Err(e) => ToolOutput::err(format!("cannot append to {rel:?}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(dir: &Path) -> ToolContext {
        ToolContext { run_id: "r1".into(), workspace: workspace_dir(dir, "r1") }
    }

    #[test]
    fn builtin_toolbox_offers_three_tools_with_their_flags() {
        let tb = Toolbox::builtin();
        let flags: Vec<(String, bool, bool)> =
            tb.defs().into_iter().map(|d| (d.name, d.side_effect_free, d.rerun_safe)).collect();
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
        for def in tb.defs() {
            assert_eq!(def.parameters["type"], "object", "{} has an object schema", def.name);
        }
    }

    #[test]
    fn workspace_dir_is_under_workspaces_and_cannot_be_steered_out() {
        let data = Path::new("/data");
        assert_eq!(
            workspace_dir(data, "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"),
            Path::new("/data/workspaces/0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")
        );
        assert_eq!(workspace_dir(data, "../etc"), Path::new("/data/workspaces/.._etc"));
        assert_eq!(workspace_dir(data, "/etc"), Path::new("/data/workspaces/_etc"));
        assert_eq!(workspace_dir(data, ".."), Path::new("/data/workspaces/__"));
        assert_eq!(workspace_dir(data, ""), Path::new("/data/workspaces/_"));
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
            ("/etc/passwd", Err(WorkspaceError::Absolute("/etc/passwd".into()))),
            ("../x", Err(WorkspaceError::Escapes("../x".into()))),
            ("a/../../x", Err(WorkspaceError::Escapes("a/../../x".into()))),
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

        assert_eq!(resolve_in_workspace(&ws, "out/f.txt"), Err(WorkspaceError::SymlinkOutside("out/f.txt".into())));
        assert_eq!(resolve_in_workspace(&ws, "dangling"), Err(WorkspaceError::SymlinkOutside("dangling".into())));
        assert_eq!(resolve_in_workspace(&ws, "file-out"), Err(WorkspaceError::SymlinkOutside("file-out".into())));
        // A link that stays inside is fine, and `..` after a link is resolved lexically, never by the OS.
        assert_eq!(resolve_in_workspace(&ws, "in/f.txt"), Ok(ws.join("in/f.txt")));
        assert_eq!(resolve_in_workspace(&ws, "out/../f.txt"), Ok(ws.join("f.txt")));
    }

    #[tokio::test(start_paused = true)]
    async fn sleep_waits_the_given_ms() {
        let dir = Path::new("/nonexistent");
        let start = tokio::time::Instant::now();
        let out = SleepTool.call(&ctx(dir), &json!({"ms": 200})).await;
        assert_eq!(out, ToolOutput::ok("slept 200 ms"));
        assert_eq!(start.elapsed(), Duration::from_millis(200));
    }

    #[tokio::test]
    async fn bad_args_name_the_field() {
        let c = ctx(Path::new("/nonexistent"));
        let cases: Vec<(&dyn Tool, Value, &str)> = vec![
            (&SleepTool, json!({}), "missing field `ms`"),
            (&SleepTool, json!({"ms": -1}), "field `ms` must be a non-negative integer"),
            (&SleepTool, json!({"ms": "5"}), "field `ms` must be a non-negative integer"),
            (&SleepTool, json!([1]), "args must be a JSON object"),
            (&EchoTool, json!({"txt": "x"}), "missing field `text`"),
            (&EchoTool, json!({"text": 3}), "field `text` must be a string"),
            (&AppendFileTool, json!({"line": "x"}), "missing field `path`"),
            (&AppendFileTool, json!({"path": "a"}), "missing field `line`"),
            (&AppendFileTool, Value::Null, "args must be a JSON object"),
        ];
        for (tool, args, want) in cases {
            assert_eq!(tool.call(&c, &args).await, ToolOutput::err(want), "{} {args}", tool.def().name);
        }
    }

    #[tokio::test]
    async fn echo_answers_the_text() {
        let out = EchoTool.call(&ctx(Path::new("/nonexistent")), &json!({"text": "step 1"})).await;
        assert_eq!(out, ToolOutput::ok("step 1"));
    }

    #[tokio::test]
    async fn append_file_creates_the_workspace_and_appends_lines() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path());
        assert!(!c.workspace.exists());
        let tool = Toolbox::builtin().get("append_file").unwrap();
        let first = tool.call(&c, &json!({"path": "logs/steps.log", "line": "step 1"})).await;
        assert_eq!(first, ToolOutput::ok("appended 7 bytes to logs/steps.log"));
        let second = tool.call(&c, &json!({"path": "logs/steps.log", "line": "step 2"})).await;
        assert!(second.ok, "{second:?}");
        let text = std::fs::read_to_string(c.workspace.join("logs/steps.log")).unwrap();
        assert_eq!(text, "step 1\nstep 2\n");
    }

    #[tokio::test]
    async fn append_file_outside_the_workspace_is_refused_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path());
        let out = AppendFileTool.call(&c, &json!({"path": "../../escaped.txt", "line": "x"})).await;
        assert!(!out.ok);
        assert!(out.output.starts_with("refused: "), "{}", out.output);
        assert!(out.output.contains("escapes the workspace"), "{}", out.output);
        let abs = dir.path().join("abs.txt");
        let out = AppendFileTool.call(&c, &json!({"path": abs.to_str().unwrap(), "line": "x"})).await;
        assert!(!out.ok && out.output.contains("absolute"), "{}", out.output);
        assert!(!abs.exists());
        assert!(!dir.path().join("escaped.txt").exists());
        assert!(!c.workspace.exists(), "a refused call creates nothing");
    }

    #[test]
    fn append_file_works_without_a_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path());
        let out = AppendFileTool.call(&c, &json!({"path": "a.txt", "line": "hi"})).now_or_never();
        assert_eq!(out, Some(ToolOutput::ok("appended 3 bytes to a.txt")));
    }
}
