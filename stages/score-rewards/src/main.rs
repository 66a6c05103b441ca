//! `score-rewards`: trajectory rewards and rule step matches.
fn main() -> std::process::ExitCode {
    embodyflow_core::cli::main_with(embodyflow_score_rewards::run)
}
