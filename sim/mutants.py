#!/usr/bin/env python3
"""The simulator's mutation gate (CI): four bugs the nothing-lost work fixed, put back into the production
code one at a time as source mutations; the simulator, driving that code, must fail a seed within the
budget for each. A mutation that survives means the simulator stopped seeing a class of bug it once
caught. Each source file is restored whatever happens.

Usage: python3 sim/mutants.py [--seeds N]      (from the repository root; CARGO_TARGET_DIR is honoured)
"""
import os
import subprocess
import sys
import time

# (name, file, the production text, the mutation)
MUTANTS = [
    (
        "a folded follow-up's input event goes out through the flusher, not with the step's commit",
        "actors/src/run/work.rs",
        "            self.publish_in_step(storage::record::input_event(",
        "            self.publish(storage::record::input_event(",
    ),
    (
        "a close admits no successor for the run's unread follow-ups",
        "actors/src/run/record.rs",
        ".finish(deps.gen.as_str().to_owned(), record, None, Some(successor))",
        ".finish(deps.gen.as_str().to_owned(), record, None, Some(successor).filter(|_| false))",
    ),
    (
        "a mutating tool writes whoever the workspace fence names",
        "actors/src/tools/mod.rs",
        "    if owner != gen {\n        return Err(WorkspaceError::FencedBy {",
        "    if owner != gen && false {\n        return Err(WorkspaceError::FencedBy {",
    ),
    (
        "the supervisor never re-adopts its own orphaned rows",
        "actors/src/supervisor/recovery.rs",
        "        if self.config.draining.load(Ordering::SeqCst) {\n            return;\n        }\n        let registry",
        "        if true || self.config.draining.load(Ordering::SeqCst) {\n            return;\n        }\n        let registry",
    ),
]


def main():
    seeds = 20000
    if "--seeds" in sys.argv:
        seeds = int(sys.argv[sys.argv.index("--seeds") + 1])
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    sweep = os.path.join(target, "debug", "examples", "sweep")
    survivors = []
    for name, path, original, mutated in MUTANTS:
        with open(path) as f:
            source = f.read()
        if source.count(original) != 1:
            print(f"mutant {name!r}: its production text is not found once in {path}; update sim/mutants.py")
            sys.exit(2)
        started = time.time()
        try:
            with open(path, "w") as f:
                f.write(source.replace(original, mutated))
            subprocess.run(
                ["cargo", "build", "--quiet", "--locked", "-p", "sim", "--example", "sweep"],
                check=True,
            )
            run = subprocess.run(
                [sweep, "--seeds", str(seeds), "--stop-after", "1"],
                capture_output=True,
                text=True,
            )
        finally:
            with open(path, "w") as f:
                f.write(source)
        found = [l for l in run.stdout.splitlines() if l.startswith("seed ") and ": [" in l]
        took = time.time() - started
        if run.returncode == 1 and found:
            print(f"caught   ({took:5.0f} s) {name}: {found[0]}")
        else:
            print(f"SURVIVED ({took:5.0f} s) {name} (exit {run.returncode})")
            survivors.append(name)
    # Leave the example built from the production source.
    subprocess.run(["cargo", "build", "--quiet", "--locked", "-p", "sim", "--example", "sweep"], check=True)
    if survivors:
        print(f"{len(survivors)} of {len(MUTANTS)} mutants survived {seeds} seeds")
        sys.exit(1)
    print(f"all {len(MUTANTS)} mutants caught")


if __name__ == "__main__":
    main()
