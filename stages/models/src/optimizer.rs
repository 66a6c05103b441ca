//! AdamW whose state lives in the checkpoint, so that an RL run made of many
//! `update-policy` calls optimises like one trainer process (veRL keeps its
//! actor optimizer for the whole run). A fresh Adam makes its first steps
//! sign-like (every parameter moves by about `lr`), which at every iteration
//! of a short RL loop is a different optimizer from the one a monolithic
//! trainer runs.
//!
//! The update is PyTorch's `torch.optim.AdamW` (Loshchilov & Hutter,
//! decoupled weight decay), step `t` from 1:
//!
//! ```text
//! p  <- p · (1 − lr·wd)
//! m  <- β1·m + (1 − β1)·g          v <- β2·v + (1 − β2)·g²
//! p  <- p − (lr / (1 − β1^t)) · m / (sqrt(v) / sqrt(1 − β2^t) + eps)
//! ```
//!
//! The `lr` of step `t` is the base rate times an [`LrSchedule`] factor of
//! the steps taken before it (`s = t - 1`, the saved step count), the
//! `LambdaLR` of transformers' `get_constant_schedule_with_warmup` /
//! `get_cosine_schedule_with_warmup` and veRL's
//! `verl/utils/torch_functional.py` (`warmup_style = constant | cosine`,
//! `min_lr_ratio`, one half-cosine), which a trainer steps after each
//! optimizer step, so the first step uses `factor(0)`:
//!
//! ```text
//! warm-up (s < W):       factor = s / W
//! linear_warmup (s ≥ W): factor = 1
//! cosine (s ≥ W):        progress = min(1, (s − W) / max(1, N − W))
//!                        factor   = m + (1 − m) · ½ (1 + cos(π · progress))
//! ```
//! (`W` warm-up steps, `N` total steps, `m` the minimum lr ratio). Past `N`
//! the cosine stays at `m` (Megatron's rule; the references' formula would
//! climb back up the next half-cosine). Because the position is the step
//! count saved in `optimizer.json`, an RL run of many `update-policy` calls
//! follows one schedule.
//!
//! A parameter group of its own rate ([`AdamW::with_lr_scale`]): the
//! parameters whose name starts with a prefix step at the scheduled rate
//! times a factor (decay included), as a second PyTorch optimizer or param
//! group over them would — Adam's moments are per parameter, so two
//! optimizers stepped together are one optimizer with two rates. LaST-R1's
//! value head steps at 10× the policy's rate this way
//! (`value_head_lr = 3e-4` against `lr = 3e-5`).
//!
//! The state is saved next to the weights as `optimizer.safetensors`
//! (`exp_avg.<parameter>`, `exp_avg_sq.<parameter>`) and `optimizer.json`
//! (step count and the objective it optimised); loading checks every moment
//! against the model's parameters and names the file at fault.
//!
//! ```no_run
//! use embodyflow_models::checkpoint::Checkpoint;
//! use embodyflow_models::optimizer::{AdamW, AdamWConfig, LrSchedule, OptimizerState};
//! let dir = std::path::Path::new("runs/it0/policy");
//! let policy = Checkpoint::load(dir, tch::Device::Cpu).unwrap();
//! let state = OptimizerState::load(dir, &policy.vars).unwrap();
//! let schedule = LrSchedule::Cosine { warmup_steps: 10, total_steps: 200, min_lr_ratio: 0.1 };
//! let mut adam = AdamW::new(AdamWConfig::default(), state.unwrap_or_else(|| OptimizerState::fresh("ppo")))
//!     .with_schedule(schedule);
//! // ... loss.backward() ...
//! let norm = adam.clip_grad_norm(&policy.vars, 1.0);
//! let lr_used = adam.step(&policy.vars);
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::nn::VarStore;
use tch::{Kind, Tensor};

use crate::ModelError;

/// Hyper-parameters of one AdamW run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    /// Learning rate.
    pub lr: f64,
    /// β1, the first-moment decay.
    pub beta1: f64,
    /// β2, the second-moment decay.
    pub beta2: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Added to the denominator.
    pub eps: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            weight_decay: 0.0,
            eps: 1e-8,
        }
    }
}

