//! libtorch's CPU generator is one per process: `tch::manual_seed` and
//! every draw (a network's initial weights, sampling noise) share it
//! across threads. A network built or loaded by this crate draws its
//! initial weights while holding it ([`hold`]), and [`seeded`] seeds it and
//! holds it, so a seeded build sees no other thread's build draw in
//! between: "same seed, same weights" holds in a process whose threads
//! build networks at once (a test binary's parallel tests).
//!
//! Holding is re-entrant on a thread: a build inside [`seeded`]'s hold does
//! not wait for itself.
//!
//! ```no_run
//! use embodyflow_models::generator;
//! let _held = generator::seeded(3);
//! let a = tch::Tensor::randn([4], (tch::Kind::Float, tch::Device::Cpu));
//! // no build on another thread draws before `a` is drawn
//! ```

use std::cell::Cell;
use std::sync::{Mutex, MutexGuard};

static GENERATOR: Mutex<()> = Mutex::new(());

thread_local! {
    static HELD: Cell<bool> = const { Cell::new(false) };
}

/// The generator, held by this thread until the value drops.
#[must_use = "the generator is released when this value drops"]
pub struct Held {
    /// `None` when this thread held it already.
    guard: Option<MutexGuard<'static, ()>>,
}

/// Holds the generator (waits for another thread's hold to end; returns at
/// once when this thread holds it already).
pub fn hold() -> Held {
    if HELD.get() {
        return Held { guard: None };
    }
    let guard = GENERATOR
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    HELD.set(true);
    Held { guard: Some(guard) }
}

/// Seeds the generator with `seed` and holds it.
pub fn seeded(seed: i64) -> Held {
    let held = hold();
    tch::manual_seed(seed);
    held
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.guard.is_some() {
            HELD.set(false);
        }
    }
}
