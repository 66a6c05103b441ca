//! `collect-rollouts`: G sampled answers per task, executed, written as trajectories and steps.
fn main() -> std::process::ExitCode {
    embodyflow_core::cli::main_with(embodyflow_collect_rollouts::run)
}
