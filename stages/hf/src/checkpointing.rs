//! Gradient (activation) checkpointing per block: a training forward keeps
//! only each block's input, and the backward recomputes one block at a time
//! (what `torch.utils.checkpoint` does per decoder layer in the trainers
//! the seeds use; libtorch's Rust binding has no such function, so it is
//! written here over plain autograd).
//!
//! ```text
//! forward (no graph):   x_0 = entry;  x_{i+1} = f_i(x_i)  i < n, keeping x_i
//!                       out = leaf(x_n)       the caller's loss is built on it
//! loss.backward()       fills g_n = ∂L/∂out
//! i = n-1 … 0:          x = leaf(x_i); y = f_i(x)  (the graph of block i only)
//!                       backward(sum(y ⊙ g_{i+1}))  → ∂L/∂θ_i added, g_i = ∂L/∂x
//! outside:              backward(sum(entry ⊙ g_0) + Σ_s sum(side_s ⊙ ∂L/∂leaf(side_s)))
//! ```
//!
//! `sum(y ⊙ g)`'s gradient with respect to `y` is `g`, so the backward of
//! block `i` adds exactly its vector–Jacobian product to the parameters'
//! gradients and gives the input's; the recomputed `y` is bit for bit the
//! forward's (the same operations on the same input), so the gradients are
//! those of the plain path up to the order of summation. Tensors a block
//! reads from outside the chain with a graph of their own (Qwen3-VL's
//! DeepStack features, which come from the vision tower) enter as leaves
//! and get their gradient in the one outside backward, with the entry's
//! (the embeddings, and through them the vision tower or a VLA's own
//! embeddings), so no graph is walked twice. Peak activation memory is the
//! `n` block inputs plus one block's graph, instead of every block's graph.
//!
//! A block is a boxed closure over shallow clones of its parameters
//! ([`Shallow`]: the same variables, so gradients land on them). A run
//! records its segment on a per-thread tape when checkpointing is
//! [`enable`]d and gradients are on (a `no_grad` scorer, the KL reference,
//! sampling: the plain path); [`backward`] runs `loss.backward()` and then
//! the recorded segments, last first (a segment fed by an earlier one, as a
//! vision tower feeding the language model, passes its gradient to the
//! earlier one's output). Blocks hold no dropout (the networks here have
//! none), so recomputation needs no random state.
//!
//! ```no_run
//! use embodyflow_hf::checkpointing;
//! # let model = embodyflow_hf::HfDecoder::load("m".as_ref(), tch::Device::Cpu).unwrap();
//! # let (ids, mask) = (tch::Tensor::zeros([1, 2], (tch::Kind::Int64, tch::Device::Cpu)), tch::Tensor::ones([1, 2], (tch::Kind::Int64, tch::Device::Cpu)));
//! let _on = checkpointing::enable(true);
//! let loss = model.forward(&ids, &mask).unwrap().mean(tch::Kind::Float);
//! checkpointing::backward(&loss); // the blocks' gradients, one block's graph at a time
//! ```

use std::cell::{Cell, RefCell};

use tch::nn;
use tch::{Device, Kind, Tensor};

/// One block of a chain: its input to its output.
pub type Block = Box<dyn Fn(&Tensor) -> Tensor>;

/// A copy of a network part sharing its tensors (and so their gradients):
/// what a [`Block`] captures.
pub trait Shallow {
    /// The copy.
    fn shallow(&self) -> Self;
}

impl Shallow for Tensor {
    fn shallow(&self) -> Self {
        self.shallow_clone()
    }
}

impl<T: Shallow> Shallow for Option<T> {
    fn shallow(&self) -> Self {
        self.as_ref().map(T::shallow)
    }
}

impl<A: Shallow, B: Shallow> Shallow for (A, B) {
    fn shallow(&self) -> Self {
        (self.0.shallow(), self.1.shallow())
    }
}

impl Shallow for nn::Linear {
    fn shallow(&self) -> Self {
        nn::Linear {
            ws: self.ws.shallow(),
            bs: self.bs.shallow(),
        }
    }
}

/// A recorded chain: what its backward needs.
struct Segment {
    blocks: Vec<Block>,
    /// Each block's input, without a graph.
    inputs: Vec<Tensor>,
    /// The leaf the caller got as the chain's output.
    output: Tensor,
    /// The first block's input as the caller gave it (with its graph).
    entry: Tensor,
    /// Side inputs: (as given, with their graph; the leaf the blocks read).
    sides: Vec<(Tensor, Tensor)>,
}

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static TAPE: RefCell<Vec<Segment>> = const { RefCell::new(Vec::new()) };
}

