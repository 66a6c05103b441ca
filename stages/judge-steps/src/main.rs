//! `judge-steps`: the built-in rule judge (the step_gates table).
fn main() -> std::process::ExitCode {
    embodyflow_core::cli::main_with(embodyflow_judge_steps::run)
}
