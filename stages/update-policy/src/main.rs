//! `update-policy`: SFT and PPO/GRPO updates of a policy checkpoint.
fn main() -> std::process::ExitCode {
    embodyflow_core::cli::main_with(embodyflow_update_policy::run)
}