/// Keeps checkpointing switched as [`enable`] set it until dropped, then
/// restores the previous setting (and forgets segments no backward ran).
#[must_use = "checkpointing is switched back when the guard is dropped"]
pub struct Enabled {
    previous: bool,
}

/// Switches checkpointing on (or off) on this thread until the guard drops.
pub fn enable(on: bool) -> Enabled {
    Enabled {
        previous: ON.with(|c| c.replace(on)),
    }
}

impl Drop for Enabled {
    fn drop(&mut self) {
        ON.with(|c| c.set(self.previous));
        if !self.previous {
            TAPE.with(|t| t.borrow_mut().clear());
        }
    }
}

/// Segments recorded on this thread that no [`backward`] has run yet.
pub fn pending() -> usize {
    TAPE.with(|t| t.borrow().len())
}

/// Whether gradients are being recorded (libtorch's grad mode).
fn grad_mode() -> bool {
    let probe = Tensor::zeros([], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    (&probe * 1.0).requires_grad()
}

/// Whether a run now records a segment: switched on and gradients on.
pub fn active() -> bool {
    ON.with(Cell::get) && grad_mode()
}

/// Runs the chain `blocks(sides)` on `entry`. Inactive ([`active`]): the
/// blocks in order with their graph. Active: without a graph, keeping
/// each block's input and recording the segment for [`backward`]; the
/// output is a leaf the caller builds its loss on. `sides` are tensors
/// the blocks read besides the chain (given to `blocks` as they are, or
/// as leaves when active). `trains`: whether the blocks' parameters
/// require gradients; with neither they nor `entry` nor a side requiring
/// them (a frozen vision tower), nothing is kept or recorded.
pub fn run(
    entry: Tensor,
    sides: &[&Tensor],
    trains: bool,
    blocks: impl FnOnce(&[Tensor]) -> Vec<Block>,
) -> Tensor {
    if !active() {
        let sides: Vec<Tensor> = sides.iter().map(|t| t.shallow_clone()).collect();
        return blocks(&sides).iter().fold(entry, |x, block| block(&x));
    }
    let leaves: Vec<Tensor> = sides
        .iter()
        .map(|t| t.detach().set_requires_grad(t.requires_grad()))
        .collect();
    let blocks = blocks(&leaves);
    let mut inputs = Vec::with_capacity(blocks.len());
    let last = tch::no_grad(|| {
        blocks.iter().fold(entry.detach(), |x, block| {
            let y = block(&x);
            inputs.push(x);
            y
        })
    });
    if !(trains || entry.requires_grad() || sides.iter().any(|t| t.requires_grad())) {
        return last;
    }
    let output = last.set_requires_grad(true);
    TAPE.with(|t| {
        t.borrow_mut().push(Segment {
            blocks,
            inputs,
            output: output.shallow_clone(),
            entry,
            sides: sides
                .iter()
                .map(|t| t.shallow_clone())
                .zip(leaves)
                .collect(),
        })
    });
    output
}

/// `loss.backward()`, then every segment recorded since, last first
/// (the module doc's backward). With nothing recorded, `loss.backward()`.
pub fn backward(loss: &Tensor) {
    loss.backward();
    while let Some(segment) = TAPE.with(|t| t.borrow_mut().pop()) {
        segment.backward();
    }
}

impl Segment {
    fn backward(self) {
        let mut grad = self.output.grad();
        if !grad.defined() {
            return; // the loss did not use this output
        }
        for (block, input) in self.blocks.iter().zip(&self.inputs).rev() {
            let x = input.detach().set_requires_grad(true);
            let y = block(&x);
            if !y.requires_grad() {
                return; // nothing before it is trained
            }
            (y * &grad).sum(Kind::Float).backward();
            grad = x.grad();
            if !grad.defined() {
                grad = x.zeros_like();
            }
        }
        let mut outside: Vec<Tensor> = Vec::new();
        if self.entry.requires_grad() {
            outside.push((&self.entry * &grad).sum(Kind::Float));
        }
        for (given, leaf) in &self.sides {
            let g = leaf.grad();
            if given.requires_grad() && g.defined() {
                outside.push((given * g).sum(Kind::Float));
            }
        }
        if !outside.is_empty() {
            Tensor::stack(&outside, 0).sum(Kind::Float).backward();
        }
    }
}