/// The learning-rate factor of each optimizer step (see the module docs for
/// the formulas and the references they follow).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum LrSchedule {
    /// The base rate at every step.
    #[default]
    Constant,
    /// A linear ramp from 0 over `warmup_steps` steps, then the base rate.
    LinearWarmup {
        /// Steps of the ramp.
        warmup_steps: u64,
    },
    /// The linear ramp, then a half-cosine from the base rate down to
    /// `min_lr_ratio` times it at step `total_steps`, and that floor after.
    Cosine {
        /// Steps of the ramp.
        warmup_steps: u64,
        /// The step at which the cosine reaches its floor.
        total_steps: u64,
        /// The floor, as a fraction of the base rate.
        min_lr_ratio: f64,
    },
}

impl LrSchedule {
    /// The factor of the base rate for the step taken after `steps` steps.
    pub fn factor(&self, steps: u64) -> f64 {
        let ramp =
            |warmup_steps: u64| (steps < warmup_steps).then(|| steps as f64 / warmup_steps as f64);
        match *self {
            LrSchedule::Constant => 1.0,
            LrSchedule::LinearWarmup { warmup_steps } => ramp(warmup_steps).unwrap_or(1.0),
            LrSchedule::Cosine {
                warmup_steps,
                total_steps,
                min_lr_ratio,
            } => ramp(warmup_steps).unwrap_or_else(|| {
                let span = total_steps.saturating_sub(warmup_steps).max(1) as f64;
                let progress = ((steps - warmup_steps) as f64 / span).min(1.0);
                min_lr_ratio
                    + (1.0 - min_lr_ratio) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
            }),
        }
    }
}

/// `optimizer.json`: what the moments in `optimizer.safetensors` belong to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerMeta {
    /// Steps taken (the `t` of the bias corrections).
    pub steps: u64,
    /// The objective the moments were accumulated on (`sft`, `ppo`).
    pub objective: String,
}

/// The moments of every parameter and the step count.
pub struct OptimizerState {
    /// Step count and objective.
    pub meta: OptimizerMeta,
    exp_avg: BTreeMap<String, Tensor>,
    exp_avg_sq: BTreeMap<String, Tensor>,
}

pub(crate) const WEIGHTS_FILE: &str = "optimizer.safetensors";
pub(crate) const META_FILE: &str = "optimizer.json";

fn bad(path: &Path, reason: impl Into<String>) -> ModelError {
    ModelError::BadCheckpoint {
        file: path.to_path_buf(),
        reason: reason.into(),
    }
}

impl OptimizerState {
    /// No steps taken yet; moments are created at the first step.
    pub fn fresh(objective: &str) -> OptimizerState {
        OptimizerState {
            meta: OptimizerMeta {
                steps: 0,
                objective: objective.to_string(),
            },
            exp_avg: BTreeMap::new(),
            exp_avg_sq: BTreeMap::new(),
        }
    }

