//! `init-policy`: a fresh policy checkpoint with a tokenizer trained on the environment's language.
fn main() -> std::process::ExitCode {
    embodyflow_core::cli::main_with(embodyflow_update_policy::init::run)
}
