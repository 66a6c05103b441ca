//! Policy models in tch (libtorch). The stages that run a network
//! (collect-rollouts, teacher-logp, update-policy, evaluate) load them from
//! here, on the device `--device` names.
//!
//! - [`device`]: `--device cpu|cuda:N` to a `tch::Device`, with a clear error
//!   when CUDA is asked for and absent;
//! - [`gpt`]: a small decoder-only transformer (GPT-2 shape, pre-norm, learned
//!   positions, tied embeddings) whose `config.json` is a serde struct.
//!
//! The examples in these docs are not run as doctests (`doctest = false`):
//! rustdoc links them in a temporary directory that the binaries' relative
//! rpath to `.venv/libtorch/lib` does not reach; the unit tests run the same code.

pub mod device;
pub mod gpt;