    /// The state saved in checkpoint `dir`, `None` when it holds none.
    /// Every moment must name a parameter of `vars` with its shape, and a
    /// parameter has both moments or neither (it was never updated).
    pub fn load(dir: &Path, vars: &VarStore) -> Result<Option<OptimizerState>, ModelError> {
        let meta_path = dir.join(META_FILE);
        let weights_path = dir.join(WEIGHTS_FILE);
        match (meta_path.exists(), weights_path.exists()) {
            (false, false) => return Ok(None),
            (true, false) => return Err(bad(&weights_path, format!("missing beside {META_FILE}"))),
            (false, true) => return Err(bad(&meta_path, format!("missing beside {WEIGHTS_FILE}"))),
            (true, true) => {}
        }
        let text =
            std::fs::read_to_string(&meta_path).map_err(|e| bad(&meta_path, e.to_string()))?;
        let meta: OptimizerMeta =
            serde_json::from_str(&text).map_err(|e| bad(&meta_path, e.to_string()))?;
        let device = vars.device();
        let mut exp_avg = BTreeMap::new();
        let mut exp_avg_sq = BTreeMap::new();
        let parameters = vars.variables();
        for (name, tensor) in Tensor::read_safetensors(&weights_path)
            .map_err(|e| bad(&weights_path, e.to_string()))?
        {
            let (moments, parameter) = if let Some(p) = name.strip_prefix("exp_avg_sq.") {
                (&mut exp_avg_sq, p)
            } else if let Some(p) = name.strip_prefix("exp_avg.") {
                (&mut exp_avg, p)
            } else {
                return Err(bad(&weights_path, format!("unexpected tensor `{name}`")));
            };
            let Some(var) = parameters.get(parameter) else {
                return Err(bad(
                    &weights_path,
                    format!("tensor `{name}` belongs to no parameter of the model"),
                ));
            };
            if var.size() != tensor.size() {
                return Err(bad(
                    &weights_path,
                    format!(
                        "tensor `{name}` has shape {:?}, the parameter {:?}",
                        tensor.size(),
                        var.size()
                    ),
                ));
            }
            moments.insert(parameter.to_string(), tensor.to_device(device));
        }
        // A parameter that never had a gradient has no moments (PyTorch
        // creates a parameter's state at its first update, so a value head
        // left out of a warm-up's loss has none); one moment without the
        // other is a damaged file.
        for name in parameters.keys() {
            if exp_avg.contains_key(name) != exp_avg_sq.contains_key(name) {
                return Err(bad(
                    &weights_path,
                    format!("holds one of the two moments of parameter `{name}`, not both"),
                ));
            }
        }
        Ok(Some(OptimizerState {
            meta,
            exp_avg,
            exp_avg_sq,
        }))
    }

    /// Writes `optimizer.safetensors` and `optimizer.json` into `dir`
    /// (a checkpoint's staging directory: the checkpoint's commit makes it atomic).
    pub fn save(&self, dir: &Path) -> Result<(), ModelError> {
        let weights_path = dir.join(WEIGHTS_FILE);
        let tensors: Vec<(String, &Tensor)> = self
            .exp_avg
            .iter()
            .map(|(name, t)| (format!("exp_avg.{name}"), t))
            .chain(
                self.exp_avg_sq
                    .iter()
                    .map(|(name, t)| (format!("exp_avg_sq.{name}"), t)),
            )
            .collect();
        Tensor::write_safetensors(&tensors, &weights_path)
            .map_err(|e| ModelError::Torch(format!("writing {}: {e}", weights_path.display())))?;
        let meta_path = dir.join(META_FILE);
        let text =
            serde_json::to_string_pretty(&self.meta).expect("plain struct serializes") + "\n";
        std::fs::write(&meta_path, text).map_err(|e| bad(&meta_path, e.to_string()))
    }
}

/// The factor of the rate for parameter `name` among `lr_scales`.
fn lr_scale(lr_scales: &[(String, f64)], name: &str) -> f64 {
    lr_scales
        .iter()
        .find(|(prefix, _)| name.starts_with(prefix.as_str()))
        .map_or(1.0, |&(_, factor)| factor)
}

/// AdamW over the trainable parameters of a `VarStore`, with explicit state.
pub struct AdamW {
    /// Hyper-parameters (`lr` is the base rate the schedule scales).
    pub config: AdamWConfig,
    /// The learning-rate schedule, positioned by the state's step count.
    pub schedule: LrSchedule,
    /// Moments and step count.
    pub state: OptimizerState,
    /// Parameter groups of their own rate: (name prefix, factor of the rate).
    pub lr_scales: Vec<(String, f64)>,
}

impl AdamW {
    /// An optimizer continuing from `state` at a constant rate.
    pub fn new(config: AdamWConfig, state: OptimizerState) -> AdamW {
        AdamW {
            config,
            schedule: LrSchedule::Constant,
            state,
            lr_scales: Vec::new(),
        }
    }

