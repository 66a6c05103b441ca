//! bf16 training over fp32 master weights (mixed precision as veRL's FSDP
//! actor and Megatron run it): the network's parameters hold bf16 copies,
//! the forward and backward run in bf16, and the optimizer updates an fp32
//! copy of every parameter with fp32 gradients and fp32 AdamW moments,
//! after which the bf16 copies are rewritten from it.
//!
//! ```text
//! start:   master_p = fp32(p);  p ← bf16(p)                (every parameter)
//! step:    g = fp32(∂L/∂p)  (the bf16 backward's gradients)
//!          clip(g); AdamW(master_p, g)  (moments fp32);  p ← bf16(master_p)
//! finish:  p ← master_p  (fp32 again, exactly the master weights)
//! ```
//!
//! The log-probs the PPO/GRPO ratio reads are computed from logits upcast
//! to fp32 before `log_softmax` (the scorers' `log_softmax(-1, Float)`), so
//! only the network runs in bf16. A VLA ([`crate::vla`]) also casts its
//! float inputs (pixels, proprio, latent slots) to the parameters' dtype
//! where they enter and upcasts its values and predicted latents to fp32. On CUDA this is the same option; torch's
//! autocast would instead keep fp32 parameters and cast each matmul's
//! inputs, which costs the same bf16 matmuls with the fp32 copy held as
//! the parameters themselves.
//!
//! ```no_run
//! use embodyflow_models::optimizer::{AdamW, AdamWConfig, OptimizerState, clip_grads};
//! use embodyflow_models::precision::MasterWeights;
//! # let mut vs = tch::nn::VarStore::new(tch::Device::Cpu);
//! let mut adam = AdamW::new(AdamWConfig::default(), OptimizerState::fresh("ppo"));
//! let master = MasterWeights::new(&mut vs); // vs now bf16
//! // ... zero_grad, loss.backward() in bf16 ...
//! let params = master.gradients(&vs);
//! let grads: Vec<tch::Tensor> = params.iter().map(|(_, _, g)| g.shallow_clone()).collect();
//! clip_grads(&grads, 1.0);
//! adam.step_params(params);
//! master.write_back(&vs);
//! master.finish(&mut vs); // fp32 again, for saving
//! ```

use tch::nn::VarStore;
use tch::{Kind, Tensor};

/// The fp32 master copy of a store's parameters while the store holds bf16.
#[derive(Debug)]
pub struct MasterWeights {
    /// (name, fp32 copy), every variable of the store.
    weights: Vec<(String, Tensor)>,
}

impl MasterWeights {
    /// Copies every variable of `vars` to fp32 and turns the store to bf16.
    pub fn new(vars: &mut VarStore) -> MasterWeights {
        let mut weights: Vec<(String, Tensor)> = vars
            .variables()
            .into_iter()
            .map(|(name, var)| (name, var.detach().to_kind(Kind::Float).copy()))
            .collect();
        weights.sort_by(|a, b| a.0.cmp(&b.0));
        vars.bfloat16();
        MasterWeights { weights }
    }

    /// (name, master weight, its fp32 gradient) of every trainable variable
    /// of `vars` that has a gradient: what [`crate::optimizer::AdamW::step_params`] takes.
    pub fn gradients(&self, vars: &VarStore) -> Vec<(String, Tensor, Tensor)> {
        let variables = vars.variables();
        self.weights
            .iter()
            .filter_map(|(name, master)| {
                let var = variables.get(name)?;
                let grad = var.grad();
                (var.requires_grad() && grad.defined()).then(|| {
                    (
                        name.clone(),
                        master.shallow_clone(),
                        grad.to_kind(Kind::Float),
                    )
                })
            })
            .collect()
    }

    /// Rewrites the store's bf16 parameters from the master weights.
    pub fn write_back(&self, vars: &VarStore) {
        let variables = vars.variables();
        tch::no_grad(|| {
            for (name, master) in &self.weights {
                if let Some(var) = variables.get(name) {
                    let mut var = var.shallow_clone();
                    var.copy_(master);
                }
            }
        });
    }

    /// Turns the store back to fp32 holding exactly the master weights.
    pub fn finish(self, vars: &mut VarStore) {
        vars.float();
        self.write_back(vars);
    }
}
