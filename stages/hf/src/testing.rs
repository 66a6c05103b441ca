//! What the tests and the benchmark of this crate share: running
//! `scripts/hf_golden.py` with the project venv's Python (`scripts/setup`
//! installs transformers there), and checking a network's tensor list
//! against its parameters (the policy networks of `embodyflow-models` use
//! it too). Not part of the crate's API.

use std::collections::BTreeMap;
use std::process::Command;

use crate::safetensors::Expected;

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

/// Asserts that `expected` lists exactly the variables of `vs`, each with
/// its shape: a network's tensor list and its constructor describe one
/// network.
pub fn assert_tensors_are_the_variables(
    vs: &tch::nn::VarStore,
    expected: impl IntoIterator<Item = Expected>,
) {
    let variables: BTreeMap<String, Vec<i64>> = vs
        .variables()
        .into_iter()
        .map(|(name, tensor)| (name, tensor.size()))
        .collect();
    let listed: Vec<(String, Vec<i64>)> = expected.into_iter().map(|e| (e.name, e.shape)).collect();
    assert_eq!(
        listed.len(),
        variables.len(),
        "{listed:?}\nvs\n{variables:?}"
    );
    assert_eq!(listed.into_iter().collect::<BTreeMap<_, _>>(), variables);
}