    /// The same optimizer with the parameters whose name starts with
    /// `prefix` stepping at `factor` times the rate (the first matching
    /// prefix wins).
    pub fn with_lr_scale(mut self, prefix: &str, factor: f64) -> AdamW {
        self.lr_scales.push((prefix.to_string(), factor));
        self
    }

    /// The same optimizer following `schedule` from the state's step count.
    pub fn with_schedule(self, schedule: LrSchedule) -> AdamW {
        AdamW { schedule, ..self }
    }

    /// The learning rate the next [`AdamW::step`] uses.
    pub fn lr(&self) -> f64 {
        self.config.lr * self.schedule.factor(self.state.meta.steps)
    }

    /// Clears the gradients of every parameter.
    pub fn zero_grad(&self, vars: &VarStore) {
        for mut var in vars.trainable_variables() {
            var.zero_grad();
        }
    }

    /// Scales the gradients so their global L2 norm is at most `max_norm`
    /// (`max_norm <= 0`: no clipping) and returns the norm before clipping.
    pub fn clip_grad_norm(&self, vars: &VarStore, max_norm: f64) -> f64 {
        let grads: Vec<Tensor> = vars
            .trainable_variables()
            .iter()
            .map(Tensor::grad)
            .filter(Tensor::defined)
            .collect();
        clip_grads(&grads, max_norm)
    }

    /// One AdamW step on every parameter that has a gradient; returns the
    /// learning rate it used.
    pub fn step(&mut self, vars: &VarStore) -> f64 {
        let params = vars
            .variables()
            .into_iter()
            .filter(|(_, var)| var.requires_grad())
            .map(|(name, var)| {
                let grad = var.grad();
                (name, var, grad)
            })
            .filter(|(_, _, grad)| grad.defined())
            .collect();
        self.step_params(params)
    }

    /// One AdamW step on `params` (name, parameter, its gradient; the
    /// moments take the parameter's dtype): [`AdamW::step`] on a store,
    /// or on fp32 master weights ([`crate::precision`]).
    pub fn step_params(&mut self, params: Vec<(String, Tensor, Tensor)>) -> f64 {
        let lr = self.lr();
        let AdamWConfig {
            beta1,
            beta2,
            weight_decay,
            eps,
            ..
        } = self.config;
        self.state.meta.steps += 1;
        let t = self.state.meta.steps as i32;
        let correction2 = (1.0 - beta2.powi(t)).sqrt();
        let lr_scales = &self.lr_scales;
        let (exp_avg, exp_avg_sq) = (&mut self.state.exp_avg, &mut self.state.exp_avg_sq);
        tch::no_grad(|| {
            for (name, mut var, grad) in params {
                let lr = lr * lr_scale(lr_scales, &name);
                let step_size = lr / (1.0 - beta1.powi(t));
                let m = exp_avg
                    .entry(name.clone())
                    .or_insert_with(|| var.zeros_like());
                let _ = m.g_mul_scalar_(beta1);
                let _ = m.g_add_(&(&grad * (1.0 - beta1)));
                let v = exp_avg_sq.entry(name).or_insert_with(|| var.zeros_like());
                let _ = v.g_mul_scalar_(beta2);
                let _ = v.g_add_(&(grad.square() * (1.0 - beta2)));
                if weight_decay != 0.0 {
                    let _ = var.g_mul_scalar_(1.0 - lr * weight_decay);
                }
                let denominator = v.sqrt() / correction2 + eps;
                let _ = var.g_sub_(&(&*m / denominator * step_size));
            }
        });
        lr
    }
}

