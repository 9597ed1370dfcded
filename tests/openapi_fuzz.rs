//! The API contract, fuzzed on the real binary: schemathesis (PyPI; `.ci/run` installs it and names it in
//! `SWITCHBOARD_SCHEMATHESIS`) generates requests from the served `/api/openapi.json`, schema-valid and
//! not, and checks every answer against the document — statuses, bodies, content types — with all its
//! checks. Left out: the SSE stream (it never ends, by design; its frames are documented) and the admin
//! routes (they drain or crash the process under test).

mod support;

use std::path::PathBuf;
use std::process::Command;

use serde_json::json;
use support::child::{http, Proc};

/// The schemathesis CLI: `SWITCHBOARD_SCHEMATHESIS`, else `st` on the PATH.
fn schemathesis() -> PathBuf {
    if let Some(path) = std::env::var_os("SWITCHBOARD_SCHEMATHESIS") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("st"))
        .find(|p| p.is_file());
    on_path.unwrap_or_else(|| {
        panic!(
            "schemathesis is not installed: `bash .ci/run` installs it (python3 -m venv DIR && \
             DIR/bin/pip install schemathesis==4.32.5, then SWITCHBOARD_SCHEMATHESIS=DIR/bin/st)"
        )
    })
}

#[test]
fn every_answer_of_the_api_matches_its_openapi_document_under_a_property_based_fuzzer() {
    let st = schemathesis();
    let dir = tempfile::tempdir().unwrap();
    let p = Proc::start(dir.path(), &[]);
    // Runs to read, so the reads reach their data and not only their 404s.
    for thread in ["a", "b"] {
        let (status, body) = http(|c| {
            c.post(p.url("/api/messages")).json(
                &json!({"thread": thread, "channel": "fuzz", "user": "u", "text": "steps=1 ms=1"}),
            )
        });
        assert_eq!(status, 202, "{body}");
    }
    // schemathesis keeps its example database in its working directory: the test's, not the tree.
    let out = Command::new(&st)
        .current_dir(dir.path())
        .args([
            "run",
            &p.url("/api/openapi.json"),
            "--checks",
            "all",
            "--max-examples",
            "60",
            "--seed",
            "1",
            "--exclude-path-regex",
            "/stream$|^/admin/",
            "--no-color",
        ])
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", st.display()));
    let report = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the fuzzer found answers the document does not describe:\n{report}"
    );
    assert!(report.contains(" passed"), "{report}");
}
