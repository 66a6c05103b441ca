//! `compute-advantages`: per-token advantages from rollouts and rewards.
fn main() -> std::process::ExitCode {
    embodyflow_core::cli::main_with(embodyflow_compute_advantages::run)
}
