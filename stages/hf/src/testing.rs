//! What the tests and the benchmark of this crate share: running
//! `scripts/hf_golden.py` with the project venv's Python (`scripts/setup`
//! installs transformers there), and checking a network's tensor list
//! against its parameters (the policy networks of `embodyflow-models` use
//! it too). Not part of the crate's API.

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;
use tch::{Kind, Tensor};

use crate::safetensors::Expected;

/// The project venv's Python.
pub const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../.venv/bin/python");
/// The script that makes the tiny random models and transformers' references.
pub const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/hf_golden.py");

/// The script that makes the tiny vision-language models and references.
pub const VL_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/hf_vl_golden.py");

/// Runs `hf_golden.py ARGS` and returns its stdout; panics, saying to run
/// `scripts/setup`, when Python or transformers is missing or the script fails.
pub fn golden_script(args: &[&str]) -> String {
    run_script(SCRIPT, args)
}

/// As [`golden_script`], for `hf_vl_golden.py`.
pub fn vl_golden_script(args: &[&str]) -> String {
    run_script(VL_SCRIPT, args)
}

fn run_script(script: &str, args: &[&str]) -> String {
    let out = Command::new(PYTHON)
        .arg(script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {PYTHON} ({e}): run scripts/setup"));
    assert!(
        out.status.success(),
        "{PYTHON} {script} {args:?} failed (transformers missing? run scripts/setup):\n{}",
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

/// A nested JSON list of numbers as a tensor of `kind`.
pub fn tensor_from_json(value: &Value, kind: Kind) -> Tensor {
    fn flatten(v: &Value, shape: &mut Vec<i64>, depth: usize, out: &mut Vec<f64>) {
        match v {
            Value::Array(items) => {
                if shape.len() == depth {
                    shape.push(items.len() as i64);
                }
                for item in items {
                    flatten(item, shape, depth + 1, out);
                }
            }
            other => out.push(other.as_f64().expect("a number")),
        }
    }
    let (mut shape, mut data) = (Vec::new(), Vec::new());
    flatten(value, &mut shape, 0, &mut data);
    Tensor::from_slice(&data)
        .view(shape.as_slice())
        .to_kind(kind)
}

/// Max |ours - theirs| over the positions that are tokens (padding rows'
/// logits attend to nothing and are not compared).
pub fn max_diff_at_tokens(ours: &Tensor, theirs: &Tensor, mask: &Tensor) -> f64 {
    let keep = mask.ne(0).unsqueeze(-1);
    (ours.to_kind(Kind::Double) - theirs)
        .abs()
        .masked_fill(&keep.logical_not(), 0.0)
        .max()
        .double_value(&[])
}

/// Every variable of `vs` set to `N(0, 0.2²)` draws (a network built
/// zero-initialised, without weights files).
pub fn randomize(vs: &tch::nn::VarStore) {
    tch::no_grad(|| {
        for (_, mut var) in vs.variables() {
            let draw = var.randn_like() * 0.2;
            var.copy_(&draw);
        }
    });
}

/// The largest difference between the parameters' gradients of `loss()`
/// backpropagated plainly and with block checkpointing
/// ([`crate::checkpointing`]); asserts that the checkpointed pass recorded
/// segments and that both give a gradient to the same parameters.
pub fn checkpointing_gradient_diff(vs: &tch::nn::VarStore, loss: &dyn Fn() -> Tensor) -> f64 {
    use crate::checkpointing;
    let grads = |on: bool| {
        for mut var in vs.trainable_variables() {
            var.zero_grad();
        }
        let _switch = checkpointing::enable(on);
        let value = loss();
        assert_eq!(checkpointing::pending() > 0, on, "segments recorded: {on}");
        checkpointing::backward(&value);
        assert_eq!(checkpointing::pending(), 0);
        vs.variables()
            .into_iter()
            .map(|(name, var)| {
                let g = var.grad();
                (name, g.defined().then(|| g.copy()))
            })
            .collect::<BTreeMap<_, _>>()
    };
    let (plain, checkpointed) = (grads(false), grads(true));
    let mut diff = 0f64;
    for (name, g) in &plain {
        match (g, &checkpointed[name]) {
            (Some(a), Some(b)) => {
                let d = (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
                    .abs()
                    .max();
                diff = diff.max(d.double_value(&[]));
            }
            (None, None) => {}
            (a, b) => panic!(
                "{name}: a gradient plainly {}, checkpointed {}",
                a.is_some(),
                b.is_some()
            ),
        }
    }
    assert!(plain.values().any(Option::is_some), "no gradient at all");
    diff
}
