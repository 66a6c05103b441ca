//! `evaluate`: greedy success rates by split and task type.
fn main() -> std::process::ExitCode {
    embodyflow_core::cli::main_with(embodyflow_evaluate::run)
}