/// Scales `grads` in place so their global L2 norm is at most `max_norm`
/// (`max_norm <= 0`: no clipping; PyTorch's `clip_grad_norm_`) and returns
/// the norm before clipping.
pub fn clip_grads(grads: &[Tensor], max_norm: f64) -> f64 {
    let norm = grads
        .iter()
        .map(|g| g.square().sum(Kind::Double).double_value(&[]))
        .sum::<f64>()
        .sqrt();
    if max_norm > 0.0 && norm > max_norm {
        // PyTorch's clip_grad_norm_: scale by max_norm / (norm + 1e-6).
        let scale = max_norm / (norm + 1e-6);
        tch::no_grad(|| {
            for g in grads {
                let _ = g.shallow_clone().g_mul_scalar_(scale);
            }
        });
    }
    norm
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::nn::OptimizerConfig;

    /// Two copies of one small model: same weights, independent gradients.
    fn twin_models() -> (VarStore, tch::nn::Linear, VarStore, tch::nn::Linear) {
        let _generator = crate::testing::seed(7);
        let config = tch::nn::LinearConfig::default();
        let a = VarStore::new(tch::Device::Cpu);
        let layer_a = tch::nn::linear(a.root() / "layer", 6, 3, config);
        let mut b = VarStore::new(tch::Device::Cpu);
        let layer_b = tch::nn::linear(b.root() / "layer", 6, 3, config);
        b.copy(&a).unwrap();
        (a, layer_a, b, layer_b)
    }

    fn backward(layer: &tch::nn::Linear, step: i64) {
        use tch::nn::Module;
        let x = Tensor::arange(12, (Kind::Float, tch::Device::Cpu)).reshape([2, 6]) / 10.0
            + step as f64;
        (layer.forward(&x).sin().sum(Kind::Float) * (step as f64 - 1.5)).backward();
    }

    fn max_difference(a: &VarStore, b: &VarStore) -> f64 {
        let b_vars = b.variables();
        a.variables()
            .iter()
            .map(|(name, t)| (t - &b_vars[name]).abs().max().double_value(&[]))
            .fold(0.0, f64::max)
    }

    #[test]
    fn matches_torch_adamw_step_for_step() {
        let (ours_vars, ours_layer, torch_vars, torch_layer) = twin_models();
        let config = AdamWConfig {
            lr: 0.05,
            weight_decay: 0.1,
            ..AdamWConfig::default()
        };
        let mut ours = AdamW::new(config, OptimizerState::fresh("sft"));
        let mut torch = tch::nn::AdamW {
            beta1: config.beta1,
            beta2: config.beta2,
            wd: config.weight_decay,
            eps: config.eps,
            amsgrad: false,
        }
        .build(&torch_vars, config.lr)
        .unwrap();
        for step in 0..6 {
            ours.zero_grad(&ours_vars);
            backward(&ours_layer, step);
            let norm = ours.clip_grad_norm(&ours_vars, 0.5);
            ours.step(&ours_vars);
            torch.zero_grad();
            backward(&torch_layer, step);
            torch.clip_grad_norm(0.5);
            torch.step();
            assert!(norm > 0.0);
        }
        let difference = max_difference(&ours_vars, &torch_vars);
        assert!(difference < 1e-6, "max |ours - torch| = {difference}");
        assert_eq!(ours.state.meta.steps, 6);
    }

    /// Adam's first step moves each parameter by its rate times the sign of
    /// its gradient (`m / sqrt(v) = g / |g|`), so a group at 10× the rate
    /// moves 10× as far and the others as without the group.
    #[test]
    fn a_parameter_group_steps_at_its_own_rate() {
        let (vars, layer, plain_vars, plain_layer) = twin_models();
        let before: BTreeMap<String, Tensor> = vars
            .variables()
            .into_iter()
            .map(|(name, t)| (name, t.copy()))
            .collect();
        let lr = 1e-3;
        let config = AdamWConfig {
            lr,
            ..AdamWConfig::default()
        };
        let mut grouped =
            AdamW::new(config, OptimizerState::fresh("lapo")).with_lr_scale("layer.bias", 10.0);
        let mut plain = AdamW::new(config, OptimizerState::fresh("lapo"));
        backward(&layer, 0);
        backward(&plain_layer, 0);
        grouped.step(&vars);
        plain.step(&plain_vars);
        let moved = |name: &str| {
            (&vars.variables()[name] - &before[name])
                .abs()
                .max()
                .double_value(&[])
        };
        assert!(
            (moved("layer.bias") - 10.0 * lr).abs() < 1e-6,
            "{}",
            moved("layer.bias")
        );
        assert!(
            (moved("layer.weight") - lr).abs() < 1e-6,
            "{}",
            moved("layer.weight")
        );
        let weight = (&vars.variables()["layer.weight"] - &plain_vars.variables()["layer.weight"])
            .abs()
            .max()
            .double_value(&[]);
        assert_eq!(
            weight, 0.0,
            "the other parameters step as without the group"
        );
    }

    /// veRL's `get_cosine_schedule_with_warmup` lambda (transformers' with
    /// `min_lr_ratio = 0`), written as the reference writes it.
    fn verl_cosine(step: u64, warmup: u64, total: u64, min_lr_ratio: f64) -> f64 {
        if step < warmup {
            return step as f64 / warmup.max(1) as f64;
        }
        let progress = (step - warmup) as f64 / total.saturating_sub(warmup).max(1) as f64;
        let x = (std::f64::consts::PI * 0.5 * 2.0 * progress).cos();
        let (coef, intercept) = ((1.0 - min_lr_ratio) * 0.5, (1.0 + min_lr_ratio) * 0.5);
        (x * coef + intercept).max(0.0)
    }

    #[test]
    fn schedules_follow_the_reference_formulas() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        for step in [0, 1, 7, 1_000_000] {
            assert_eq!(LrSchedule::Constant.factor(step), 1.0);
        }
        let warmup = LrSchedule::LinearWarmup { warmup_steps: 4 };
        let ramp: Vec<f64> = (0..7).map(|s| warmup.factor(s)).collect();
        assert_eq!(ramp, [0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0]);
        for min_lr_ratio in [0.0, 0.1] {
            let (w, n) = (10, 110);
            let cosine = LrSchedule::Cosine {
                warmup_steps: w,
                total_steps: n,
                min_lr_ratio,
            };
            for step in 0..=n {
                let (ours, reference) =
                    (cosine.factor(step), verl_cosine(step, w, n, min_lr_ratio));
                assert!(close(ours, reference), "step {step}: {ours} vs {reference}");
            }
            assert!(close(cosine.factor(5), 0.5), "half the ramp");
            assert!(close(cosine.factor(w), 1.0), "the top after the ramp");
            assert!(
                close(cosine.factor(60), (1.0 + min_lr_ratio) / 2.0),
                "the midpoint"
            );
            assert!(close(cosine.factor(n), min_lr_ratio), "the end");
            // Past the end the floor holds (the reference formula climbs back up).
            assert!(close(cosine.factor(n + 50), min_lr_ratio));
            assert!(verl_cosine(n + 50, w, n, min_lr_ratio) > min_lr_ratio + 0.4);
        }
    }

    #[test]
    fn a_scheduled_step_matches_torch_adamw_at_that_lr() {
        let (ours_vars, ours_layer, torch_vars, torch_layer) = twin_models();
        let config = AdamWConfig {
            lr: 0.05,
            weight_decay: 0.1,
            ..AdamWConfig::default()
        };
        let (w, n, m) = (2, 5, 0.2);
        let schedule = LrSchedule::Cosine {
            warmup_steps: w,
            total_steps: n,
            min_lr_ratio: m,
        };
        let mut ours = AdamW::new(config, OptimizerState::fresh("sft")).with_schedule(schedule);
        let mut torch = tch::nn::AdamW {
            beta1: config.beta1,
            beta2: config.beta2,
            wd: config.weight_decay,
            eps: config.eps,
            amsgrad: false,
        }
        .build(&torch_vars, config.lr)
        .unwrap();
        let mut used = Vec::new();
        for step in 0..7 {
            // Step 6 is past the end: the floor, the reference's value at step n.
            let lr = config.lr * verl_cosine(step.min(n), w, n, m);
            let announced = ours.lr();
            ours.zero_grad(&ours_vars);
            backward(&ours_layer, step as i64);
            used.push(ours.step(&ours_vars));
            assert_eq!(
                announced, used[step as usize],
                "lr() names the next step's rate"
            );
            torch.set_lr(lr);
            torch.zero_grad();
            backward(&torch_layer, step as i64);
            torch.step();
            assert!((used[step as usize] - lr).abs() < 1e-15, "step {step}");
        }
        assert_eq!(used[0], 0.0, "the first warm-up step, as in the references");
        let difference = max_difference(&ours_vars, &torch_vars);
        assert!(difference < 1e-6, "max |ours - torch| = {difference}");
    }

    #[test]
    fn a_saved_state_continues_like_one_run() {
        let (straight_vars, straight_layer, resumed_vars, resumed_layer) = twin_models();
        let config = AdamWConfig::default();
        let mut straight = AdamW::new(config, OptimizerState::fresh("ppo"));
        for step in 0..4 {
            straight.zero_grad(&straight_vars);
            backward(&straight_layer, step);
            straight.step(&straight_vars);
        }
        let dir = tempfile::tempdir().unwrap();
        let mut first = AdamW::new(config, OptimizerState::fresh("ppo"));
        for step in 0..2 {
            first.zero_grad(&resumed_vars);
            backward(&resumed_layer, step);
            first.step(&resumed_vars);
        }
        first.state.save(dir.path()).unwrap();
        let state = OptimizerState::load(dir.path(), &resumed_vars)
            .unwrap()
            .unwrap();
        assert_eq!(state.meta.steps, 2);
        let mut second = AdamW::new(config, state);
        for step in 2..4 {
            second.zero_grad(&resumed_vars);
            backward(&resumed_layer, step);
            second.step(&resumed_vars);
        }
        assert_eq!(max_difference(&straight_vars, &resumed_vars), 0.0);
    }

    #[test]
    fn a_state_that_does_not_fit_the_model_names_the_file() {
        let (vars, layer, _, _) = twin_models();
        let dir = tempfile::tempdir().unwrap();
        assert!(OptimizerState::load(dir.path(), &vars).unwrap().is_none());
        let mut adam = AdamW::new(AdamWConfig::default(), OptimizerState::fresh("ppo"));
        backward(&layer, 0);
        adam.step(&vars);
        adam.state.save(dir.path()).unwrap();
        let other = VarStore::new(tch::Device::Cpu);
        let _ = tch::nn::linear(other.root() / "layer", 5, 3, Default::default());
        let error = OptimizerState::load(dir.path(), &other)
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("optimizer.safetensors") && error.contains("shape"),
            "{error}"
        );
        std::fs::remove_file(dir.path().join("optimizer.safetensors")).unwrap();
        let error = OptimizerState::load(dir.path(), &vars)
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("optimizer.safetensors") && error.contains("missing"),
            "{error}"
        );
    }

    /// A parameter without a gradient (a head left out of the loss) gets no
    /// moments, as in PyTorch; such a state saves, loads and resumes. One
    /// moment without the other is refused, naming the parameter.
    #[test]
    fn a_parameter_never_updated_has_no_moments_and_still_resumes() {
        let vars = VarStore::new(tch::Device::Cpu);
        let used = tch::nn::linear(vars.root() / "used", 6, 2, Default::default());
        let _unused = tch::nn::linear(vars.root() / "unused", 6, 2, Default::default());
        let mut adam = AdamW::new(AdamWConfig::default(), OptimizerState::fresh("sft"));
        adam.zero_grad(&vars);
        backward(&used, 3);
        adam.step(&vars);
        assert!(!adam.state.exp_avg.contains_key("unused.weight"));
        let dir = tempfile::tempdir().unwrap();
        adam.state.save(dir.path()).unwrap();
        let state = OptimizerState::load(dir.path(), &vars).unwrap().unwrap();
        assert_eq!(state.meta.steps, 1);
        assert!(state.exp_avg.contains_key("used.weight"));
        let mut damaged = state;
        damaged.exp_avg_sq.remove("used.bias");
        damaged.save(dir.path()).unwrap();
        let error = OptimizerState::load(dir.path(), &vars)
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("one of the two moments of parameter `used.bias`"),
            "{error}"
        );
    }
}
