//! What the tests and the benchmark of this crate share: running
//! `scripts/hf_golden.py` with the project venv's Python (`scripts/setup`
//! installs transformers there). Not part of the crate's API.

use std::process::Command;

/// The project venv's Python.
pub const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../.venv/bin/python");
/// The script that makes the tiny random models and transformers' references.
pub const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/hf_golden.py");

/// Runs `hf_golden.py ARGS` and returns its stdout; panics, saying to run
/// `scripts/setup`, when Python or transformers is missing or the script fails.
pub fn golden_script(args: &[&str]) -> String {
    let out = Command::new(PYTHON)
        .arg(SCRIPT)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {PYTHON} ({e}): run scripts/setup"));
    assert!(
        out.status.success(),
        "{PYTHON} {SCRIPT} {args:?} failed (transformers missing? run scripts/setup):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
